"""Data-parallel training of one model: ``train(..., workers := N)`` on N of the cluster's device workers.

The job's workers are the placement's own device workers, reused across jobs
(``Cluster.acquire_set``: idle ones first, preferring a set that already has its process group,
then new ones on free devices, all N at once or none while the job waits), each the job's
alone while it runs: a process has one default process group. Among them torch.distributed's
default group (gloo on CPU, NCCL on GPU) is set up once per worker set (``form_group``):
rendezvous at rank 0's node IP on a port free there, every member joins (``group.join``);
the group stays alive while the same set runs the next data-parallel job, and a member leaves
it when it joins another set or its job failed in a collective. Start-up on a warm set is a few actor calls,
where Ray Train's TorchTrainer (used before; no longer) started N processes and a new group
for every job: 28 s to the first step of 2 workers against 0.1 s for one placed job, where
a warm set now takes 0.13 s (docs/architecture.md, "Data-parallel start-up").

Each worker runs ``DeviceWorker.run_collective``: one worker's part of the job
(``worker.run_task``: the rows streamed into its DuckDB, training's ``_fit_model`` from the
last checkpoint) with ``collective=True``, so its step is the scheduled
``core.dataparallel.DataParallelStep`` (``ddp.DDPStep`` under policy 'eager'). Rank 0 reports
progress and checkpoints through the hub; its outcome is the job's: the driver stores the
model once (``dbml.cluster.remote``).

How a job ends (``DataParallel.outcome``): every worker finished: rank 0's outcome. An error of
dbml's own (a diverging loss, a cancel: every worker stops at the same step) is the job's
outcome, not a failure. A worker that died, or any other error (a peer gone mid-collective),
fails the attempt with ``WorkerDied``: the dead workers leave the pool, the others have left
the broken group (or are killed, if they have not ended ``GRACE_S`` after the first), and
``RemoteFit`` restarts the job on a new set from its last checkpoint while ``max_retries``
allows, else fails it naming the setting. Nothing is stored before the driver has the model.
"""

from __future__ import annotations

import time
import uuid

from .group import Group, failed_in_collective
from .placement import WAIT_POLL_S, WorkerDied, first_line

# After the first worker of a job ends with an error, the others have this long to end too
# (a peer gone: gloo raises at once; a stuck collective: killed).
GRACE_S = 5.0
# Forming a group: every member has joined within this, else the attempt fails (a member stuck).
JOIN_S = 60.0
# Sets formed for one attempt when members are found dead as the set forms (died while idle).
FORM_TRIES = 3


def form_group(ray, slots: list, backend: str, check=None) -> bool:
    """Every slot in the default process group of this worker set, ``slots[r]`` as rank ``r``:
    the group they share if they are one set already (each member checks, at once), else a
    new one at rank 0's node on a free port, once every member has answered (no member then
    waits in the rendezvous for one that is gone). Whether the group was reused.
    ``MembersGone`` naming the members found dead before any waited; ``WorkerDied`` if one
    died in the rendezvous or a member has not joined within ``JOIN_S``."""
    world = len(slots)
    first = slots[0].group
    reused = first is not None and all(s.group is not None and s.group.id == first.id and s.group.rank == r
                                       and s.group.world == world for r, s in enumerate(slots))
    if reused:
        groups = [s.group for s in slots]
    else:
        answers = _get(ray, [slots[0].actor.rendezvous.remote()] + [s.actor.describe.remote() for s in slots[1:]],
                       check, members=True)
        address, port = answers[0]
        gid = uuid.uuid4().hex[:8]
        groups = [Group(gid, r, world, address, port, backend) for r in range(world)]
    for s in slots:
        s.group = None   # until it has joined
    _get(ray, [s.actor.join_group.remote(g) for s, g in zip(slots, groups)], check, members=reused)
    for s, g in zip(slots, groups):
        s.group = g
    return reused


class MembersGone(WorkerDied):
    """Members of a worker set found dead as the set formed, before any member waited for them."""

    def __init__(self, ranks: list[int], first: str):
        super().__init__(first)
        self.ranks = ranks


def _get(ray, refs: list, check, members: bool) -> list:
    """The answers of ``refs``, one per member; a member gone raises (``MembersGone`` where
    ``members``: the others did not wait for it), as does a wait past ``JOIN_S``."""
    deadline = time.monotonic() + JOIN_S
    while True:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=WAIT_POLL_S)
        gone = {}
        for i, ref in enumerate(refs):
            if ref in ready:
                try:
                    ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                        ray.exceptions.NodeDiedError) as e:
                    gone[i] = first_line(e)
        if gone:
            first = next(iter(gone.values()))
            raise MembersGone(sorted(gone), first) if members else WorkerDied(first)
        if len(ready) == len(refs):
            return ray.get(refs)
        if time.monotonic() > deadline:
            raise WorkerDied(f"a worker did not join the job's process group within {JOIN_S:g} s")
        if check is not None:
            check()


