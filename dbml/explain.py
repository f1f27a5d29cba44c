"""Feature attributions: how much each input feature moved one prediction away from a baseline.

* linear models (``nn.Linear``): exact, ``w_i * (x_i - b_i)`` of the explained output;
* tree models (``dbml.core.kinds.trees``): TreeSHAP (LightGBM's ``pred_contrib``), exact for trees;
* every other network, and every classifier but trees: integrated gradients (``_integrated_gradients``,
  torch's autograd, no extra install) from the baseline along the straight path to the row,
  ``IG_STEPS`` Gauss-Legendre points.

The baseline is the all-zero encoded row: every numeric feature at its training mean (dbml
standardises with the training statistics), every category absent. The explained output is
the predicted class's probability (classification: what ``predict_proba`` gives it; trees:
the log-odds toward the predicted class, which TreeSHAP splits exactly) or the prediction
(regression: attributions in the label's units, baseline and prediction values of the label).
Attributions of a categorical feature's one-hot columns (or an array's elements) are summed,
so there is one attribution per input column. Completeness: the attributions sum to
``prediction - baseline`` (``approximation_error`` is what integrated gradients miss).

SQL's ``explain(model, source)`` (``explain_sql``, ``explanations``) returns every source row
with ``prediction`` (as ``predictions``), ``attributions`` (one per input column, in the
model's feature order), ``baseline_value``, ``prediction_value`` and ``approximation_error``;
BigQuery ML's ``ML.EXPLAIN_PREDICT`` and ``ML.GLOBAL_EXPLAIN`` read ``explain_rows``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch
from sqlglot import exp
from torch import nn

from .core.columns import EXPLAIN_RESULT
from .errors import InvalidArgument

IG_STEPS = 64   # Gauss-Legendre points on the path: ~0.2 % of prediction - baseline left unexplained


def linear_layer(module: nn.Module) -> nn.Linear | None:
    if isinstance(module, nn.Linear):
        return module
    if isinstance(module, nn.Sequential) and len(module) == 1 and isinstance(module[0], nn.Linear):
        return module[0]
    return None


def _outputs(model, x: np.ndarray) -> np.ndarray:
    """The model's outputs, in chunks of as many rows as the memory budget holds."""
    from .core.inference import forward
    return forward(model, x, fn="explain").double().numpy()


def encoded(model, x: np.ndarray) -> dict:
    """Per encoded column: ``attributions`` (rows x width), ``baseline`` and ``prediction`` (rows,)
    of the explained output, ``target`` (its index) and ``approximation_error``."""
    module, prep = model.module, model.preprocessing
    if prep.input is not None:
        raise InvalidArgument(f"explain(): model {model.name!r} takes {prep.input.kind} input; explanations "
                              f"cover tabular models (numeric and categorical columns)")
    x = np.asarray(x, dtype=np.float32)
    out = _outputs(model, x)
    base_out = _outputs(model, np.zeros((1, x.shape[1]), dtype=np.float32))
    classifier = prep.task == "classification"
    target = out.argmax(1) if classifier else np.zeros(len(x), dtype=np.int64)
    rows = np.arange(len(x))
    scale = 1.0 if prep.task == "classification" else prep.target_std
    shift = 0.0 if prep.task == "classification" else prep.target_mean
    if hasattr(module, "attributions"):            # trees: TreeSHAP in LightGBM's raw score
        attr, base = module.attributions(x, target)
        pred = base + attr.sum(1)
        return _result(attr * scale, base * scale + shift, pred * scale + shift, target, np.zeros(len(x)))
    linear = linear_layer(module)
    if linear is not None and not classifier:   # exact: the output is linear in the row
        w = linear.weight.detach().double().numpy()[target]
        attr = w * x.astype(np.float64)
    else:
        attr = _integrated_gradients(model, x, target, probability=classifier)
    if classifier:   # the explained output: the class's probability
        out, base_out = _softmax(out), _softmax(base_out)
    base = np.broadcast_to(base_out[0], out.shape)[rows, target]
    pred = out[rows, target]
    error = np.abs(attr.sum(1) - (pred - base))
    return _result(attr * scale, base * scale + shift, pred * scale + shift, target, error * scale)


def _result(attr, base, pred, target, error) -> dict:
    return {"attributions": attr, "baseline": base, "prediction": pred, "target": target, "approximation_error": error}


