"""The latency predictor: TENSILE's cold-start op latency model (journal IV-A), small.

One MLP for all op kinds (the authors trained one 2048x2048 tanh MLP per op type, 321 MB,
on unnormalised inputs): input = one-hot op kind ++ standardised
:func:`~.opfeatures.op_features` ++ device utilisation; output = standardised
log-latency. About 40k parameters (< 200 kB). Samples come from :mod:`.calibrate`.

:class:`Predictor` implements :class:`~.estimate.LatencyModel`. Nodes that are not timed
kernels (views, ``getitem``, scalar arithmetic) take :class:`~.estimate.RooflineModel`'s
view latency; an op kind calibration never saw falls back to the roofline model and is
counted in ``predictor.fallbacks``; an op far outside the sizes calibration measured is
predicted by its kind's least-squares power law instead of the MLP (counted in
``predictor.extrapolated``). ``predictor.machine`` (the calibrated roofline figures,
host<->device copy bandwidth included) is what :mod:`.access` reads for swap times.

Persistence: ``<cache>/predictor-<device>-<key>.pt`` (plain tensors, loaded with
``weights_only=True``) beside ``.json`` metadata, where ``<cache>`` is ``$DBML_CACHE_DIR``,
else ``$XDG_CACHE_HOME/dbml``, else ``~/.cache/dbml``, and ``<key>`` hashes the device
fingerprint (device name, torch version, threads on CPU, feature format). A machine or
torch upgrade therefore finds no predictor: :func:`load_predictor` returns None and the
caller calibrates (:func:`~.calibrate.load_or_calibrate`). So does a file whose metadata
names another format or another feature layout (``FEATURE_NAMES``) than this code's.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, NamedTuple

import torch
import torch.fx as fx

from ..execute.rng import JobRandom
from .estimate import Machine, RooflineModel
from .opfeatures import FEATURE_NAMES, LOG_BYTES, LOG_FLOPS, N_FEATURES, op_features, op_kind
from .samples import Samples, baseline_log, fit_baseline, median_relative_error, r2_score, split_heldout
from .utilisation import device_utilisation
from .. import config

__all__ = ["Predictor", "Samples", "OpReport", "PredictorReport", "fit_predictor", "load_predictor",
           "fingerprint", "cache_dir", "predictor_path", "split_heldout", "fit_baseline", "r2_score",
           "median_relative_error", "predictions", "heldout_report"]

FORMAT = 3                     # bump when features or architecture change: old caches go stale
HIDDEN = (128, 128, 64)        # four weight layers, as the paper's "four layers MLP"
BATCH = 256
LEARNING_RATE = 3e-3
# Huber loss on standardised log-latency: a timing spiked by another process's burst
# (a shared machine) pulls the fit linearly, not quadratically.
HUBER_DELTA = 0.5
# Kinds with many samples (optimizer elementwise ops) would drown rare, costly kinds
# (convolution_backward): sample minibatches with weight count(kind) ** -BALANCE_POWER.
BALANCE_POWER = 0.5
# An op whose log2 FLOPs or bytes exceed the largest calibrated for its kind by more than
# this many doublings is predicted by the kind's least-squares power law: the MLP
# interpolates well and extrapolates arbitrarily; a power law in FLOPs/bytes scales.
# (switch: DBML_PREDICTOR_EXTRAPOLATE, read in config.py)
EXTRAPOLATION_MARGIN = 1.0
# The MLP learns the residual of its kind's least-squares power law (log t ~ a + b log
# FLOPs + c log bytes + d util) rather than log t itself: the power law carries the
# scale and extrapolates; the MLP adds what shape, strides, layout and load do beyond
# it. With a few dozen shapes per kind a bare MLP overfits the scale.
# (switch: DBML_PREDICTOR_RESIDUAL, read in config.py)
# Features are log2 sizes, flags and a [0, 1] load: a feature (nearly) constant in training
# (every add was float32) must not blow up when a graph brings another value (an int64
# counter), so standardisation divides by at least this.
STD_FLOOR = 0.25
# Predictions are clamped to [1 ns, 1000 s]: a guard, never reached by sane inputs.
LOG_LATENCY_RANGE = (math.log(1e-9), math.log(1e3))
# No op is predicted faster than its FLOPs at the highest FLOP/s calibration measured, or
# its bytes at the copy bandwidth (the calibrated machine's roofline): beyond the sizes calibration timed,
# a kind's power law fitted on overhead-bound small shapes grows too slowly (held-out
# transformer, batch 16: its ops summed to a fifth of the roofline's estimate).
ROOFLINE_FLOOR = True
UTIL_TTL_S = 1.0               # re-read device utilisation at most once a second


# -- the network ------------------------------------------------------------------------

def _make_net(n_in: int, hidden: tuple[int, ...]) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for width in hidden:
        layers += [torch.nn.Linear(n_in, width), torch.nn.SiLU()]
        n_in = width
    layers.append(torch.nn.Linear(n_in, 1))
    return torch.nn.Sequential(*layers)


def _inputs(idx: torch.Tensor, features: torch.Tensor, util: torch.Tensor, n_kinds: int,
            mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    onehot = torch.nn.functional.one_hot(idx, n_kinds).float()
    x = torch.cat([features, util[:, None]], dim=1)
    return torch.cat([onehot, (x - mean) / std], dim=1)


def _learning_rate(progress: float) -> float:
    """Linear warm-up over the first 5%, then cosine decay to zero at ``progress`` 1."""
    if progress < 0.05:
        return LEARNING_RATE * progress / 0.05
    return LEARNING_RATE * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _train_net(x: torch.Tensor, y: torch.Tensor, weights: torch.Tensor, hidden: tuple[int, ...],
               steps: int, seconds: float, seed: int,
               progress: Callable[[int, int], None] | None) -> torch.nn.Sequential:
    """Minibatch AdamW for ``steps`` steps or ``seconds``, whichever ends first; the
    learning-rate schedule follows whichever is further along."""
    gen = torch.Generator().manual_seed(seed)
    net = JobRandom(seed).call(_make_net, x.shape[1], hidden)   # never the process's generator
    opt = torch.optim.AdamW(net.parameters(), lr=LEARNING_RATE, weight_decay=1e-4)
    start, step, done = time.perf_counter(), 0, 0.0
    while done < 1.0:
        for group in opt.param_groups:
            group["lr"] = _learning_rate(done)
        rows = torch.multinomial(weights, min(BATCH, len(weights)), replacement=True, generator=gen)
        loss = torch.nn.functional.huber_loss(net(x[rows]).squeeze(1), y[rows], delta=HUBER_DELTA)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        done = max(step / steps, (time.perf_counter() - start) / seconds)
        if progress is not None and step % 50 == 0:
            progress(min(steps, int(done * steps)), steps)
    return net.eval()


# -- report -----------------------------------------------------------------------------

class OpReport(NamedTuple):
    op: str
    samples: int              # calibration rows of this kind (training + held-out)
    r2: float                 # MLP, log-latency, held-out shapes
    baseline_r2: float        # least squares on log FLOPs / log bytes / util, same data
    median_rel_error: float   # MLP, |pred - t| / t, held-out shapes
    baseline_median_rel_error: float | None = None   # the baseline's, same rows (None: an older predictor's report)


@dataclass(frozen=True)
class PredictorReport:
    rows: list[OpReport]
    fingerprint: dict
    model_bytes: int
    calibration_seconds: float
    fallbacks: dict[str, int]
    copy_bandwidth: dict[str, float]

    def format(self) -> str:
        """The table ``python -m dbml install`` prints: per op kind, the median relative error
        of the network and of the least-squares baseline on held-out shapes. R^2 is left to
        the ``dbml_predictor`` view: on log latencies that barely vary within a kind (an
        elementwise op's held-out shapes) it is a large negative number, e.g. -3919.9, even
        where the predictions are within a few per cent."""
        lines = ["held-out shapes: median |predicted - measured| / measured",
                 f"{'op':44} {'samples':>7} {'network':>8} {'baseline':>8}"]
        for r in self.rows:
            base = "-" if r.baseline_median_rel_error is None else f"{r.baseline_median_rel_error:.1%}"
            lines.append(f"{r.op:44} {r.samples:7d} {r.median_rel_error:8.1%} {base:>8}")
        lines.append(f"model {self.model_bytes / 1e3:.0f} kB, calibration {self.calibration_seconds:.0f} s, "
                     f"fallbacks {sum(self.fallbacks.values())}; " + "R^2 per op: SELECT * FROM dbml_predictor")
        return "\n".join(lines)


def _evaluate(pred_log: torch.Tensor, base_log: torch.Tensor, log_latency: torch.Tensor,
              kinds: list[str], counts: Counter) -> list[OpReport]:
    rows = []
    for kind in sorted(set(kinds)):
        sel = torch.tensor([i for i, s in enumerate(kinds) if s == kind], dtype=torch.long)
        y = log_latency[sel]
        rows.append(OpReport(kind, counts[kind], r2_score(y, pred_log[sel]), r2_score(y, base_log[sel]),
                             median_relative_error(y.exp(), pred_log[sel].exp()),
                             median_relative_error(y.exp(), base_log[sel].exp())))
    return rows


# -- the predictor ------------------------------------------------------------------------

class Predictor:
    """An MLP latency model over captured nodes (a :class:`~.estimate.LatencyModel`)."""

    def __init__(self, tensors: dict[str, torch.Tensor], meta: dict):
        self.tensors, self.meta = tensors, meta
        self.device = meta["device"]
        self.vocab: dict[str, int] = meta["vocab"]
        self.net = _make_net(len(self.vocab) + N_FEATURES + 1, tuple(meta["hidden"]))
        self.net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
        self.net.eval()
        self.machine = Machine(**meta["machine"])
        self.copy_bandwidth: dict[str, float] = meta["copy_bandwidth"]
        # Kinds calibration never saw: the roofline at the bandwidth FLOP-less ops typically
        # reach (elementwise kernels with transcendentals run far below a copy's bandwidth);
        # every kind: no faster than the calibrated machine's roofline (ROOFLINE_FLOOR).
        # The floor without the fixed cost per op: small ops are the network's to predict
        # (their fixed cost is what it learns best; the machine's is one fastest sample).
        self.floor = RooflineModel(replace(self.machine, op_overhead=0.0))
        typical = meta.get("fallback_bandwidth")
        self.fallback = RooflineModel(replace(self.machine, memory_bandwidth=typical or self.machine.memory_bandwidth))
        self.fallbacks: Counter[str] = Counter()
        self.extrapolated: Counter[str] = Counter()
        self.utilisation: float | None = None   # set to pin the load; None reads the device
        self._util_read = (-math.inf, 0.0)
        self._cache: dict[tuple, float] = {}
        self.samples: Samples | None = None
        # an iteration ~ iteration_scale * its ops' latencies + node_overhead per node (.iteration)
        self.iteration_scale: float = meta.get("iteration_scale", 1.0)
        self.node_overhead: float = meta.get("node_overhead", 0.0)

    # LatencyModel
    def predict(self, node: fx.Node) -> float:
        """The node's share of a whole iteration: its latency as an op timed on its own,
        times :attr:`iteration_scale`, plus :attr:`node_overhead` (see :mod:`.iteration`)."""
        return self.iteration_scale * self.predict_op(node) + self.node_overhead

    def predict_op(self, node: fx.Node) -> float:
        """The node's latency timed on its own, as calibration timed ops."""
        kind = op_kind(node)
        if kind is None:
            return self.fallback.predict(node)
        if kind not in self.vocab:
            self.fallbacks[kind] += 1
            return self.fallback.predict(node)
        predicted = self.predict_features(kind, op_features(node), self.current_utilisation())
        return max(predicted, self.floor.predict(node)) if ROOFLINE_FLOOR else predicted

    def current_utilisation(self) -> float:
        if self.utilisation is not None:
            return float(self.utilisation)
        at, value = self._util_read
        if time.monotonic() - at > UTIL_TTL_S:
            value = device_utilisation(self.device)
            self._util_read = (time.monotonic(), value)
        return value

    def predict_features(self, kind: str, features: list[float], util: float) -> float:
        key = (kind, tuple(features), round(util, 3))
        if key not in self._cache:
            self._cache[key] = self._predict_uncached(kind, features, util)
        return self._cache[key]

    def _predict_uncached(self, kind: str, features: list[float], util: float) -> float:
        idx = torch.tensor([self.vocab[kind]])
        f = torch.tensor([features], dtype=torch.float32)
        u = torch.tensor([util], dtype=torch.float32)
        if config.predictor_extrapolates_with_baseline() and self._beyond_calibration(kind, features):
            self.extrapolated[kind] += 1
            return float(baseline_log(self.tensors["baseline"], idx, f, u).clamp(*LOG_LATENCY_RANGE).exp())
        return float(self.predict_log(idx, f, u).exp())

    def _beyond_calibration(self, kind: str, features: list[float]) -> bool:
        top_flops, top_bytes = self.meta["kind_max"][kind]
        return (features[LOG_FLOPS] > top_flops + EXTRAPOLATION_MARGIN
                or features[LOG_BYTES] > top_bytes + EXTRAPOLATION_MARGIN)

    @torch.no_grad()
    def predict_log(self, idx: torch.Tensor, features: torch.Tensor, util: torch.Tensor) -> torch.Tensor:
        """Natural-log latency (seconds) of rows of (kind index, features, utilisation)."""
        t = self.tensors
        x = _inputs(idx, features, util, len(self.vocab), t["x_mean"], t["x_std"])
        out = self.net(x).squeeze(1) * t["y_std"] + t["y_mean"]
        if self.meta["residual"]:
            out = out + baseline_log(t["baseline"], idx, features, util)
        return out.clamp(*LOG_LATENCY_RANGE)

    @property
    def model_bytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.tensors.values())

    def report(self) -> PredictorReport:
        rows = [OpReport(*r) for r in self.meta["report"]]
        return PredictorReport(rows, self.meta["fingerprint"], self.model_bytes,
                               self.meta.get("calibration_seconds", 0.0), dict(self.fallbacks),
                               dict(self.copy_bandwidth))

    def save(self, path: str | Path | None = None) -> Path:
        """Write ``path`` (.pt tensors) and its .json metadata; returns the .pt path."""
        path = Path(path) if path is not None else predictor_path(self.device)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_pt, tmp_json = path.with_suffix(".pt.tmp"), path.with_suffix(".json.tmp")
        torch.save({k: v.contiguous() for k, v in self.tensors.items()}, tmp_pt)
        tmp_json.write_text(json.dumps(self.meta, indent=1, sort_keys=True))
        os.replace(tmp_pt, path)
        os.replace(tmp_json, path.with_suffix(".json"))  # written last: its presence = complete
        return path


