"""The job manager (TENSILE's Global Controller): training jobs as worker threads.

Every database instance dbml is installed in has one :class:`JobManager`; jobs started
from any connection or thread to that database share it. A job runs the manager's
``run`` function (``training.train``, given by ``dbml.core.instance``) on a thread of its own
with a cursor of its own, reporting progress through :class:`Job` (the live row of
``dbml_jobs``; it satisfies ``training.Progress``) and stopping at its next iteration
boundary when cancelled. One job's failure or cancellation never touches another: each
has its own cursor, model, runner and scratch table, and nothing is stored unless it
finishes.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Callable, Iterator

import duckdb
from sqlglot import exp

from .columns import train_result
from ..errors import DbmlError, Interrupted, InvalidArgument, JobCancelled
from . import home
from .runtime import runtime

if TYPE_CHECKING:   # spec imports the scheduler, which the job manager does not
    from .spec import TrainCall

__all__ = ["Job", "JobManager", "JobCancelled", "Wait", "outcome", "summary", "train_all"]   # JobCancelled: from .errors

# A job's id: the next value of the catalog's sequence (sql/catalog.sql, in the catalog's home),
# taken without the catalog module (it imports torch), so that a job that fails its checks never
# imports it.
def next_job_id(cur: duckdb.DuckDBPyConnection) -> int:
    sequence = exp.Literal.string(home.of(cur).name("job_ids"))   # nextval takes the sequence's name as text
    return cur.execute(exp.select(exp.func("nextval", sequence)).sql("duckdb")).fetchall()[0][0]


@dataclass
class Job:
    id: int
    model: str
    status: str = "queued"
    connection: int | None = None   # the DuckDB connection whose statement started the job
    epochs: int = 0
    epoch: int = 0
    progress: float = 0.0
    loss: float | None = None
    rows_per_s: float | None = None
    planned_peak_bytes: int | None = None
    measured_peak_bytes: int | None = None
    swaps: int | None = None
    recomputes: int | None = None
    passive_swaps: int | None = None
    replans: int | None = None
    estimated_seconds: float | None = None   # the job's estimated time (dbml.core.estimate): predicted once planned, then from its first steps
    warnings: str | None = None              # what the job said before training (a slow estimate)
    started: datetime | None = None
    finished: datetime | None = None
    error: str | None = None
    result: dict | None = None
    exception: BaseException | None = field(default=None, repr=False)
    history: list[dict] = field(default_factory=list)
    schedule: tuple | None = field(default=None, repr=False)   # (plan, access sequence) last run: dbml.plot.memory
    # Set by what the job runs, before training starts (a tune() trial): ``on_epoch(record)``
    # after each epoch's record is kept, which may raise JobCancelled to stop the job at
    # that boundary (its pruner); ``validate_epochs``: records hold val_loss and val_metric.
    on_epoch: Callable[[dict], None] | None = field(default=None, repr=False)
    validate_epochs: bool = False
    # On a Ray cluster (dbml.cluster.remote): the node and device its worker runs on, and what it
    # waits for there ('memory': admission on its device; 'a device': a worker to start)
    node: str | None = None
    device: str | None = None
    queued_for: str | None = None
    # time.perf_counter() when the statement that started the job began: what its estimate
    # counts its start-up from (imports, reading rows, the first plan: dbml.core.estimate)
    since: float = field(default_factory=time.perf_counter)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _done: threading.Event = field(default_factory=threading.Event, repr=False)
    _scheduler: object = field(default=None, repr=False)
    _memory: object = field(default=None, repr=False)   # its database's DatabaseMemory (dbml.core.duckmem)
    _cursor: object = field(default=None, repr=False)   # the job's own cursor, while it runs
    _reason: str | None = field(default=None, repr=False)
    _rows: int = 0
    _steps_per_epoch: int = 1
    _epoch_steps: int = 0      # iterations since the last epoch ended
    _t0: float = 0.0

    @property
    def name(self) -> str:
        """The job's name in the memory scheduler."""
        return f"job_{self.id}"

    def cancel(self, reason: str | None = None) -> None:
        """Ask the job to stop at its next iteration boundary (or while it waits for memory);
        ``reason`` (e.g. "the connection was closed") goes into its error."""
        if reason is not None and not self._cancel.is_set():
            self._reason = reason
        self._cancel.set()
        cursor = self._cursor
        if cursor is not None:   # stop a long query of the job (statistics, materialising) too
            try:
                cursor.interrupt()
            except duckdb.Error:   # closed as the job ended
                pass

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job has ended, whatever its fate (or ``timeout`` s); whether it has."""
        return self._done.wait(timeout)

    def attach_scheduler(self, scheduler) -> None:
        """The shared MemoryScheduler planning this job; it is left when the job ends."""
        self._scheduler = scheduler

    def release_scheduler(self) -> None:
        """Leave the shared scheduler, give back the budget held there and what was taken
        off the database's memory_limit; once the job's runner is closed, or it ended
        without one (``JobManager`` calls it then too)."""
        if self._scheduler is not None:
            self._scheduler.unregister(self.name)
            self._scheduler.release_budget(self.name)
            self._scheduler = None
        if self._memory is not None:
            self._memory.release(self.name)

    def memory_limit(self) -> int | None:
        """Its database's memory_limit as the user set it (``runners.JobHandle``)."""
        return None if self._memory is None else self._memory.user_limit()

    def hold_memory(self, budget: int, pool: str | None) -> None:
        """Take ``budget`` off its database's memory_limit (``runners.JobHandle``); raises
        JobCancelled if cancelled while it waits for DuckDB to give the memory back."""
        if self._memory is not None and not self._memory.hold(self.name, budget, pool=pool,
                                                              cancelled=self.cancelled):
            raise self._cancelled()

    def waiting_for_memory(self) -> bool:
        if self.queued_for is not None and self.queued_for.startswith("memory"):
            return True
        if self._memory is not None and self._memory.waiting(self.name):
            return True
        return self._scheduler is not None and self.name in self._scheduler.waiting()

    @property
    def shown_status(self) -> str:
        """The status dbml_jobs shows: a running job that waits for admission (or, on a Ray
        cluster, for a device) is 'queued'."""
        waiting = self.waiting_for_memory() or self.queued_for is not None
        return "queued" if self.status == "running" and waiting else self.status

    def place(self, node: str | None, device: str | None, queued_for: str | None) -> None:
        """Where the job runs on a Ray cluster and what it waits for (``dbml.cluster.remote``)."""
        self.node, self.device, self.queued_for = node, device, queued_for

    def checkpoint(self, state) -> None:
        """A local job keeps no checkpoint (see ``training.Progress.checkpoint``)."""

    # -- reporting, called by the training loop on the job's thread ------------------------
    def begin(self, epochs: int, steps_per_epoch: int) -> None:
        self.epochs, self._steps_per_epoch, self._epoch_steps = epochs, max(1, steps_per_epoch), 0
        self._t0 = time.perf_counter()

    def step(self, rows: int) -> None:
        """After an iteration; raises JobCancelled at this boundary if cancel() was called.
        ``progress`` is counted in epochs, so it agrees with ``epoch`` of ``epochs``: the
        epochs done and this one's share of its estimated iterations (never all of it before
        the epoch ends: the estimate may be short)."""
        self._epoch_steps += 1
        self._rows += rows
        within = min(self._epoch_steps / self._steps_per_epoch, 0.99)
        self.progress = min(1.0, (self.epoch + within) / max(self.epochs, 1))
        self.rows_per_s = self._rows / max(time.perf_counter() - self._t0, 1e-9)
        self.check()

    def check(self) -> None:
        """Raise JobCancelled if cancel() was called (at iteration boundaries and before storing)."""
        if self._cancel.is_set():
            raise self._cancelled()

    def _cancelled(self) -> JobCancelled:
        why = f": {self._reason}" if self._reason else ""
        return JobCancelled(f"job {self.id} ({self.model!r}) was cancelled{why}; nothing was stored")

    def estimated(self, seconds: float, warning: str | None) -> None:
        self.estimated_seconds, self.warnings = seconds, warning

    def end_epoch(self, record: dict, memory: dict) -> None:
        self.epoch, self.loss = record["epoch"], record["loss"]
        self.progress, self._epoch_steps = min(1.0, self.epoch / max(self.epochs, 1)), 0
        self.history.append(record)
        self.schedule = memory.get("schedule") or self.schedule
        for key in ("planned_peak_bytes", "measured_peak_bytes", "swaps", "recomputes", "passive_swaps",
                    "replans"):
            if memory.get(key) is not None:
                setattr(self, key, memory[key])
        if self.on_epoch is not None:
            self.on_epoch(record)

    # -- its fate, set by the JobManager ---------------------------------------------------
    def run(self, work: Callable[[], dict]) -> None:
        """Run ``work`` as this job: its result or error, status and times recorded."""
        self.status, self.started = "running", datetime.now()
        try:
            self.result = work()
            self.status = "finished"
        except JobCancelled as e:
            self.status, self.error, self.exception = "cancelled", str(e), e
        except BaseException as e:  # the job fails alone; the message is its row's error
            if self._cancel.is_set():   # e.g. the interrupt of its cursor, sent by cancel()
                e = self._cancelled()
                self.status, self.error, self.exception = "cancelled", str(e), e
            else:
                self.status, self.error, self.exception = "failed", _message(e), e
        finally:
            self.finished = datetime.now()

    def ended(self) -> None:
        """Wake every ``wait()``: the job has ended and its cursor is closed."""
        self._done.set()


