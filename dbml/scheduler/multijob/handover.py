"""Publishing plans and handing them over (TENSILE IV-F): :class:`Handover` owns the
plans published for each job (with their versions) and the plans each runner runs now;
:class:`JobPlanner` is one job's hook for ScheduledStep's ``planner=`` argument.

**Versions.** Each job's plans carry a version that increases exactly when one of its
plans changes (a replan that leaves a job's plans equal keeps its version, so its
executor is not rebuilt for nothing). A runner compares the version with the one it runs
at each iteration boundary and fetches the plan for its graph when it differs.

**Hand-over.** Plans fit the budget together, but each runner switches at its own next
iteration boundary; a job whose plan grows (a new job, a new graph, room freed by a leave
or a drift) could run beside another that still runs its old, larger plan. So a growing
plan is handed out only once the jobs it takes room from have taken their smaller plans;
a new job's first plan waits for that too. The plans in effect of the hooked jobs never
sum past the budget.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping, NamedTuple, Protocol

from ..errors import NotAdmitted, SchedulerError
from ..graph.sequence import AccessSequence, Plan
from .admission import POLL_SECONDS
from .ledger import DeviceLedger
from .solve import JobGraphs, JobSolution, Solution, graph_key

__all__ = ["Handover", "JobPlanner", "JobPlans", "Offer", "PlanningScheduler"]


@dataclass(frozen=True)
class JobPlans:
    """A job's published plans: one per graph, and the version they were published at."""
    job: str
    version: int
    primary: Hashable                 # graph_key of the graph in the joint plan
    plans: Mapping[Hashable, Plan]    # graph_key -> plan
    reserved_bytes: int               # the largest planned peak over the job's graphs
    sequences: Mapping[Hashable, AccessSequence] = field(default_factory=dict)   # what each was made from

    def plan(self, seq: AccessSequence | None = None) -> Plan:
        key = self.primary if seq is None else graph_key(seq)
        if key not in self.plans:
            raise KeyError(f"job {self.job!r} has no plan for this graph ({len(seq.ops)} ops); "
                           f"register it first with update({self.job!r}, seq)")
        return self.plans[key]


class Offer(NamedTuple):
    """What a hooked runner may run now. ``pending``: smaller plans handed out that count
    as taken only once the runner says it holds no more than they allow."""
    plans: JobPlans | None
    pending: bool = False


