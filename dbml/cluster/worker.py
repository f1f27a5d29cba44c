"""What runs on a Ray cluster's workers: a job's training, reported home through the hub.

``DeviceWorker`` is the actor that owns one device (a GPU, or a CPU slot: ``dbml.cluster.placement``
starts it with ``num_gpus=1`` or ``num_cpus=1``). It runs the jobs placed on it, each on a
thread of its own, with dbml's training code (``training._fit_model``, handed over by
reference in the job's ``Task``) and this process's shared memory scheduler for its device,
which plans the jobs running there jointly and queues one that does not fit, as on one
machine. A data-parallel job's workers are device workers too, each the job's alone, in
the worker set's process group (``run_collective``; ``dbml.cluster.parallel``). Either way
``run_task`` is one worker's part of a job: the rows into a DuckDB of its own
(``dbml.cluster.shipping``), training from the last checkpoint if the job was retried, and
the outcome: the trained model as bytes, or the error.

``RemoteProgress`` is the job's ``training.Progress`` on the worker: what training reports
(steps, epochs, memory, whether it waits for memory) goes to the driver's ``Job`` through
the hub; the driver's cancel, and its verdict on an epoch a tune() trial's pruner must see
first, come back.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import torch

from ..core import preload
from ..errors import JobCancelled, TrainingError

REPORT_S = 0.2   # how often a worker reports its progress and learns of a cancel


@dataclass
class Task:
    """One job, as its workers get it (pickled once per dispatch)."""
    key: str                     # <session>:<job id>, the job's key in the hub
    job_id: int
    spec: object                 # the TrainSpec
    prep: object                 # the Preprocessing fitted on the driver: statistics, vocabulary, encoders
    n_train: int
    n_val: int
    fit: Callable                # training._fit_model (pickled by reference: the worker imports dbml)
    hub: object
    validate_epochs: bool = False
    sync_epochs: bool = False    # wait for the driver's verdict after each epoch (a trial's pruner)


class RemoteProgress:
    """A job's Progress on a worker (see the module docstring). ``collective``: a worker of a
    data-parallel job, which stops only where every worker does (``ddp.DDPStep``); only
    rank 0 reports progress and checkpoints."""

    def __init__(self, task: Task, rank: int, node: str, device: str, collective: bool = False,
                 reporter: "Reporter | None" = None, node_id: str = "", comm_bandwidth: float | None = None):
        self.task, self.id, self.rank, self.collective = task, task.job_id, rank, collective
        self.comm_bandwidth = comm_bandwidth   # the worker set's, measured when it formed (group.join)
        self.validate_epochs = task.validate_epochs
        self.since = time.perf_counter()   # the worker's start-up, as the estimate counts it
        self.worker = {"rank": rank, "node": node, "device": device, "pid": os.getpid(), "node_id": node_id}
        self._cancel = threading.Event()
        self._reason: str | None = None
        self._lock = threading.Lock()
        self._pending: dict = {"worker": self.worker}
        self._verdicts: dict = {}
        self._scheduler = None
        self._stop = threading.Event()
        self._reporter = reporter   # the worker process's, for all its jobs; else a thread of its own
        self._thread = None if reporter is not None else threading.Thread(
            target=self._report_loop, name=f"dbml-report-{task.job_id}", daemon=True)

    @property
    def name(self) -> str:
        return f"job_{self.id}@{self.task.key.split(':')[0]}"   # unique among every driver's jobs on this worker

    def start(self) -> "RemoteProgress":
        if self._reporter is not None:
            self._reporter.add(self)
        else:
            self._thread.start()
        return self

    def close(self) -> None:
        if self._reporter is not None:
            self._reporter.remove(self)
        else:
            self._stop.set()
            self._thread.join()
        self._flush()

    # -- training.Progress -----------------------------------------------------------------
    def begin(self, epochs: int, steps_per_epoch: int) -> None:
        self._add("begin", (epochs, steps_per_epoch))
        self._flush()

    def step(self, rows: int) -> None:
        with self._lock:
            self._pending.setdefault("steps", []).append(rows)
            if "first_step" not in self.worker:   # the driver's start-up figure (time.time: one clock per machine)
                self.worker["first_step"] = time.time()
                self._pending["worker"] = self.worker
        if not self.collective:
            self.check()

    def estimated(self, seconds: float, warning: str | None) -> None:
        self._add("estimated", (seconds, warning))

    def check(self) -> None:
        if self._cancel.is_set():
            raise JobCancelled(self._reason or f"job {self.id} was cancelled; nothing was stored")

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def end_epoch(self, record: dict, memory: dict) -> None:
        if self.rank != 0:
            return
        memory = {k: v for k, v in memory.items() if k != "schedule"}   # the plan stays here
        with self._lock:
            self._pending.setdefault("epochs", []).append((dict(record), memory))
        self._flush()
        if self.task.sync_epochs:
            self._await_verdict(record["epoch"])

    def checkpoint(self, state) -> None:
        if self.rank == 0:
            from ..core import checkpoints
            import ray
            saved = state()
            ray.get(self.task.hub.save_checkpoint.remote(self.task.key, saved["epoch"], checkpoints.to_bytes(saved)))

    def place(self, node, device, queued_for) -> None:
        """Placement is the driver's to report."""

    def note(self, **fields) -> None:
        """Figures for the driver (the rows received: ``shipped``)."""
        with self._lock:
            self._pending.update(fields)

    # -- the shared scheduler (runners.JobHandle) ----------------------------------------
    def attach_scheduler(self, scheduler) -> None:
        self._scheduler = scheduler

    def release_scheduler(self) -> None:
        if self._scheduler is not None:
            self._scheduler.unregister(self.name)
            self._scheduler.release_budget(self.name)
            self._scheduler = None

    def memory_limit(self) -> int | None:
        """No database here: a job without a budget gets the CPU's fixed default."""
        return None

    def hold_memory(self, budget: int, pool: str | None) -> None:
        """No DuckDB in this worker process: nothing to take the budget off."""

    def waiting_for_memory(self) -> bool:
        return self._scheduler is not None and self.name in self._scheduler.waiting()

    # -- to and from the hub ---------------------------------------------------------------
    def _add(self, key: str, value) -> None:
        with self._lock:
            self._pending[key] = value

    def _report_loop(self) -> None:
        while not self._stop.wait(REPORT_S):
            self._flush()

    def _flush(self) -> None:
        import ray
        self.answer(ray.get(self.task.hub.report.remote(self.task.key, self.take())))

    def take(self) -> dict:
        """The update to report: what is pending since the last one."""
        with self._lock:
            update, self._pending = self._pending, {}
        if self.rank == 0:
            update["waiting"] = self.waiting_for_memory()
        else:
            update = {k: v for k, v in update.items() if k == "worker"}
        return update

    def answer(self, control: dict) -> None:
        """The hub's answer to a report: a cancel, the verdicts so far."""
        self._verdicts.update(control["verdicts"])
        if control["cancel"] and not self._cancel.is_set():
            self._reason = f"job {self.id} was cancelled: {control['cancel']}; nothing was stored"
            self._cancel.set()

    def _await_verdict(self, epoch: int) -> None:
        while epoch not in self._verdicts and not self._cancel.is_set():
            time.sleep(REPORT_S / 4)
            self._flush()
        stop = self._verdicts.get(epoch)
        if stop:
            self._reason = stop
            self._cancel.set()
            if not self.collective:   # a data-parallel worker stops at the next step, with the others
                self.check()


