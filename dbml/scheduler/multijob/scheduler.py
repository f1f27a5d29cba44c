"""One memory scheduler for every training job on a device (TENSILE III-D, IV-C, IV-F).

TENSILE's Memory Scheduler sees all running jobs and plans them jointly (Algorithm 3
over all jobs: the global peak is the sum of the jobs' own peaks). :class:`MemoryScheduler`
is that component for one process: jobs register their access sequences, every join,
leave or update reruns the joint solve (:mod:`.solve`) over all registered jobs and
publishes the result, and each job's runner picks up its latest plan at its next
iteration boundary (IV-F). Its components: :mod:`.admission` (the waiting jobs),
:mod:`.handover` (published plans, plans in effect, and each job's :class:`JobPlanner`),
:mod:`.registry` (one scheduler per device, process-wide).

>>> from dbml.scheduler.graph.sequence import AccessSequence, TensorInfo, TensorKind, Op, Phase
>>> t = (TensorInfo(0, "x", 4, TensorKind.BATCH), TensorInfo(1, "y", 4, TensorKind.ACTIVATION))
>>> seq = AccessSequence("j", t, (Op(0, "relu", (0,), (1,), 0.0, 1.0, Phase.FORWARD),), frozenset({0}))
>>> ms = MemoryScheduler(20)
>>> ms.request("a", seq), ms.request("b", seq), ms.request("c", seq)
(True, True, False)
>>> ms.snapshot()["planned_peak_bytes"]
16
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Mapping

from .. import config
from ..errors import NotAdmitted
from ..graph.sequence import AccessSequence, EventKind, Plan
from ..plan.planner import InfeasibleBudget, PlanSettings
from .admission import AdmissionQueue, Waiter
from .handover import Handover, JobPlanner, JobPlans
from .ledger import DeviceLedger
from .solve import JobGraphs, Solution, for_job, graph_key, job_settings, solve, solve_within_share

__all__ = ["MemoryScheduler", "JobPlanner", "JobPlans", "NotAdmitted", "graph_key"]


class MemoryScheduler:
    """Joint TENSILE planning and admission control for the jobs sharing one device.

    ``budget_bytes``: the device memory all jobs together may use. ``settings``: the
    planner's settings; a job's ``swap_rate`` (``register``) overrides
    ``settings.swap_rates`` / ``settings.max_swap_rate`` for it. ``strict_fifo``: waiting
    jobs are admitted strictly in arrival order (see :mod:`.admission`). ``ledger``: the
    device's :class:`~.ledger.DeviceLedger`, where the runners of its jobs report the
    memory they hold (``snapshot()["measured_peak_bytes"]``). ``local_drift``: a drifted
    graph is first replanned alone within its job's reservation, the other jobs' plans
    untouched (an extension; False: always the paper's joint replan). ``clock``: what
    timeouts are measured on.

    ``planner_for(job)`` is the hook for ScheduledStep (see :class:`JobPlanner`): it hands
    a plan out only once it is safe to run beside what the other runners run now
    (``snapshot()["running_bytes"]`` never passes the budget). The bare ``plan_for`` /
    ``version`` hand out the latest plans at once.

    Locks: planning runs under ``_plan_lock`` (one mutation at a time); results are
    published under ``_cond`` (shared with the components), which readers take only
    briefly: a runner never waits for someone else's planning.
    """

    def __init__(self, budget_bytes: int, settings: PlanSettings | None = None, *, strict_fifo: bool = False,
                 ledger: DeviceLedger | None = None, local_drift: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        if budget_bytes < 0:
            raise ValueError(f"MemoryScheduler(): budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self.settings = settings or PlanSettings()
        self.local_drift = local_drift
        self.clock = clock
        # what the jobs' executors hold together, measured (runners of hooked jobs report to it)
        self.ledger = ledger if ledger is not None else DeviceLedger()
        self._plan_lock = threading.Lock()     # one mutation (and its planning) at a time
        self._cond = threading.Condition()     # guards what follows and the components' state
        self.admission = AdmissionQueue(self._cond, clock, strict_fifo)
        self.handover = Handover(self._cond, clock)
        self._jobs: dict[str, JobGraphs] = {}  # registered, in admission order
        self._holders: set[str] = set()        # jobs holding the budget in force (hold_budget)
        self._budget_waiters: list[str] = []   # jobs waiting for the device to be idle to change it
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
            return self.handover.published(job).version

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
        deadline = None if timeout is None else self.clock() + timeout
        with self._plan_lock:
            entry = self._new_job(job, seq, swap_rate)
            waiter = self._try_admit(entry, queue_first=True)
            if waiter is True:
                return True
        return self.admission.wait(waiter, deadline, cancelled)

    def update(self, job: str, seq: AccessSequence) -> int:
        """Replace the graph's sequence (drifted latencies: whether enough to replan is the
        caller's decision) or add a graph (a new batch shape) and replan; returns the job's
        plan version. A drift is first planned within the job's reservation (``local_drift``:
        no other job's plan changes), else jointly. If no joint plan fits: InfeasibleBudget,
        and the plans stay (their peaks still fit; only their timing is stale); a drifted
        graph's latencies are kept for the next replan (``failed_replans``), a new graph is
        not added."""
        key = graph_key(seq)
        with self._plan_lock:
            current = self._registered(job)
            seq = for_job(seq, job)
            if current.graphs.get(key) == seq:
                return self.handover.published(job).version
            jobs = {**self._jobs, job: current.with_graph(key, seq)}
            if key in current.graphs and self.local_drift:
                local = self._timed(solve_within_share, self.handover.solution(), job, key, seq,
                                    job_settings(self.settings, self._jobs))
                if local is not None:
                    self._commit(jobs, local)
                    self.local_replans += 1
                    self._admit_waiters()   # new timings may leave room for a waiting job
                    return self.handover.published(job).version
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
            return self.handover.published(job).version

    def unregister(self, job: str) -> bool:
        """Remove a job (running or waiting); True if it was there. Call it once the job's
        memory is freed (after its last iteration): its room goes to the others at once.
        Re-checks the waiting jobs in arrival order."""
        with self._plan_lock:
            if self.admission.withdraw(job):
                return True
            if job not in self._jobs:
                return False
            jobs = {k: v for k, v in self._jobs.items() if k != job}
            self.handover.forget(job)
            try:
                solution = self._solve(jobs)
            except InfeasibleBudget:   # the remaining plans still fit: their sum only fell
                solution = {k: v for k, v in self.handover.solution().items() if k != job}
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

    # -- the budget, held --------------------------------------------------------------
    def hold_budget(self, job: str, budget_bytes: int | None, default: Callable[[], int], *,
                    cancelled: Callable[[], bool] | None = None) -> int:
        """Let ``job`` run under the budget in force, asked for as ``budget_bytes`` (None: any;
        ``default()`` if the device is idle), and return that budget; release it with
        :meth:`release_budget` once the job has left.

        The budget is a promise to every job running under it: it changes only while no job
        holds it. A job asking another budget than the one in force waits (listed in
        ``waiting()``) until the jobs holding it have left, then sets its own; so one
        connection's budget setting never shrinks another's running jobs, and no job runs
        under a budget larger than it asked for. Raises NotAdmitted if ``cancelled()`` turns
        true while waiting."""
        with self._cond:
            while True:
                idle = not self._holders and not self._jobs and not self.admission.names()
                wanted = budget_bytes if budget_bytes is not None else default() if idle else self.budget_bytes
                if wanted == self.budget_bytes or idle:
                    self.budget_bytes = int(wanted)    # idle: no plan was made for the old one
                    self._holders.add(job)
                    if job in self._budget_waiters:
                        self._budget_waiters.remove(job)
                    return self.budget_bytes
                if job not in self._budget_waiters:
                    self._budget_waiters.append(job)
                if cancelled is not None and cancelled():
                    self._budget_waiters.remove(job)
                    raise NotAdmitted(f"job {job!r} was cancelled while waiting for the device's budget "
                                      f"({self.budget_bytes} bytes, held by running jobs) to become "
                                      f"{budget_bytes} bytes")
                self._cond.wait(0.05)

    def release_budget(self, job: str) -> None:
        """``job`` no longer holds the budget (it has left: unregister it first)."""
        with self._cond:
            self._holders.discard(job)
            if job in self._budget_waiters:
                self._budget_waiters.remove(job)
            self._cond.notify_all()

    # -- reading -----------------------------------------------------------------------
    def plans(self, job: str) -> JobPlans:
        """The job's published plans and their version, read together."""
        return self.handover.published(job)

    def plan_for(self, job: str, seq: AccessSequence | None = None) -> Plan:
        """The job's latest plan for ``seq``'s graph (default: its primary graph)."""
        return self.plans(job).plan(seq)

    def version(self, job: str) -> int:
        return self.plans(job).version

    def planner_for(self, job: str, swap_rate: float | None = None, *, wait: bool = False,
                    cancelled: Callable[[], bool] | None = None, timeout: float | None = None,
                    settle: bool = True) -> JobPlanner:
        """The job's hook for ScheduledStep's ``planner=`` argument (see :class:`JobPlanner`)."""
        return JobPlanner(self, job, swap_rate, wait, cancelled, timeout, settle)

    def jobs(self) -> list[str]:
        with self._cond:
            return list(self._jobs)

    def waiting(self) -> list[str]:
        """Jobs waiting for room (admission) or for the device's budget to change (hold_budget)."""
        with self._cond:
            return self.admission.names() + list(self._budget_waiters)

    def snapshot(self) -> dict:
        """A live view: budget, global planned peak (sum of the jobs' reservations), the
        measured global figures from the ledger (``held_bytes`` now, ``measured_peak_bytes``
        and, with pooled buffers, ``reserved_peak_bytes`` since it was created), per job
        its planned peak, share of the budget, version and held bytes, the waiting jobs,
        replans."""
        with self._cond:
            held = self.ledger.snapshot()
            jobs = {name: _job_row(jp, self._jobs[name].swap_rate, self.handover.in_effect_bytes(name),
                                   held["jobs"].get(name), self.budget_bytes)
                    for name, jp in self.handover.all_published().items()}
            peak = sum(j["planned_peak_bytes"] for j in jobs.values())
            return {"budget_bytes": self.budget_bytes, "planned_peak_bytes": peak,
                    "running_bytes": self.handover.running_bytes(),
                    "held_bytes": held["current_bytes"], "measured_peak_bytes": held["peak_bytes"],
                    "reserved_peak_bytes": held["reserved_peak_bytes"],
                    "free_bytes": self.budget_bytes - peak, "jobs": jobs,
                    "waiting": self.admission.names(), "replans": self.replans,
                    "failed_replans": self.failed_replans, "plan_seconds": self.plan_seconds}

    # -- internals (the caller holds _plan_lock) -----------------------------------------
    def _new_job(self, job: str, seq: AccessSequence, swap_rate: float | None) -> JobGraphs:
        with self._cond:
            if job in self._jobs or job in self.admission.names():
                raise ValueError(f"job {job!r} is already registered or waiting; "
                                 f"use update({job!r}, seq) or unregister({job!r}) first")
        return JobGraphs.of(job, seq, swap_rate)

    def _registered(self, job: str) -> JobGraphs:
        if job not in self._jobs:
            raise KeyError(f"job {job!r} is not registered with this MemoryScheduler; register it first")
        return self._jobs[job]

    def _try_admit(self, entry: JobGraphs, queue_first: bool) -> bool | Waiter:
        """True if admitted now; else the queued Waiter (queue_first) or False. Raises
        InfeasibleBudget if the job cannot fit alone."""
        if not self.admission.blocked():
            try:
                self._admit(entry, self._fit(entry))
                return True
            except InfeasibleBudget:
                pass
        alone = self._alone_peak(entry)   # raises: it cannot fit even alone
        return self.admission.enqueue(entry, alone) if queue_first else False

    def _admit_waiters(self) -> None:
        """Re-check the waiting jobs in arrival order, admitting each that fits."""
        self.admission.recheck(fit=self._fit, alone_peak=self._alone_peak, admit=self._admit,
                               budget_bytes=self.budget_bytes)

    def _fit(self, entry: JobGraphs) -> Solution:
        """The running jobs and ``entry`` within the budget, or InfeasibleBudget."""
        return self._solve({**self._jobs, entry.name: entry})

    def _alone_peak(self, entry: JobGraphs) -> int:
        return self._solve({entry.name: entry})[entry.name].reserved_bytes

    def _admit(self, entry: JobGraphs, solution: Solution) -> None:
        self._commit({**self._jobs, entry.name: entry}, solution)

    def _solve(self, jobs: Mapping[str, JobGraphs]) -> Solution:
        """Plans for every graph of every job within the budget, or InfeasibleBudget."""
        return self._timed(solve, jobs, self.budget_bytes, job_settings(self.settings, jobs)) if jobs else {}

    def _timed(self, fn: Callable, *args):
        """``fn(*args)``, its time added to ``plan_seconds``."""
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.plan_seconds += time.perf_counter() - t0

    def _commit(self, jobs: Mapping[str, JobGraphs], solution: Solution) -> None:
        """Publish ``solution`` for ``jobs``, the jobs registered from now on."""
        with self._cond:
            self.handover.publish(jobs, solution, self.budget_bytes)
            self._jobs = dict(jobs)
            self.replans += 1
        if config.debug():
            print(f"dbml.scheduler: {_summary(self.snapshot())}", file=sys.stderr)


def _summary(snap: dict) -> str:
    """One line: "3 jobs, planned 812 MB of 900 MB, 2 waiting, replan 7 (0.31 s planning)"."""
    return (f"{len(snap['jobs'])} jobs, planned {snap['planned_peak_bytes'] / 2**20:.0f} MB of "
            f"{snap['budget_bytes'] / 2**20:.0f} MB, {len(snap['waiting'])} waiting, "
            f"replan {snap['replans']} ({snap['plan_seconds']:.2f} s planning)")


def _job_row(jp: JobPlans, swap_rate: float | None, in_effect_bytes: int | None, held_bytes: int | None,
             budget_bytes: int) -> dict:
    """One job's line in :meth:`MemoryScheduler.snapshot`."""
    primary = jp.plans[jp.primary]
    return {
        "planned_peak_bytes": jp.reserved_bytes,
        "share": jp.reserved_bytes / budget_bytes if budget_bytes else 0.0,
        "vanilla_peak_bytes": max(p.vanilla_peak_bytes for p in jp.plans.values()),
        "version": jp.version,
        "graphs": len(jp.plans),
        "swap_rate": swap_rate,
        "swaps": primary.count(EventKind.SWAP_OUT),
        "recomputes": primary.count(EventKind.RECOMPUTE),
        "extra_seconds": primary.extra_time,
        "in_effect_bytes": in_effect_bytes,
        "held_bytes": held_bytes,
    }