class Handover:
    """The published plans and the plans in effect, under the scheduler's condition
    ``cond`` (every method takes it; it is re-entrant). ``clock`` measures deadlines."""

    def __init__(self, cond: threading.Condition, clock: Callable[[], float]):
        self._cond, self._clock = cond, clock
        self._published: dict[str, JobPlans] = {}
        self._in_effect: dict[str, JobPlans] = {}   # what each hooked runner last took
        self._hooked: set[str] = set()              # jobs whose runners use a JobPlanner
        self._version = 0                      # last version handed out (all jobs share the counter)
        self._budget = 0                       # what the published plans fit together

    # -- publishing --------------------------------------------------------------------
    def publish(self, jobs: Mapping[str, JobGraphs], solution: Solution, budget_bytes: int) -> None:
        """Publish ``solution`` for ``jobs`` (the jobs now registered): a job's version
        moves only where one of its plans changed. Wakes every waiter."""
        with self._cond:
            published = {}
            for name in jobs:
                new, old = solution[name], self._published.get(name)
                if old is not None and old.primary == new.primary and dict(old.plans) == dict(new.plans):
                    published[name] = old
                    continue
                self._version += 1
                published[name] = JobPlans(name, self._version, new.primary, dict(new.plans), new.reserved_bytes,
                                           {k: jobs[name].graphs[k] for k in new.plans})
            total = sum(jp.reserved_bytes for jp in published.values())
            if total > budget_bytes:   # the solve promises this; a bug if not
                raise SchedulerError(f"MemoryScheduler: plans for {list(published)} reserve {total} bytes, "
                                     f"over the budget of {budget_bytes} bytes")
            self._published, self._budget = published, budget_bytes
            self._cond.notify_all()

    def published(self, job: str) -> JobPlans:
        """The job's published plans and their version, read together."""
        with self._cond:
            if job not in self._published:
                raise KeyError(f"job {job!r} is not registered with this MemoryScheduler")
            return self._published[job]

    def all_published(self) -> dict[str, JobPlans]:
        with self._cond:
            return dict(self._published)

    def solution(self) -> Solution:
        """The published plans as a solution (to change one job's and publish again)."""
        with self._cond:
            return {name: JobSolution(jp.primary, dict(jp.plans)) for name, jp in self._published.items()}

    def hook(self, job: str) -> None:
        """``job``'s runner plans through a JobPlanner: its plans in effect count."""
        with self._cond:
            self._hooked.add(job)

    def forget(self, job: str) -> None:
        """``job`` leaves: its runner runs nothing any more."""
        with self._cond:
            self._in_effect.pop(job, None)
            self._hooked.discard(job)

    def in_effect_bytes(self, job: str) -> int | None:
        with self._cond:
            return self._in_effect[job].reserved_bytes if job in self._in_effect else None

    def running_bytes(self) -> int:
        """What the runners may use now: hooked ones their plans in effect, others the latest."""
        with self._cond:
            return sum((self.in_effect_bytes(name) or 0) if name in self._hooked else jp.reserved_bytes
                       for name, jp in self._published.items())

    # -- hand-over ---------------------------------------------------------------------
    def may_adopt(self, job: str) -> bool:
        """Whether ``job`` may take its published plans now without the device's jobs
        together passing the budget they were published for: its plans shrink, or every other
        job's memory — the larger of what it runs and what it is to run — leaves room for
        them. (Other jobs take their new plans only at their next iteration boundary.)"""
        with self._cond:
            new = self._published[job].reserved_bytes
            old = self._in_effect.get(job)
            if old is not None and new <= old.reserved_bytes:
                return True
            others = sum(max(jp.reserved_bytes, self.in_effect_bytes(k) or 0)
                         for k, jp in self._published.items() if k != job)
            return others + new <= self._budget

    def offer(self, job: str, settle: bool = True, defer_shrink: bool = False) -> Offer:
        """The plans a hooked runner may run now: the published ones where safe (or where
        ``settle`` is off), and taking them counts as adopting them; else those it runs
        (None if it runs none yet). ``defer_shrink``: smaller plans are handed out
        ``pending``, adopted only once the runner calls :meth:`adopted` (until then the
        room they free is not given to others)."""
        with self._cond:
            published, current = self.published(job), self._in_effect.get(job)
            if current is not published and (not settle or self.may_adopt(job)):
                if defer_shrink and current is not None and published.reserved_bytes < current.reserved_bytes:
                    return Offer(published, pending=True)
                self.adopted(job, published)
            return Offer(self._in_effect.get(job))

    def adopted(self, job: str, plans: JobPlans) -> None:
        """``job``'s runner runs ``plans`` now."""
        with self._cond:
            if job in self._published:
                self._in_effect[job] = plans
                self._cond.notify_all()   # a job waiting for others to shrink may go on

    def adopt_when_safe(self, job: str, deadline: float | None,
                        cancelled: Callable[[], bool] | None) -> JobPlans | None:
        """Wait until ``job`` may take its published plans, then take them; None once
        ``deadline`` (on the clock) passes or ``cancelled()`` turns true."""
        with self._cond:
            while not self.may_adopt(job):
                left = None if deadline is None else deadline - self._clock()
                if (left is not None and left <= 0) or (cancelled is not None and cancelled()):
                    return None
                self._cond.wait(POLL_SECONDS if left is None else min(left, POLL_SECONDS))
            return self.offer(job).plans

    def version(self, job: str, settle: bool = True) -> int:
        """The version of the plans ``job`` may run now; 0 before it is registered."""
        with self._cond:
            if job not in self._published:
                return 0
            if settle and job in self._in_effect and not self.may_adopt(job):
                return self._in_effect[job].version
            return self._published[job].version

    def current(self, job: str) -> JobPlans:
        """The plans ``job``'s runner runs: those in effect, else the published ones."""
        with self._cond:
            return self._in_effect.get(job) or self.published(job)


class PlanningScheduler(Protocol):
    """What a :class:`JobPlanner` asks of its MemoryScheduler (declared here, so that this
    module does not import the scheduler's)."""
    budget_bytes: int
    ledger: DeviceLedger
    handover: Handover
    clock: Callable[[], float]

    def jobs(self) -> list[str]: ...
    def register(self, job: str, seq: AccessSequence, swap_rate: float | None = None) -> int: ...
    def update(self, job: str, seq: AccessSequence) -> int: ...
    def wait_admission(self, job: str, seq: AccessSequence, swap_rate: float | None = None, *,
                       cancelled: Callable[[], bool] | None = None, timeout: float | None = None) -> bool: ...
    def unregister(self, job: str) -> bool: ...
    def snapshot(self) -> dict: ...


