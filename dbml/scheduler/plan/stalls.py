"""Swaps with planned stalls: when no swap fits the copy channel without making compute
wait, take the tensor off the device anyway and let compute wait the least (a pure pass).

peak.py's rule 7 models the waits exactly: a SWAP_OUT with ``before == w`` is
*synchronous* (op ``w`` is not entered until its copy has ended, so its bytes are free
before op ``w``), and a SWAP_IN whose copy ends after op ``before`` would start makes that
op wait for it (a *late* swap-in; the executor already waits for one). Later ops shift by
the wait, as after a recompute stall, so the planned peak stays an exact ledger.

For a gap that holds the peak, :func:`propose_stalling_swap`:

* frees the tensor before the peak: a RELEASE when its host copy is still valid; else a
  swap-out in the channel's first free slot after the access that opens the gap, made
  synchronous (waited for before ``w``, the op at the peak) when it would end after the
  peak;
* brings it back after the peak: in the latest free slot that ends before the access
  that closes the gap, or, if none, in the first free slot after the peak, late.

Copies never overlap on the channel. The proposal's ``cost`` is the waits it adds (the
planner compares it with a recompute's stall per byte freed). Cross-iteration gaps
(gaps.py) get the same treatment: the updated tensor's swap-out waited for where it must
end before the peak or the iteration's end, the old tensor's swap-in late if it must.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .gaps import CROSS, SWAPPED, lex_lt
from .peak import FIRST, PeakKey, end_rank, event_rank, event_time, issued_rank
from .state import PlanState, Proposal
from .swap import event_at
from ..graph.sequence import Event, EventKind

__all__ = ["propose_stalling_swap", "propose_again", "propose_later_swap_in", "resident_at_peak"]

INF = math.inf


def propose_stalling_swap(state: PlanState, gap: int, peak: PeakKey, peak_op: int,
                          margin: float = 0.0) -> Proposal | None:
    """Take the gap's tensor off the device across the peak point, making compute wait
    where the channel has no room; None if even that cannot cover the peak."""
    if state.gaps.kind[gap] == CROSS:
        return _propose_cross(state, gap, peak, peak_op, margin)
    t, lo, hi = int(state.gaps.tensor[gap]), int(state.gaps.lo[gap]), int(state.gaps.hi[gap])
    lo_time = state.op_end(lo)
    # the host copy is still valid (a graph output is never released: swapped out again)
    if state.host_ready.get(t, INF) <= lo_time and lo >= 0 and t not in state.seq.outputs:
        out, free_from, in_lo, out_wait = Event(lo, 0.0, EventKind.RELEASE, t), lo_time, lo, 0.0
    else:
        placed = _swap_out(state, t, lo, hi, peak, peak_op)
        if placed is None:
            return None
        out, free_from, in_lo, out_wait = placed
    # not before the step at the peak has ended: a copy started during it is held beside it
    in_lo = max(in_lo, min(_peak_step(state, peak, peak_op), hi - 1))
    swap_in, in_wait = _swap_in(state, t, max(free_from, peak[0]), in_lo, hi, in_lo, margin)
    if not _after(state, swap_in, peak):
        return None
    return Proposal(gap, (out, swap_in), SWAPPED, cost=out_wait + in_wait, stalls=True)


def propose_again(state: PlanState, gap: int, peak: PeakKey, peak_op: int, margin: float = 0.0) -> Proposal | None:
    """A swapped gap whose tensor is still on the device at the peak (its swap-out ends
    after the peak, or its swap-in starts before it, planned when the peak was elsewhere):
    plan it again, with waits where needed. The new events replace the old (``drop``)."""
    old = state.gap_events.get(gap)
    if old is None:
        return None
    copies = [(t0, t0 + state.seq.copy_time(e.tensor)) for e in old
              if e.kind in (EventKind.SWAP_IN, EventKind.SWAP_OUT) for t0 in [event_time(e, state.curve.op_end)]]
    own_copy = {e.tensor for e in old if e.kind is EventKind.SWAP_OUT}
    ready = {t: state.host_ready.pop(t) for t in own_copy if t in state.host_ready}
    removed = []
    try:   # propose as if the old swap were not there (the state is restored below)
        for c in copies:
            state.channel.remove(*c)
            removed.append(c)
        p = propose_stalling_swap(state, gap, peak, peak_op, margin)
    except Exception:   # noqa: BLE001 - a copy not where the events say: do not replan it
        p = None
    finally:
        for c in removed:
            state.channel.add(*c)
        state.host_ready.update(ready)
    if p is None or set(p.events) == set(old):
        return None
    return replace(p, drop=old)


def propose_later_swap_in(state: PlanState, gap: int, peak: PeakKey, peak_op: int,
                          margin: float = 0.0) -> Proposal | None:
    """A swapped gap whose tensor is back on the device at the peak (its swap-in starts
    before it): keep its swap-out as planned and bring it back after the peak, late where
    the channel has no room. :func:`propose_again` plans the swap-out anew as well, and its
    new swap-out, not waited for, can leave the tensor on the device at an earlier point
    the old one (waited for) had cleared: a 16 KB parameter re-planned so raised an MLP's
    peak from 66.8 to 67.6 KB at its first ReLU, and the plan stopped 30 % above what fits."""
    old = state.gap_events.get(gap)
    if old is None or state.gaps.kind[gap] == CROSS:
        return None
    t, hi = int(state.gaps.tensor[gap]), int(state.gaps.hi[gap])
    outs = [e for e in old if e.kind is EventKind.SWAP_OUT and e.tensor == t]
    ins = [e for e in old if e.kind is EventKind.SWAP_IN and e.tensor == t]
    if len(outs) != 1 or len(ins) != 1 or len(old) != 2:
        return None
    out, back = outs[0], ins[0]
    d = state.seq.copy_time(t)
    free_from = event_time(out, state.curve.op_end) + d
    if out.before >= 0:   # waited for before op ``before``: freed once that op is entered
        if not _entered_before(state, out.before, peak):
            return None
        in_lo = out.before
    else:
        if not lex_lt(free_from, FIRST, *peak):
            return None   # not freed by the peak: only a new swap-out helps (propose_again)
        in_lo = out.trigger
    in_lo = max(in_lo, min(_peak_step(state, peak, peak_op), hi - 1))
    start = event_time(back, state.curve.op_end)
    state.channel.remove(start, start + d)
    try:
        swap_in, in_wait = _swap_in(state, t, max(free_from, peak[0]), in_lo, hi, in_lo, margin)
    finally:
        state.channel.add(start, start + d)
    if not _after(state, swap_in, peak) or swap_in == back:
        return None
    return Proposal(gap, (out, swap_in), SWAPPED, cost=in_wait, stalls=True, drop=old)


def resident_at_peak(state: PlanState) -> np.ndarray:
    """Per tensor: on the device at the job's peak point (after the change that makes it)."""
    tl = state.curve
    i = tl.peak_index()
    tensors, deltas = tl.tensors[:i + 1], tl.deltas[:i + 1]
    keep = tensors >= 0
    tensors, deltas = tensors[keep][::-1], deltas[keep][::-1]
    resident = np.zeros(len(state.seq.tensors), dtype=bool)
    if len(tensors):
        seen, last = np.unique(tensors, return_index=True)   # each tensor's last change
        resident[seen] = deltas[last] > 0
    return resident