class JobManager:
    """The jobs of one database instance, their threads and their fates.

    ``run(cursor, spec, job)`` is what a job does (``training.train``): it gets a cursor of
    its own and the job to report its progress to, and returns the job's summary row.
    ``memory``: the database's ``dbml.core.duckmem.DatabaseMemory``, which its jobs' budgets are
    taken off DuckDB's memory_limit through (None: nothing is).
    """

    def __init__(self, cursor: Callable[[], duckdb.DuckDBPyConnection],
                 run: Callable[[duckdb.DuckDBPyConnection, object, Job], dict], memory=None):
        self._cursor = cursor
        self._memory = memory
        self._run_job = run
        self._jobs: dict[int, Job] = {}
        self._threads: dict[int, threading.Thread] = {}   # of jobs not yet ended
        self._waits: dict[int, list[Wait]] = {}   # statements waiting on jobs, by DuckDB connection id
        self._lock = threading.Lock()

    def submit(self, spec, connection: int | None = None,
               run: Callable[[duckdb.DuckDBPyConnection, object, Job], dict] | None = None,
               since: float | None = None) -> Job:
        """Start a training job on a thread of its own; return it at once. ``connection``:
        the DuckDB connection id of the statement that starts it. ``run``: what the job does
        instead of the manager's function (a tune() trial trains without storing). ``since``:
        ``time.perf_counter()`` when the statement began (default: now)."""
        cur = self._cursor()
        job = Job(id=next_job_id(cur), model=spec.model, epochs=spec.epochs, connection=connection,
                  **({} if since is None else {"since": since}))
        job._memory = self._memory
        thread = threading.Thread(target=self._run, args=(job, spec, cur, run or self._run_job),
                                  name=f"dbml-job-{job.id}", daemon=True)
        with self._lock:
            self._jobs[job.id] = job
            self._threads[job.id] = thread
        try:
            thread.start()
        except BaseException:   # Ctrl-C while the thread starts: the job is nobody's to wait for
            job.cancel("the statement was interrupted")
            raise
        return job

    def _run(self, job: Job, spec, cur: duckdb.DuckDBPyConnection, run) -> None:
        job._cursor = cur
        try:
            job.run(lambda: run(cur, spec, job))
        finally:
            try:
                job.release_scheduler()   # whatever the job's fate and wherever it stopped
            finally:
                job._cursor = None
                cur.close()
                with self._lock:
                    self._threads.pop(job.id, None)
                job.ended()

    def get(self, job_id: int, *, fn: str) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise InvalidArgument(f"{fn}(): no job {job_id} in this database; "
                                  f"see SELECT job_id, model, status FROM dbml_jobs")
        return job

    def wait(self, job_id: int, connection: int | None = None, *, fn: str = "wait_job") -> dict:
        """Block until the job ends; its summary, or its error raised. An interrupt of the
        waiting statement (Ctrl-C, ``interrupt(connection)``) ends the wait, not the job."""
        job = self.get(job_id, fn=fn)
        with self._waiting(Wait([], fn), connection) as w:
            w.until_ended([job])
        return summary(job)

    def wait_statement(self, jobs: list[Job], connection: int | None, *, fn: str = "train",
                       since: float | None = None) -> None:
        """Block until the statement's ``jobs`` have ended. An interrupt of the statement —
        Ctrl-C (KeyboardInterrupt on this thread) or ``interrupt(connection)`` from another
        thread — cancels them, waits for them to stop at their next iteration boundary and
        raises ``Interrupted`` with each job's fate. ``since``: when the statement began
        (``time.perf_counter()``), so that a Ctrl-C between then and its wait is not lost."""
        with self._waiting(Wait(jobs, fn, since), connection) as w:
            w.until_ended(jobs)

    @contextmanager
    def statement(self, connection: int | None, *, fn: str, since: float | None = None) -> Iterator["Wait"]:
        """A statement that starts jobs as it goes (tune()): its Wait, which ``interrupt(connection)``
        and Ctrl-C off the main thread reach (``Wait.interrupted``, and its jobs cancelled);
        the statement adds each job it starts (``Wait.add``) and waits for them itself.
        ``since``: when the statement began, as for :meth:`wait_statement`."""
        with self._waiting(Wait([], fn, since), connection) as w:
            yield w

    @contextmanager
    def _waiting(self, wait: "Wait", connection: int | None) -> Iterator["Wait"]:
        with self._lock:
            self._waits.setdefault(connection, []).append(wait)
        if wait.off_main:
            runtime().off_main.add(wait)
            # a Ctrl-C after the statement began and before this (the hook found no wait of
            # it): the statement was interrupted. Added first, read second: no Ctrl-C is lost
            if runtime().ctrl_c_since(wait.since):
                wait.interrupt()
        try:
            yield wait
        finally:
            runtime().off_main.discard(wait)
            with self._lock:
                self._waits[connection].remove(wait)
                if not self._waits[connection]:
                    del self._waits[connection]

    def interrupt(self, connection: int) -> int:
        """Interrupt every statement of DuckDB connection ``connection`` waiting on jobs
        (``dbml.Connection.interrupt``): each cancels its own jobs; jobs started with
        ``wait := false`` by earlier statements are untouched. Returns how many it reached."""
        with self._lock:
            waits = list(self._waits.get(connection, ()))
        for w in waits:
            w.interrupt()
        return len(waits)

    def cancel(self, job_id: int) -> str:
        job = self.get(job_id, fn="cancel_job")
        job.cancel()
        return job.status

    def shutdown(self, reason: str, timeout: float = 120.0) -> list[Job]:
        """Cancel every job still running (``reason`` in its error), join their threads
        (each stops at its next iteration boundary), and return the jobs it cancelled."""
        with self._lock:
            running = [(self._jobs[i], t) for i, t in self._threads.items()]
        for job, _ in running:
            job.cancel(reason)
        for _, thread in running:
            if thread is not threading.current_thread():
                thread.join(timeout)
        return [job for job, _ in running if job.status == "cancelled"]

    def jobs(self) -> list[Job]:
        """Every job of this database, oldest first."""
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.id)