class JobPlanner:
    """One job's hook for ScheduledStep's ``planner=`` argument.

    Called with an access sequence, it admits the job at its first graph — at once or
    InfeasibleBudget (``wait=False``), or waiting as ``MemoryScheduler.wait_admission``
    does (``wait=True``: raises :class:`NotAdmitted` on timeout or cancellation) — and
    sends later graphs and retimed sequences to ``MemoryScheduler.update`` (which raises
    InfeasibleBudget when no joint plan fits: the runner keeps its plan). It returns that
    graph's plan. ``version()`` and ``latest(seq)`` let the runner pick up, at an
    iteration boundary, a plan the joint planner changed when another job came, went or
    drifted.

    Hand-over (``settle=True``): the other jobs take their new, smaller plans only at
    their next iteration boundary, so a plan that grows — a new job's first, a new
    graph's, or a job's after another left or drifted — is handed out only once the jobs
    it takes room from have taken theirs: until then ``version()`` and ``latest()`` keep
    to the plan the job runs, and a new job's or graph's call waits (within ``timeout``,
    then NotAdmitted). So the device holds at most the budget at every moment, not only in
    the plans. ``settle=False`` hands out the latest plans at once (one thread stepping
    several runners in turn must use it: it would wait for itself).
    """

    def __init__(self, scheduler: PlanningScheduler, job: str, swap_rate: float | None = None,
                 wait: bool = False, cancelled: Callable[[], bool] | None = None,
                 timeout: float | None = None, settle: bool = True):
        self.scheduler, self.job, self.swap_rate = scheduler, job, swap_rate
        self.wait, self.cancelled, self.timeout, self.settle = wait, cancelled, timeout, settle
        self.ledger = scheduler.ledger     # the runner's executors report their memory here
        self._handover = scheduler.handover
        self._taking: JobPlans | None = None   # smaller plans handed out, not yet applied

    def __call__(self, seq: AccessSequence) -> Plan:
        ms, job = self.scheduler, self.job
        deadline = None if self.timeout is None else ms.clock() + self.timeout
        new_job = job not in ms.jobs()
        if not new_job:
            ms.update(job, seq)
        elif not self.wait:
            ms.register(job, seq, self.swap_rate)
        elif not ms.wait_admission(job, seq, self.swap_rate, cancelled=self.cancelled, timeout=self.timeout):
            raise NotAdmitted(f"job {job!r} {self._why()} while waiting for device memory: "
                              f"{ms.snapshot()['free_bytes']} of {ms.budget_bytes} bytes are free")
        if new_job:
            self._handover.hook(job)
        key = graph_key(seq)
        offer = self._handover.offer(job, self.settle, defer_shrink=not new_job)
        if offer.plans is not None and key in offer.plans.plans:   # a known graph keeps its plan until safe
            if offer.pending:
                self._taking = offer.plans   # smaller: taken once the runner has applied it
            return offer.plans.plans[key]
        taken = self._handover.adopt_when_safe(job, deadline, self.cancelled)
        if taken is None:
            if new_job:
                ms.unregister(job)
            raise NotAdmitted(f"job {job!r} {self._why()} while the other jobs took the smaller "
                              f"plans that make room for it")
        return taken.plan(seq)

    def _why(self) -> str:
        return ("was cancelled" if self.cancelled is not None and self.cancelled()
                else f"timed out after {self.timeout} s")

    def version(self) -> int:
        """The version of the plans the job may run now; 0 before it is registered."""
        return self._handover.version(self.job, self.settle)

    def latest(self, seq: AccessSequence) -> Plan:
        """The plan ``seq``'s graph may run now (the same object while it is unchanged);
        the runner takes it at this iteration boundary. A smaller plan counts as taken
        only once the runner calls :meth:`applied`."""
        key = graph_key(seq)
        offer = self._handover.offer(self.job, self.settle, defer_shrink=True)
        if offer.pending:
            self._taking = offer.plans
        if offer.plans is not None and key in offer.plans.plans:
            return offer.plans.plans[key]
        return self._handover.published(self.job).plan(seq)

    def made_from(self, seq: AccessSequence) -> AccessSequence:
        """The sequence (with the latencies) the plan :meth:`latest` gives for ``seq``'s
        graph was made from: the executor times its events by it."""
        jp = self._taking or self._handover.current(self.job)
        return jp.sequences.get(graph_key(seq), seq)

    def applied(self) -> None:
        """The runner has taken the plan :meth:`latest` gave and holds no more memory
        than it allows (its state is where the plan wants it at the iteration's start):
        the room a smaller plan frees may go to other jobs now."""
        taking, self._taking = self._taking, None
        if taking is not None:
            self._handover.adopted(self.job, taking)
