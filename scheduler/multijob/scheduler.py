"""One memory scheduler for every training job on a device (TENSILE III-D, IV-C, IV-F).

TENSILE's Memory Scheduler sees all running jobs and plans them jointly (Algorithm 3
over all jobs: the global peak is the sum of the jobs' own peaks). :class:`MemoryScheduler`
is that component for one process: jobs register their access sequences, every join,
leave or update reruns :func:`~.planner.plan_jobs` over all registered jobs, and each job
fetches its latest plan, picking it up at its next iteration boundary (IV-F: "the system
will apply the new plan before computing the next batch of data").

>>> from dbml.scheduler.graph.sequence import AccessSequence, TensorInfo, TensorKind, Op, Phase
>>> t = (TensorInfo(0, "x", 4, TensorKind.BATCH), TensorInfo(1, "y", 4, TensorKind.ACTIVATION))
>>> seq = AccessSequence("j", t, (Op(0, "relu", (0,), (1,), 0.0, 1.0, Phase.FORWARD),), frozenset({0}))
>>> ms = MemoryScheduler(20)
>>> ms.request("a", seq), ms.request("b", seq), ms.request("c", seq)
(True, True, False)
>>> ms.snapshot()["planned_peak_bytes"]
16

**Admission control.** A job is admitted only if a joint plan of the running jobs and
it exists within the budget; so no job ever runs in an infeasible joint plan, and the
sum of the planned peaks never exceeds the budget. A job that cannot fit even alone is
rejected at once with :class:`~.planner.InfeasibleBudget`, whose ``min_budget`` is the
budget it needs. A job that fits alone but not beside the running ones waits
(:meth:`MemoryScheduler.wait_admission`); whenever room may have appeared (a job left,
a plan was updated, the budget grew), the waiting jobs are re-checked in arrival order
and each that fits is admitted (first fit; ``strict_fifo=True`` admits none past the
first that does not fit, so a large job is never overtaken).

**Several graphs per job.** A job that sees several batch shapes has one access
sequence per graph (told apart by :func:`graph_key`: tensor sizes and op structure, not
latencies). Only one graph runs at a time, so the job's *primary* graph — the one with
the largest release-only peak — takes part in the joint plan, and its planned peak is the
job's share; each other graph is planned alone within that share, or, if it cannot fit
there, within the share plus the room no job reserves. A job's reservation is the
largest planned peak over its graphs; the reservations sum to at most the budget.

**Plan versions.** Each job's plans carry a version that increases exactly when one of
its plans changes (a replan that leaves a job's plans equal keeps its version, so its
executor is not rebuilt for nothing). A runner compares the version with the one it
runs at each iteration boundary and fetches the plan for its graph when it differs.

**Hand-over.** Plans fit the budget together, but each runner switches at its own next
iteration boundary; a job whose plan grows (a new job, a new graph, room freed by a
leave or a drift) could run beside another that still runs its old, larger plan.
:class:`JobPlanner` (``planner_for(job)``, the hook for ScheduledStep) therefore hands a
growing plan out only once the jobs it takes room from have taken their smaller plans;
a new job's first plan waits for that too. ``snapshot()["running_bytes"]`` sums the
plans the runners run now (those in effect, for hooked jobs); it never passes the budget.
The bare ``plan_for``/``version`` hand out the latest plans at once.

**Updates.** ``update(job, seq)`` replaces the graph's sequence (drifted latencies) or
adds a graph (a new batch shape). Whether latencies drifted enough to replan (the
paper's threshold on the relative change of their sum) is the caller's decision (the
runner's :mod:`.updating`). If no joint plan fits, it raises InfeasibleBudget and the
plans stay (they still fit the budget: a plan's peak is a ledger bound the executor
enforces, only its timing is stale); a drifted graph's new latencies are kept for the
next replan (``failed_replans`` counts these), a new graph is not added. A drifted
graph is first planned alone within its job's reservation (``local_drift``, the
default): where that fits, no other job's plan changes, so a drift in one job costs one
job's planning and no hand-over; only where it does not fit do all jobs replan jointly.

Locks: planning runs under ``_plan_lock`` (one mutation at a time), results are
published under ``_cond``'s lock, which readers (``plan_for``, ``version``,
``snapshot``) take only briefly: a runner never waits for someone else's planning.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping

from ..plan.liveness import release_events
from .ledger import DeviceLedger
from ..plan.peak import analyse_peak
from ..plan.planner import InfeasibleBudget, PlanSettings, plan, plan_jobs
from ..graph.sequence import AccessSequence, EventKind, Plan
from ..errors import NotAdmitted
from .. import config

__all__ = ["MemoryScheduler", "JobPlanner", "JobPlans", "NotAdmitted", "device_ledger", "graph_key",
           "shared_scheduler"]

POLL_SECONDS = 0.05   # how often a waiting job looks at its ``cancelled`` callable


def graph_key(seq: AccessSequence) -> Hashable:
    """What tells one graph of a job from another: tensor sizes and op structure. Two
    sequences of the same graph with different latencies have the same key."""
    return (tuple(t.nbytes for t in seq.tensors), tuple((o.inputs, o.outputs) for o in seq.ops),
            seq.initial, seq.workspace)


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


@dataclass
class _Job:
    name: str
    swap_rate: float | None
    graphs: dict[Hashable, AccessSequence]      # graph_key -> sequence, in arrival order
    vanilla: dict[Hashable, int]                # graph_key -> release-only peak

    def primary(self) -> Hashable:
        """The graph with the largest release-only peak (the first such, on ties)."""
        return max(self.graphs, key=lambda k: self.vanilla[k])

    def with_graph(self, key: Hashable, seq: AccessSequence) -> "_Job":
        graphs, vanilla = dict(self.graphs), dict(self.vanilla)
        graphs[key] = seq
        vanilla[key] = analyse_peak(seq, release_events(seq)).bytes
        return _Job(self.name, self.swap_rate, graphs, vanilla)


@dataclass
class _Waiter:
    job: _Job
    state: str = "waiting"               # -> admitted | withdrawn | rejected
    error: Exception | None = None
    alone_peak: int = 0                  # its planned peak alone at some budget >= this


class MemoryScheduler:
    """Joint TENSILE planning and admission control for the jobs sharing one device.

    ``budget_bytes``: the device memory all jobs together may use. ``settings``: the
    planner's settings; a job's ``swap_rate`` (``register``) overrides
    ``settings.swap_rates`` / ``settings.max_swap_rate`` for it. ``strict_fifo``: waiting
    jobs are admitted strictly in arrival order (see the module docstring). ``ledger``:
    the device's :class:`~.memory.DeviceLedger`, where the runners of its jobs report
    the memory they hold (``snapshot()["measured_peak_bytes"]``). ``local_drift``: a
    drifted graph is first replanned alone within its job's reservation, the other
    jobs' plans untouched (an extension; False: always the paper's joint replan).
    """

    def __init__(self, budget_bytes: int, settings: PlanSettings | None = None, *, strict_fifo: bool = False,
                 ledger: DeviceLedger | None = None, local_drift: bool = True):
        if budget_bytes < 0:
            raise ValueError(f"MemoryScheduler(): budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self.settings = settings or PlanSettings()
        self.strict_fifo = strict_fifo
        self.local_drift = local_drift
        # what the jobs' executors hold together, measured (runners of hooked jobs report to it)
        self.ledger = ledger if ledger is not None else DeviceLedger()
        self._plan_lock = threading.Lock()     # one mutation (and its planning) at a time
        self._cond = threading.Condition()     # guards what follows; notified on every publish
        self._jobs: dict[str, _Job] = {}       # registered, in admission order
        self._published: dict[str, JobPlans] = {}
        self._in_effect: dict[str, JobPlans] = {}   # what each hooked runner last took
        self._hooked: set[str] = set()              # jobs whose runners use a JobPlanner
        self._waiting: deque[_Waiter] = deque()
        self._version = 0                      # last version handed out (all jobs share the counter)
        self.replans = 0                       # joint plans published
        self.failed_replans = 0                # drift updates that found no joint plan
        self.local_replans = 0                 # drift updates planned within the job's share
        self.plan_seconds = 0.0

    # -- registration ------------------------------------------------------------------
    def register(self, job: str, seq: AccessSequence, swap_rate: float | None = None) -> int:
        """Admit ``job`` now or raise InfeasibleBudget (naming the joint minimum budget);
        it neither waits nor queues behind waiting jobs. Returns the job's plan version."""
        with self._plan_lock:
            entry = self._new_job(job, seq, swap_rate)
            self._commit({**self._jobs, job: entry}, self._solve({**self._jobs, job: entry}))
            return self._published[job].version

    def request(self, job: str, seq: AccessSequence, swap_rate: float | None = None) -> bool:
        """Admit ``job`` if it fits beside the running jobs now (True), else False; raises
        InfeasibleBudget if it cannot fit even alone. Never queues the job."""
        with self._plan_lock:
            entry = self._new_job(job, seq, swap_rate)
            return self._try_admit(entry, queue_first=False) is True

    def wait_admission(self, job: str, seq: AccessSequence, swap_rate: float | None = None, *,
                       cancelled: Callable[[], bool] | None = None, timeout: float | None = None) -> bool:
        """Admit ``job``, waiting (in arrival order) until it fits beside the running jobs.

        True once admitted; False if ``timeout`` seconds pass or ``cancelled()`` turns true
        first (the job then leaves the queue). Raises InfeasibleBudget at once if the job
        cannot fit even alone (or later, if a smaller budget makes it so)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._plan_lock:
            entry = self._new_job(job, seq, swap_rate)
            waiter = self._try_admit(entry, queue_first=True)
            if waiter is True:
                return True
        with self._cond:
            while waiter.state == "waiting":
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or (cancelled is not None and cancelled()):
                    waiter.state = "withdrawn"
                    self._waiting.remove(waiter)
                    return False
                self._cond.wait(POLL_SECONDS if left is None else min(left, POLL_SECONDS))
            if waiter.state == "rejected":
                raise waiter.error
            return waiter.state == "admitted"   # not "withdrawn" by unregister(job)

    def update(self, job: str, seq: AccessSequence) -> int:
        """Replace the graph's sequence (new latencies) or add a graph (new batch shape) and
        replan; returns the job's plan version. Raises InfeasibleBudget if no joint plan
        fits: the plans in effect stay (they still fit the budget); a drifted graph's new
        latencies are kept for the next replan, a new graph is not added."""
        key = graph_key(seq)
        with self._plan_lock:
            current = self._registered(job)
            seq = _named(seq, job)
            if current.graphs.get(key) == seq:
                return self._published[job].version
            new = current.with_graph(key, seq)
            jobs = {**self._jobs, job: new}
            if key in current.graphs and self.local_drift:
                local = self._replan_within_share(job, key, seq)
                if local is not None:
                    self._commit(jobs, local)
                    self.local_replans += 1
                    return self._published[job].version
            try:
                solution = self._solve(jobs)
            except InfeasibleBudget:
                if key not in current.graphs:
                    raise
                with self._cond:
                    self._jobs = jobs     # keep the new latencies for the next replan
                    self.failed_replans += 1
                raise
            self._commit(jobs, solution)
            self._admit_waiters()
            return self._published[job].version

    def _replan_within_share(self, job: str, key: Hashable, seq: AccessSequence):
        """A drifted graph planned alone within the job's reservation: the solution with
        only that plan changed, or None if it does not fit there."""
        jp = self._published[job]
        t0 = time.perf_counter()
        try:
            new = plan(seq, jp.reserved_bytes, settings=self._settings(self._jobs))
        except InfeasibleBudget:
            return None
        finally:
            self.plan_seconds += time.perf_counter() - t0
        solution = self._current_solution()
        solution[job] = (jp.primary, {**jp.plans, key: new})
        return solution

    def unregister(self, job: str) -> bool:
        """Remove a job (running or waiting); True if it was there. Call it once the job's
        memory is freed (after its last iteration): its room goes to the others at once.
        Re-checks the waiting jobs in arrival order."""
        with self._plan_lock:
            with self._cond:
                for w in self._waiting:
                    if w.job.name == job and w.state == "waiting":
                        w.state = "withdrawn"
                        self._waiting.remove(w)
                        self._cond.notify_all()
                        return True
            if job not in self._jobs:
                return False
            jobs = {k: v for k, v in self._jobs.items() if k != job}
            with self._cond:
                self._in_effect.pop(job, None)
                self._hooked.discard(job)
            try:
                solution = self._solve(jobs)
            except InfeasibleBudget:   # the remaining plans still fit: their sum only fell
                solution = {k: v for k, v in self._current_solution().items() if k != job}
            self._commit(jobs, solution)
            self._admit_waiters()
            return True

    def set_budget(self, budget_bytes: int) -> None:
        """Change the budget and replan; raises InfeasibleBudget (changing nothing) if the
        running jobs cannot fit the new one."""
        with self._plan_lock:
            old, self.budget_bytes = self.budget_bytes, int(budget_bytes)
            try:
                solution = self._solve(self._jobs)
            except InfeasibleBudget:
                self.budget_bytes = old
                raise
            self._commit(self._jobs, solution)
            self._admit_waiters()

    # -- reading -----------------------------------------------------------------------
    def plans(self, job: str) -> JobPlans:
        """The job's published plans and their version, read together."""
        with self._cond:
            if job not in self._published:
                raise KeyError(f"job {job!r} is not registered with this MemoryScheduler")
            return self._published[job]

    def plan_for(self, job: str, seq: AccessSequence | None = None) -> Plan:
        """The job's latest plan for ``seq``'s graph (default: its primary graph)."""
        return self.plans(job).plan(seq)

    def version(self, job: str) -> int:
        return self.plans(job).version

    def planner_for(self, job: str, swap_rate: float | None = None, *, wait: bool = False,
                    cancelled: Callable[[], bool] | None = None, timeout: float | None = None,
                    settle: bool = True) -> "JobPlanner":
        """The job's hook for ScheduledStep's ``planner=`` argument (see :class:`JobPlanner`)."""
        return JobPlanner(self, job, swap_rate, wait, cancelled, timeout, settle)

    # -- plan hand-over (used by JobPlanner) -------------------------------------------
    def _may_adopt(self, job: str) -> bool:
        """Whether ``job`` may take its published plans now without the device's jobs
        together passing the budget: its plans shrink, or every other job's memory —
        the larger of what it runs and what it is to run — leaves room for them. (Other
        jobs take their new plans only at their next iteration boundary.) Caller holds _cond."""
        new = self._published[job].reserved_bytes
        old = self._in_effect.get(job)
        if old is not None and new <= old.reserved_bytes:
            return True
        others = sum(max(jp.reserved_bytes, self._in_effect[k].reserved_bytes if k in self._in_effect else 0)
                     for k, jp in self._published.items() if k != job)
        return others + new <= self.budget_bytes

    def _offered(self, job: str, settle: bool = True, defer_shrink: bool = False) -> JobPlans | None:
        """The plans a hooked runner may run now: the published ones where safe (or where
        ``settle`` is off), and taking them counts as adopting them; else those it runs
        (None if it runs none yet). ``defer_shrink``: smaller plans are handed out but
        count as adopted only once the runner says it holds no more than they allow
        (:meth:`_adopted`): until then the room they free is not given to others.
        Caller holds _cond."""
        if job not in self._published:
            raise KeyError(f"job {job!r} is not registered with this MemoryScheduler")
        if not settle or self._may_adopt(job):
            published, current = self._published[job], self._in_effect.get(job)
            if current is not published:
                if defer_shrink and current is not None and published.reserved_bytes < current.reserved_bytes:
                    return published
                self._adopted(job, published)
        return self._in_effect.get(job)

    def _adopted(self, job: str, plans: JobPlans) -> None:
        """``job``'s runner runs ``plans`` now. Caller holds _cond."""
        if job in self._published:
            self._in_effect[job] = plans
            self._cond.notify_all()   # a job waiting for others to shrink may go on

    def _adopt_when_safe(self, job: str, deadline: float | None,
                         cancelled: Callable[[], bool] | None) -> JobPlans | None:
        """Wait until ``job`` may take its published plans, then take them; None on
        timeout or cancellation."""
        with self._cond:
            while not self._may_adopt(job):
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or (cancelled is not None and cancelled()):
                    return None
                self._cond.wait(POLL_SECONDS if left is None else min(left, POLL_SECONDS))
            return self._offered(job)

    def jobs(self) -> list[str]:
        with self._cond:
            return list(self._jobs)

    def waiting(self) -> list[str]:
        with self._cond:
            return [w.job.name for w in self._waiting]

    def snapshot(self) -> dict:
        """A live view: budget, global planned peak (sum of the jobs' reservations), the
        measured global figures from the ledger (``held_bytes`` now, ``measured_peak_bytes``
        and, with pooled buffers, ``reserved_peak_bytes`` since it was created), per job
        its planned peak, share of the budget, version and held bytes, the waiting jobs,
        replans."""
        with self._cond:
            jobs = {}
            for name, jp in self._published.items():
                primary = jp.plans[jp.primary]
                jobs[name] = {
                    "planned_peak_bytes": jp.reserved_bytes,
                    "share": jp.reserved_bytes / self.budget_bytes if self.budget_bytes else 0.0,
                    "vanilla_peak_bytes": max(p.vanilla_peak_bytes for p in jp.plans.values()),
                    "version": jp.version,
                    "graphs": len(jp.plans),
                    "swap_rate": self._jobs[name].swap_rate,
                    "swaps": primary.count(EventKind.SWAP_OUT),
                    "recomputes": primary.count(EventKind.RECOMPUTE),
                    "extra_seconds": primary.extra_time,
                    "in_effect_bytes": (self._in_effect[name].reserved_bytes if name in self._in_effect
                                        else None),
                }
            peak = sum(j["planned_peak_bytes"] for j in jobs.values())
            # what the runners may use now: hooked ones their plans in effect, others the latest
            running = sum(j["in_effect_bytes"] or 0 if name in self._hooked else j["planned_peak_bytes"]
                          for name, j in jobs.items())
            held = self.ledger.snapshot()
            for name, j in jobs.items():
                j["held_bytes"] = held["jobs"].get(name)
            return {"budget_bytes": self.budget_bytes, "planned_peak_bytes": peak, "running_bytes": running,
                    "held_bytes": held["current_bytes"], "measured_peak_bytes": held["peak_bytes"],
                    "reserved_peak_bytes": held["reserved_peak_bytes"],
                    "free_bytes": self.budget_bytes - peak, "jobs": jobs,
                    "waiting": [w.job.name for w in self._waiting], "replans": self.replans,
                    "failed_replans": self.failed_replans, "plan_seconds": self.plan_seconds}

    # -- internals (the caller holds _plan_lock) -----------------------------------------
    def _new_job(self, job: str, seq: AccessSequence, swap_rate: float | None) -> _Job:
        with self._cond:
            if job in self._jobs or any(w.job.name == job for w in self._waiting):
                raise ValueError(f"job {job!r} is already registered or waiting; "
                                 f"use update({job!r}, seq) or unregister({job!r}) first")
        if swap_rate is not None and not 0.0 <= swap_rate <= 1.0:
            raise ValueError(f"job {job!r}: swap_rate must be within [0, 1], got {swap_rate}")
        return _Job(job, swap_rate, {}, {}).with_graph(graph_key(seq), _named(seq, job))

    def _registered(self, job: str) -> _Job:
        if job not in self._jobs:
            raise KeyError(f"job {job!r} is not registered with this MemoryScheduler; register it first")
        return self._jobs[job]

    def _try_admit(self, entry: _Job, queue_first: bool):
        """True if admitted now; else the queued _Waiter (queue_first) or False. Raises
        InfeasibleBudget if the job cannot fit alone."""
        with self._cond:
            blocked = self.strict_fifo and bool(self._waiting)
        if not blocked:
            jobs = {**self._jobs, entry.name: entry}
            try:
                self._commit(jobs, self._solve(jobs))
                return True
            except InfeasibleBudget:
                pass
        alone = self._solve({entry.name: entry})   # raises: it cannot fit even alone
        if not queue_first:
            return False
        waiter = _Waiter(entry, alone_peak=_reserved(alone[entry.name]))
        with self._cond:
            self._waiting.append(waiter)
        return waiter

    def _admit_waiters(self) -> None:
        """Re-check the waiting jobs in arrival order, admitting each that fits."""
        with self._cond:
            queue = list(self._waiting)
        for w in queue:
            jobs = {**self._jobs, w.job.name: w.job}
            try:
                solution = self._solve(jobs)
            except InfeasibleBudget:
                if self.budget_bytes < w.alone_peak:   # the budget shrank: does it still fit alone?
                    try:
                        w.alone_peak = _reserved(self._solve({w.job.name: w.job})[w.job.name])
                    except InfeasibleBudget as err:
                        self._finish_waiter(w, "rejected", err)
                        continue
                if self.strict_fifo:
                    return
                continue
            except Exception as err:   # the planner failed on its sequence: its own error
                self._finish_waiter(w, "rejected", err)
                continue
            with self._cond:
                if w.state != "waiting":   # withdrawn while we planned
                    continue
                self._commit(jobs, solution)
                self._finish_waiter(w, "admitted")

    def _finish_waiter(self, w: _Waiter, state: str, error: Exception | None = None) -> None:
        with self._cond:
            if w.state == "waiting":
                w.state, w.error = state, error
                self._waiting.remove(w)
                self._cond.notify_all()

    def _settings(self, jobs: Mapping[str, _Job]) -> PlanSettings:
        rates = dict(self.settings.swap_rates)
        rates.update({name: j.swap_rate for name, j in jobs.items() if j.swap_rate is not None})
        return dataclasses.replace(self.settings, swap_rates=rates)

    def _solve(self, jobs: Mapping[str, _Job]) -> dict[str, tuple[Hashable, dict[Hashable, Plan]]]:
        """Plans for every graph of every job within the budget, or InfeasibleBudget."""
        if not jobs:
            return {}
        t0 = time.perf_counter()
        try:
            settings = self._settings(jobs)
            primary = {name: j.primary() for name, j in jobs.items()}
            joint = plan_jobs([j.graphs[primary[name]] for name, j in jobs.items()], self.budget_bytes, settings)
            out = {name: (primary[name], {primary[name]: joint[name]}) for name in jobs}
            free = self.budget_bytes - sum(p.peak_bytes for p in joint.values())
            for name, j in jobs.items():
                share = joint[name].peak_bytes
                for key, seq in j.graphs.items():
                    if key != primary[name]:
                        out[name][1][key] = p = self._plan_alone(seq, share, free, settings)
                        free -= max(0, p.peak_bytes - share)
                        share = max(share, p.peak_bytes)
            return out
        finally:
            self.plan_seconds += time.perf_counter() - t0

    def _plan_alone(self, seq: AccessSequence, share: int, free: int, settings: PlanSettings) -> Plan:
        """A secondary graph: within the job's share, else within the share and the free room."""
        try:
            return plan(seq, share, settings=settings)
        except InfeasibleBudget as err:
            if err.min_budget > share + free:
                raise InfeasibleBudget(f"{seq.job!r} (its graph of {len(seq.ops)} ops, beside the "
                                       f"other jobs)", share + free, err.min_budget) from None
            return plan(seq, share + free, settings=settings)

    def _current_solution(self):
        return {name: (jp.primary, dict(jp.plans)) for name, jp in self._published.items()}

    def _commit(self, jobs: Mapping[str, _Job], solution) -> None:
        """Publish: a job's version moves only where one of its plans changed."""
        with self._cond:
            published = {}
            for name in jobs:
                primary, plans = solution[name]
                old = self._published.get(name)
                if old is not None and old.primary == primary and dict(old.plans) == plans:
                    published[name] = old
                    continue
                self._version += 1
                published[name] = JobPlans(name, self._version, primary, plans, _reserved(solution[name]),
                                           {k: jobs[name].graphs[k] for k in plans})
            assert sum(jp.reserved_bytes for jp in published.values()) <= self.budget_bytes, \
                f"MemoryScheduler: plans for {list(published)} exceed the budget of {self.budget_bytes} bytes"
            self._jobs, self._published = dict(jobs), published
            self.replans += 1
            self._cond.notify_all()
        if config.debug():
            print(f"dbml.scheduler: {self._summary()}", file=sys.stderr)

    def _summary(self) -> str:
        """One line: "3 jobs, planned 812 MB of 900 MB, 2 waiting, replan 7 (0.31 s planning)"."""
        snap = self.snapshot()
        return (f"{len(snap['jobs'])} jobs, planned {snap['planned_peak_bytes'] / 2**20:.0f} MB of "
                f"{self.budget_bytes / 2**20:.0f} MB, {len(snap['waiting'])} waiting, "
                f"replan {snap['replans']} ({snap['plan_seconds']:.2f} s planning)")


