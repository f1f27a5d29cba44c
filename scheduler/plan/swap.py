"""Swap scheduling (TENSILE Algorithm 2) on one copy channel.

A tensor can leave the device only in a *gap*: between two consecutive accesses
(its TGA or the iteration start, then the ops that read it). Tensors are immutable, so
one SWAP_OUT gives a host copy that stays valid for the rest of the iteration; a later
gap then needs only a RELEASE after the access before it and a SWAP_IN.

For the gap that holds the peak, :func:`schedule_swap` puts the swap-out as early as
possible after the access that opens the gap, finished before the peak, and the
swap-in as late as possible, started after the peak and finished before the access
that closes the gap (less ``swap_in_margin``): no planned swap makes computation wait.
Copies never overlap on the channel. With ``swap_later_accesses`` the tensor is then
also released and swapped in again in each of its later gaps where that fits
(Algorithm 2, line 34).

Cross-iteration: an updated tensor ``n`` (``seq.updates[n] == o``) is swapped out after
its last access in the optimizer phase, finished by the end of the iteration, and ``o``
is swapped in before its first access of the next iteration: in the plan that is a
SWAP_IN of ``o`` (``before`` = that access) triggered at ``-1`` or an early op, and
``o`` is in ``Plan.host_at_start``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .peak import FIRST, event_rank, event_time
from ..graph.sequence import Event, EventKind

if TYPE_CHECKING:
    from .planner import JobSchedule

INNER, CROSS = 0, 1
OPEN, SWAPPED, RECOMPUTED, PINNED = 0, 1, 2, 3
START_RANK = 2 * FIRST   # rank of the iteration-start totals
TOL = 1e-12              # seconds: float rounding between equal event times


class Channel:
    """Busy intervals of one copy channel, disjoint and sorted."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def fits(self, start: float, end: float) -> bool:
        """Free for [start, end), up to float rounding of re-derived event times."""
        i = bisect.bisect_left(self.starts, start)
        return not ((i > 0 and self.ends[i - 1] > start + TOL) or
                    (i < len(self.starts) and self.starts[i] < end - TOL))

    def add(self, start: float, end: float) -> None:
        if not self.fits(start, end):
            raise AssertionError(f"copy [{start}, {end}) overlaps the channel's busy intervals")
        i = bisect.bisect_left(self.starts, start)
        self.starts.insert(i, start)
        self.ends.insert(i, end)

    def remove(self, start: float, end: float) -> None:
        i = bisect.bisect_left(self.starts, start)
        assert self.starts[i] == start and self.ends[i] == end, (start, end)
        del self.starts[i], self.ends[i]

    def earliest(self, lo: float, hi: float, d: float) -> float | None:
        """Earliest x >= lo with [x, x + d) free and x + d <= hi."""
        x = lo
        i = max(bisect.bisect_right(self.starts, lo) - 1, 0)
        while i < len(self.starts) and self.starts[i] < x + d:
            x = max(x, self.ends[i])
            i += 1
        return x if x + d <= hi else None

    def latest(self, lo: float, hi: float, d: float) -> float | None:
        """Latest x >= lo with [x, x + d) free and x + d <= hi."""
        x = hi - d
        j = bisect.bisect_left(self.starts, hi) - 1
        while j >= 0 and self.ends[j] > x:
            x = min(x, self.starts[j] - d)
            j -= 1
        return x if x >= lo else None


@dataclass
class Gaps:
    """Every gap of every tensor of one job, as arrays (``hi == len(ops)``: the iteration end)."""

    tensor: np.ndarray   # the tensor that leaves (for CROSS: the updated tensor n)
    other: np.ndarray    # CROSS: the old tensor o swapped in next iteration; else -1
    lo: np.ndarray       # op index of the access that opens the gap (-1: iteration start)
    hi: np.ndarray       # op index of the access that closes it (CROSS: o's first access)
    kind: np.ndarray
    nbytes: np.ndarray
    status: np.ndarray
    by_size: np.ndarray  # gap indices, largest tensor first (stable)
    _by_tensor: dict | None = None

    def of_tensor(self, tensor: int) -> list[int]:
        """The gaps of a tensor (as ``tensor`` or, for CROSS, as ``other``), in order."""
        if self._by_tensor is None:
            self._by_tensor = {}
            for g, (t, o) in enumerate(zip(self.tensor.tolist(), self.other.tolist())):
                self._by_tensor.setdefault(t, []).append(g)
                if o >= 0:
                    self._by_tensor.setdefault(o, []).append(g)
        return self._by_tensor.get(tensor, [])


def find_gaps(seq, live) -> Gaps:
    rows = []
    targets = {o: n for n, o in seq.updates.items()}
    for t, info in enumerate(seq.tensors):
        if info.nbytes == 0 or (live.gen[t] == -1 and t not in seq.initial):
            continue
        points = [live.gen[t]] + [a for a in live.accesses[t] if a != live.gen[t]]
        for a, b in zip(points, points[1:]):
            if b - a >= 2 and not (a == -1 and t in targets):
                rows.append((t, -1, a, b, INNER))
    for n, o in sorted(seq.updates.items()):
        if seq.tensors[n].nbytes and live.gen[n] >= 0 and o in seq.initial and live.accesses[o]:
            rows.append((n, o, live.last_access(n), live.accesses[o][0], CROSS))
    t, other, lo, hi, kind = (np.array(c, dtype=np.int64) for c in zip(*rows)) if rows else [np.zeros(0, np.int64)] * 5
    nbytes = np.array([seq.tensors[x].nbytes for x in t.tolist()], dtype=np.int64)
    return Gaps(t, other, lo, hi, kind, nbytes, np.zeros(len(t), dtype=np.int64),
                np.argsort(-nbytes, kind="stable"))


