"""Swap scheduling (TENSILE Algorithm 2) on one copy channel: a pure pass.

A tensor can leave the device only in a *gap* (gaps.py). Tensors are immutable, so one
SWAP_OUT gives a host copy that stays valid for the rest of the iteration; a later gap
then needs only a RELEASE after the access before it and a SWAP_IN.

For the gap that holds the peak, :func:`propose_swap` puts the swap-out as early as
possible after the access that opens the gap, finished before the peak, and the
swap-in as late as possible, started after the peak and finished before the access
that closes the gap (less ``swap_in_margin``): no planned swap makes computation wait.
Copies never overlap on the channel. With ``swap_later_accesses`` the planner then
also asks :func:`propose_later_swap` for each of the tensor's later gaps: a RELEASE and
a SWAP_IN again, where that fits (Algorithm 2, line 34).

Cross-iteration: an updated tensor ``n`` (``seq.updates[n] == o``) is swapped out after
its last access in the optimizer phase, finished by the end of the iteration, and ``o``
is swapped in before its first access of the next iteration: in the plan that is a
SWAP_IN of ``o`` (``before`` = that access) triggered at ``-1`` or an early op, and
``o`` is in ``Plan.host_at_start``.

Both functions read a PlanState and return a Proposal (or None); they never change it.

>>> from dbml.scheduler.plan.state import PlanState
>>> from dbml.scheduler.plan.channel import Channel
>>> from dbml.scheduler.plan.gaps import candidates
>>> from dbml.scheduler.synthetic import training_sequence
>>> state = PlanState(training_sequence("j", 60, seed=1), Channel())
>>> peak = state.peak_key()
>>> gap = int(candidates(state.gaps, state.gap_keys(), peak)[0])
>>> p = propose_swap(state, gap, peak, swap_in_margin=0.0)
>>> [e.kind.value for e in p.events], state.events[-1].kind.value   # state unchanged
(['swap_out', 'swap_in'], 'release')
"""

from __future__ import annotations

import numpy as np

from .gaps import CROSS, INNER, OPEN, SWAPPED, lex_lt
from .peak import PeakKey, event_rank, event_time
from .state import PlanState, Proposal
from ..graph.sequence import Event, EventKind

__all__ = ["propose_swap", "propose_later_swap"]


def event_at(state: PlanState, x: float, kind: EventKind, t: int, lo: int, hi: int) -> Event:
    """The event issued at time ``x``: after the last op ended by then, within (lo, hi)."""
    op_end = state.curve.op_end
    trigger = int(np.searchsorted(op_end, x, "right")) - 1
    trigger = min(max(trigger, lo), hi - 1)
    delay = max(x - state.op_end(trigger), 0.0)
    if kind is EventKind.SWAP_IN:   # rounding must not make it finish late
        d, deadline = state.seq.copy_time(t), x + state.seq.copy_time(t)
        while delay > 0 and state.op_end(trigger) + delay + d > deadline:
            delay = float(np.nextafter(delay, -np.inf))
    return Event(trigger, delay, kind, t, hi if kind is EventKind.SWAP_IN else -1)


def propose_swap(state: PlanState, gap: int, peak: PeakKey, swap_in_margin: float) -> Proposal | None:
    """Take the gap's tensor off the device across the peak point, or None if it cannot be."""
    if state.gaps.kind[gap] == CROSS:
        return _propose_cross(state, gap, peak, swap_in_margin)
    p_t, p_r = peak
    t, lo, hi = int(state.gaps.tensor[gap]), int(state.gaps.lo[gap]), int(state.gaps.hi[gap])
    d = state.seq.copy_time(t)
    lo_time = state.op_end(lo)
    deadline = float(state.curve.op_start[hi]) - swap_in_margin
    events = []
    if state.host_ready.get(t, np.inf) <= lo_time and lo >= 0:   # the host copy is still valid
        events.append(Event(lo, 0.0, EventKind.RELEASE, t))
        free_from = lo_time
    else:
        out = state.channel.earliest(lo_time, p_t, d)
        if out is None:
            return None
        events.append(event_at(state, out, EventKind.SWAP_OUT, t, lo, hi))
        free_from = event_time(events[-1], state.curve.op_end) + d
        if free_from > p_t:
            return None
    x = state.channel.latest(max(free_from, p_t), deadline, d)
    if x is None:
        return None
    swap_in = event_at(state, x, EventKind.SWAP_IN, t, lo, hi)
    in_key = (event_time(swap_in, state.curve.op_end), event_rank(swap_in, state.curve.op_step, True))
    if not lex_lt(p_t, p_r, *in_key):
        return None
    return Proposal(gap, (*events, swap_in), SWAPPED)


def propose_later_swap(state: PlanState, gap: int, t: int, after: int,
                       swap_in_margin: float) -> Proposal | None:
    """Tensor ``t``, swapped out in a gap that closes at op ``after``, off the device again
    in a later open gap ``gap`` of its own (release, swap in from the host copy)."""
    lo, hi = int(state.gaps.lo[gap]), int(state.gaps.hi[gap])
    if state.gaps.kind[gap] != INNER or state.gaps.status[gap] != OPEN or lo < after or t in state.seq.outputs:
        return None   # (a graph output is never released)
    deadline = float(state.curve.op_start[hi]) - swap_in_margin
    x = state.channel.latest(max(state.op_end(lo), state.host_ready[t]), deadline, state.seq.copy_time(t))
    if x is None:
        return None
    return Proposal(gap, (Event(lo, 0.0, EventKind.RELEASE, t), event_at(state, x, EventKind.SWAP_IN, t, lo, hi)),
                    SWAPPED)


def _propose_cross(state: PlanState, gap: int, peak: PeakKey, swap_in_margin: float) -> Proposal | None:
    p_t, p_r = peak
    n, o = int(state.gaps.tensor[gap]), int(state.gaps.other[gap])
    lo, hi = int(state.gaps.lo[gap]), int(state.gaps.hi[gap])
    d_n, d_o = state.seq.copy_time(n), state.seq.copy_time(o)
    end = float(state.curve.op_end[-1])
    out = state.channel.earliest(state.op_end(lo), end, d_n)
    x = state.channel.latest(0.0, float(state.curve.op_start[hi]) - swap_in_margin, d_o)
    if out is None or x is None or (out < x + d_o and x < out + d_n):   # the two copies overlap
        return None
    swap_out = event_at(state, out, EventKind.SWAP_OUT, n, lo, len(state.seq.ops))
    swap_in = event_at(state, x, EventKind.SWAP_IN, o, -1, hi)
    out_end = event_time(swap_out, state.curve.op_end) + d_n
    in_key = (event_time(swap_in, state.curve.op_end), event_rank(swap_in, state.curve.op_step, True))
    covered = (out_end <= p_t and out_end <= end) or lex_lt(p_t, p_r, *in_key)
    if not covered or out_end > end:
        return None
    return Proposal(gap, (swap_out, swap_in), SWAPPED)