def _softmax(out: np.ndarray) -> np.ndarray:
    e = np.exp(out - out.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _integrated_gradients(model, x: np.ndarray, target: np.ndarray, probability: bool) -> np.ndarray:
    """Integrated gradients of each row's ``target`` output (its softmax probability where
    ``probability``) from the all-zero baseline: ``x_i`` times the path's gradient averaged over
    ``IG_STEPS`` Gauss-Legendre points (Sundararajan et al. 2017; Captum's default rule), by
    torch's autograd. Each row's points are one forward and backward pass together, in passes of
    as many points as the memory budget holds (the rows and their gradients held beside them),
    so a vector of DuckDB rows through a transformer is not one pass of rows x ``IG_STEPS`` rows."""
    from .core.forward_memory import rows_within
    from .core.inference import inference_budget
    nodes, weights = np.polynomial.legendre.leggauss(IG_STEPS)
    alphas = torch.as_tensor((nodes + 1) / 2, dtype=torch.float32)[:, None, None]   # on [0, 1]
    weights = torch.as_tensor(weights / 2, dtype=torch.float64)[:, None, None]
    held = x.size * (4 + 4 + 8)   # the rows, their gradients and the float64 attributions
    at_once = rows_within(model.config, inference_budget(), held=held, fn="explain", grad=True)
    rows = max(1, min(len(x), at_once // IG_STEPS))   # rows per pass; their points: at_once
    parts = []
    with torch.enable_grad():
        for i in range(0, len(x), rows):
            inputs = torch.tensor(np.asarray(x[i:i + rows], dtype=np.float32))   # a copy: writable
            n = len(inputs)
            path = (alphas * inputs[None]).reshape(IG_STEPS * n, -1).requires_grad_(True)
            out = model.module(path)
            if probability:
                out = torch.softmax(out, 1)
            picked = out.reshape(IG_STEPS, n, -1)[:, torch.arange(n), torch.as_tensor(target[i:i + rows])]
            grads, = torch.autograd.grad(picked.sum(), path)
            mean_grad = (weights * grads.reshape(IG_STEPS, n, -1).double()).sum(0)
            parts.append((inputs.double() * mean_grad).numpy())
    return np.concatenate(parts) if parts else np.zeros(x.shape, dtype=np.float64)


def per_feature(prep, attributions: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Encoded columns' attributions summed per input column: (feature names, rows x features)."""
    names, cols, start = [], [], 0
    for f in prep.features:
        names.append(f.name)
        cols.append(attributions[:, start:start + f.width].sum(1))
        start += f.width
    return names, np.stack(cols, axis=1) if cols else np.zeros((len(attributions), 0))


def explain_rows(model, x: np.ndarray) -> dict:
    """``encoded`` summed per input column, with the feature names."""
    e = encoded(model, x)
    names, attr = per_feature(model.preprocessing, e["attributions"])
    return {**e, "features": names, "attributions": attr}


ATTRIBUTION = pa.struct([("feature", pa.string()), ("attribution", pa.float64())])


def explanations(model, x: pa.Array) -> pa.Array:
    """``dbml_explain``: per row encoded by ``features_sql`` (FLOAT[width]), a STRUCT of
    ``columns.EXPLAIN_RESULT``."""
    x = x.combine_chunks() if isinstance(x, pa.ChunkedArray) else x
    rows = x.flatten().to_numpy(zero_copy_only=False).reshape(len(x), model.preprocessing.width)
    e = explain_rows(model, rows)
    features = pa.array(np.tile(np.array(e["features"], dtype=object), len(x)), pa.string())
    values = pa.array(e["attributions"].reshape(-1), pa.float64())
    offsets = pa.array(np.arange(len(x) + 1, dtype=np.int32) * len(e["features"]))
    attributions = pa.ListArray.from_arrays(offsets, pa.StructArray.from_arrays([features, values],
                                                                               fields=list(ATTRIBUTION)))
    columns = {"attributions": attributions, "baseline_value": pa.array(e["baseline"], pa.float64()),
               "prediction_value": pa.array(e["prediction"], pa.float64()),
               "approximation_error": pa.array(e["approximation_error"], pa.float64())}
    return pa.StructArray.from_arrays([columns[k] for k in EXPLAIN_RESULT], names=list(EXPLAIN_RESULT))


def explain_sql(cur, cache, name: str, source: str) -> str:
    """The query behind ``explain(model, source)``: every source row, ``prediction`` and the
    columns of ``columns.EXPLAIN_RESULT``."""
    from .core.inference import model_and_source, over_source, prediction_expression
    from .core.source import parsed, value_sql
    model, select_sql, _ = model_and_source(cur, cache, name, source, "explain")
    prep = model.preprocessing
    if prep.input is not None:
        raise InvalidArgument(f"explain(): model {name!r} takes {prep.input.kind} input; explanations cover "
                              f"tabular models (numeric and categorical columns)")
    call = exp.Anonymous(this="dbml_explain", expressions=[
        value_sql(model.name), value_sql(model.uid), parsed(prep.features_sql())])
    return over_source([exp.alias_(prediction_expression(model), "prediction"), exp.func("unnest", call)],
                       select_sql)
