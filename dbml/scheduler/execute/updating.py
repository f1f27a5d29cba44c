"""Plan updating (TENSILE journal IV-E): measured op latencies correct the estimates.

The executor reports each op's measured latency after every iteration. A
:class:`LatencyTracker` keeps, per op, an exponentially weighted moving average
``new = beta * measured + (1 - beta) * old``, started from the latencies of the sequence
the current plan was made from. When the summed average ``s'`` has moved away from that
sequence's summed latency ``s`` by more than the threshold, ``|s' - s| / s > threshold``,
the tracker says so; the runner then rebuilds the access sequence with the averaged
latencies (:func:`retime`), replans, and the new plan takes effect at the next
iteration boundary. The new sequence becomes the reference: ``s`` is now ``s'``.

The authors' controller (tinyflow) compares the raw measured sum against the planned one
and folds the measurement in (``0.9 * measured + 0.1 * old``) only when it replans; here
the average is kept every iteration, so one noisy iteration moves it by ``beta`` of its
deviation and a lasting drift is followed at once. With ``beta=0.9`` the two agree for a
step change.

>>> from dbml.scheduler.graph.sequence import AccessSequence, Op, Phase
>>> seq = AccessSequence("j", (), (Op(0, "a", (), (), 0.0, 1.0, Phase.FORWARD),
...                               Op(1, "b", (), (), 1.0, 2.0, Phase.FORWARD)), frozenset())
>>> tracker = LatencyTracker(seq, UpdateSettings(beta=0.5, threshold=0.6))
>>> tracker.observe([1.0, 1.0]), tracker.observe([1.0, 3.0]), tracker.observe([1.0, 3.0])
(False, False, True)
>>> [op.latency for op in retime(seq, tracker.latencies).ops]
[1.0, 2.5]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from ..graph.sequence import AccessSequence

__all__ = ["UpdateSettings", "LatencyTracker", "drift", "ewma", "retime"]

# An op measured at 0 s (a getitem the executor skips) would give a zero-length op;
# the planner works with positive durations, as the estimators give.
MIN_LATENCY = 1e-7


@dataclass(frozen=True)
class UpdateSettings:
    """Plan updating. ``beta``: weight of a new measurement in the per-op moving average
    (the authors' 0.9). ``threshold``: relative change of the summed latency that
    triggers a replan (the authors' 0.3). ``enabled=False``: never replan.
    ``copy_bandwidth=True``: also follow the measured copy bandwidth (an extension).
    ``max_plan_share``: at most this fraction of the job's wall time since its first
    iteration goes to drift replans; past it a drift waits (it is kept) until the share
    allows the next replan (an extension: jobs sharing a CPU drift whenever one joins or
    leaves, and each joint replan costs CPU time; None: the paper's, no limit)."""

    beta: float = 0.9
    threshold: float = 0.3
    enabled: bool = True
    # Also correct the copy bandwidth (host <-> device) by the moving average of what the
    # copy channel achieved, and replan when it drifts past the threshold. Off by default:
    # the paper corrects op latencies only. Where the copy thread shares cores with
    # compute (CPU), copies run slower than measured on an idle machine.
    copy_bandwidth: bool = False
    max_plan_share: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.beta <= 1.0:
            raise ValueError(f"UpdateSettings: beta must be in (0, 1], got {self.beta}")
        if self.threshold < 0.0:
            raise ValueError(f"UpdateSettings: threshold must be >= 0, got {self.threshold}")
        if self.max_plan_share is not None and not 0.0 < self.max_plan_share <= 1.0:
            raise ValueError(f"UpdateSettings: max_plan_share must be in (0, 1] or None, got {self.max_plan_share}")


def ewma(old: Sequence[float], measured: Sequence[float], beta: float) -> list[float]:
    """Per op: ``beta * measured + (1 - beta) * old``."""
    if len(old) != len(measured):
        raise ValueError(f"ewma(): {len(measured)} measured latencies for {len(old)} ops")
    return [beta * m + (1.0 - beta) * o for o, m in zip(old, measured)]


def drift(reference: float, current: float) -> float:
    """``|s' - s| / s``: the relative change of the summed latency."""
    return abs(current - reference) / reference if reference > 0 else float("inf") if current > 0 else 0.0


def retime(seq: AccessSequence, latencies: Sequence[float], copy_bandwidth: float | None = None) -> AccessSequence:
    """The same access sequence with op ``i`` lasting ``latencies[i]`` seconds (one op
    after another, from 0), as :func:`~.access.build_sequence` lays ops out; and copies
    at ``copy_bandwidth`` bytes/s where given."""
    if len(latencies) != len(seq.ops):
        raise ValueError(f"retime(): {len(latencies)} latencies for {len(seq.ops)} ops of job {seq.job!r}")
    ops, t = [], 0.0
    for op, lat in zip(seq.ops, latencies):
        lat = max(float(lat), MIN_LATENCY)
        ops.append(dataclasses.replace(op, start=t, end=t + lat))
        t += lat
    bandwidth = seq.copy_bandwidth if copy_bandwidth is None else float(copy_bandwidth)
    return dataclasses.replace(seq, ops=tuple(ops), copy_bandwidth=bandwidth)


class LatencyTracker:
    """The moving average of one job graph's op latencies against its plan's sequence."""

    def __init__(self, seq: AccessSequence, settings: UpdateSettings | None = None):
        self.settings = settings or UpdateSettings()
        self.rebase(seq)

    def rebase(self, seq: AccessSequence) -> None:
        """A plan was made from ``seq``: measure drift against its latencies from now on
        (the average carries on from its own values where it has them)."""
        lats = [op.latency for op in seq.ops]
        if getattr(self, "latencies", None) is None or len(self.latencies) != len(lats):
            self.latencies = lats
            self.bandwidth = seq.copy_bandwidth
        self.reference = sum(lats)
        self.reference_bandwidth = seq.copy_bandwidth

    def observe(self, measured: Sequence[float], bandwidth: float | None = None) -> bool:
        """Fold one iteration's measured latencies (and the copy bandwidth achieved, if
        any copies ran and ``settings.copy_bandwidth``) in; True when the summed latency
        or the bandwidth has drifted past the threshold (the caller replans with
        :func:`retime` and calls :meth:`rebase`)."""
        beta = self.settings.beta
        self.latencies = ewma(self.latencies, measured, beta)
        if bandwidth is not None and self.settings.copy_bandwidth:
            self.bandwidth = beta * bandwidth + (1.0 - beta) * self.bandwidth
        return self.settings.enabled and self.drift > self.settings.threshold

    @property
    def drift(self) -> float:
        return max(drift(self.reference, sum(self.latencies)),
                   drift(self.reference_bandwidth, self.bandwidth) if self.settings.copy_bandwidth else 0.0)
