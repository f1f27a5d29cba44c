"""Where training jobs run: threads of this process, or a Ray cluster (the ``cluster`` setting).

    SET VARIABLE dbml_cluster = 'ray';               -- the Ray cluster this process is connected to
                                                      -- (ray.init called), else RAY_ADDRESS, else 'auto'
    SET VARIABLE dbml_cluster = 'ray://head:10001';  -- a remote cluster through Ray Client
    SET VARIABLE dbml_cluster = 'local';             -- the default: no Ray

Ray is an extra (``pip install 'dbml[ray]'``); it is imported only when a job or a
connection asks for a cluster. This module owns the rules of where a job may run
(``check_job``), the process's one connection to a cluster (Ray connects a process to
one cluster: ``connect``) and, on it, the ``Cluster``: the hub actor that carries
progress, control, data refs and results (``dbml.cluster.hub``), and the pool of device workers
(``dbml.cluster.worker.DeviceWorker`` actors, each owning one GPU, or one CPU slot where the
cluster has no GPUs), kept warm between jobs so a job is dispatched by one call.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..errors import InvalidArgument
from ..core.placement import shown
from ..core.runtime import runtime

INSTALL = "pip install 'dbml[ray]'"
# A TCP probe of the address before Ray's own connect: Ray retries an unreachable GCS for
# ever and Ray Client gives up only after 30 s; the probe answers in this many seconds.
PROBE_S = 3.0
# A device worker's thread pool: the jobs it runs at once (planned jointly by its device's
# scheduler) and the short calls beside them (describe, stop).
WORKER_CONCURRENCY = 32
# a device worker's malloc: one arena for all its threads. A job's step runs on one of the actor's
# threads and its swaps on a copy thread; with an arena each, the tensors either frees stay resident
# in that arena's holes, beside the budget (issue 33: 20-35 MB over a 67 MB budget; one arena: none)
WORKER_ENV = {"env_vars": {"MALLOC_ARENA_MAX": "1"}}
# An idle device worker keeps its slot this long for the next job (a warm worker makes a
# dispatch one call, ~ms; a cold one starts a process and imports torch and dbml, seconds).
# A data-parallel job takes idle workers as its own (``acquire_set``).
IDLE_S = 120.0
# A job waiting for a device worker to start looks at its cancel this often.
WAIT_POLL_S = 0.1

# The process's one connection is the runtime's (``runtime().cluster``, under ``cluster_lock``).


class WorkerDied(Exception):
    """A job's worker (or its node) is gone; the message says how Ray saw it (``dbml.cluster.remote``
    retries the job or fails it naming the ``max_retries`` setting)."""


def first_line(e: BaseException) -> str:
    """How Ray saw a worker die, in one line (``WorkerDied``'s message)."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".strip()


def check_job(spec) -> None:
    """The cluster's rules for one job (``TrainSpec.__post_init__``): the setting's form,
    and what data-parallel training needs. Reaching the cluster happens when the job runs."""
    check_value(spec.settings.cluster, fn="train")
    if spec.workers > 1 and spec.settings.cluster == "local":
        raise InvalidArgument(f"train(): workers := {spec.workers} trains on a Ray cluster; "
                              f"SET VARIABLE dbml_cluster = 'ray' first, or pass workers := 1")
    if spec.workers > 1 and spec.policy not in ("tensile", "eager"):
        raise InvalidArgument(f"train(): workers := {spec.workers} runs each worker's step as plain PyTorch under "
                              f"DistributedDataParallel, not policy {spec.policy!r}; pass policy := 'eager'")
    from ..zoo import fitter
    if fitter(spec.arch) is not None:   # fitted in one call, not stepped: no worker's training loop, no model bytes to ship
        raise InvalidArgument(f"train(): arch {spec.arch!r} is fitted on this machine, not on a Ray cluster; "
                              f"SET VARIABLE dbml_cluster = 'local' for it")
    if spec.settings.max_retries is not None and spec.settings.max_retries < 0:
        raise InvalidArgument(f"setting max_retries is {spec.settings.max_retries}; SET VARIABLE dbml_max_retries = 0 (or more)")


def check_value(value: str, *, fn: str) -> None:
    """'local', 'ray' or 'ray://host:port'; InvalidArgument naming the fix otherwise."""
    if value in ("local", "ray"):
        return
    parts = urlsplit(value or "")
    if parts.scheme == "ray" and parts.hostname and _port(parts) and not parts.path.strip("/"):
        return
    raise InvalidArgument(f"{fn}(): setting cluster is {shown(value)!r}; SET VARIABLE dbml_cluster = 'local', 'ray' "
                          f"or 'ray://<head host>:<client port, 10001 by default>'")


def _port(parts) -> int | None:
    try:
        return parts.port
    except ValueError:
        return None


def require_ray():
    """The ray module; InvalidArgument naming the extra if it is not installed."""
    try:
        import ray
    except ImportError:
        raise InvalidArgument(f"setting cluster needs Ray, which is not installed; {INSTALL} "
                              f"(or SET VARIABLE dbml_cluster = 'local')") from None
    return ray


def connect(value: str, *, fn: str = "train") -> "Cluster":
    """The process's Cluster for setting ``value`` ('ray' or 'ray://...'), connecting once.
    One line naming the fix if Ray is missing, the address cannot be reached, or the
    process is already connected to another cluster."""
    check_value(value, fn=fn)
    rt = runtime()
    with rt.cluster_lock:
        cluster = rt.cluster
        if cluster is not None and cluster.alive():
            if value not in ("ray", cluster.setting):
                raise InvalidArgument(f"{fn}(): this process is connected to Ray cluster {cluster.setting!r}, and "
                                      f"Ray connects a process to one cluster; SET VARIABLE dbml_cluster = "
                                      f"{cluster.setting!r} (or 'ray'), or use another process")
            return cluster
        ray = require_ray()
        if not ray.is_initialized():
            _init(ray, value, fn)
        rt.cluster = Cluster(ray, value)
        return rt.cluster


def current() -> "Cluster | None":
    """The connected Cluster, if any (tests and benchmarks inject faults through it)."""
    return runtime().cluster


def _address(value: str) -> str:
    return (os.environ.get("RAY_ADDRESS") or "auto") if value == "ray" else value


def _init(ray, value: str, fn: str) -> None:
    address = _address(value)
    where = "" if address == "auto" else f" at {shown(address)}"
    fix = ("start one with `ray start --head` (and `ray start --address=<head>:6379` on the other nodes), "
           "or SET VARIABLE dbml_cluster = 'local'")
    if address != "auto":
        target = urlsplit(address if "://" in address else f"tcp://{address}")
        try:
            socket.create_connection((target.hostname, _port(target) or 6379), timeout=PROBE_S).close()
        except OSError as e:
            raise InvalidArgument(f"{fn}(): cannot reach the Ray cluster{where} ({e.strerror or e}); {fix}") from None
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, TimeoutError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InvalidArgument(f"{fn}(): cannot reach the Ray cluster{where} ({first}); {fix}") from None


def disconnect() -> None:
    """Stop this process's device workers and hub (the cluster itself runs on)."""
    rt = runtime()
    with rt.cluster_lock:
        cluster, rt.cluster = rt.cluster, None
    if cluster is not None:
        cluster.close()


@dataclass
class Slot:
    """One device worker: its actor, where it runs, and the jobs it runs now."""
    actor: object
    node: str = ""
    device: str = ""
    pid: int = 0
    jobs: set = field(default_factory=set)
    idle_since: float = field(default_factory=time.monotonic)
    ready: bool = False
    collective: bool = False   # running a data-parallel job's part, which has it alone
    group: object = None       # the process group its worker is in (``group.Group``), as far as the driver knows


POLL_S = 0.05   # how often the driver takes its remote jobs' progress from the hub


class Poller:
    """The driver's one poll of its hub for all its running remote jobs: every ``POLL_S``, a
    ``poll_all`` whose updates wait in each job's queue until the job takes them (the calls
    grow with drivers, not with jobs). Its thread runs while any job is watched."""

    def __init__(self, ray, hub):
        self.ray, self.hub = ray, hub
        self._queues: dict[str, list] = {}
        self._lock = threading.Lock()        # the queues
        self._calling = threading.Lock()     # one poll at a time: a drain sees every update in order
        self._thread: threading.Thread | None = None

    def watch(self, key: str) -> None:
        with self._lock:
            self._queues.setdefault(key, [])
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="dbml-poller", daemon=True)
                self._thread.start()

    def take(self, key: str) -> list[dict]:
        """The updates polled for ``key`` since it last took them."""
        with self._lock:
            updates, self._queues[key] = self._queues.get(key, []), []
            return updates

    def drain(self, key: str) -> list[dict]:
        """Every update of ``key`` (the job has ended): those polled, then the hub's last, in
        order; ``key`` is no longer watched."""
        with self._calling:
            last = self.ray.get(self.hub.poll.remote(key))
            with self._lock:
                return self._queues.pop(key, []) + last

    def forget(self, key: str) -> None:
        with self._lock:
            self._queues.pop(key, None)

    def _loop(self) -> None:
        while True:
            time.sleep(POLL_S)
            with self._lock:
                if not self._queues:
                    self._thread = None
                    return
            with self._calling:
                try:
                    got = self.ray.get(self.hub.poll_all.remote())
                except Exception:  # noqa: BLE001 - the cluster is gone: each job's follow loop sees its worker die
                    continue
                with self._lock:
                    for key, updates in got.items():
                        if key in self._queues:
                            self._queues[key].extend(updates)