class Reporter:
    """A device worker's reports to the hubs of the jobs it runs: every ``REPORT_S``, one
    ``report_many`` call per hub (per driver) for all of that driver's jobs here, on one
    thread, which runs while any job does. A hub that many worker processes report to
    answers with a longer interval (``hub.REPORTS_PER_S``): the longest any hub asks for is
    the next sleep."""

    def __init__(self):
        self._jobs: dict[str, RemoteProgress] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.id = f"{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.every = REPORT_S

    def add(self, progress: RemoteProgress) -> None:
        with self._lock:
            self._jobs[progress.task.key] = progress
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="dbml-reporter", daemon=True)
                self._thread.start()

    def remove(self, progress: RemoteProgress) -> None:
        with self._lock:
            self._jobs.pop(progress.task.key, None)

    def _loop(self) -> None:
        import ray
        while True:
            time.sleep(self.every)
            with self._lock:
                if not self._jobs:
                    self._thread = None
                    return
                jobs = list(self._jobs.values())
            by_hub: dict = {}
            for job in jobs:   # a driver's hub, by its actor id (jobs of several drivers can share a worker)
                by_hub.setdefault(job.task.hub._actor_id, []).append(job)
            every = REPORT_S
            for group in by_hub.values():
                try:
                    answer = ray.get(group[0].task.hub.report_many.remote(
                        {j.task.key: j.take() for j in group}, self.id, REPORT_S))
                except Exception:  # noqa: BLE001 - a driver gone: its jobs are cancelled by Ray
                    continue
                every = max(every, answer["next_s"])
                for job in group:
                    job.answer(answer["answers"][job.task.key])
            self.every = every


