"""The hub: one small actor per driver process that carries everything between a job on the
driver and its workers on a Ray cluster, except the weights of a running model.

It is plain Python (``dbml.cluster.placement`` makes it a Ray actor, ``num_cpus=0``), keyed by the
job's key (``<session>:<job id>``); every call is short and never blocks for long, so one
hub serves every job of the process:

=====================  ==============================================================
progress               a worker's ``report`` (steps, epochs, memory, where it runs, what
                       it waits for) queued for the driver's ``poll``; batched: one
                       ``report_many`` per worker process and one ``poll_all`` per
                       driver each interval, for all their jobs (the calls grow with
                       worker processes, not with jobs)
control                the driver's ``cancel`` and, after an epoch whose record the driver
                       must see first (a tune() trial's pruner), its ``verdict``
data                   the record batches' object refs (``feed``), handed to each worker
                       in order (``chunk``), and what each has taken (``ack``): the driver
                       keeps a bounded window of chunks in the object store
checkpoints            the state after the last finished epoch, when retries are allowed:
                       a retried or restarted worker resumes from it
results                the trained model of a finished worker (``finish``), or its error
=====================  ==============================================================

Refs travel inside lists, so Ray hands the hub the reference, not the object.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict

END = "end"       # chunk(): the feed has no more chunks
WAIT_S = 0.5      # the longest a chunk() call waits for the next chunk before answering None
# The report calls per second one hub takes at most: a worker process reports every
# ``report_many(every=...)`` seconds while few report, and less often as more do, so that the
# hub's calls stay near this rate whatever the jobs (a third of what one hub served on a
# loaded 2-core machine: benchmarks/sim_cluster.py's hub section measured 751 report_many/s).
REPORTS_PER_S = 250.0
REPORTER_GONE_S = 10.0   # a worker process not heard from this long no longer counts


class Hub:
    def __init__(self):
        self._lock = threading.Condition()
        self._jobs: dict[str, dict] = {}
        self._fresh: set[str] = set()   # jobs with updates queued since the last poll_all
        self._reporters: dict[str, float] = {}   # worker process -> when it last reported

    def _job(self, key: str) -> dict:
        job = self._jobs.get(key)
        if job is None:
            job = self._jobs[key] = {"updates": [], "cancel": None, "verdicts": {}, "chunks": {},
                                     "acked": defaultdict(lambda: -1), "checkpoint": None, "result": None,
                                     "workers": {}}
        return job

    def pid(self) -> int:
        return os.getpid()

    # -- progress and control ----------------------------------------------------------
    def report(self, key: str, update: dict) -> dict:
        """A worker's progress; the driver's answer: a cancel reason (or None) and the verdicts so far."""
        with self._lock:
            job = self._job(key)
            if update:
                job["updates"].append(update)
                self._fresh.add(key)
                if "worker" in update:
                    job["workers"][update["worker"]["rank"]] = update["worker"]
            return {"cancel": job["cancel"], "verdicts": dict(job["verdicts"])}

    def report_many(self, updates: dict[str, dict], reporter: str = "", every: float = 0.0) -> dict:
        """One worker process's reports for all its jobs of this driver, in one call (a
        ``report`` each): ``answers``, each job's answer, and ``next_s``, when this process
        is to report next: ``every`` (its own interval) or, when more processes report
        than the hub takes at ``REPORTS_PER_S``, as long as spreads them to that rate (a
        cancel and the progress then reach them that much later)."""
        with self._lock:
            now = time.monotonic()
            self._reporters[reporter] = now
            if len(self._reporters) > REPORTS_PER_S * every:   # possibly crowded: forget the gone first
                gone = now - max(REPORTER_GONE_S, 3 * len(self._reporters) / REPORTS_PER_S)
                self._reporters = {r: t for r, t in self._reporters.items() if t >= gone}
            return {"answers": {key: self.report(key, update) for key, update in updates.items()},
                    "next_s": max(every, len(self._reporters) / REPORTS_PER_S)}

    def poll_all(self) -> dict[str, list[dict]]:
        """The driver's one poll for all its jobs (the hub is the driver's own): the updates
        queued for each job that has some, taken. Its cost grows with the updates, not the jobs."""
        with self._lock:
            out = {key: self._jobs[key]["updates"] for key in self._fresh}
            for key in self._fresh:
                self._jobs[key]["updates"] = []
            self._fresh.clear()
            return out

    def poll(self, key: str) -> list[dict]:
        """The driver takes the updates queued since its last poll."""
        with self._lock:
            job = self._job(key)
            updates, job["updates"] = job["updates"], []
            self._fresh.discard(key)
            return updates

    def cancel(self, key: str, reason: str) -> None:
        with self._lock:
            self._job(key)["cancel"] = reason

    def verdict(self, key: str, epoch: int, stop: str | None) -> None:
        """The driver has seen ``epoch``'s record: ``stop`` (why the job stops there) or None (go on)."""
        with self._lock:
            self._job(key)["verdicts"][epoch] = stop or ""

    def workers(self, key: str) -> dict:
        """Rank -> {node, device, pid} of the workers that reported."""
        with self._lock:
            return dict(self._job(key)["workers"])

    # -- data --------------------------------------------------------------------------
    def feed(self, key: str, index: int, chunk) -> None:
        """Chunk ``index`` of the job's rows: ``[ref]``, a description of files, or ``END``."""
        with self._lock:
            self._job(key)["chunks"][index] = chunk
            self._lock.notify_all()

    def chunk(self, key: str, index: int):
        """Chunk ``index`` once it is fed (waiting up to WAIT_S), else None: ask again."""
        deadline = time.monotonic() + WAIT_S
        with self._lock:
            while index not in self._job(key)["chunks"]:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)
            return self._jobs[key]["chunks"][index]

    def ack(self, key: str, rank: int, index: int) -> None:
        """Worker ``rank`` holds chunk ``index`` and every one before it."""
        with self._lock:
            job = self._job(key)
            job["acked"][rank] = index
            done = min(job["acked"][r] for r in range(job.get("consumers", 1)))
            for i in [i for i in job["chunks"] if i <= done and job["chunks"][i] != END]:
                del job["chunks"][i]   # every worker has it: the object store may free it

    def expect(self, key: str, consumers: int) -> None:
        """A new feed for ``consumers`` workers (ranks 0..consumers-1); an earlier one is dropped."""
        with self._lock:
            job = self._job(key)
            job.update(consumers=consumers, chunks={}, acked=defaultdict(lambda: -1))

    def taken(self, key: str) -> int:
        """The last chunk every worker holds (-1: none yet)."""
        with self._lock:
            job = self._job(key)
            return min(job["acked"][r] for r in range(job.get("consumers", 1)))

    # -- checkpoints and results ---------------------------------------------------------
    def save_checkpoint(self, key: str, epoch: int, state: bytes) -> None:
        with self._lock:
            self._job(key)["checkpoint"] = (epoch, state)

    def checkpoint(self, key: str):
        """(epoch, state) of the last finished epoch saved, or None."""
        with self._lock:
            return self._job(key)["checkpoint"]

    def finish(self, key: str, outcome: tuple) -> None:
        """A worker's outcome: ("ok", result bytes) or ("error", packed error). A later outcome
        replaces an error (a restarted worker group's), never a model."""
        with self._lock:
            job = self._job(key)
            if job["result"] is None or job["result"][0] != "ok":
                job["result"] = outcome

    def result(self, key: str):
        with self._lock:
            return self._job(key)["result"]

    def close(self, key: str) -> None:
        """The job has ended on the driver: forget it (its chunks' refs go with it)."""
        with self._lock:
            self._jobs.pop(key, None)
            self._fresh.discard(key)