def _reserved(job_solution) -> int:
    """A job's reservation in a solution: the largest planned peak over its graphs."""
    return max(p.peak_bytes for p in job_solution[1].values())


def _named(seq: AccessSequence, job: str) -> AccessSequence:
    return seq if seq.job == job else dataclasses.replace(seq, job=job)


class JobPlanner:
    """One job's hook for ScheduledStep's ``planner=`` argument.

    Called with an access sequence, it admits the job at its first graph — at once or
    InfeasibleBudget (``wait=False``), or waiting as :meth:`MemoryScheduler.wait_admission`
    does (``wait=True``: raises :class:`NotAdmitted` on timeout or cancellation) — and
    sends later graphs and retimed sequences to :meth:`MemoryScheduler.update` (which
    raises InfeasibleBudget when no joint plan fits: the runner keeps its plan). It
    returns that graph's plan. ``version()`` and ``latest(seq)`` let the runner pick up,
    at an iteration boundary, a plan the joint planner changed when another job came,
    went or drifted.

    Hand-over (``settle=True``): the other jobs take their new, smaller plans only at
    their next iteration boundary, so a plan that grows — a new job's first, a new
    graph's, or a job's after another left or drifted — is handed out only once the jobs
    it takes room from have taken theirs: until then ``version()`` and ``latest()`` keep
    to the plan the job runs, and a new job's or graph's call waits (within ``timeout``,
    then NotAdmitted). So the device holds at most the budget at every moment, not only in
    the plans. ``settle=False`` hands out the latest plans at once (one thread stepping
    several runners in turn must use it: it would wait for itself).
    """

    def __init__(self, scheduler: MemoryScheduler, job: str, swap_rate: float | None = None,
                 wait: bool = False, cancelled: Callable[[], bool] | None = None,
                 timeout: float | None = None, settle: bool = True):
        self.scheduler, self.job, self.swap_rate = scheduler, job, swap_rate
        self.wait, self.cancelled, self.timeout, self.settle = wait, cancelled, timeout, settle
        self.ledger = scheduler.ledger     # the runner's executors report their memory here
        self._taking: JobPlans | None = None   # smaller plans handed out, not yet applied

    def __call__(self, seq: AccessSequence) -> Plan:
        ms, job = self.scheduler, self.job
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        new_job = job not in ms.jobs()
        if not new_job:
            ms.update(job, seq)
        elif not self.wait:
            ms.register(job, seq, self.swap_rate)
        elif not ms.wait_admission(job, seq, self.swap_rate, cancelled=self.cancelled, timeout=self.timeout):
            raise NotAdmitted(f"job {job!r} {self._why()} while waiting for device memory: "
                              f"{ms.snapshot()['free_bytes']} of {ms.budget_bytes} bytes are free")
        if new_job:
            with ms._cond:
                ms._hooked.add(job)
        key = graph_key(seq)
        with ms._cond:
            offered = ms._offered(job, self.settle, defer_shrink=not new_job)
            if offered is not None and key in offered.plans:   # a known graph keeps its plan until safe
                if offered is not ms._in_effect.get(job):
                    self._taking = offered   # smaller: taken once the runner has applied it
                return offered.plans[key]
        offered = ms._adopt_when_safe(job, deadline, self.cancelled)
        if offered is None:
            if new_job:
                ms.unregister(job)
            raise NotAdmitted(f"job {job!r} {self._why()} while the other jobs took the smaller "
                              f"plans that make room for it")
        return offered.plan(seq)

    def _why(self) -> str:
        return ("was cancelled" if self.cancelled is not None and self.cancelled()
                else f"timed out after {self.timeout} s")

    def version(self) -> int:
        """The version of the plans the job may run now; 0 before it is registered."""
        ms = self.scheduler
        with ms._cond:
            if self.job not in ms._published:
                return 0
            if self.settle and self.job in ms._in_effect and not ms._may_adopt(self.job):
                return ms._in_effect[self.job].version
            return ms._published[self.job].version

    def latest(self, seq: AccessSequence) -> Plan:
        """The plan ``seq``'s graph may run now (the same object while it is unchanged);
        the runner takes it at this iteration boundary. A smaller plan counts as taken
        only once the runner calls :meth:`applied`."""
        ms, key = self.scheduler, graph_key(seq)
        with ms._cond:
            offered = ms._offered(self.job, self.settle, defer_shrink=True)
            if offered is not None and offered is not ms._in_effect.get(self.job):
                self._taking = offered
            return offered.plans[key] if offered is not None and key in offered.plans else \
                ms._published[self.job].plan(seq)

    def made_from(self, seq: AccessSequence) -> AccessSequence:
        """The sequence (with the latencies) the plan :meth:`latest` gives for ``seq``'s
        graph was made from: the executor times its events by it."""
        ms, key = self.scheduler, graph_key(seq)
        with ms._cond:
            jp = self._taking or ms._in_effect.get(self.job) or ms._published[self.job]
            return jp.sequences.get(key, seq)

    def applied(self) -> None:
        """The runner has taken the plan :meth:`latest` gave and holds no more memory
        than it allows (its state is where the plan wants it at the iteration's start):
        the room a smaller plan frees may go to other jobs now."""
        ms = self.scheduler
        with ms._cond:
            taking, self._taking = self._taking, None
            if taking is not None:
                ms._adopted(self.job, taking)


