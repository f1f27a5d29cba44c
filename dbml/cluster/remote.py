"""One job's model fitted on a Ray cluster, seen from the driver (``training.fit`` calls
``fit_model`` when the ``cluster`` setting names one).

Everything before and after the fitting stays on the driver, as for a local job: the
source is checked, the preprocessing statistics fitted and the rows encoded by the
driver's DuckDB (``training.fit``), and the model the workers return is validated and
stored there, in one transaction, once (``training.train``). Here:

1. **Placement.** ``workers := 1``: the job goes to a device worker of the cluster's pool
   (``Cluster.acquire``: an idle one, a new one on a free device, or the one with the
   fewest jobs, where its device's scheduler plans it with the others). ``workers := N``:
   N device workers of the same pool, the job's alone while it runs, in a process group
   formed once per worker set (``dbml.cluster.parallel``).
2. **Data.** A ``shipping.Sender`` streams the scratch table to the job's workers while
   they start.
3. **Following.** Every ``POLL_S`` the driver takes the workers' progress from the hub (one
   ``poll_many`` for all its jobs: ``placement.Poller``) and
   hands it to the job (``dbml_jobs`` shows it live: node, device, what it waits for,
   epoch, loss, memory), forwards a cancel (``cancel_job``, Ctrl-C, a closed connection)
   and, for a tune() trial, its verdict after each epoch. A worker that does not stop
   within ``KILL_AFTER_S`` of a cancel is killed.
4. **Faults.** A worker that dies (``ray.kill``, a killed process, a lost node) fails the
   job with an error naming the setting that retries it, or, while ``max_retries`` allows,
   restarts it on another worker from its last finished epoch (``dbml.core.checkpoints``); a
   data-parallel job's whole worker set is restarted the same way, from rank 0's checkpoints.
   Nothing is stored before the driver has the whole model.
"""

from __future__ import annotations

import time

from .placement import POLL_S, Cluster, WorkerDied, connect, first_line
from ..errors import JobCancelled, TrainingError
from .shipping import Sender
from .worker import Task, unpack_error, unpack_result

KILL_AFTER_S = 10.0  # a cancelled job's worker that has not stopped by then is killed


def fit_model(cur, table: str, prep, spec, n_train: int, n_val: int, progress, fit) -> dict:
    """``training._fit_model`` on the cluster: its result, the module on the driver's CPU."""
    return RemoteFit(connect(spec.settings.cluster), cur, table, prep, spec, n_train, n_val, progress, fit).run()


