"""Gaps: where a tensor can leave the device, and which gaps hold a peak point.

A tensor can leave the device only in a *gap*: between two consecutive accesses (its
TGA or the iteration start, then the ops that read it). An INNER gap lies within the
iteration; a CROSS gap runs from an updated tensor ``n``'s last access in the optimizer
phase to the first access of the tensor ``o`` it replaces, in the next iteration
(``seq.updates[n] == o``). Each gap has a status: OPEN until a swap or a recompute takes
its tensor off the device (SWAPPED, RECOMPUTED), or a recompute needs its tensor kept
resident (PINNED).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .liveness import analyse_liveness
from .peak import START_RANK, PeakKey, Timeline, issued_rank, start_rank
from ..graph.sequence import AccessSequence, EventKind

INNER, CROSS = 0, 1                          # Gaps.kind
OPEN, SWAPPED, RECOMPUTED, PINNED = 0, 1, 2, 3   # Gaps.status

GapKeys = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]   # lo time, lo rank, hi time, hi rank


@dataclass
class Gaps:
    """Every gap of every tensor of one job, as arrays (``hi == len(ops)``: the iteration end).
    Only ``status`` changes, and only when the planner commits a proposal."""

    tensor: np.ndarray   # the tensor that leaves (for CROSS: the updated tensor n)
    other: np.ndarray    # CROSS: the old tensor o swapped in next iteration; else -1
    lo: np.ndarray       # op index of the access that opens the gap (-1: iteration start)
    hi: np.ndarray       # op index of the access that closes it (CROSS: o's first access)
    kind: np.ndarray     # INNER or CROSS
    nbytes: np.ndarray
    status: np.ndarray   # OPEN, SWAPPED, RECOMPUTED or PINNED
    by_size: np.ndarray  # gap indices, largest tensor first (stable)
    _by_tensor: dict | None = None   # of_tensor's index, built on first use

    def of_tensor(self, tensor: int) -> list[int]:
        """The gaps of a tensor (as ``tensor`` or, for CROSS, as ``other``), in order."""
        if self._by_tensor is None:
            self._by_tensor = {}
            for g, (t, o) in enumerate(zip(self.tensor.tolist(), self.other.tolist())):
                self._by_tensor.setdefault(t, []).append(g)
                if o >= 0:
                    self._by_tensor.setdefault(o, []).append(g)
        return self._by_tensor.get(tensor, [])


def find_gaps(seq: AccessSequence) -> Gaps:
    """Every gap of two ops or more of every tensor that holds memory, all OPEN."""
    live = analyse_liveness(seq)
    rows = []
    targets = {o: n for n, o in seq.updates.items()}
    for t, info in enumerate(seq.tensors):
        if info.nbytes == 0 or (live.gen[t] == -1 and t not in seq.initial):
            continue
        if info.caller_held:
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
    """(at, ar) < (bt, br) for (time, rank) keys, elementwise on arrays."""
    return (at < bt) | ((at == bt) & (ar < br))


def gap_keys(gaps: Gaps, curve: Timeline) -> GapKeys:
    """(time, rank) of each gap's opening (after its release) and closing (op start)."""
    lo = np.maximum(gaps.lo, 0)
    lo_t = np.where(gaps.lo >= 0, curve.op_end[lo], 0.0)
    lo_r = np.where(gaps.lo >= 0, issued_rank(curve.op_step[lo], EventKind.RELEASE), START_RANK)
    hi = np.minimum(gaps.hi, len(curve.op_start) - 1)
    return lo_t, lo_r, curve.op_start[hi], start_rank(curve.op_step[hi])


def candidates(gaps: Gaps, keys: GapKeys, peak: PeakKey, status: int = OPEN) -> np.ndarray:
    """Gaps of ``status`` (open ones by default) that hold the peak point, largest tensor
    first (ties: gap order)."""
    lo_t, lo_r, hi_t, hi_r = keys
    p_t, p_r = peak
    after_lo = lex_lt(lo_t, lo_r, p_t, p_r)
    before_hi = lex_lt(p_t, p_r, hi_t, hi_r)
    holds = np.where(gaps.kind == INNER, after_lo & before_hi, after_lo | before_hi)
    order = gaps.by_size
    return order[(holds & (gaps.status == status))[order]]
