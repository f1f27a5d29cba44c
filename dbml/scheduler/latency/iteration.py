"""The whole-iteration scale: what a captured step takes end to end, against the sum of
its ops' predicted latencies.

Calibration times each op on its own, in a loop over the same inputs (caches warm, the
output's memory just freed). Run in sequence, as an iteration runs them, the same ops
take longer: their inputs were written by other ops and have left the cache, outputs
land in memory first touched now, and every node (views and ``getitem`` included) costs
an interpreter step. Measured on the zoo's networks before this scale existed, the sum of
the predicted op times was 0.08-0.59x of a whole iteration.

So calibration also runs the zoo networks' steps end to end, as a job runs them (the
runtime passes in a runner per network: ``Workload.iteration``; the scheduler package
does not build jobs), and :func:`fit_iteration_scale` learns two numbers over those
networks: ``measured ~ scale * sum of op predictions + per_node * call nodes``. The
predictor returns ``scale * op latency + per_node`` for every node, so that a
sequence's op times add up to an iteration (the planner places swaps against those
times). Two global numbers, not a factor per op kind: with a handful of networks per
calibration, per-kind factors would be fitted on a few points each and would fit the
networks' mix rather than the ops.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch
import torch.fx as fx

__all__ = ["StepTiming", "predicted_step_seconds", "step_points", "fit_iteration_scale", "SCALE_RANGE"]

# The factor is clamped to this range: a guard against a calibration whose step timings
# were all spoiled (measured: 1.7x to 12x on a shared 2-core CPU).
SCALE_RANGE = (0.25, 50.0)


@dataclass(frozen=True)
class StepTiming:
    """One captured workload's step, run end to end at one load level."""

    describe: str
    graph: fx.GraphModule      # its nodes are what the predictor predicts
    util: float                # device utilisation read before the runs
    seconds: float             # a low quantile of the runs' wall times


def predicted_step_seconds(predict, graph: fx.GraphModule) -> float:
    """Sum of ``predict(node)`` over the step's call nodes (what the planner's access
    sequence adds up)."""
    return sum(predict(n) for n in graph.graph.nodes if n.op == "call_function")


def step_points(predictor, timings: list[StepTiming]) -> list[tuple[str, float, int, float]]:
    """(workload, predicted seconds, call nodes, measured seconds) per timing: the sum of
    the predictor's unscaled op latencies (``predict_op``) at the load each step was
    timed under."""
    pinned = predictor.utilisation
    out = []
    try:
        for t in timings:
            predictor.utilisation = t.util
            nodes = sum(n.op == "call_function" for n in t.graph.graph.nodes)
            out.append((t.describe, predicted_step_seconds(predictor.predict_op, t.graph), nodes, t.seconds))
    finally:
        predictor.utilisation = pinned
    return out


def fit_iteration_scale(points: list[tuple[str, float, int, float]]) -> tuple[float, float]:
    """(scale, seconds per node) of ``measured ~ scale * predicted + per_node * nodes``,
    least squares in relative error over ``points`` (from :func:`step_points`): each
    network counts alike, whatever its size. The per-node term is what every node costs
    in an iteration beyond its kernel (the executor's bookkeeping, the dispatcher): it
    dominates a small network's step. Constrained to ``scale >= 1`` (ops in sequence are
    not faster than alone) and ``per_node >= 0``: calibration's networks are small, so
    the two terms are nearly collinear and, on a loaded machine, the free fit swung from
    a negative scale to 7x. Where the free fit breaks a constraint, the better (in
    relative error) of the two fits on the boundary: scale 1 with a per-node cost, or a
    scale alone. No points: (1.0, 0.0). The scale is clamped to :data:`SCALE_RANGE`."""
    if not points:
        return 1.0, 0.0
    candidates = [_scale_only(points), _overhead_only(points)]
    if len(points) >= 3:
        a = torch.tensor([[p / m, n / m] for _, p, n, m in points], dtype=torch.float64)
        scale, per_node = torch.linalg.lstsq(a, torch.ones(len(points), 1, dtype=torch.float64)).solution.flatten().tolist()
        if scale >= 1 and per_node >= 0:
            candidates.append((scale, per_node))
    best = min(candidates, key=lambda c: _relative_error(points, *c))
    return _clamp(best[0]), best[1]


def _scale_only(points) -> tuple[float, float]:
    return max(1.0, math.exp(statistics.fmean(math.log(m / max(p, 1e-12)) for _, p, _, m in points))), 0.0


def _overhead_only(points) -> tuple[float, float]:
    """scale 1: per_node minimising the relative squared error (closed form)."""
    num = sum((n / m) * (1 - p / m) for _, p, n, m in points)
    den = sum((n / m) ** 2 for _, p, n, m in points)
    return 1.0, max(0.0, num / den) if den > 0 else 0.0


def _relative_error(points, scale: float, per_node: float) -> float:
    return sum(((scale * p + per_node * n) / m - 1) ** 2 for _, p, n, m in points)


def _clamp(scale: float) -> float:
    return min(SCALE_RANGE[1], max(SCALE_RANGE[0], scale))
