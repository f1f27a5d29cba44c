"""One iteration's books: the ledger of the job's device bytes, and the values in flight.

:class:`IterationLedger` owns the measured memory: two counters (compute's and the copy
channel's), the iteration's peak, the job's account in the device's global ledger (a
:class:`NullAccount` where there is none) and the wait for room under a hard limit.
:class:`IterationState` owns the flat value list, the resident flags and the counts of
one iteration, and rebuilds or drops the values that view a storage.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol

import torch

from ..errors import ExecutionError
from .devices import as_view, storage_bytes
from .program import MULTI, Program

__all__ = ["ExecState", "Account", "NullAccount", "IterationLedger", "IterationState", "COUNTS", "OpRecord",
           "EventRecord"]

# what an iteration counts (Executor.counts, and summed over iterations, Executor.totals,
# where "iterations" counts the iterations run; it stays 0 in one iteration's counts)
COUNTS = ("swap_outs", "swap_ins", "releases", "recomputes", "passive_swaps", "late_swap_ins",
          "passive_recomputes", "setup_swaps", "budget_waits", "passive_swap_outs",
          "reused_buffers", "refresh_swaps", "planned_waits", "iterations")


@dataclass
class ExecState:
    """Parameters, buffers and optimizer state between iterations, by placeholder
    position: a device tensor in ``values``, or ``None`` there and host bytes in ``host``."""

    values: list
    host: dict[int, torch.Tensor] = field(default_factory=dict)


class OpRecord(NamedTuple):
    """Event log: op ``op`` ran, reading ``reads``; ``resident`` says which were."""
    kind: str            # always "op"
    op: int
    reads: tuple[int, ...]
    resident: tuple[bool, ...]


class EventRecord(NamedTuple):
    """Event log: an event (``EventKind.value``, or "passive_swap_out") after op ``op``."""
    kind: str
    op: int
    tensor: int


class Account(Protocol):
    """The job's part of the device's global ledger (multijob.ledger.JobAccount)."""

    def add(self, nbytes: int) -> None: ...
    def set(self, nbytes: int) -> None: ...
    def add_pool(self, nbytes: int) -> None: ...


class NullAccount:
    """No global ledger: every change is dropped."""

    def add(self, nbytes: int) -> None:
        pass

    def set(self, nbytes: int) -> None:
        pass

    def add_pool(self, nbytes: int) -> None:
        pass


class IterationLedger:
    """The executor's count of the job's device bytes (it mirrors ``peak.py``'s rules).

    Two counters, each written by one thread only (no lost updates without a lock on
    the hot path): ``on_compute`` (every increase, and the frees the compute thread
    makes) and ``on_copy`` (swap-outs completing, on the copy channel). ``cv`` guards
    the copy side; compute waits on it for room. Every change is told to ``account``."""

    def __init__(self, account: Account | None = None):
        self.account: Account = account if account is not None else NullAccount()
        self.on_compute = 0
        self.on_copy = 0
        self.peak = 0            # largest total this iteration
        self.cv = threading.Condition()
        # called with the new total after every alloc() (the executor's reuse pool gives
        # buffers back there, so that ledger + pool stays within the limit)
        self.on_grow: Callable[[int], None] | None = None

    @property
    def total(self) -> int:
        return self.on_compute + self.on_copy

    def hold(self, nbytes: int) -> None:
        """The job holds exactly ``nbytes`` now (an iteration's start or end)."""
        self.on_compute, self.on_copy = nbytes, 0
        self.account.set(nbytes)

    def alloc(self, nbytes: int) -> None:
        self.on_compute += nbytes
        self.account.add(nbytes)
        total = self.on_compute + self.on_copy
        if total > self.peak:
            self.peak = total
        if self.on_grow is not None:
            self.on_grow(total)

    def free(self, nbytes: int) -> None:
        self.on_compute -= nbytes
        self.account.add(-nbytes)

    def copied_out(self, nbytes: int) -> None:
        """On the copy thread, holding ``cv``: a swap-out's device bytes are free."""
        self.on_copy -= nbytes
        self.account.add(-nbytes)

    def wait_for_room(self, nbytes: int, limit: int, inflight_out: set) -> None:
        """The budget is a hard limit: a copy slower than planned makes compute wait
        for the swap-outs in flight rather than exceed it."""
        with self.cv:
            while self.on_compute + self.on_copy + nbytes > limit and inflight_out:
                self.cv.wait()


class IterationState:
    """The values of one iteration: ``env`` (by node position), ``res`` (resident
    flags by storage), ``counts`` and ``deferred`` (releases planned with a delay:
    ``(due time, tensor)``); :meth:`reset` starts the next iteration."""

    def __init__(self, prog: Program):
        self.prog = prog
        self.env: list = []
        self.res: list[bool] = []
        self.counts: dict[str, int] = dict.fromkeys(COUNTS, 0)
        self.deferred: list[tuple[float, int]] = []

    def reset(self) -> None:
        self.env = [None] * len(self.prog.nodes)
        self.res = [False] * len(self.prog.nbytes)
        self.counts = dict.fromkeys(COUNTS, 0)
        self.deferred = []

    def due(self) -> list[int]:
        """The delayed releases whose time has come, taken off ``deferred``."""
        now = time.perf_counter()
        due = [d for d in self.deferred if d[0] <= now]
        for d in due:
            self.deferred.remove(d)
        return [sid for _, sid in due]

    def drop(self, sid: int) -> None:
        env = self.env
        for a in self.prog.alias[sid]:
            env[a.pos] = None
        self.res[sid] = False

    def value_of(self, sid: int):
        for a in self.prog.alias[sid]:
            v = self.env[a.pos]
            if v is not None:
                return v
        return None

    def bytes_of(self, sid: int) -> torch.Tensor:
        v = self.value_of(sid)
        if v is None:
            raise ExecutionError(f"job {self.prog.job!r}: no value holds tensor {sid} "
                                 f"({self.prog.seq.tensors[sid].name})")
        return storage_bytes(v)

    def store(self, k: int, kk: int, value) -> None:
        """The value of op ``k`` (of kind ``kk``, not PLAIN): a multi-output op's parts go
        to its getitem nodes; an in-place update takes the old tensor's storage."""
        prog, env, res = self.prog, self.env, self.res
        if kk != MULTI:
            env[prog.op_pos[k]] = value
        else:
            for idx, p in prog.distribute[k]:
                env[p] = value[idx]
        for s in prog.outputs[k]:
            res[s] = True
        if k in prog.in_place:   # self.drop(old), inlined: every update does this
            _, old = prog.in_place[k]
            res[old] = False
            for a in prog.alias[old]:
                env[a.pos] = None

    def rebuild(self, sid: int, flat: torch.Tensor, k: int) -> None:
        """Values of the nodes viewing ``sid`` that ran before op ``k`` and are read later."""
        env, last = self.env, self.prog.last_use
        for p, dtype, size, stride, offset, ran in self.prog.alias[sid]:
            if ran < k and last[p] >= k:
                env[p] = as_view(flat, dtype, size, stride, offset)
        self.res[sid] = True