def _on_this_node(ray):
    """The hub's placement: on the driver's node, pinned. A zero-CPU actor may go to any node
    (a worker node in one of three starts of a three-node cluster, tests/multinode.py), and losing that
    node would take every job's progress, rows and checkpoints with it; on the driver's node it
    is lost only with the driver, whose jobs are lost anyway."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def _driver(ray) -> tuple[str, str]:
    """Which connection to Ray this process has: its driver's job and node (a new local cluster
    numbers its jobs from 1 again, on a node of a new id)."""
    context = ray.get_runtime_context()
    return context.get_job_id(), context.get_node_id()


class Cluster:
    """The process's connection to a Ray cluster: its hub and its pool of device workers."""

    def __init__(self, ray, setting: str):
        from .hub import Hub
        self.ray, self.setting = ray, setting
        self.session = uuid.uuid4().hex[:8]
        # the driver's connection: a ray.shutdown() and ray.init() in this process (a notebook's
        # restart) is another, where this one's hub and workers are gone (alive)
        self.driver = _driver(ray)
        started = time.perf_counter()
        self.hub = ray.remote(num_cpus=0, max_concurrency=WORKER_CONCURRENCY,
                              scheduling_strategy=_on_this_node(ray))(Hub).remote()
        ray.get(self.hub.pid.remote())
        self.poller = Poller(ray, self.hub)
        self.start_seconds = time.perf_counter() - started
        self._slots: list[Slot] = []
        self._lock = threading.Lock()

    def alive(self) -> bool:
        """Whether this process is still connected to Ray by the connection that started the
        hub and the workers (after ray.shutdown() and ray.init() they are gone: connect() then
        starts new ones, where their handles answered "Can't find actor")."""
        return self.ray.is_initialized() and _driver(self.ray) == self.driver

    def gpus(self) -> bool:
        """Whether the cluster has GPUs: then a device is a GPU, else a CPU slot."""
        return self.ray.cluster_resources().get("GPU", 0) > 0

    def check_room(self, workers: int, gpu: bool, *, fn: str = "train") -> None:
        """A job of ``workers`` workers (one CPU slot each, and one GPU each where ``gpu``) fits
        the cluster's resources in all, once other jobs have ended; else InvalidArgument saying
        what it asked and what the cluster has (Ray would keep it waiting for ever)."""
        resources = self.ray.cluster_resources()
        kinds = ["CPU", "GPU"] if gpu else ["CPU"]
        short = [k for k in kinds if resources.get(k, 0) < workers]
        if short:
            has = ", ".join(f"{resources.get(k, 0):g} {k}" for k in kinds)
            most = int(min(resources.get(k, 0) for k in kinds))
            raise InvalidArgument(f"{fn}(): workers := {workers} needs {workers} {' and '.join(kinds)} slots on the "
                                  f"Ray cluster (one per worker), and the cluster has {has} in all; the job can never "
                                  f"be placed: pass workers := {max(most, 1)} or fewer, or add nodes to the cluster")

    def devices(self) -> int:
        """How many devices the cluster has (GPUs, else CPU slots)."""
        resources = self.ray.cluster_resources()
        return int(resources.get("GPU", 0) or resources.get("CPU", 0))

    # -- device workers --------------------------------------------------------------------
    def acquire(self, key: str, gpu: bool, on_wait=None, check=None) -> Slot:
        """A device worker for job ``key``: an idle one, else a new one where the cluster has a
        free device, else the one with the fewest jobs (its scheduler plans them jointly and
        admits this one when it fits); while every device runs a data-parallel job's part
        (each has its device alone), the job waits for one to end. ``on_wait()`` is told when
        the job waits for a device or a new worker to start; ``check()`` is called while it
        waits, and what it raises (the job's cancel) stops the wait and the worker started for it."""
        def take() -> Slot | None:   # under the lock
            slot = next((s for s in self._slots if not s.jobs and s.ready), None)
            shared = [s for s in self._slots if s.ready and not s.collective]
            if slot is None and self._free(gpu):
                slot = Slot(self._start(gpu))
                self._slots.append(slot)
            elif slot is None and shared:
                slot = min(shared, key=lambda s: len(s.jobs))
            elif slot is None and not any(s.collective for s in self._slots):
                slot = Slot(self._start(gpu))   # every worker is still starting: a new one queues for a device
                self._slots.append(slot)
            if slot is not None:
                slot.jobs.add(key)
            return slot

        slot, waited = self._wait_for(take, on_wait, check)
        if not slot.ready:
            if on_wait is not None and not waited:
                on_wait()
            try:
                self._ready(slot, check)
            except BaseException:
                self.discard(slot)   # started for this job alone (a starting worker takes no other)
                raise
        return slot

    def _wait_for(self, take, on_wait, check) -> tuple:
        """``take()`` under the lock (after reaping idle workers) until it gives something;
        ``on_wait()`` once when it first does not, ``check()`` on every wait (a cancel raises).
        Returns what it gave and whether it waited."""
        waited = False
        while True:
            with self._lock:
                self._reap()
                got = take()
            if got is not None:
                return got, waited
            if not waited and on_wait is not None:
                on_wait()
            waited = True
            if check is not None:
                check()
            time.sleep(WAIT_POLL_S)

    def acquire_set(self, key: str, n: int, gpu: bool, on_wait=None, check=None) -> list[Slot]:
        """``n`` device workers for data-parallel job ``key``, in rank order, each the job's alone
        (a process has one default process group): idle ones, the members of a set that has
        its process group first (``parallel.form_group`` then reuses it), then new ones on free
        devices; all ``n`` at once or none (two jobs each holding part of what both need would
        wait for ever), waiting for running jobs to end meanwhile. ``on_wait`` and ``check`` as
        for ``acquire``; a cancel while the new workers start stops them."""
        taken, _ = self._wait_for(lambda: self._take_set(key, n, gpu), on_wait, check)
        try:
            for s in taken:
                if not s.ready:
                    self._ready(s, check)
        except BaseException:
            for s in taken:
                if s.ready:
                    self.release(s, key)
                else:
                    self.discard(s)
            raise
        return taken

    def _take_set(self, key: str, n: int, gpu: bool) -> list[Slot] | None:
        """``acquire_set``'s choice, under the lock: the slots, marked the job's, or None."""
        idle = [s for s in self._slots if s.ready and not s.jobs]
        sets: dict = {}
        for s in idle:
            if s.group is not None and s.group.world == n:
                sets.setdefault(s.group.id, {})[s.group.rank] = s
        whole = next((members for members in sets.values() if len(members) == n), None)
        if whole is not None:
            taken = [whole[r] for r in range(n)]
        else:
            starting = sum(not s.ready for s in self._slots)
            free = int(self.ray.available_resources().get("GPU" if gpu else "CPU", 0)) - starting
            if len(idle) + max(free, 0) < n:
                return None
            taken = idle[:n]
            new = [Slot(self._start(gpu)) for _ in range(n - len(taken))]
            self._slots.extend(new)
            taken += new
        for s in taken:
            s.jobs.add(key)
            s.collective = True
        return taken

    def release(self, slot: Slot, key: str) -> None:
        with self._lock:
            slot.jobs.discard(key)
            if not slot.jobs:
                slot.idle_since = time.monotonic()
                slot.collective = False

    def discard(self, slot: Slot) -> None:
        """A worker that died: out of the pool (a retry starts or takes another)."""
        with self._lock:
            if slot in self._slots:
                self._slots.remove(slot)
        try:
            self.ray.kill(slot.actor)
        except Exception:   # already gone
            pass

    def slot_of(self, key: str) -> Slot | None:
        with self._lock:
            return next((s for s in self._slots if key in s.jobs), None)

    def warm(self, n: int, gpu: bool = False) -> list[Slot]:
        """Start ``n`` device workers ahead of jobs (benchmarks, and a session that knows it will train)."""
        with self._lock:
            new = [Slot(self._start(gpu)) for _ in range(n)]
            self._slots.extend(new)
        for s in new:
            self._ready(s)
        return new

    def _free(self, gpu: bool) -> bool:
        available = self.ray.available_resources()
        starting = sum(not s.ready for s in self._slots)
        return available.get("GPU" if gpu else "CPU", 0) - starting >= 1

    def _start(self, gpu: bool):
        from .worker import DeviceWorker
        resources = dict(num_cpus=1, num_gpus=1) if gpu else dict(num_cpus=1)
        return self.ray.remote(max_concurrency=WORKER_CONCURRENCY, runtime_env=WORKER_ENV,
                               **resources)(DeviceWorker).remote()

    def _ready(self, slot: Slot, check=None) -> None:
        ref = slot.actor.describe.remote()
        while check is not None and not self.ray.wait([ref], timeout=WAIT_POLL_S)[0]:
            check()   # a job queued for a device stops when cancelled
        info = self.ray.get(ref)
        slot.node, slot.device, slot.pid, slot.ready = info["node"], info["device"], info["pid"], True

    def _reap(self) -> None:
        """Stop workers idle for IDLE_S (called under the lock)."""
        now = time.monotonic()
        stale = [s for s in self._slots if s.ready and not s.jobs and now - s.idle_since > IDLE_S]
        for s in stale:
            self._slots.remove(s)
            self.ray.kill(s.actor)

    def slots(self) -> list[Slot]:
        with self._lock:
            return list(self._slots)

    def close(self) -> None:
        with self._lock:
            slots, self._slots = self._slots, []
        for s in slots:
            try:
                self.ray.kill(s.actor)
            except Exception:   # the cluster went first
                pass
        try:
            self.ray.kill(self.hub)
        except Exception:
            pass
