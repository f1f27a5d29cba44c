"""Who makes a runner's plans: the :class:`ExternalPlanner` protocol and its two local kinds.

A :class:`~.runner.ScheduledStep` asks one planner for every plan it runs (a graph's
first plan, a replan after its latencies drifted, a plan from a passive iteration's
observation), and at each iteration boundary asks it whether a newer plan is out. The
planner is one of:

* a shared multi-job planner (``MemoryScheduler.planner_for(job)``, a
  :class:`~..multijob.scheduler.JobPlanner`), which plans every job on the device jointly
  and changes a job's plans when another comes, goes or drifts;
* :class:`LocalPlanner`: a job alone, within its own budget (``planner.plan``);
* :class:`FixedPlanner`: a plain ``(AccessSequence) -> Plan`` callable (a test's hook),
  whose plans never change by themselves;
* :class:`SearchPlanner`: a job alone within its own budget by one of the seeds' other
  planners, PoocH (``plan/pooch.py``) or SwapAdvisor (``plan/swapadvisor.py``).
"""

from __future__ import annotations

import sys
from typing import Callable, Protocol, runtime_checkable

from ..graph.sequence import AccessSequence, Plan
from ..multijob.ledger import DeviceLedger
from ..plan.planner import PlanSettings, plan
from ..plan.pooch import pooch_plan
from ..plan.swapadvisor import swapadvisor_plan

__all__ = ["ExternalPlanner", "LocalPlanner", "FixedPlanner", "SearchPlanner", "SEARCHES", "as_planner",
           "release_only"]


@runtime_checkable
class ExternalPlanner(Protocol):
    """What a runner needs of its planner."""

    ledger: DeviceLedger | None   # the device's ledger the job's executors report to, if any

    def __call__(self, seq: AccessSequence) -> Plan:
        """A plan for ``seq``'s graph (raises InfeasibleBudget, or NotAdmitted)."""

    def version(self) -> int:
        """Changes when the plans the job may run change (LookupError: job unknown yet)."""

    def latest(self, seq: AccessSequence) -> Plan:
        """The plan ``seq``'s graph may run now (LookupError: none yet)."""

    def made_from(self, seq: AccessSequence) -> AccessSequence:
        """The sequence (with the latencies) the plan :meth:`latest` gives was made from."""

    def applied(self) -> None:
        """The runner has taken the plan :meth:`latest` gave and holds no more than it allows."""


class _Unchanging:
    """A planner whose plans change only when the runner asks for a new one."""

    ledger: DeviceLedger | None = None

    def version(self) -> int:
        return 0

    def latest(self, seq: AccessSequence) -> Plan:
        raise LookupError("a local planner publishes no plans")   # never asked: the version never moves

    def made_from(self, seq: AccessSequence) -> AccessSequence:
        return seq

    def applied(self) -> None:
        pass


class LocalPlanner(_Unchanging):
    """One job alone: ``plan(seq, budget_bytes)``. ``budget_bytes=None``: no limit (the
    plan releases after last use; ``swap=False`` plans with the planner's policy
    ``"none"``, which never swaps)."""

    def __init__(self, budget_bytes: int | None, swap: bool = True, settings: PlanSettings | None = None):
        self.budget_bytes, self.swap, self.settings = budget_bytes, swap, settings

    def __call__(self, seq: AccessSequence) -> Plan:
        budget = sys.maxsize if self.budget_bytes is None else self.budget_bytes
        return plan(seq, budget, policy="tensile" if self.swap else "none", settings=self.settings)


class FixedPlanner(_Unchanging):
    """A plain ``(AccessSequence) -> Plan`` callable as a planner."""

    def __init__(self, fn: Callable[[AccessSequence], Plan]):
        self.fn = fn

    def __call__(self, seq: AccessSequence) -> Plan:
        return self.fn(seq)


# runner policy -> the planner that searches a job's plan within its budget
SEARCHES = {"pooch": pooch_plan, "swapadvisor": swapadvisor_plan}


class SearchPlanner(_Unchanging):
    """One job alone within its own budget (None: no limit), planned by ``SEARCHES[policy]``.
    ``settings``: that planner's own (PoochSettings, SwapAdvisorSettings); TENSILE's
    PlanSettings are not theirs and are ignored."""

    def __init__(self, policy: str, budget_bytes: int | None, settings=None):
        self.search, self.budget_bytes = SEARCHES[policy], budget_bytes
        self.settings = None if isinstance(settings, PlanSettings) else settings

    def __call__(self, seq: AccessSequence) -> Plan:
        budget = sys.maxsize if self.budget_bytes is None else self.budget_bytes
        return self.search(seq, budget, self.settings)


def as_planner(planner: ExternalPlanner | Callable[[AccessSequence], Plan]) -> ExternalPlanner:
    """``planner`` itself when it is a whole :class:`ExternalPlanner`, else a bare
    callable wrapped as a :class:`FixedPlanner`."""
    return planner if isinstance(planner, ExternalPlanner) else FixedPlanner(planner)


def release_only(seq: AccessSequence, settings: PlanSettings | None = None) -> Plan:
    """No plan yet: release after last use, nothing else (passive mode starts from it)."""
    return plan(seq, sys.maxsize, policy="none", settings=settings)