class DeviceWorker:
    """A Ray actor owning one device; it runs the jobs placed on it (``dbml.cluster.placement.Cluster``)."""

    def __init__(self):
        import duckdb
        import ray
        gpus = ray.get_gpu_ids()
        # the node's GPU (this process sees it as cuda), or which CPU slot: this worker's
        self.device = f"cuda:{int(gpus[0])}" if gpus else f"cpu (worker {os.getpid()})"
        self.node = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()   # the Ray node: nodes on one machine share the address
        self.db = duckdb.connect()   # in memory: the rows of the jobs running here, gone with the worker
        self.reporter = Reporter()   # one report per interval for all the jobs running here
        self.group = None            # the data-parallel process group this worker is in (``group.Group``)
        preload.start()   # a job's imports and first trace, while the driver sends its rows

    def describe(self) -> dict:
        return {"node": self.node, "device": self.device, "pid": os.getpid(), "node_id": self.node_id}

    def run(self, task: Task) -> tuple:
        """Run ``task`` here: ("ok", the trained model as bytes) or ("error", the packed error)."""
        preload.wait()
        cur = self.db.cursor()
        try:
            return run_task(task, cur, RemoteProgress(task, 0, self.node, self.device, reporter=self.reporter,
                                                          node_id=self.node_id))
        finally:
            cur.close()

    # -- a data-parallel job's part (``dbml.cluster.parallel``) ----------------------------
    def rendezvous(self) -> tuple[str, int]:
        """Where a new process group with this worker as rank 0 meets: its node, a free port."""
        from .group import free_port
        return self.node, free_port()

    def join_group(self, group) -> None:
        """In ``group`` (at once if already; else out of the one it was in first)."""
        from .group import join
        current, self.group = self.group, None   # none while it joins (a failed join leaves it in none)
        self.group = join(current, group)

    def run_collective(self, task: Task) -> tuple:
        """Rank ``self.group.rank``'s part of data-parallel ``task``, as ``run``; the model
        only from rank 0 (the others' is the same). An error that is not dbml's own has
        broken the group: this worker leaves it."""
        from .group import failed_in_collective, leave
        preload.wait()
        group = self.group
        cur = self.db.cursor()
        try:
            outcome = run_task(task, cur, RemoteProgress(task, group.rank, self.node, self.device, collective=True,
                                                         reporter=self.reporter, comm_bandwidth=group.bandwidth))
        finally:
            cur.close()
        if failed_in_collective(outcome):
            leave()
            self.group = None
        return outcome if group.rank == 0 or outcome[0] == "error" else ("ok", None)


def run_task(task: Task, cur, progress: RemoteProgress) -> tuple:
    """One worker's part of ``task``: rows, resume point, training; the outcome (never raises)."""
    import ray
    from ..core import checkpoints
    from . import shipping
    from ..core.data import drop_scratch
    from ..core.training import give_back_host_memory
    table = f"job_{task.job_id}_{uuid.uuid4().hex[:8]}"
    progress.start()
    try:
        received = shipping.receive(ray, task.hub, task.key, progress.rank, cur, table, progress)
        progress.note(shipped={"rows": received.rows, "bytes": received.bytes, "seconds": received.seconds,
                               "how": received.how})
        saved = ray.get(task.hub.checkpoint.remote(task.key))
        resume = checkpoints.from_bytes(saved[1]) if saved is not None else None
        result = task.fit(cur, table, task.prep, task.spec, task.n_train, task.n_val, progress, resume=resume)
        return "ok", pack_result(result, task.spec, resumed_from=0 if resume is None else resume["epoch"])
    except BaseException as e:   # the driver raises it as the job's error
        return "error", pack_error(e)
    finally:
        progress.close()
        cur.execute(drop_scratch(table).sql("duckdb"))
        # as the driver's train() does after each job: what malloc kept for the job's steps goes
        # back, else the worker's next job starts on (and its real peak hides behind) this one's
        give_back_host_memory()


# -- outcomes, as bytes and back -----------------------------------------------------------

def pack_result(result: dict, sent_spec, resumed_from: int = 0) -> bytes:
    """``_fit_model``'s result with the module as its state dict (tensors, plain values), and
    its spec as what the job resolved there (``lr := NULL``'s rate) against ``sent_spec``."""
    buf = io.BytesIO()
    resolved = {f.name: getattr(result["spec"], f.name) for f in dataclasses.fields(sent_spec)
                if getattr(result["spec"], f.name) != getattr(sent_spec, f.name)}
    torch.save({"config": result["config"].to_json(), "weights": result["module"].state_dict(),
                "metrics": json.dumps(result["metrics"]), "memory": json.dumps(result["memory"]),
                "resolved": resolved, "resumed_from": resumed_from}, buf)
    return buf.getvalue()


def unpack_result(data: bytes, sent_spec) -> dict:
    """The driver's side: ``_fit_model``'s result, the module rebuilt on the CPU, the spec
    ``sent_spec`` with what the job resolved."""
    from ..core.models import ModelConfig, build
    d = torch.load(io.BytesIO(data), weights_only=True)
    config = ModelConfig.from_json(d["config"])
    module = build(config)
    module.load_state_dict(d["weights"])
    module.eval()
    return {"config": config, "module": module, "metrics": json.loads(d["metrics"]), "memory": json.loads(d["memory"]),
            "spec": dataclasses.replace(sent_spec, **d["resolved"]), "resumed_from": d["resumed_from"]}


def pack_error(e: BaseException) -> tuple:
    """An exception as (class, args, attributes): rebuilt without calling its constructor,
    so errors with constructors of their own (BudgetTooSmall) survive the trip."""
    attrs = {k: v for k, v in vars(e).items() if _plain(v)}
    return type(e), e.args, attrs


def unpack_error(packed: tuple) -> BaseException:
    cls, args, attrs = packed
    try:
        e = cls.__new__(cls)
        e.args = args
        e.__dict__.update(attrs)
        return e
    except TypeError:   # a class that cannot be made this way
        return TrainingError(f"{cls.__name__}: {args[0] if args else ''}")


def _plain(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str, bytes, tuple, list, dict))