# Waits running on a DuckDB worker thread rather than the caller's (DuckDB may run a UDF
# there): Ctrl-C raises KeyboardInterrupt only on the main thread, in DuckDB's own loop,
# so a SIGINT hook (``instance.install_sigint_hook``) interrupts these: the runtime's
# ``off_main`` (dbml.core.runtime), since the signal chain is the process's.


def interrupted_since(since: float, fn: str) -> None:
    """Raise ``Interrupted`` if a Ctrl-C came since ``since`` (``time.perf_counter()``): a
    UDF that waited to start (a shell's preload) on a thread where no KeyboardInterrupt
    arrives, before it had anything to cancel."""
    if runtime().ctrl_c_since(since):
        raise Interrupted(f"{fn}() was interrupted (Ctrl-C) before it started; nothing was run or stored")


def interrupt_off_main_thread() -> None:
    """Ctrl-C: interrupt every statement waiting on jobs off the main thread."""
    for wait in list(runtime().off_main):
        wait.interrupt()


class Wait:
    """One statement waiting in a UDF on jobs: ``jobs`` (the statement's own, cancelled
    if it is interrupted; none for wait_job) and whether it was interrupted."""

    POLL_S = 0.05          # how often a wait looks for an interrupt from another thread
    STOP_S = 60.0          # how long an interrupted wait waits for its jobs to stop

    def __init__(self, jobs: list[Job], fn: str, since: float | None = None):
        self.jobs, self.fn = jobs, fn
        self.since = time.perf_counter() if since is None else since   # when the statement began
        self.interrupted = threading.Event()
        self.off_main = threading.current_thread() is not threading.main_thread()

    def interrupt(self) -> None:
        self.interrupted.set()
        for job in list(self.jobs):
            job.cancel("the statement was interrupted")

    def add(self, job: Job) -> None:
        """A job the statement started: an interrupt cancels it too (one that came first, at once)."""
        self.jobs.append(job)
        if self.interrupted.is_set():
            job.cancel("the statement was interrupted")

    def until_ended(self, jobs: list[Job]) -> None:
        try:
            for job in jobs:
                while not job.wait(self.POLL_S) and not self.interrupted.is_set():
                    pass
        except KeyboardInterrupt:   # Ctrl-C in a script, the shell or Jupyter: on this thread
            self.interrupt()
        if self.interrupted.is_set():
            self._stop()

    def _stop(self) -> None:
        """After an interrupt: wait (a second Ctrl-C stops waiting) for the jobs to stop, then raise."""
        try:
            deadline = time.monotonic() + self.STOP_S
            for job in self.jobs:
                job.wait(max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:
            pass
        fates = "; ".join(_fate(job) for job in self.jobs)
        raise Interrupted(f"{self.fn}() was interrupted" + (f": {fates}" if fates else
                                                             "; the job it waited for runs on"))


def _fate(job: Job) -> str:
    if job.status == "finished":
        return f"job {job.id} ({job.model!r}) had already finished and is stored as version {job.result['version']}"
    if job.status == "cancelled":
        return f"job {job.id} ({job.model!r}) was cancelled; nothing was stored"
    if job.status == "failed":
        return f"job {job.id} ({job.model!r}) failed: {job.error}"
    return f"job {job.id} ({job.model!r}) is stopping at its next iteration boundary; nothing will be stored"


def summary(job: Job) -> dict:
    """The train() result of an ended job; failed and cancelled jobs raise their error."""
    if job.status in ("failed", "cancelled"):
        raise job.exception
    return outcome(job)


def outcome(job: Job) -> dict:
    """The train() row of a job, whatever its fate: its summary once finished, else its
    status (and error), every TRAIN_RESULT column present."""
    row = job.result if job.status == "finished" else {"job_id": job.id, "model": job.model,
                                                       "status": job.status, "error": job.error}
    return train_result(row)


def _message(e: BaseException) -> str:
    # dbml's own errors are shown as they are; anything else is prefixed with its type name
    # ("OutOfMemoryError: ..."), scheduler errors keep theirs through errors.scheduler_errors.
    return str(e) if isinstance(e, DbmlError) else f"{type(e).__name__}: {e}"


def train_all(manager: JobManager, calls: list[TrainCall], connection: int | None = None,
              since: float | None = None) -> list[dict]:
    """Start every row's job at once; return one row per call.

    Unless every row says ``wait := false``, return when all jobs have ended. Then a row
    whose job failed or was cancelled raises its error under ``on_error := 'raise'`` (the
    first such row's, after the others ended and stored their models); under 'continue'
    it returns its status and error, as does a row whose arguments were invalid (no job).
    An interrupt of the statement (Ctrl-C, or ``connection``'s interrupt) cancels its jobs
    and raises ``Interrupted`` (``JobManager.wait_statement``). ``since``: ``time.perf_counter()``
    when the statement began (its jobs' estimates count their start-up from it).
    """
    jobs: list[Job | None] = []
    try:
        for c in calls:
            jobs.append(manager.submit(c.spec, connection, since=since) if c.spec is not None else None)
        if any(c.wait for c in calls):
            manager.wait_statement([job for job in jobs if job is not None], connection, since=since)
    except KeyboardInterrupt:
        # Ctrl-C before the statement's wait began (a loaded machine: while a job's thread
        # started): its jobs ran on, orphaned, to the end (tests/test_interrupts.py, the shell)
        for job in jobs:
            if job is not None:
                job.cancel("the statement was interrupted")
        raise
    if any(c.wait for c in calls):
        for c, job in zip(calls, jobs):
            if c.on_error == "raise" and job is not None and job.status in ("failed", "cancelled"):
                raise job.exception
    return [outcome(job) if job is not None else
            train_result({"model": c.model, "status": "failed", "error": str(c.error)})
            for c, job in zip(calls, jobs)]