# -- fingerprint and cache ------------------------------------------------------------------

def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(device: str | torch.device = "cpu", threads: int | None = None) -> dict:
    """What a predictor's timings depend on: device, its name, torch (and CUDA) version;
    on CPU also the core and intra-op thread counts (latency scales with them; ``threads``
    defaults to the current ``torch.get_num_threads()``)."""
    device = torch.device(device)
    fp = {"device": device.type, "torch": torch.__version__, "format": FORMAT}
    if device.type == "cuda":
        fp["name"] = torch.cuda.get_device_name(device) if torch.cuda.is_available() else "unavailable"
        fp["cuda"] = torch.version.cuda
    else:
        fp.update(name=_cpu_name(), cores=os.cpu_count(),
                  threads=torch.get_num_threads() if threads is None else threads)
    return fp


def cache_dir() -> Path:
    return config.cache_dir()


def predictor_path(device: str | torch.device = "cpu", threads: int | None = None) -> Path:
    fp = fingerprint(device, threads)
    key = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"predictor-{fp['device']}-{key}.pt"


def _current(meta: dict, device: str | torch.device, threads: int | None) -> bool:
    """Whether saved ``meta`` fits this code and machine: its format, its feature layout
    (a layout changed without a format bump still goes stale: the network's input width
    would not match, or worse, match with other meanings) and the device fingerprint."""
    return (meta.get("format") == FORMAT and meta.get("features") == FEATURE_NAMES
            and meta.get("fingerprint") == fingerprint(device, threads))


