"""The job manager (TENSILE's Global Controller): training jobs as worker threads.

Every database instance dbml is installed in has one :class:`JobManager`; jobs started
from any connection or thread to that database share it. A job runs
``training.train`` on a thread of its own with a cursor of its own, reporting progress
through :class:`Job` (the live row of ``dbml_jobs``) and stopping at its next iteration
boundary when cancelled. One job's failure or cancellation never touches another: each
has its own cursor, model, runner and scratch table, and nothing is stored unless it
finishes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

import duckdb

from .columns import JOB_COLUMNS, MEMORY_COLUMNS
from .errors import DbmlError, InvalidArgument

STATUSES = ("queued", "running", "finished", "failed", "cancelled")


class JobCancelled(DbmlError):
    """The job was cancelled; nothing was stored."""


@dataclass
class Job:
    id: int
    model: str
    status: str = "queued"
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
    started: datetime | None = None
    finished: datetime | None = None
    error: str | None = None
    result: dict | None = None
    exception: BaseException | None = field(default=None, repr=False)
    history: list[dict] = field(default_factory=list)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _done: threading.Event = field(default_factory=threading.Event, repr=False)
    _scheduler: object = field(default=None, repr=False)
    _rows: int = 0
    _steps_total: int = 0
    _steps: int = 0
    _t0: float = 0.0

    @property
    def name(self) -> str:
        """The job's name in the memory scheduler."""
        return f"job_{self.id}"

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def attach_scheduler(self, scheduler) -> None:
        """The shared MemoryScheduler planning this job; it is left when the job ends."""
        self._scheduler = scheduler

    def release_scheduler(self) -> None:
        if self._scheduler is not None:
            self._scheduler.unregister(self.name)
            self._scheduler = None

    def waiting_for_memory(self) -> bool:
        return self._scheduler is not None and self.name in self._scheduler.waiting()

    # -- reporting, called by the training loop on the job's thread ------------------------
    def begin(self, epochs: int, steps_per_epoch: int) -> None:
        self.epochs, self._steps_total = epochs, max(1, epochs * steps_per_epoch)
        self._t0 = time.perf_counter()

    def step(self, rows: int) -> None:
        """After an iteration; raises JobCancelled at this boundary if cancel() was called."""
        self._steps += 1
        self._rows += rows
        self.progress = min(1.0, self._steps / self._steps_total)
        self.rows_per_s = self._rows / max(time.perf_counter() - self._t0, 1e-9)
        if self._cancel.is_set():
            raise JobCancelled(f"job {self.id} ({self.model!r}) was cancelled; nothing was stored")

    def end_epoch(self, record: dict, memory: dict) -> None:
        self.epoch, self.loss = record["epoch"], record["loss"]
        self.history.append(record)
        for key in ("planned_peak_bytes", "measured_peak_bytes", "swaps", "recomputes", "passive_swaps",
                    "replans"):
            if memory.get(key) is not None:
                setattr(self, key, memory[key])

    def row(self) -> dict:
        row = {k: getattr(self, k) for k in JOB_COLUMNS}
        if self.status == "running" and self.waiting_for_memory():
            row["status"] = "queued"
        return row


