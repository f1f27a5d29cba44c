"""Passive mode (Capuchin's first iteration: no plan, only a budget): on-demand swap-outs.

An allocation that would pass the budget first swaps resident tensors out, least
recently used first, waiting for each copy; the op that next needs one swaps it back in
(:meth:`.transfers.Transfers.fetch`). This is a small planner of its own, kept out of
the executor, which only performs plans: the executor calls :meth:`PassiveEvictor.make_room`
where it has one, and has none outside passive mode.
"""

from __future__ import annotations

from .iteration import EventRecord, IterationLedger, IterationState
from .pool import BufferPool
from .program import Program
from .transfers import Transfers

__all__ = ["PassiveEvictor"]


class PassiveEvictor:
    """Capuchin's passive swap-outs over the budget, least recently used first.

    Least recently used, as Capuchin evicts, rather than largest: without a plan the
    executor knows the past, not the future, and the tensor touched longest ago
    (usually an early activation waiting for the backward pass, or a parameter used
    once in the forward pass) is the one least likely to be read next."""

    def __init__(self, prog: Program, it: IterationState, ledger: IterationLedger,
                 transfers: Transfers, pool: BufferPool, log: list | None = None):
        self.prog, self.it, self.ledger = prog, it, ledger
        self.transfers, self.pool, self.log = transfers, pool, log
        self.caller_held = {s for s, info in enumerate(prog.seq.tensors) if info.caller_held}
        # a collective's buffer, from its op to its wait (plan/gaps.py's in_flight): (tensor, issue, wait)
        live = prog.live
        self.flights = [(t, g, min((a for a in live.accesses[t] if a > g), default=g))
                        for t, g in enumerate(live.gen) if g >= 0 and prog.seq.ops[g].collective]

    def victims(self, k: int, keep: tuple = ()) -> list[int]:
        """The tensors it would evict before op ``k``, in order: the least recently
        accessed first, the largest first among equals. Never evicted: what op ``k``
        reads or updates (and ``keep``), the loss, tensors in flight (copies coming in, a
        collective's buffer before its wait), empty ones."""
        prog, res, inflight_in = self.prog, self.it.res, self.transfers.inflight_in
        protected = set(prog.req[k] if k < len(prog.req) else ()) | set(keep) | {prog.loss_sid} | \
            self.caller_held | {t for t, g, wait in self.flights if g < k <= wait}
        order = sorted((prog.last_access_before(s, k), -prog.nbytes[s], s)
                       for s in range(len(prog.nbytes))
                       if res[s] and s not in protected and s not in inflight_in
                       and prog.nbytes[s] > 0 and self.it.value_of(s) is not None)
        return [s for _, _, s in order]

    def make_room(self, nbytes: int, k: int, budget: int, keep: tuple = ()) -> None:
        """Until ``nbytes`` more fit the budget, copy the next victim to the host, wait
        for the copy, and free it (a host copy still valid is kept: it is just dropped)."""
        it, ledger, transfers = self.it, self.ledger, self.transfers
        for sid in self.victims(k, keep):
            if ledger.total + nbytes <= budget:
                return
            if sid not in transfers.host_store:
                transfers.copy_out_now(sid)
            it.drop(sid)
            ledger.free(self.prog.nbytes[sid])
            it.counts["passive_swap_outs"] += 1
            if self.log is not None:
                self.log.append(EventRecord("passive_swap_out", k, sid))
        if self.pool.bytes:
            self.pool.hold_within(ledger.total + nbytes, budget)