def lex_lt(at, ar, bt, br):
    return (at < bt) | ((at == bt) & (ar < br))


def gap_keys(js: "JobSchedule"):
    """(time, rank) of each gap's opening (after its release) and closing (op start)."""
    g, tl = js.gaps, js.curve
    lo_t = np.where(g.lo >= 0, tl.op_end[np.maximum(g.lo, 0)], 0.0)
    lo_r = np.where(g.lo >= 0, 2.0 * tl.op_step[np.maximum(g.lo, 0)] + 2.1, START_RANK)
    hi = np.minimum(g.hi, len(tl.op_start) - 1)
    return lo_t, lo_r, tl.op_start[hi], 2.0 * tl.op_step[hi] + 1


def candidates(js: "JobSchedule", p_t: float, p_r: float) -> np.ndarray:
    """Open gaps that hold the peak point, largest tensor first (ties: gap order)."""
    lo_t, lo_r, hi_t, hi_r = js.gap_keys()
    after_lo = lex_lt(lo_t, lo_r, p_t, p_r)
    before_hi = lex_lt(p_t, p_r, hi_t, hi_r)
    is_inner = js.gaps.kind == INNER
    holds = np.where(is_inner, after_lo & before_hi, after_lo | before_hi)
    order = js.gaps.by_size
    return order[(holds & (js.gaps.status == OPEN))[order]]


def schedule_swap(js: "JobSchedule", gap: int, p_t: float, p_r: float, settings) -> bool:
    """Try to take the gap's tensor off the device across the peak point; commit on success."""
    if js.gaps.kind[gap] == CROSS:
        return _schedule_cross(js, gap, p_t, p_r, settings)
    t, lo, hi = int(js.gaps.tensor[gap]), int(js.gaps.lo[gap]), int(js.gaps.hi[gap])
    d = js.seq.copy_time(t)
    lo_time = js.op_end(lo)
    deadline = float(js.curve.op_start[hi]) - settings.swap_in_margin
    events = []
    if js.host_ready.get(t, np.inf) <= lo_time and lo >= 0:
        events.append(Event(lo, 0.0, EventKind.RELEASE, t))
        free_from = lo_time
    else:
        out = js.channel.earliest(lo_time, p_t, d)
        if out is None:
            return False
        events.append(js.event_at(out, EventKind.SWAP_OUT, t, lo, hi))
        free_from = event_time(events[-1], js.curve.op_end) + d
        if free_from > p_t:
            return False
    x = js.channel.latest(max(free_from, p_t), deadline, d)
    if x is None:
        return False
    swap_in = js.event_at(x, EventKind.SWAP_IN, t, lo, hi)
    if not lex_lt(p_t, p_r, event_time(swap_in, js.curve.op_end), event_rank(swap_in, js.curve.op_step, True)):
        return False
    js.commit(gap, events + [swap_in])
    if settings.swap_later_accesses:
        _swap_later_gaps(js, t, hi, settings)
    return True


def _swap_later_gaps(js: "JobSchedule", t: int, after: int, settings) -> None:
    d = js.seq.copy_time(t)
    for gap in js.gaps.of_tensor(t):
        lo, hi = int(js.gaps.lo[gap]), int(js.gaps.hi[gap])
        if js.gaps.kind[gap] != INNER or js.gaps.status[gap] != OPEN or lo < after:
            continue
        deadline = float(js.curve.op_start[hi]) - settings.swap_in_margin
        x = js.channel.latest(max(js.op_end(lo), js.host_ready[t]), deadline, d)
        if x is not None:
            js.commit(gap, [Event(lo, 0.0, EventKind.RELEASE, t), js.event_at(x, EventKind.SWAP_IN, t, lo, hi)])


def _schedule_cross(js: "JobSchedule", gap: int, p_t: float, p_r: float, settings) -> bool:
    n, o = int(js.gaps.tensor[gap]), int(js.gaps.other[gap])
    lo, hi = int(js.gaps.lo[gap]), int(js.gaps.hi[gap])
    end = float(js.curve.op_end[-1])
    out = js.channel.earliest(js.op_end(lo), end, js.seq.copy_time(n))
    x = js.channel.latest(0.0, float(js.curve.op_start[hi]) - settings.swap_in_margin, js.seq.copy_time(o))
    if out is None or x is None or (out < x + js.seq.copy_time(o) and x < out + js.seq.copy_time(n)):
        return False
    swap_out = js.event_at(out, EventKind.SWAP_OUT, n, lo, len(js.seq.ops))
    swap_in = js.event_at(x, EventKind.SWAP_IN, o, -1, hi)
    out_end = event_time(swap_out, js.curve.op_end) + js.seq.copy_time(n)
    in_key = (event_time(swap_in, js.curve.op_end), event_rank(swap_in, js.curve.op_step, True))
    covered = (out_end <= p_t and out_end <= end) or lex_lt(p_t, p_r, *in_key)
    if not covered or out_end > end:
        return False
    js.commit(gap, [swap_out, swap_in])
    return True
