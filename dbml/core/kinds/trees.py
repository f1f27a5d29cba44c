"""``boosted_tree`` and ``random_forest``: LightGBM's gradient-boosted trees and random forests
over a job's encoded features (numeric columns standardised, categories one-hot, as for every
dbml model: monotone per feature, so the trees' splits are the same).

The model is a ``torch.nn.Module`` holding LightGBM's text model as a uint8 buffer, so the
catalog stores and loads it as any model's weights; ``forward`` returns logits
(classification: log-probabilities up to a constant, so softmax gives LightGBM's
probabilities) or the scaled target (regression). ``attributions`` gives TreeSHAP values
(LightGBM's ``pred_contrib``), exact for trees.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ...errors import InvalidArgument
from ..models import ModelConfig, _frozen
from .scratch import Clock, read, validation_metric

BOOSTED_OPTIONS = {"max_iterations": 20, "learn_rate": 0.3, "max_tree_depth": 6, "subsample": 1.0,
                   "min_split_loss": 0.0, "l1_reg": 0.0, "l2_reg": 1.0, "min_tree_child_weight": 1.0,
                   "colsample_bytree": 1.0, "colsample_bynode": 1.0, "booster_type": "gbtree",
                   "early_stop": True, "min_rel_progress": 0.01, "auto_class_weights": False,
                   "num_parallel_tree": 1, "tree_method": "auto"}
# early_stop and min_rel_progress are taken and have nothing to stop: a forest is one
# iteration of num_parallel_tree trees (in BigQuery ML too)
FOREST_OPTIONS = {"num_parallel_tree": 100, "max_tree_depth": 15, "subsample": 0.8, "min_split_loss": 0.0,
                  "l1_reg": 0.0, "l2_reg": 0.0, "min_tree_child_weight": 1.0, "colsample_bytree": 1.0,
                  "colsample_bynode": 0.8, "auto_class_weights": False, "early_stop": False,
                  "min_rel_progress": 0.01, "tree_method": "auto"}
# LightGBM always splits on histograms of the features (BigQuery's HIST; AUTO picks it for
# large data); EXACT and APPROX are other algorithms it does not have
TREE_METHODS = ("auto", "hist")


def _lightgbm():
    try:
        import lightgbm
    except ImportError as e:
        raise InvalidArgument("train(): tree models need LightGBM; pip install 'dbml[trees]'") from e
    return lightgbm


class TreeModel(nn.Module):
    """A LightGBM booster as a module: its text model is the ``booster`` buffer."""

    def __init__(self, inputs, outputs: int, **options):
        super().__init__()
        self.outputs, self.options = outputs, options
        self.register_buffer("booster", torch.zeros(0, dtype=torch.uint8))
        self._lgb, self._scale = None, 1.0

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "booster"
        if key in state_dict:   # the stored model's size, whatever the empty module held
            self.booster = torch.empty_like(state_dict[key])
            self._lgb = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def set_booster(self, booster) -> None:
        text = booster.model_to_string().encode()
        self.booster = torch.frombuffer(bytearray(text), dtype=torch.uint8).clone()
        self._lgb = None

    def model(self):
        if self._lgb is None:
            text = bytes(self.booster.numpy()).decode()
            self._lgb = _lightgbm().Booster(model_str=text)
            # a forest's raw score is the sum of its trees' (its predictions average them)
            self._scale = 1.0 / self._lgb.current_iteration() if "[boosting: rf]" in text else 1.0
        return self._lgb

    def raw(self, x: np.ndarray) -> np.ndarray:
        """(rows, outputs) raw scores: logits (binary: [0, log-odds]) or the scaled target."""
        raw = np.asarray(self.model().predict(np.asarray(x, dtype=np.float64), raw_score=True)) * self._scale
        if self.outputs == 2:
            return np.stack([np.zeros_like(raw), raw], axis=1)
        return raw.reshape(len(x), -1)

    def forward(self, x):
        if x.is_meta:   # forward_memory plans a pass on the meta device: the outputs are what torch holds
            return torch.empty(len(x), self.outputs, device="meta")
        return torch.as_tensor(self.raw(x.detach().cpu().numpy()), dtype=torch.float32)

    def attributions(self, x: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """TreeSHAP per input column for output ``target`` of each row (binary: the log-odds,
        for either class, signed toward that class); (attributions, baseline)."""
        contrib = np.asarray(self.model().predict(np.asarray(x, dtype=np.float64), pred_contrib=True)) * self._scale
        d = x.shape[1]
        if self.outputs > 2:
            per = contrib.reshape(len(x), self.outputs, d + 1)[np.arange(len(x)), target]
        else:
            per = contrib.reshape(len(x), d + 1)
            if self.outputs == 2:
                per = np.where((target == 0)[:, None], -per, per)
        return per[:, :d], per[:, d]


def _factory(inputs, outputs: int, **options) -> nn.Module:
    return TreeModel(inputs, outputs, **options)


BOOSTED = (_factory, BOOSTED_OPTIONS, "gradient-boosted trees (LightGBM; pip install 'dbml[trees]')")
FOREST = (_factory, FOREST_OPTIONS, "a random forest (LightGBM's rf mode; pip install 'dbml[trees]')")


def params(arch: str, options: dict, prep, seed: int, threads: int) -> tuple[dict, int]:
    """LightGBM's parameters and number of rounds for BigQuery ML's tree options."""
    o = options
    if str(o["tree_method"]).lower() not in TREE_METHODS:
        raise InvalidArgument(f"train(): tree_method {o['tree_method']!r} is not supported: LightGBM splits on "
                              f"histograms; pass 'hist' or 'auto'")
    p = {"max_depth": int(o["max_tree_depth"]), "num_leaves": min(2 ** int(o["max_tree_depth"]), 131072),
         "lambda_l1": o["l1_reg"], "lambda_l2": o["l2_reg"], "min_gain_to_split": o["min_split_loss"],
         "min_sum_hessian_in_leaf": o["min_tree_child_weight"], "feature_fraction": o["colsample_bytree"],
         "feature_fraction_bynode": o["colsample_bynode"], "bagging_fraction": o["subsample"],
         "bagging_freq": 1 if o["subsample"] < 1 else 0, "seed": seed, "deterministic": True,
         "num_threads": threads, "verbosity": -1, "min_data_in_leaf": 1}
    if prep.task == "classification":
        k = len(prep.classes)
        p.update({"objective": "binary", "metric": "binary_logloss"} if k == 2 else
                 {"objective": "multiclass", "num_class": k, "metric": "multi_logloss"})
    else:
        p.update({"objective": "regression", "metric": "l2"})
    if arch == "random_forest":
        if not o["subsample"] < 1:
            raise InvalidArgument("train(): a random forest needs subsample < 1 (each tree sees a sample of "
                                  "the rows); pass e.g. options := '{\"subsample\": 0.8}'")
        p.update({"boosting": "rf", "learning_rate": 1.0})
        return p, int(o["num_parallel_tree"])
    if int(o["num_parallel_tree"]) != 1:
        raise InvalidArgument(f"train(): num_parallel_tree is {o['num_parallel_tree']} for boosted trees; LightGBM "
                              f"grows one tree per boosting round: pass 1, or use a random forest")
    boosting = {"gbtree": "gbdt", "dart": "dart"}.get(str(o["booster_type"]).lower())
    if boosting is None:
        raise InvalidArgument(f"train(): booster_type {o['booster_type']!r} is not supported; use 'gbtree' or 'dart'")
    p.update({"boosting": boosting, "learning_rate": o["learn_rate"]})
    return p, int(o["max_iterations"])


def _weights(prep, y: np.ndarray, balanced: bool) -> np.ndarray | None:
    """Per-row weights inversely proportional to class frequency (``auto_class_weights``)."""
    if not balanced or prep.task != "classification":
        return None
    counts = np.bincount(y.astype(np.int64), minlength=len(prep.classes)).astype(np.float64)
    w = len(y) / (len(prep.classes) * np.maximum(counts, 1))
    return w[y.astype(np.int64)]


def fit(cur, table: str, prep, spec, n_train: int, n_val: int, progress) -> dict:
    """Fit the trees on the job's training rows; early stopping (boosted trees) on the held-out rows."""
    lgb = _lightgbm()
    from ...zoo import arch as zoo_arch, resolve_options
    options = resolve_options(zoo_arch(spec.arch), spec.options_dict(), prep.model_inputs())
    x, y, is_val = read(cur, table, prep.width)
    p, rounds = params(spec.arch, options, prep, int(spec.seed), int(spec.settings.torch_threads))
    balanced = bool(options.get("auto_class_weights"))
    train = lgb.Dataset(x[~is_val], y[~is_val], weight=_weights(prep, y[~is_val], balanced), free_raw_data=False)
    valid = [lgb.Dataset(x[is_val], y[is_val], reference=train)] if is_val.any() else []
    history, clock = [], Clock()
    progress.begin(rounds, 1)

    def callback(env):
        progress.step(n_train)
        values = {name: value for name, _, value, _ in env.evaluation_result_list}
        record = clock.record(env.iteration + 1, values["train"], learning_rate=p["learning_rate"],
                              **({"eval_loss": values["eval"]} if "eval" in values else {}))
        history.append(record)
        progress.end_epoch(record, {})
        if _stalled(history, options, spec.arch):
            raise lgb.callback.EarlyStopException(env.iteration, env.evaluation_result_list)

    booster = lgb.train(p, train, num_boost_round=rounds, valid_sets=[train, *valid],
                        valid_names=["train", *(["eval"] if valid else [])], callbacks=[callback])
    module = TreeModel(prep.model_inputs(), len(prep.classes) if prep.task == "classification" else 1, **options)
    module.set_booster(booster)
    module.eval()
    config = ModelConfig(spec.arch, prep.model_inputs(), module.outputs, _frozen(options))
    stored = {"final_loss": history[-1]["loss"], "history": history, "fetch_wait_seconds": 0.0, "memory": {}}
    stored.update(validation_metric(prep, module.raw(x[is_val]), y[is_val]))
    return {"config": config, "module": module, "metrics": stored, "memory": {}}


def _stalled(history: list, options: dict, arch: str) -> bool:
    """BigQuery ML's early stop: the eval loss improved by less than min_rel_progress (relative)."""
    if arch != "boosted_tree" or not options.get("early_stop") or len(history) < 2 or "eval_loss" not in history[-1]:
        return False
    before, now = history[-2]["eval_loss"], history[-1]["eval_loss"]
    return before > 0 and (before - now) / before < options["min_rel_progress"]