def _swap_out(state: PlanState, t: int, lo: int, hi: int, peak: PeakKey, peak_op: int):
    """(event, host copy ready, the least trigger of the swap-in, wait): a swap-out that
    frees ``t`` before the peak, synchronous if the channel cannot finish it earlier."""
    d = state.seq.copy_time(t)
    x = state.channel.earliest(state.op_end(lo), INF, d)
    if lex_lt(x + d, FIRST, *peak):   # frees before the peak without a wait
        e = event_at(state, x, EventKind.SWAP_OUT, t, lo, hi)
        return e, event_time(e, state.curve.op_end) + d, lo, 0.0
    w = max(peak_op, lo + 1)          # the op whose entry waits for the copy
    if w >= hi or not _entered_before(state, w, peak):
        return None
    e = _issued_at(state, x, EventKind.SWAP_OUT, t, lo, w)
    return e, x + d, w, max(0.0, x + d - float(state.curve.op_entry[w]))


def _swap_in(state: PlanState, t: int, start: float, lo: int, hi: int, floor_trigger: int, margin: float):
    """(event, wait): ``t`` back for op ``hi``, starting no earlier than ``start`` and
    issued after op ``lo`` (when ``floor_trigger`` >= 0, its end bounds the start too);
    in time means ``margin`` seconds before op ``hi``, else op ``hi`` waits for it."""
    d = state.seq.copy_time(t)
    if floor_trigger >= 0:
        start = max(start, state.op_end(floor_trigger))
    deadline = float(state.curve.op_start[hi])
    x = state.channel.latest(start, deadline - margin, d)
    wait = 0.0
    if x is None:
        x = state.channel.earliest(max(start, deadline - d), INF, d)
        wait = max(0.0, x + d - deadline)
    return event_at(state, x, EventKind.SWAP_IN, t, lo, hi), wait


