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
_LOADED: dict[tuple[str, int], object] = {}   # (device, threads) -> Predictor


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


def loaded_predictor(device: str, threads: int):
    """The predictor jobs on ``device`` with ``threads`` threads plan with: the one this
    process loaded or calibrated, else the installed one; None if there is none."""
    from .scheduler.latency.predictor import load_predictor

    return _LOADED.get((device, threads)) or load_predictor(device, threads=threads)
