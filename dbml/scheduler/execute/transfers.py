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

from .devices import CopyChannel, Device, storage_bytes
from ..errors import ExecutionError
from .iteration import ExecState, IterationLedger, IterationState
from .program import Program

__all__ = ["Transfers"]


Room = Callable[[int, int, tuple], None]   # (nbytes, before op, keep): make room for nbytes


class Transfers:
    """Host store, in-flight sets and swaps of one executor (reset per iteration).

    A swap-in on the compute thread first calls ``room(nbytes, k, keep)`` (the
    executor's passive-mode eviction, or nothing). It is passed per call, not kept:
    the components hold no reference back to the executor."""

    def __init__(self, prog: Program, device: Device, channel: CopyChannel, ledger: IterationLedger,
                 it: IterationState):
        self.prog, self.device, self.channel = prog, device, channel
        self.ledger, self.it = ledger, it
        self.copied = [0, 0.0]   # bytes and seconds the copy channel copied in the last iteration
        self.reset()

    def reset(self) -> None:
        self.host_store: dict[int, torch.Tensor] = {}
        self.inflight_in: set[int] = set()
        self.inflight_out: set[int] = set()
        self.out_at: dict[int, float] = {}   # when each swap-out in flight is due on the channel
        self.done: deque = deque()      # finished swap-ins: (sid, device bytes, marker)
        # swap-ins held back for room: {sid: planned start}; issued by :meth:`issue_waiting`
        self.waiting: dict[int, float] = {}
        # written in place since their host copy was made (the executor reads it on
        # every release: a set lookup, not a method call)
        self.stale: set[int] = set()
        self.copied = [0, 0.0]

    # -- the host store ------------------------------------------------------------------
    def keep_host(self, sid: int, host: torch.Tensor) -> None:
        """The host store keeps a tensor's copy until the iteration ends: tensors of a
        functional graph never change, so a released tensor may be swapped in again."""
        self.stale.discard(sid)
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
                self.stale.add(s)

    # -- the state between iterations: on the device, or in the host store ------------
    def load_state(self, state: ExecState, x, y) -> int:
        """Take the state (and the batch) into the iteration; returns the bytes resident."""
        prog, env, res = self.prog, self.it.env, self.it.res
        values = list(state.values) + [x, y]
        for i, (p, sid) in enumerate(zip(prog.placeholders, prog.ph_sid)):
            if values[i] is not None:
                env[p], res[sid] = values[i], True
                if i < len(state.values):
                    state.values[i] = None  # the executor holds it now
            else:
                self.host_store[sid] = state.host.pop(i)
        return sum(prog.nbytes[s] for s in prog.ph_sid if res[s])

    def place_initial(self, host_at_start: frozenset, room: Room) -> None:
        """Bring initial tensors where the plan expects them when the iteration starts."""
        prog, it = self.prog, self.it
        for sid in prog.ph_sid:
            if sid in host_at_start and it.res[sid]:
                self.copy_out_now(sid)
                it.drop(sid)
                self.ledger.free(prog.nbytes[sid])
                it.counts["setup_swaps"] += 1
            elif sid not in host_at_start and not it.res[sid]:
                self.swap_in_now(sid, 0, room)
                it.counts["setup_swaps"] += 1

    def store_state(self, state: ExecState) -> int:
        """Hand the updated state back at the iteration's end; returns the bytes that
        stay resident."""
        prog, it = self.prog, self.it
        source = {ph: o for o, ph in prog.updates.items()}
        held = 0
        for i in range(len(state.values)):
            o = source.get(i)
            p = prog.out_pos[o] if o is not None else prog.placeholders[i]
            sid = prog.nodes[p].meta["dbml_storage"]
            if it.res[sid] and it.env[p] is not None:
                state.values[i] = it.env[p]
                self.forget_host(sid)
                held += prog.nbytes[sid]
            elif sid in self.host_store:
                state.values[i] = None
                state.host[i] = self.host_store.pop(sid)
            else:
                raise ExecutionError(f"job {prog.job!r}: {prog.nodes[p].format_node()} is "
                                     f"neither resident nor on the host at the end of the iteration")
        return held

    def settle_state(self, state: ExecState, host_at_start: frozenset) -> tuple[int, int]:
        """Between iterations: move the state a new plan keeps on the host at its start
        there now. Returns (tensors moved, bytes still on the device)."""
        prog, device = self.prog, self.device
        moved = 0
        for i, sid in enumerate(prog.ph_sid[:len(state.values)]):
            v = state.values[i]
            if sid in host_at_start and v is not None:
                state.host[i] = device.copy_out(storage_bytes(v), device.compute_marker())
                state.values[i] = None
                moved += 1
        held = sum(prog.nbytes[sid] for i, sid in enumerate(prog.ph_sid[:len(state.values)])
                   if state.values[i] is not None)
        return moved, held

    # -- swaps -----------------------------------------------------------------------
    def swap_out(self, sid: int, at: float) -> None:
        it, ledger = self.it, self.ledger
        if not it.res[sid]:
            return
        holder = [it.bytes_of(sid)]
        it.drop(sid)
        self.inflight_out.add(sid)
        self.out_at[sid] = at
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
        self.channel.submit(at, _failing_wakes(job, ledger, self.inflight_out, sid))

    def wait_out(self, sid: int) -> None:
        """A planned stall: compute waits until the swap-out of ``sid`` has ended (its
        device bytes are free)."""
        cv = self.ledger.cv
        with cv:
            if sid in self.inflight_out:
                self.it.counts["planned_waits"] += 1
            while sid in self.inflight_out:
                cv.wait()

    def copy_bandwidth(self) -> float | None:
        """Bytes per second copied in the last iteration (None: nothing copied)."""
        nbytes, seconds = self.copied
        return nbytes / seconds if nbytes and seconds > 0 else None

    def _copied(self, nbytes: int, t0: float) -> None:
        """On the copy thread (the only writer while an iteration runs)."""
        self.copied[0] += nbytes
        self.copied[1] += time.perf_counter() - t0

    def swap_in(self, sid: int, at: float, budget: int | None, reserve: int = 0) -> None:
        """Issue a swap-in. Its destination is counted here, on the compute thread, when
        it is issued (the planned start, to an op): every increase of the ledger happens
        on this thread, where the limit is enforced, so a copy channel running late can
        only make compute wait, never make the device hold more than planned.
        ``reserve``: the outputs of the op compute starts next, which the plan counts
        beside this copy (peak.py, rules 2 and 4); a swap-in that fits only without them
        waits (:meth:`issue_waiting`), or the op that reads it fetches it: issued, it
        would take that op's room, and the op would pass the limit (an op cannot wait
        for a copy in, which frees nothing)."""
        it, ledger = self.it, self.ledger
        if it.res[sid] or sid in self.inflight_in:
            return
        if sid not in self.host_store and sid not in self.inflight_out:
            return   # nothing to copy (a plan mismatch): the op that needs it will fetch
        nbytes = self.prog.nbytes[sid] + reserve
        if budget is not None and ledger.total + nbytes > budget:
            if self.inflight_out:
                ledger.wait_for_room(nbytes, budget, self.inflight_out)
            it.counts["budget_waits"] += 1
            if ledger.total + nbytes > budget:
                # planned with a delay past releases compute has not reached yet (compute
                # slower than the plan): it waits for them rather than pass the limit now
                self.waiting[sid] = at
                return
        self._issue(sid, at)

    def issue_waiting(self, budget: int, reserve: int = 0) -> None:
        """Issue the swap-ins held back for room that now fit (after releases, or at
        an op boundary) beside ``reserve``, the next op's outputs (:meth:`swap_in`); the
        one that does not fit yet and those after it keep waiting (in the plan's order)."""
        ledger, now, res = self.ledger, time.perf_counter(), self.it.res
        for sid, at in list(self.waiting.items()):
            if res[sid] or sid in self.inflight_in or (sid not in self.host_store and sid not in self.inflight_out):
                del self.waiting[sid]   # brought in meanwhile (fetched, recomputed), or nothing to copy
                continue
            if ledger.total + self.prog.nbytes[sid] + reserve > budget:
                return
            del self.waiting[sid]
            self._issue(sid, max(at, now))

    def _issue(self, sid: int, at: float) -> None:
        it, ledger = self.it, self.ledger
        nbytes = self.prog.nbytes[sid]
        ledger.alloc(nbytes)
        self.inflight_in.add(sid)
        if sid in self.inflight_out:
            # its swap-out may be due later than this (a delayed one, compute ahead of the
            # plan): the channel runs jobs by due time, and this copy needs that one's result
            at = max(at, self.out_at[sid])

        ahead = self.device.alloc(nbytes) if self.device.alloc_on_issue else None

        def job():
            t0 = time.perf_counter()
            host = self.host_store[sid]   # a swap-out of it, issued earlier, has completed
            dst = ahead if ahead is not None else self.device.alloc(nbytes)
            marker = self.device.copy_in(host, dst)
            self._copied(nbytes, t0)
            with ledger.cv:
                self.done.append((sid, dst, marker))
                ledger.cv.notify_all()

        it.counts["swap_ins"] += 1
        self.channel.submit(at, _failing_wakes(job, ledger, self.inflight_in, sid))

    def install(self, sid: int, dst: torch.Tensor, marker, k: int) -> None:
        self.device.use_on_compute(dst, marker)
        self.it.rebuild(sid, dst, k)
        self.inflight_in.discard(sid)

    def install_done(self, k: int) -> None:
        """Install the swap-ins the copy channel has finished."""
        while self.done:
            self.install(*self.done.popleft(), k)

    def swap_in_now(self, sid: int, k: int, room: Room) -> None:
        """A swap-in on the compute thread (passive, or setting up the iteration)."""
        host = self.host_store[sid]
        nbytes = self.prog.nbytes[sid]
        room(nbytes, k, (sid,))
        self.ledger.alloc(nbytes)
        dst = self.device.alloc(nbytes)
        marker = self.device.copy_in(host, dst)
        self.install(sid, dst, marker, k)

    def fetch(self, sid: int, k: int, service: Callable[[int], None], room: Room) -> bool:
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
            self.waiting.pop(sid, None)   # held back for room, and needed now: passive
            if sid in self.host_store:
                self.swap_in_now(sid, k, room)
                self.it.counts["passive_swaps"] += 1
                return True
            return False


def _failing_wakes(job: Callable[[], None], ledger: IterationLedger, inflight: set, sid: int) -> Callable[[], None]:
    """``job``, which on failure also takes ``sid`` off ``inflight`` and wakes compute: an
    op waiting for that copy goes on (recomputing or failing) instead of waiting forever;
    the channel hands the error to the next ``drain``."""
    def guarded() -> None:
        try:
            job()
        except BaseException:
            with ledger.cv:
                inflight.discard(sid)
                ledger.cv.notify_all()
            raise
    return guarded