def _propose_cross(state: PlanState, gap: int, peak: PeakKey, peak_op: int, margin: float) -> Proposal | None:
    """The updated tensor ``n`` leaves after its last access, the old ``o`` comes back
    for its first access next iteration; waits where the channel is full."""
    n, o = int(state.gaps.tensor[gap]), int(state.gaps.other[gap])
    lo, hi = int(state.gaps.lo[gap]), int(state.gaps.hi[gap])
    n_ops = len(state.seq.ops)
    d_n = state.seq.copy_time(n)
    x = state.channel.earliest(state.op_end(lo), INF, d_n)
    lo_key = (state.op_end(lo), issued_rank(state.curve.op_step[lo], EventKind.RELEASE))
    after_lo = lex_lt(*lo_key, *peak)
    frees_before = lex_lt(x + d_n, FIRST, *peak)
    out_wait = 0.0
    if after_lo and not frees_before:   # n must be gone by the peak
        w = max(peak_op, lo + 1)
        if w >= n_ops or not _entered_before(state, w, peak):
            return None
        out, frees_before = _issued_at(state, x, EventKind.SWAP_OUT, n, lo, w), True
        out_wait = max(0.0, x + d_n - float(state.curve.op_entry[w]))
    elif x + d_n > float(state.curve.op_end[-1]):   # n must be on the host by the iteration's end
        w = n_ops - 1
        if w <= lo:
            return None
        out = _issued_at(state, x, EventKind.SWAP_OUT, n, lo, w)
        out_wait = max(0.0, x + d_n - float(state.curve.op_entry[w]))
    else:
        out = event_at(state, x, EventKind.SWAP_OUT, n, lo, n_ops)
    before_hi = lex_lt(*peak, float(state.curve.op_start[hi]), float(state.curve.op_step[hi]) * 2 + 1)
    in_lo = min(_peak_step(state, peak, peak_op), hi - 1) if before_hi and not frees_before else -1
    start = peak[0] if in_lo >= 0 else 0.0
    state.channel.add(x, x + d_n)   # the swap-in must not overlap the swap-out just placed
    try:
        swap_in, in_wait = _swap_in(state, o, start, in_lo, hi, in_lo, margin)
    finally:
        state.channel.remove(x, x + d_n)
    if not (frees_before or _after(state, swap_in, peak)):
        return None
    return Proposal(gap, (out, swap_in), SWAPPED, cost=out_wait + in_wait, stalls=True)


def _peak_step(state: PlanState, peak: PeakKey, peak_op: int) -> int:
    """The op whose end closes the stretch of compute holding the peak: the op at the
    peak, or the next one when the peak lies after its end (in a wait or a recompute
    stall before the next op)."""
    if peak_op < 0:
        return 0
    end = (float(state.curve.op_end[peak_op]), float(end_rank(state.curve.op_step[peak_op])))
    return peak_op if lex_lt(*peak, *end) else peak_op + 1


def _issued_at(state: PlanState, x: float, kind: EventKind, t: int, lo: int, w: int) -> Event:
    """An event issued at time ``x`` (after op ``lo``) that op ``w`` waits for: its
    trigger is the last op ended by ``x``, but at most ``w - 1``."""
    k = int(np.searchsorted(state.curve.op_end, x, "right")) - 1
    k = min(max(k, lo), w - 1)
    return Event(k, max(x - state.op_end(k), 0.0), kind, t, w)


def _entered_before(state: PlanState, w: int, peak: PeakKey) -> bool:
    """Op ``w`` is entered (where a synchronous swap-out is waited for) before the peak."""
    entry = (float(state.curve.op_entry[w]), issued_rank(state.curve.op_step[w - 1], EventKind.RECOMPUTE) + 0.1)
    return lex_lt(*entry, *peak)


def _after(state: PlanState, swap_in: Event, peak: PeakKey) -> bool:
    key = (event_time(swap_in, state.curve.op_end), event_rank(swap_in, state.curve.op_step, True))
    return bool(lex_lt(*peak, *key))