class JobManager:
    """The jobs of one database instance, their threads and their fates."""

    def __init__(self, cursor: Callable[[], duckdb.DuckDBPyConnection]):
        self._cursor = cursor
        self._jobs: dict[int, Job] = {}
        self._lock = threading.Lock()

    def submit(self, spec) -> Job:
        """Start a training job on a thread of its own; return it at once."""
        from . import catalog, training

        cur = self._cursor()
        job = Job(id=catalog.next_job_id(cur), model=spec.model, epochs=spec.epochs)
        with self._lock:
            self._jobs[job.id] = job
        thread = threading.Thread(target=self._run, args=(job, spec, cur, training.train),
                                  name=f"dbml-job-{job.id}", daemon=True)
        thread.start()
        return job

    def _run(self, job: Job, spec, cur: duckdb.DuckDBPyConnection, train) -> None:
        job.status, job.started = "running", datetime.now()
        try:
            job.result = train(cur, spec, job=job)
            job.status = "finished"
        except JobCancelled as e:
            job.status, job.error, job.exception = "cancelled", str(e), e
        except BaseException as e:  # the job fails alone; the message is its row's error
            job.status, job.error, job.exception = "failed", _message(e), e
        finally:
            job.finished = datetime.now()
            cur.close()
            job._done.set()

    def get(self, job_id: int, *, fn: str) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise InvalidArgument(f"{fn}(): no job {job_id} in this database; "
                                  f"see SELECT id, model, status FROM dbml_jobs")
        return job

    def wait(self, job_id: int, *, fn: str = "wait_job") -> dict:
        """Block until the job ends; its summary, or its error raised."""
        job = self.get(job_id, fn=fn)
        job._done.wait()
        return summary(job)

    def cancel(self, job_id: int) -> str:
        job = self.get(job_id, fn="cancel_job")
        job._cancel.set()
        return job.status

    def rows(self) -> list[dict]:
        with self._lock:
            return [j.row() for j in sorted(self._jobs.values(), key=lambda j: j.id)]


def summary(job: Job) -> dict:
    """The train() result of an ended job; failed and cancelled jobs raise their error."""
    if job.status == "finished":
        return job.result
    if job.status in ("failed", "cancelled"):
        raise job.exception
    return {"job_id": job.id, "model": job.model, "status": job.status}


def _message(e: BaseException) -> str:
    return str(e) if isinstance(e, DbmlError) else f"{type(e).__name__}: {e}"


def train_all(manager: JobManager, specs: list, wait: bool) -> list[dict]:
    """Start every job at once; with ``wait``, return when all have ended (raising the
    first failure's error after the others finished), else return their ids at once."""
    jobs = [manager.submit(spec) for spec in specs]
    if not wait:
        return [{"job_id": j.id, "model": j.model, "status": j.status} for j in jobs]
    for job in jobs:
        job._done.wait()
    return [summary(j) for j in jobs]


def memory_rows(manager: JobManager, scheduler, ledger=None) -> list[dict]:
    """``dbml_memory``: the shared device budget and each of this database's jobs in it.

    One row per job the scheduler holds (planned or waiting), with the global figures
    repeated; one row with no job when it holds none. ``in_effect_bytes`` is what the
    job's current plan may use (a new, larger plan takes effect only once the other jobs
    have shrunk); ``held_bytes`` what its executors hold now and ``measured_peak_bytes``
    its own peak so far. ``global_held_bytes`` and ``global_measured_peak_bytes`` come
    from the device's ledger (``ledger``), where every scheduled job's executors report
    their memory as it changes: what all jobs hold together now, and the most they held
    at one moment since the process started.
    """
    snap = scheduler.snapshot() if scheduler is not None else {
        "budget_bytes": None, "planned_peak_bytes": 0, "running_bytes": 0, "jobs": {}, "waiting": []}
    overall = {"budget_bytes": snap["budget_bytes"], "global_planned_peak_bytes": snap["planned_peak_bytes"],
               "global_in_effect_bytes": snap["running_bytes"], "waiting_jobs": len(snap["waiting"])}
    held = ledger.snapshot() if ledger is not None else {"current_bytes": None, "peak_bytes": None, "jobs": {}}
    overall.update(global_held_bytes=held["current_bytes"], global_measured_peak_bytes=held["peak_bytes"])
    with manager._lock:
        by_name = {job.name: job for job in manager._jobs.values()}
    rows = []
    for name in list(snap["jobs"]) + [w for w in snap["waiting"] if w not in snap["jobs"]]:
        job, plan = by_name.get(name), snap["jobs"].get(name, {})
        if job is None:
            continue   # a job of another database on the same device
        rows.append({"job_id": job.id, "model": job.model, "status": job.row()["status"],
                     "planned_peak_bytes": plan.get("planned_peak_bytes"),
                     "in_effect_bytes": plan.get("in_effect_bytes"), "share": plan.get("share"),
                     "held_bytes": held["jobs"].get(name),
                     "measured_peak_bytes": job.measured_peak_bytes, **overall})
    return rows or [{**dict.fromkeys(MEMORY_COLUMNS), **overall}]
