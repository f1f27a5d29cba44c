"""Transfers between the device and the host store during one iteration.

Owns the host store (host copies, kept until the iteration ends: tensors of a
functional graph never change, so a released tensor may be swapped in again), the
tensors in flight each way, the swap-ins the copy channel finished, and the host copies
made stale by an op that wrote into its input (BatchNorm's running statistics).

* SWAP_OUT hands the storage's bytes to the device's copy channel, which copies them to
  the host store and then frees them (the copy side of the ledger);
* SWAP_IN counts its destination when issued (on the compute thread), allocates device
  bytes on the channel and copies them back; :meth:`install` rebuilds the values of the
  nodes that view that storage;
* :meth:`fetch`: an op needs a tensor that is not resident: wait for its in-flight
  swap-in (a *late* swap-in) or swap it in now (a *passive* swap).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

import torch

from .devices import CopyChannel, Device
from .iteration import IterationLedger, IterationState
from .program import Program

__all__ = ["Transfers"]


class Transfers:
    """Host store, in-flight sets and swaps of one executor (reset per iteration).

    ``room(nbytes, k, keep)`` is called before a swap-in on the compute thread takes
    memory (the executor's passive-mode eviction, or nothing)."""

    def __init__(self, prog: Program, device: Device, channel: CopyChannel, ledger: IterationLedger,
                 it: IterationState, room: Callable[[int, int, tuple], None]):
        self.prog, self.device, self.channel = prog, device, channel
        self.ledger, self.it, self.room = ledger, it, room
        self.copied = [0, 0.0]   # bytes and seconds the copy channel copied in the last iteration
        self.reset()

    def reset(self) -> None:
        self.host_store: dict[int, torch.Tensor] = {}
        self.inflight_in: set[int] = set()
        self.inflight_out: set[int] = set()
        self.done: deque = deque()      # finished swap-ins: (sid, device bytes, marker)
        self._stale: set[int] = set()   # written in place since their host copy was made
        self.copied = [0, 0.0]

    # -- the host store ------------------------------------------------------------------
    def keep_host(self, sid: int, host: torch.Tensor) -> None:
        """The host store keeps a tensor's copy until the iteration ends: tensors of a
        functional graph never change, so a released tensor may be swapped in again."""
        self._stale.discard(sid)
        old = self.host_store.get(sid)
        self.host_store[sid] = host
        if old is not None:
            self.device.free_host(old)

    def forget_host(self, sid: int) -> None:
        host = self.host_store.pop(sid, None)
        if host is not None:
            self.device.free_host(host)

    def forget_all(self) -> None:
        for sid in list(self.host_store):
            self.forget_host(sid)

    def copy_out_now(self, sid: int) -> None:
        """Copy a resident tensor to the host store on the compute thread, waiting."""
        device = self.device
        self.keep_host(sid, device.copy_out(self.it.bytes_of(sid), device.compute_marker()))

    def written(self, sids: tuple[int, ...]) -> None:
        """An op wrote into these tensors (BatchNorm's running statistics): their host
        copies are stale now."""
        for s in sids:
            if s in self.host_store:
                self.forget_host(s)
                self._stale.add(s)

    def is_stale(self, sid: int) -> bool:
        return sid in self._stale

    # -- swaps -----------------------------------------------------------------------
    def swap_out(self, sid: int, at: float) -> None:
        it, ledger = self.it, self.ledger
        if not it.res[sid]:
            return
        holder = [it.bytes_of(sid)]
        it.drop(sid)
        self.inflight_out.add(sid)
        marker = self.device.compute_marker()
        nbytes = self.prog.nbytes[sid]

        def job():
            t0 = time.perf_counter()
            host = self.device.copy_out(holder[0], marker)
            holder.clear()  # the device bytes are freed here
            self._copied(nbytes, t0)
            with ledger.cv:
                ledger.copied_out(nbytes)
                self.keep_host(sid, host)
                self.inflight_out.discard(sid)
                ledger.cv.notify_all()

        it.counts["swap_outs"] += 1
        self.channel.submit(at, job)

    def _copied(self, nbytes: int, t0: float) -> None:
        """On the copy thread (the only writer while an iteration runs)."""
        self.copied[0] += nbytes
        self.copied[1] += time.perf_counter() - t0

    def swap_in(self, sid: int, at: float, budget: int | None) -> None:
        """Issue a swap-in. Its destination is counted here, on the compute thread, when
        it is issued (the planned start, to an op): every increase of the ledger happens
        on this thread, where the limit is enforced, so a copy channel running late can
        only make compute wait, never make the device hold more than planned."""
        it, ledger = self.it, self.ledger
        if it.res[sid] or sid in self.inflight_in:
            return
        if sid not in self.host_store and sid not in self.inflight_out:
            return   # nothing to copy (a plan mismatch): the op that needs it will fetch
        nbytes = self.prog.nbytes[sid]
        if budget is not None and ledger.total + nbytes > budget and self.inflight_out:
            ledger.wait_for_room(nbytes, budget, self.inflight_out)
            it.counts["budget_waits"] += 1
        ledger.alloc(nbytes)
        self.inflight_in.add(sid)

        def job():
            t0 = time.perf_counter()
            host = self.host_store[sid]   # a swap-out of it, issued earlier, has completed
            dst = self.device.alloc(nbytes)
            marker = self.device.copy_in(host, dst)
            self._copied(nbytes, t0)
            with ledger.cv:
                self.done.append((sid, dst, marker))
                ledger.cv.notify_all()

        it.counts["swap_ins"] += 1
        self.channel.submit(at, job)

    def install(self, sid: int, dst: torch.Tensor, marker, k: int) -> None:
        self.device.use_on_compute(dst, marker)
        self.it.rebuild(sid, dst, k)
        self.inflight_in.discard(sid)

    def install_done(self, k: int) -> None:
        """Install the swap-ins the copy channel has finished."""
        while self.done:
            self.install(*self.done.popleft(), k)

    def swap_in_now(self, sid: int, k: int) -> None:
        """A swap-in on the compute thread (passive, or setting up the iteration)."""
        host = self.host_store[sid]
        nbytes = self.prog.nbytes[sid]
        self.room(nbytes, k, (sid,))
        self.ledger.alloc(nbytes)
        dst = self.device.alloc(nbytes)
        marker = self.device.copy_in(host, dst)
        self.install(sid, dst, marker, k)

    def fetch(self, sid: int, k: int, service: Callable[[int], None]) -> bool:
        """Op ``k`` needs ``sid`` and it is not resident: wait for its copies in flight
        (``service`` installs what arrived), or swap it in now. False: it is neither
        resident nor on the host; the caller recomputes it."""
        waited = False
        cv = self.ledger.cv
        while True:
            with cv:
                while sid in self.inflight_out or (sid in self.inflight_in and not self.done):
                    waited = True
                    cv.wait()
            service(k)
            if self.it.res[sid]:
                if waited:
                    self.it.counts["late_swap_ins"] += 1
                return True
            if sid in self.inflight_in:
                continue
            if sid in self.host_store:
                self.swap_in_now(sid, k)
                self.it.counts["passive_swaps"] += 1
                return True
            return False
