"""Calibration samples, their held-out split, and the least-squares power-law baseline
that the latency predictor's MLP learns the residual of (and is measured against)."""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from .opfeatures import LOG_BYTES, LOG_FLOPS

__all__ = ["Samples", "split_heldout", "r2_score", "median_relative_error", "fit_baseline",
           "baseline_log", "HELDOUT_FRACTION", "typical_bandwidth"]

HELDOUT_FRACTION = 0.25        # share of each op kind's distinct shapes kept out of training


# -- samples --------------------------------------------------------------------------

@dataclass
class Samples:
    """Calibration measurements: one row per (op shape, load level)."""

    kinds: list[str] = field(default_factory=list)
    features: list[list[float]] = field(default_factory=list)
    util: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)   # seconds
    level: list[float] = field(default_factory=list)     # load generator level
    probe: list[bool] = field(default_factory=list)      # timed on its own, not in a captured step
    workloads: int = 0                                   # models whose steps were timed
    steps: list = field(default_factory=list)            # iteration.StepTiming: whole steps run

    def add(self, kind: str, features: list[float], util: float, latency: float, level: float,
            probe: bool = False) -> None:
        self.kinds.append(kind)
        self.features.append(list(features))
        self.util.append(float(util))
        self.latency.append(float(latency))
        self.level.append(float(level))
        self.probe.append(bool(probe))

    def __len__(self) -> int:
        return len(self.kinds)

    def shape_key(self, i: int) -> tuple:
        return (self.kinds[i], tuple(round(f, 6) for f in self.features[i]))


def split_heldout(samples: Samples, fraction: float = HELDOUT_FRACTION,
                  seed: int = 0) -> tuple[list[int], list[int]]:
    """(train, held-out) row indices; every row of a held-out *shape* is held out, at
    every load level, so no held-out shape is ever trained on. Per kind, a share
    ``fraction`` of its distinct shapes is held out (none where it has fewer than 2)."""
    shapes: dict[str, list[tuple]] = defaultdict(list)
    for i in range(len(samples)):
        key = samples.shape_key(i)
        if key not in shapes[key[0]]:
            shapes[key[0]].append(key)
    rng = random.Random(seed)
    held: set[tuple] = set()
    for kind in sorted(shapes):
        keys = list(shapes[kind])
        rng.shuffle(keys)
        n = math.ceil(fraction * len(keys)) if len(keys) >= 2 else 0
        held.update(keys[:n])
    train = [i for i in range(len(samples)) if samples.shape_key(i) not in held]
    test = [i for i in range(len(samples)) if samples.shape_key(i) in held]
    return train, test


TYPICAL_MIN_BYTES = 1 << 20   # ops this large are bandwidth-bound, not overhead-bound


def typical_bandwidth(samples: Samples) -> float | None:
    """Median bytes/s of the FLOP-less ops (elementwise, reductions, copies) of at least
    :data:`TYPICAL_MIN_BYTES` timed without load: what the roofline fallback assumes for
    an op kind calibration never saw. None where calibration timed no such op."""
    quiet = min(samples.level, default=0.0)
    rates = [(2 ** samples.features[i][LOG_BYTES] - 1) / samples.latency[i] for i in range(len(samples))
             if samples.level[i] == quiet and samples.features[i][LOG_FLOPS] == 0
             and 2 ** samples.features[i][LOG_BYTES] > TYPICAL_MIN_BYTES]
    return statistics.median(rates) if rates else None


# -- metrics and the least-squares baseline --------------------------------------------

def r2_score(y: torch.Tensor, pred: torch.Tensor) -> float:
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")


def median_relative_error(latency: torch.Tensor, predicted: torch.Tensor) -> float:
    return float(((predicted - latency).abs() / latency).median())


def _baseline_design(features: torch.Tensor, util: torch.Tensor) -> torch.Tensor:
    ones = torch.ones_like(util)
    return torch.stack([ones, features[:, LOG_FLOPS], features[:, LOG_BYTES], util], dim=1)


# Each kind's slopes are shrunk toward the slopes pooled over all kinds with this weight
# (per row, in units of the design's squared log2 sizes). A kind seen at two or three
# shapes, or only at shapes of one size, leaves its slopes undetermined: with the tiny
# ridge this replaced, layer_norm_backward's bytes slope came out so steep that a shape
# just outside the calibrated ones was predicted at 1.4 s (measured: 60 us).
SHRINK = 1.0


def _solve(a: torch.Tensor, y: torch.Tensor, prior: torch.Tensor, weight: float) -> torch.Tensor:
    """Least squares ``a @ coef ~ y`` with ``weight * rows * |coef[1:] - prior[1:]|^2``
    added (the intercept is free)."""
    penalty = weight * len(y) * torch.eye(a.shape[1], dtype=torch.float64)
    penalty[0, 0] = 0.0
    return torch.linalg.solve(a.T @ a + penalty, a.T @ y + penalty @ prior)


def fit_baseline(kinds: list[str], features: torch.Tensor, util: torch.Tensor,
                 log_latency: torch.Tensor, vocab: dict[str, int]) -> torch.Tensor:
    """Per kind, least squares ``log t ~ a + b log FLOPs + c log bytes + d util``:
    a (len(vocab), 4) tensor of coefficients, each kind's slopes shrunk toward the
    slopes of all kinds pooled (:data:`SHRINK`)."""
    coef = torch.zeros(len(vocab), 4, dtype=torch.float64)
    design = _baseline_design(features, util).double()
    y_all = log_latency.double()
    pooled = _solve(design, y_all, torch.zeros(4, dtype=torch.float64), 1e-6) if len(kinds) else coef[0]
    for kind, k in vocab.items():
        rows = torch.tensor([i for i, s in enumerate(kinds) if s == kind], dtype=torch.long)
        if len(rows) == 0:
            continue
        coef[k] = _solve(design[rows], y_all[rows], pooled, SHRINK)
    return coef.float()


def baseline_log(coef: torch.Tensor, idx: torch.Tensor, features: torch.Tensor,
                  util: torch.Tensor) -> torch.Tensor:
    return (_baseline_design(features, util) * coef[idx]).sum(dim=1)