# -- on the driver -------------------------------------------------------------------------

class DataParallel:
    """A ``workers := N`` job on N device workers of the pool (see the module docstring)."""

    def __init__(self, cluster, task, progress):
        self.cluster, self.task, self.progress = cluster, task, progress
        self.slots: list = []
        self.refs: list = []
        self.ended: dict[int, tuple | WorkerDied] = {}   # rank -> its outcome, or how it died
        self.first_end: float | None = None
        self.figures: dict = {}   # RemoteFit adds them to the job's cluster figures

    def start(self) -> None:
        ray, spec = self.cluster.ray, self.task.spec
        gpu = self.cluster.gpus() and spec.settings.device != "cpu"
        self.cluster.check_room(spec.workers, gpu)   # before anything waits for slots that do not exist
        started = time.perf_counter()
        waiting = f"{spec.workers} devices"
        for tries in range(FORM_TRIES):
            self.slots = self.cluster.acquire_set(self.task.key, spec.workers, gpu, check=self.progress.check,
                                                  on_wait=lambda: self.progress.place(None, None, waiting))
            placed = time.perf_counter()
            try:
                reused = form_group(ray, self.slots, "nccl" if gpu else "gloo", self.progress.check)
                break
            except MembersGone as e:   # died while idle: nothing ran, so no retry is spent; another set
                for r in e.ranks:
                    self._discard(r)
                if tries + 1 == FORM_TRIES:
                    raise
                self.stop()
            except BaseException:   # not joined in time, or cancelled while forming: the set is not kept
                self.kill()
                raise
        self.figures["group"] = {"reused": reused, "place_seconds": round(placed - started, 4),
                                 "form_seconds": round(time.perf_counter() - placed, 4)}
        self.progress.place(self.slots[0].node, self.slots[0].device, None)
        self.refs = [s.actor.run_collective.remote(self.task) for s in self.slots]

    def done(self, timeout: float) -> bool:
        ray = self.cluster.ray
        pending = [r for r in range(len(self.refs)) if r not in self.ended]
        if not pending:
            return True
        ready, _ = ray.wait([self.refs[r] for r in pending], num_returns=len(pending), timeout=timeout)
        for r in pending:
            if self.refs[r] in ready:
                self.ended[r] = self._get(r)
                self.first_end = self.first_end or time.monotonic()
        if len(self.ended) == len(self.refs):
            return True
        failed = [o for o in self.ended.values() if isinstance(o, WorkerDied) or o[0] == "error"]
        if failed and time.monotonic() - self.first_end > GRACE_S:
            for r in range(len(self.refs)):   # stuck in a collective with a peer that has gone
                if r not in self.ended:
                    self.ended[r] = WorkerDied(f"worker {r} had not stopped {GRACE_S:g} s after another")
                    self._discard(r)
            return True
        return False

    def _get(self, rank: int):
        ray = self.cluster.ray
        try:
            return ray.get(self.refs[rank])
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.ObjectLostError,
                ray.exceptions.NodeDiedError) as e:
            self._discard(rank)
            return WorkerDied(first_line(e))

    def outcome(self) -> tuple:
        died = [o for o in self.ended.values() if isinstance(o, WorkerDied)]
        if died:
            raise died[0]
        broken = [(r, o) for r, o in sorted(self.ended.items()) if failed_in_collective(o)]
        if broken:   # those workers have left the group; the set is formed anew
            from .worker import unpack_error
            r, (_, packed) = broken[0]
            e = unpack_error(packed)
            text = str(e).strip()
            raise WorkerDied(f"worker {r}: {type(e).__name__}: {text.splitlines()[0] if text else ''}")
        errors = [o for r, o in sorted(self.ended.items()) if o[0] == "error"]
        return self.ended[0] if self.ended[0][0] == "error" or not errors else errors[0]

    def kill(self) -> None:
        """Stop every worker of the job (a cancel not heeded within ``remote.KILL_AFTER_S``)."""
        for r in range(len(self.slots)):
            self._discard(r)

    def _discard(self, rank: int) -> None:
        slot = self.slots[rank]
        if slot is not None:
            self.cluster.discard(slot)
            self.slots[rank] = None

    def stop(self) -> None:
        broken = any(not isinstance(o, tuple) or failed_in_collective(o) for o in self.ended.values())
        for s in self.slots:
            if s is not None:
                if broken or s.group is None:
                    s.group = None   # the group is broken: the next set forms a new one (join leaves this one)
                self.cluster.release(s, self.task.key)
        self.slots = []
