"""Which latency model a training job plans with: the installed predictor, or the roofline.

``python -m dbml install`` (or ``SELECT calibrate()``) calibrates this machine and saves
a predictor (``dbml.scheduler.latency.predictor``). A job that finds none runs the quick
calibration once per process and says so in its summary (``latency_model``).
"""

from __future__ import annotations

import threading

import torch

from .errors import InvalidArgument

LATENCY_MODELS = ("predictor", "roofline")
_LOCK = threading.Lock()
_LOADED: dict[str, object] = {}


def calibrate(device: str, quick: bool, threads: int, progress=None):
    """Calibrate ``device`` with ``threads`` PyTorch threads (the count jobs train with:
    the predictor's fingerprint includes it) and save the predictor."""
    from .scheduler.latency.calibrate import calibrate as run

    torch.set_num_threads(threads)
    with _LOCK:
        predictor = run(device, quick=quick, progress=progress)
        _LOADED[(device, threads)] = predictor
    return predictor


def latency_model(kind: str, device: str, threads: int) -> tuple[object | None, str]:
    """(model for ScheduledStep, how it was obtained). None means the runner's roofline default."""
    if kind not in LATENCY_MODELS:
        raise InvalidArgument(f"latency_model {kind!r} is unknown; SET VARIABLE dbml_latency_model = "
                              f"one of {', '.join(map(repr, LATENCY_MODELS))}")
    if kind == "roofline":
        return None, "roofline"
    from .scheduler.latency.calibrate import calibrate as run
    from .scheduler.latency.predictor import load_predictor

    key = (device, threads)
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key], "predictor"
        predictor = load_predictor(device, threads=threads)
        how = "predictor"
        if predictor is None:
            torch.set_num_threads(threads)
            predictor = run(device, quick=True)
            how = "predictor (none was installed: quick calibration ran now; run python -m dbml install)"
        _LOADED[key] = predictor
        return predictor, how


def report_rows(device: str, threads: int) -> list[dict]:
    """``dbml_predictor``: one row per op kind of the installed predictor (none if there is none)."""
    from .scheduler.latency.predictor import load_predictor

    predictor = _LOADED.get((device, threads)) or load_predictor(device, threads=threads)
    if predictor is None:
        return []
    report = predictor.report()
    fingerprint = ", ".join(f"{k}={v}" for k, v in sorted(report.fingerprint.items()))
    return [{"op": r.op, "samples": r.samples, "r2": _finite(r.r2), "baseline_r2": _finite(r.baseline_r2),
             "median_rel_error": _finite(r.median_rel_error), "fingerprint": fingerprint,
             "model_bytes": report.model_bytes, "calibration_seconds": report.calibration_seconds}
            for r in report.rows]


def _finite(x):
    return x if x is not None and x == x and abs(x) != float("inf") else None
