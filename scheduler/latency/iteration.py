"""The whole-iteration scale: what a captured step takes end to end, against the sum of
its ops' predicted latencies.

Calibration times each op on its own, in a loop over the same inputs (caches warm, the
output's memory just freed). Run in sequence, as an iteration runs them, the same ops
take longer: their inputs were written by other ops and have left the cache, outputs
land in memory first touched now, and every node (views and ``getitem`` included) costs
an interpreter step. Measured on the zoo's networks before this scale existed, the sum of
the predicted op times was 0.08-0.59x of a whole iteration.

So calibration also runs each captured workload's step end to end (its GraphModule on
real inputs: the executor calls the same kernels in the same order, within a few per
cent), and :func:`fit_iteration_scale` learns one factor: the geometric mean over those
networks of ``measured / sum of predictions``. The predictor multiplies every node's
prediction by it, so that a sequence's op times add up to an iteration (the planner
places swaps against those times). One global factor, not one per op kind: with a
dozen networks per calibration, per-kind factors would be fitted on a handful of
points each and would fit the networks' mix rather than the ops.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch.fx as fx

__all__ = ["StepTiming", "predicted_step_seconds", "step_ratios", "fit_iteration_scale", "SCALE_RANGE"]

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


def step_ratios(predictor, timings: list[StepTiming]) -> list[tuple[str, float]]:
    """(workload, measured / predicted) per timing: the predictor's unscaled op
    latencies (``predict_op``) at the load each step was timed under."""
    pinned = predictor.utilisation
    out = []
    try:
        for t in timings:
            predictor.utilisation = t.util
            predicted = predicted_step_seconds(predictor.predict_op, t.graph)
            out.append((t.describe, t.seconds / max(predicted, 1e-9)))
    finally:
        predictor.utilisation = pinned
    return out


def fit_iteration_scale(ratios: list[float]) -> float:
    """The geometric mean of ``ratios`` (1.0 where there are none), clamped to
    :data:`SCALE_RANGE`: a ratio's error is multiplicative."""
    if not ratios:
        return 1.0
    mean_log = statistics.fmean(math.log(r) for r in ratios)
    return min(SCALE_RANGE[1], max(SCALE_RANGE[0], math.exp(mean_log)))
