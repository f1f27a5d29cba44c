"""The joint solve (TENSILE Algorithm 3 over all jobs): pure functions from the jobs'
graphs and the budget to one plan per graph of every job, or InfeasibleBudget.

A job that sees several batch shapes has one access sequence per graph (told apart by
:func:`graph_key`: tensor sizes and op structure, not latencies). Only one graph runs at
a time, so the job's *primary* graph — the one with the largest release-only peak —
takes part in the joint plan, and its planned peak is the job's share; each other graph
is planned alone within that share, or, if it cannot fit there, within the share plus
the room no job reserves. A job's reservation is the largest planned peak over its
graphs; the reservations sum to at most the budget.

>>> from dbml.scheduler.graph.sequence import AccessSequence, TensorInfo, TensorKind, Op, Phase
>>> t = (TensorInfo(0, "x", 4, TensorKind.BATCH), TensorInfo(1, "y", 4, TensorKind.ACTIVATION))
>>> seq = AccessSequence("j", t, (Op(0, "relu", (0,), (1,), 0.0, 1.0, Phase.FORWARD),), frozenset({0}))
>>> jobs = {name: JobGraphs.of(name, seq) for name in ("a", "b")}
>>> {name: s.reserved_bytes for name, s in solve(jobs, 20, PlanSettings()).items()}
{'a': 8, 'b': 8}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Hashable, Mapping

from ..graph.sequence import AccessSequence, Plan
from ..plan.liveness import release_events
from ..plan.peak import analyse_peak
from ..plan.planner import InfeasibleBudget, PlanSettings, plan, plan_jobs

__all__ = ["JobGraphs", "JobSolution", "Solution", "for_job", "graph_key", "job_settings", "solve",
           "solve_within_share"]


def graph_key(seq: AccessSequence) -> Hashable:
    """What tells one graph of a job from another: tensor sizes and op structure. Two
    sequences of the same graph with different latencies have the same key."""
    return (tuple(t.nbytes for t in seq.tensors), tuple((o.inputs, o.outputs) for o in seq.ops),
            seq.initial, seq.workspace)


def for_job(seq: AccessSequence, job: str) -> AccessSequence:
    """``seq`` under the job's name (plans are named after the job they were made for)."""
    return seq if seq.job == job else dataclasses.replace(seq, job=job)


@dataclass(frozen=True)
class JobGraphs:
    """What a job brings to the solve: its graphs and their release-only peaks."""
    name: str
    swap_rate: float | None
    graphs: Mapping[Hashable, AccessSequence]   # graph_key -> sequence, in arrival order
    vanilla: Mapping[Hashable, int]             # graph_key -> release-only peak

    @classmethod
    def of(cls, name: str, seq: AccessSequence, swap_rate: float | None = None) -> "JobGraphs":
        """A job with one graph, ``seq`` (renamed to ``name``)."""
        if swap_rate is not None and not 0.0 <= swap_rate <= 1.0:
            raise ValueError(f"job {name!r}: swap_rate must be within [0, 1], got {swap_rate}")
        return cls(name, swap_rate, {}, {}).with_graph(graph_key(seq), for_job(seq, name))

    def primary(self) -> Hashable:
        """The graph with the largest release-only peak (the first such, on ties)."""
        return max(self.graphs, key=lambda k: self.vanilla[k])

    def with_graph(self, key: Hashable, seq: AccessSequence) -> "JobGraphs":
        graphs, vanilla = dict(self.graphs), dict(self.vanilla)
        graphs[key] = seq
        vanilla[key] = analyse_peak(seq, release_events(seq)).bytes
        return JobGraphs(self.name, self.swap_rate, graphs, vanilla)


@dataclass(frozen=True)
class JobSolution:
    """One job's part of a solution: a plan per graph, and which graph is primary."""
    primary: Hashable                   # graph_key of the graph in the joint plan
    plans: Mapping[Hashable, Plan]      # graph_key -> plan

    @property
    def reserved_bytes(self) -> int:
        """The job's reservation: the largest planned peak over its graphs."""
        return max(p.peak_bytes for p in self.plans.values())


Solution = dict[str, JobSolution]       # job name -> its plans


def job_settings(settings: PlanSettings, jobs: Mapping[str, JobGraphs]) -> PlanSettings:
    """``settings`` with each job's own ``swap_rate`` (where it gave one) in ``swap_rates``."""
    rates = dict(settings.swap_rates)
    rates.update({name: j.swap_rate for name, j in jobs.items() if j.swap_rate is not None})
    return dataclasses.replace(settings, swap_rates=rates)


def solve(jobs: Mapping[str, JobGraphs], budget_bytes: int, settings: PlanSettings) -> Solution:
    """Plans for every graph of every job within the budget, or InfeasibleBudget.
    ``settings`` already carry the jobs' swap rates (:func:`job_settings`)."""
    if not jobs:
        return {}
    primary = {name: j.primary() for name, j in jobs.items()}
    joint = plan_jobs([j.graphs[primary[name]] for name, j in jobs.items()], budget_bytes, settings)
    out = {}
    free = budget_bytes - sum(p.peak_bytes for p in joint.values())
    for name, j in jobs.items():
        share = joint[name].peak_bytes
        plans = {primary[name]: joint[name]}
        for key, seq in j.graphs.items():
            if key != primary[name]:
                plans[key] = p = _plan_secondary(seq, share, free, settings)
                free -= max(0, p.peak_bytes - share)
                share = max(share, p.peak_bytes)
        out[name] = JobSolution(primary[name], plans)
    return out


def _plan_secondary(seq: AccessSequence, share: int, free: int, settings: PlanSettings) -> Plan:
    """A secondary graph: within the job's share, else within the share and the free room."""
    try:
        return plan(seq, share, settings=settings)
    except InfeasibleBudget as err:
        if err.min_budget > share + free:
            raise InfeasibleBudget(f"{seq.job!r} (its graph of {len(seq.ops)} ops, beside the "
                                   f"other jobs)", share + free, err.min_budget) from None
        return plan(seq, share + free, settings=settings)


def solve_within_share(current: Mapping[str, JobSolution], job: str, key: Hashable, seq: AccessSequence,
                       settings: PlanSettings) -> Solution | None:
    """A drifted graph planned alone within its job's reservation in ``current``: the
    solution with only that plan changed, or None if it does not fit there."""
    mine = current[job]
    try:
        new = plan(seq, mine.reserved_bytes, settings=settings)
    except InfeasibleBudget:
        return None
    return {**current, job: JobSolution(mine.primary, {**mine.plans, key: new})}