class RemoteFit:
    """One job on the cluster: its attempts (a first, then retries), each followed to its end."""

    def __init__(self, cluster: Cluster, cur, table: str, prep, spec, n_train: int, n_val: int, progress, fit):
        self.cluster, self.ray, self.cur, self.table, self.spec = cluster, cluster.ray, cur, table, spec
        self.progress = progress
        self.key = f"{cluster.session}:{progress.id}"
        self.task = Task(self.key, progress.id, spec, prep, n_train, n_val, fit, cluster.hub,
                         validate_epochs=progress.validate_epochs,
                         sync_epochs=getattr(progress, "on_epoch", None) is not None)
        self.where: tuple[str | None, str | None] = (None, None)
        self.stop_error: JobCancelled | None = None   # a stop the driver decided (a pruned trial)
        self.figures: dict = {"workers": spec.workers, "retries": 0}

    def run(self) -> dict:
        try:
            for attempt in range(self._attempts()):
                try:
                    outcome = self._attempt()
                    break
                except WorkerDied as e:
                    if self.progress.cancelled() or self.stop_error is not None:
                        raise self.stop_error or self._cancelled() from None
                    if attempt + 1 >= self._attempts():
                        raise self._lost(e) from None
                    self.figures["retries"] += 1
            return self._result(outcome)
        finally:
            self.ray.get(self.cluster.hub.close.remote(self.key))
            self.progress.place(*self.where, None)

    def _attempts(self) -> int:
        return 1 + (self.spec.settings.max_retries or 0)

    def _attempt(self) -> tuple:
        started, started_at = time.perf_counter(), time.time()
        placement = self._placement()
        # the feed is made before any worker asks for it (a retry's must not see the last one's)
        sender = Sender(self.ray, self.cur, self.table, self.cluster.hub, self.key, self.spec.workers,
                        parquet_dir=self.spec.settings.cluster_storage, parquet_bytes=self.spec.settings.cluster_parquet_bytes)
        try:
            sender.start()
            placement.start()
            outcome = self._follow(placement, sender, started)
            self.figures.update(getattr(placement, "figures", {}))
            workers = self.ray.get(self.cluster.hub.workers.remote(self.key))   # each worker's first step
            self.figures["first_step_seconds"] = {r: round(w["first_step"] - started_at, 4)
                                                  for r, w in sorted(workers.items()) if "first_step" in w}
            shipped = sender.shipment
            self.figures["data"] = {"how": shipped.how, "rows": shipped.rows, "bytes": shipped.bytes,
                                    "chunks": shipped.chunks, "most_in_flight": shipped.most_in_flight,
                                    "send_seconds": shipped.seconds}
            return outcome
        finally:
            sender.stop()
            placement.stop()

    def _placement(self):
        if self.spec.workers > 1:
            from .parallel import DataParallel
            return DataParallel(self.cluster, self.task, self.progress)
        return DeviceJob(self.cluster, self.task, self.progress)

    def _follow(self, placement, sender: Sender, started: float) -> tuple:
        poller = self.cluster.poller   # one poll of the hub for all this driver's jobs
        poller.watch(self.key)
        try:
            return self._follow_polled(placement, sender, started, poller)
        finally:
            poller.forget(self.key)

    def _follow_polled(self, placement, sender: Sender, started: float, poller) -> tuple:
        cancel_sent = None
        while not placement.done(POLL_S):
            self._apply(poller.take(self.key), started)
            if sender.error is not None and not self.progress.cancelled():
                placement.kill()
                raise sender.error
            if self.progress.cancelled() or self.stop_error is not None:
                if cancel_sent is None:
                    self.ray.get(self.cluster.hub.cancel.remote(self.key, "cancelled on the driver"))
                    cancel_sent = time.monotonic()
                elif time.monotonic() - cancel_sent > KILL_AFTER_S:
                    placement.kill()
        self._apply(poller.drain(self.key), started)
        return placement.outcome()

    def _apply(self, updates: list[dict], started: float) -> None:
        """The workers' progress, handed to the job as a local job reports it."""
        for u in updates:
            if "worker" in u and u["worker"]["rank"] == 0:
                self.where = (u["worker"]["node"], u["worker"]["device"])
                self.figures["node_id"] = u["worker"].get("node_id", "")
                self.figures.setdefault("dispatch_seconds", time.perf_counter() - started)
                self.progress.place(*self.where, None)
            if "shipped" in u:   # rows/s into the worker: from its first request to its last row in its table
                got = u["shipped"]
                self.figures["received"] = {**got, "rows_per_s": got["rows"] / max(got["seconds"], 1e-9)}
            if "begin" in u:
                self.progress.begin(*u["begin"])
            if "estimated" in u:
                self.progress.estimated(*u["estimated"])
            for rows in u.get("steps", ()):
                try:
                    self.progress.step(rows)
                except JobCancelled:   # seen by the follow loop, which forwards it
                    pass
            for record, memory in u.get("epochs", ()):
                self._epoch(record, memory)
            if "waiting" in u:
                queued = f"memory on {self.where[0]} {self.where[1]}" if u["waiting"] else None
                self.progress.place(*self.where, queued)

    def _epoch(self, record: dict, memory: dict) -> None:
        stop = None
        try:
            self.progress.end_epoch(record, memory)
        except JobCancelled as e:   # the job's epoch hook stopped it here (a pruned trial)
            self.stop_error, stop = e, str(e)
        if self.task.sync_epochs:
            self.ray.get(self.cluster.hub.verdict.remote(self.key, record["epoch"], stop))

    def _result(self, outcome: tuple) -> dict:
        kind, value = outcome
        if kind == "error":
            if self.stop_error is not None:
                raise self.stop_error
            if self.progress.cancelled():
                raise self._cancelled()
            raise unpack_error(value)
        result = unpack_result(value, self.spec)
        self.figures.update(node=self.where[0], device=self.where[1], resumed_from_epoch=result.pop("resumed_from"))
        result["metrics"]["cluster"] = self.figures
        return result

    def _cancelled(self) -> JobCancelled:
        try:
            self.progress.check()
        except JobCancelled as e:
            return e
        return JobCancelled(f"job {self.progress.id} ({self.spec.model!r}) was cancelled; nothing was stored")

    def _lost(self, e: WorkerDied) -> TrainingError:
        node, device = self.where
        where = f" on {node} ({device})" if node else ""
        retried = f" after {self.figures['retries']} retries" if self.figures["retries"] else ""
        fix = ("SET VARIABLE dbml_max_retries = 1 (or more) to restart a job from its last finished epoch when a "
               "worker dies" if not self.spec.settings.max_retries else "SET VARIABLE dbml_max_retries higher, or look for "
               "what kills the workers (memory: Ray's OOM killer)")
        return TrainingError(f"train(): job {self.progress.id} ({self.spec.model!r}) lost its Ray worker{where}"
                             f"{retried} ({e}); nothing was stored; {fix}")


class DeviceJob:
    """A ``workers := 1`` job on one device worker of the pool."""

    def __init__(self, cluster: Cluster, task: Task, progress):
        self.cluster, self.task, self.progress = cluster, task, progress
        self.slot = None
        self.ref = None

    def start(self) -> None:
        gpu = self.cluster.gpus() and self.task.spec.settings.device != "cpu"
        self.slot = self.cluster.acquire(self.task.key, gpu, on_wait=lambda: self.progress.place(None, None, "a device"),
                                         check=self.progress.check)
        self.progress.place(self.slot.node, self.slot.device, None)
        self.ref = self.slot.actor.run.remote(self.task)

    def done(self, timeout: float) -> bool:
        ready, _ = self.cluster.ray.wait([self.ref], timeout=timeout)
        return bool(ready)

    def outcome(self) -> tuple:
        ray = self.cluster.ray
        try:
            return ray.get(self.ref)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.ObjectLostError,
                ray.exceptions.NodeDiedError) as e:
            self.cluster.discard(self.slot)
            self.slot = None
            raise WorkerDied(first_line(e)) from None

    def kill(self) -> None:
        if self.slot is not None:
            self.cluster.discard(self.slot)
            self.slot = None

    def stop(self) -> None:
        if self.slot is not None:
            self.cluster.release(self.slot, self.task.key)