def load_predictor(device: str | torch.device = "cpu", path: str | Path | None = None,
                   threads: int | None = None) -> Predictor | None:
    """The cached predictor for this device's fingerprint (with ``threads`` PyTorch threads,
    default the current count), or None (caller calibrates)."""
    path = Path(path) if path is not None else predictor_path(device, threads)
    meta_path = path.with_suffix(".json")
    if not path.exists() or not meta_path.exists():
        return None
    meta = json.loads(meta_path.read_text())
    if not _current(meta, device, threads):
        return None
    tensors = torch.load(path, weights_only=True, map_location="cpu")
    return Predictor(tensors, meta)


# -- fitting ------------------------------------------------------------------------------------

def _kind_max(samples: Samples, rows: list[int]) -> dict[str, list[float]]:
    top: dict[str, list[float]] = {}
    for i in rows:
        f = samples.features[i]
        cur = top.setdefault(samples.kinds[i], [-math.inf, -math.inf])
        cur[0], cur[1] = max(cur[0], f[LOG_FLOPS]), max(cur[1], f[LOG_BYTES])
    return top


def fit_predictor(samples: Samples, device: str | torch.device, machine: Machine,
                  copy_bandwidth: dict[str, float], *, steps: int | None = None, seconds: float = math.inf,
                  hidden: tuple[int, ...] = HIDDEN, seed: int = 0, residual: bool | None = None,
                  progress: Callable[[int, int], None] | None = None,
                  fallback_bandwidth: float | None = None) -> Predictor:
    """Train on the training shapes of ``samples`` (at most ``steps`` steps or
    ``seconds``); evaluate on the held-out shapes. ``fallback_bandwidth``: bytes/s the
    roofline fallback assumes for kinds calibration never saw (default the machine's). ``steps`` and ``residual`` default
    to the environment's (``config.predictor_steps``, ``config.predictor_residual``)."""
    steps = config.predictor_steps() if steps is None else steps
    residual = config.predictor_residual() if residual is None else residual
    train, test = split_heldout(samples, seed=seed)
    vocab = {k: i for i, k in enumerate(sorted({samples.kinds[i] for i in train}))}
    idx = torch.tensor([vocab.get(k, -1) for k in samples.kinds])
    feats = torch.tensor(samples.features, dtype=torch.float32)
    util = torch.tensor(samples.util, dtype=torch.float32)
    log_t = torch.tensor(samples.latency, dtype=torch.float64).log().float()
    tr = torch.tensor(train, dtype=torch.long)
    baseline = fit_baseline([samples.kinds[i] for i in train], feats[tr], util[tr], log_t[tr], vocab)
    target = log_t[tr] - (baseline_log(baseline, idx[tr], feats[tr], util[tr]) if residual else 0.0)
    x_all = torch.cat([feats, util[:, None]], dim=1)
    x_mean, x_std = x_all[tr].mean(0), x_all[tr].std(0).clamp_min(STD_FLOOR)
    y_mean, y_std = target.mean(), target.std().clamp_min(1e-3)
    counts = Counter(samples.kinds[i] for i in train)
    weights = torch.tensor([counts[samples.kinds[i]] ** -BALANCE_POWER for i in train])
    x = _inputs(idx[tr], feats[tr], util[tr], len(vocab), x_mean, x_std)
    net = _train_net(x, (target - y_mean) / y_std, weights, hidden, steps, seconds, seed, progress)
    tensors = {f"net.{k}": v.detach().clone() for k, v in net.state_dict().items()}
    tensors.update(x_mean=x_mean, x_std=x_std, y_mean=y_mean, y_std=y_std, baseline=baseline)
    meta = {"format": FORMAT, "features": FEATURE_NAMES, "device": str(torch.device(device)),
            "fingerprint": fingerprint(device),
            "vocab": vocab, "hidden": list(hidden), "residual": residual, "machine": machine.__dict__,
            "copy_bandwidth": copy_bandwidth, "kind_max": _kind_max(samples, train),
            "train_rows": len(train), "heldout_rows": len(test), "report": [],
            "fallback_bandwidth": fallback_bandwidth}
    predictor = Predictor(tensors, meta)
    meta["report"] = [list(r) for r in heldout_report(predictor, samples, test)]
    predictor.samples = samples  # in memory only, for benchmarks and tests
    return predictor