# -- one scheduler per device, process-wide ----------------------------------------------

_DEFAULTS: dict[str, MemoryScheduler] = {}
_LEDGERS: dict[str, DeviceLedger] = {}
_DEFAULTS_LOCK = threading.Lock()


def _device_key(device: str) -> str:
    kind, _, index = str(device).partition(":")
    return f"{kind}:{index or 0}" if kind == "cuda" else kind


def shared_scheduler(device: str = "cpu", budget_bytes: int | None = None,
                     settings: PlanSettings | None = None) -> MemoryScheduler:
    """The process-wide MemoryScheduler of ``device`` ("cpu", "cuda", "cuda:1"; "cuda"
    means "cuda:0"), created at the first call, which must give ``budget_bytes``.

    Every job on the device should plan through this one instance: jobs planned by
    different instances do not see each other and may together exceed the memory. A
    later call with another ``budget_bytes`` changes the budget (``set_budget``: raises
    InfeasibleBudget if the running jobs cannot fit it); ``settings`` count only at
    creation.
    """
    key = _device_key(device)
    with _DEFAULTS_LOCK:
        ms = _DEFAULTS.get(key)
        if ms is None:
            if budget_bytes is None:
                raise ValueError(f"shared_scheduler({device!r}): the first call for a device must "
                                 f"give budget_bytes, the memory all its jobs may use")
            ms = _DEFAULTS[key] = MemoryScheduler(budget_bytes, settings, ledger=_ledger(key))
            return ms
    if budget_bytes is not None and budget_bytes != ms.budget_bytes:
        ms.set_budget(budget_bytes)
    return ms


def existing_scheduler(device: str = "cpu") -> MemoryScheduler | None:
    """The process-wide MemoryScheduler of ``device`` if one was created, else None."""
    with _DEFAULTS_LOCK:
        return _DEFAULTS.get(_device_key(device))


def _ledger(key: str) -> DeviceLedger:   # the caller holds _DEFAULTS_LOCK
    if key not in _LEDGERS:
        _LEDGERS[key] = DeviceLedger()
    return _LEDGERS[key]


def device_ledger(device: str = "cpu") -> DeviceLedger:
    """The process-wide :class:`~.memory.DeviceLedger` of ``device``: every job running on
    it reports the memory its executors hold here, whether it plans through the shared
    scheduler (which uses this ledger) or alone, so its peak is the device's measured
    global peak."""
    with _DEFAULTS_LOCK:
        return _ledger(_device_key(device))
