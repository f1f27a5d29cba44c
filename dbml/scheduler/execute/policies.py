"""How a runner schedules each graph: one policy object per runner policy.

A :class:`Policy` answers the three questions where the policies differ:

* ``first_plan``: the plan a new graph starts with, the executor's hard limit, and
  whether it starts passive (no plan yet: evicting against the limit on demand);
* ``limit``: the executor's hard limit under a plan taken later;
* ``after_iteration``: after each iteration, a new plan (and the sequence it was made
  from) for the next boundary, or None.

:class:`TensilePolicy` plans from the estimates and keeps the plan up to date (TENSILE
IV-E); :class:`CapuchinPolicy` starts passive and plans from the first iteration's
measurement; :class:`NoSchedulingPolicy` plans once and never replans (policy ``"none"``,
and ``"tensile"`` with neither a budget nor a shared planner: nothing to schedule
against); :class:`VdnnPolicy` too, its planner making vDNN-conv's fixed plan, and
:class:`SearchPolicy` (``"pooch"``, ``"swapadvisor"``), whose planner searches once within
the job's budget. Every plan comes from the runner's :class:`Planning`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from ..errors import InfeasibleBudget
from ..graph.sequence import AccessSequence, Plan
from ..plan.planner import PlanSettings
from .executor import Executor
from .planners import ExternalPlanner, release_only
from .updating import LatencyTracker, UpdateSettings, retime

__all__ = ["Policy", "TensilePolicy", "CapuchinPolicy", "NoSchedulingPolicy", "VdnnPolicy", "SearchPolicy", "Planning",
           "PlanCounts", "Start", "make_policy"]


@dataclass
class PlanCounts:
    """What planning cost so far (part of the runner's stats)."""

    plan_seconds: float = 0.0    # every call of the planner: first plans, observations, replans
    replans: int = 0             # replans after latencies drifted (plan updating)
    replan_seconds: float = 0.0  # ... and the time they took
    deferred_replans: int = 0    # drifts that waited for UpdateSettings.max_plan_share
    failed_replans: int = 0      # ... that found no plan within the budget (old plan kept)


class Planning:
    """The runner's planner, timed (``counts.plan_seconds``), and the job's clock."""

    def __init__(self, planner: ExternalPlanner, settings: PlanSettings | None = None):
        self.planner, self.settings = planner, settings
        self.counts = PlanCounts()
        self.started: float | None = None   # perf_counter() at the first step

    def __call__(self, seq: AccessSequence) -> Plan:
        t0 = time.perf_counter()
        try:
            return self.planner(seq)
        finally:
            self.counts.plan_seconds += time.perf_counter() - t0

    def release_only(self, seq: AccessSequence) -> Plan:
        return release_only(seq, self.settings)

    def start(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()

    def elapsed(self) -> float:
        """Wall seconds since the job's first step."""
        return time.perf_counter() - self.started


@dataclass(frozen=True)
class Start:
    """How a new graph starts: its plan, the executor's hard limit (None: none), and
    whether it runs passive (evicting on demand against the limit)."""

    plan: Plan
    limit: int | None
    passive: bool


Offer = tuple[Plan, AccessSequence]   # a plan for the next boundary and the sequence it was made from


class Policy(Protocol):
    def first_plan(self, seq: AccessSequence, fallback_limit: int | None) -> Start:
        """``fallback_limit``: the largest limit among the job's graphs so far (None: this is its first)."""

    def limit(self, plan: Plan) -> int | None:
        """The executor's hard limit under ``plan``."""

    def after_iteration(self, executor: Executor, seq: AccessSequence, tracker: LatencyTracker,
                        passive: bool) -> Offer | None:
        """A new plan after an iteration of the graph that ``executor`` runs (``seq``: the
        sequence its plan was made from), or None."""


class NoSchedulingPolicy:
    """One plan per graph, no limit, no updating: the plan only releases (or is the
    shared planner's), whatever the latencies."""

    def __init__(self, planning: Planning):
        self.planning = planning

    def first_plan(self, seq: AccessSequence, fallback_limit: int | None) -> Start:
        return Start(self.planning(seq), None, False)

    def limit(self, plan: Plan) -> int | None:
        return None

    def after_iteration(self, executor: Executor, seq: AccessSequence, tracker: LatencyTracker,
                        passive: bool) -> Offer | None:
        return None


class VdnnPolicy(NoSchedulingPolicy):
    """vDNN-conv (the runner's planner is :func:`~..plan.vdnn.vdnn_plan`): one fixed plan
    per graph, no budget, never replanned. The plan's peak is the limit: vDNN has the
    next layer wait for a layer's offload to finish, so an offload the copy channel has
    not finished yet makes compute wait, not the device hold more than planned (without
    it the measured peak would depend on how fast the copy thread runs)."""

    def first_plan(self, seq: AccessSequence, fallback_limit: int | None) -> Start:
        plan = self.planning(seq)
        return Start(plan, self.limit(plan), False)

    def limit(self, plan: Plan) -> int | None:
        return plan.peak_bytes


class SearchPolicy(VdnnPolicy):
    """PoocH and SwapAdvisor (the runner's planner is a :class:`~.planners.SearchPlanner`):
    one plan per graph, searched by simulation within the job's budget from the latency
    model's estimates (standing in for the papers' profiled iterations), never replanned;
    the plan's peak, within the budget, is the limit."""


class TensilePolicy:
    """Plan from the estimates before the first iteration (cold start), then replan when
    the measured latencies drift (TENSILE IV-E; :mod:`.updating`)."""

    def __init__(self, planning: Planning, budget_bytes: int | None, update: UpdateSettings):
        self.planning, self.budget_bytes, self.update = planning, budget_bytes, update

    def first_plan(self, seq: AccessSequence, fallback_limit: int | None) -> Start:
        try:
            plan = self.planning(seq)
        except InfeasibleBudget:
            if fallback_limit is None:
                raise
            # A further graph (the last, smaller batch: faster ops hide fewer copies)
            # that no plan fits beside the other jobs: it runs in passive mode within
            # the largest limit the job's planned graphs have, evicting on demand,
            # and is planned again from what it measures (see after_iteration).
            return Start(self.planning.release_only(seq), fallback_limit, True)
        return Start(plan, self.limit(plan), False)

    def limit(self, plan: Plan) -> int | None:
        """The plan's peak is a promise: where copies run slower than planned, compute
        waits for them rather than exceed it (and never exceeds the budget)."""
        return min(plan.peak_bytes, self.budget_bytes if self.budget_bytes is not None else plan.peak_bytes)

    def after_iteration(self, executor: Executor, seq: AccessSequence, tracker: LatencyTracker,
                        passive: bool) -> Offer | None:
        """Fold the measured latencies in; replan when they drifted (or, in passive mode,
        plan from the observation)."""
        measured = executor.op_latencies()
        if passive:
            observed = retime(seq, measured)
            try:
                return self.planning(observed), observed
            except InfeasibleBudget:
                return None   # no plan fits: stay in passive mode, observe again next iteration
        if tracker.observe(measured, executor.copy_bandwidth()):
            return self._replan(seq, tracker)
        return None

    def _replan(self, seq: AccessSequence, tracker: LatencyTracker) -> Offer | None:
        counts, share = self.planning.counts, self.update.max_plan_share
        if share is not None and counts.replan_seconds > share * self.planning.elapsed():
            counts.deferred_replans += 1   # the drift stays: replan once the share allows it
            return None
        seq = retime(seq, tracker.latencies, tracker.bandwidth if self.update.copy_bandwidth else None)
        t0 = counts.plan_seconds
        try:
            new = self.planning(seq)
        except InfeasibleBudget:
            # the current plan still fits (its peak is a ledger bound); only its
            # timing is stale. Measure drift from the new latencies from now on.
            counts.failed_replans += 1
            tracker.rebase(seq)
            return None
        finally:
            counts.replan_seconds += counts.plan_seconds - t0
        counts.replans += 1
        return new, seq


class CapuchinPolicy(TensilePolicy):
    """Passive mode first (Capuchin, as TENSILE's paper reproduces it): a graph's first
    iteration runs with no plan, evicting against the budget on demand; its measured
    latencies are the observation the next iteration's plan is made from. From then on
    as TENSILE, with the budget as the limit, which eviction (still armed) defends."""

    def first_plan(self, seq: AccessSequence, fallback_limit: int | None) -> Start:
        return Start(self.planning.release_only(seq), self.budget_bytes, True)

    def limit(self, plan: Plan) -> int | None:
        return self.budget_bytes


def make_policy(name: str, planning: Planning, budget_bytes: int | None, update: UpdateSettings,
                bounded: bool) -> Policy:
    """The policy object for runner policy ``name``. ``bounded``: plans are made within a
    budget (the job's own, or the shared planner's); without one TENSILE has nothing to
    schedule against."""
    if name == "capuchin":
        return CapuchinPolicy(planning, budget_bytes, update)
    if name == "tensile" and bounded:
        return TensilePolicy(planning, budget_bytes, update)
    if name == "vdnn":
        return VdnnPolicy(planning)
    if name in ("pooch", "swapadvisor"):
        return SearchPolicy(planning)
    return NoSchedulingPolicy(planning)