def predictions(predictor: Predictor, samples: Samples, rows: list[int]):
    """(kinds, log t, MLP log t, baseline log t) of the sample ``rows`` whose kind the
    predictor knows (natural logs of seconds)."""
    rows = [i for i in rows if samples.kinds[i] in predictor.vocab]
    kinds = [samples.kinds[i] for i in rows]
    idx = torch.tensor([predictor.vocab[k] for k in kinds], dtype=torch.long)
    feats = torch.tensor([samples.features[i] for i in rows], dtype=torch.float32).reshape(len(rows), N_FEATURES)
    util = torch.tensor([samples.util[i] for i in rows], dtype=torch.float32)
    log_t = torch.tensor([samples.latency[i] for i in rows], dtype=torch.float64).log().float()
    pred = predictor.predict_log(idx, feats, util)
    return kinds, log_t, pred, baseline_log(predictor.tensors["baseline"], idx, feats, util)


def heldout_report(predictor: Predictor, samples: Samples, rows: list[int]) -> list[OpReport]:
    """Per kind: MLP and baseline R^2 (log-latency) and median relative errors on
    ``rows``; ``samples`` counts all rows of the kind."""
    kinds, log_t, pred, base = predictions(predictor, samples, rows)
    return _evaluate(pred, base, log_t, kinds, Counter(samples.kinds)) if kinds else []
