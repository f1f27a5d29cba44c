"""Memory peak analysis (TENSILE Algorithm 1): sequence + events -> peak.

The model is an exact ledger of device bytes. An executor that adds and removes bytes
by these rules measures the same curve; its only error is timing (latencies, copies).

Compute channel. Ops run in order; before op ``b`` run the RECOMPUTEs with
``before == b`` (in event order), each a *stall* as long as the latency of the tensor's
generating op. Stalls delay op ``b`` and everything after it, so event times are
relative to their trigger: ``time = end(trigger) + delay``, ``end(-1) = 0``.

Ledger rules (bytes of ``seq.tensors[t].nbytes``):

1. Iteration start (time 0): ``workspace`` + every initial tensor except
   ``host_at_start`` (initial tensors whose first swap event is a SWAP_IN).
2. Op start: + each output (TGA), all at once, before the op computes. An updated
   tensor written in place (``Liveness.in_place``: its old tensor is not read after
   this op) takes the old tensor's storage: + new - old (zero for equal sizes).
3. RECOMPUTE start (the stall's start): + every output of the generating op; at the
   stall's end - the outputs other than the recomputed tensor. A chain (``via``): the
   stall runs the generating op of each tensor in ``via``, then the tensor's, and adds
   every output of every one of them at its start; at its end it removes all but the
   recomputed tensor (``recompute_ops``, ``stall_latency``).
4. SWAP_IN: + at the copy's *start* (the destination is allocated then). The paper
   counts it at the copy's end; that is optimistic and a ledger would exceed it.
5. SWAP_OUT: - at the copy's end (start + nbytes / copy_bandwidth), or, if later, at
   the end of the last op that reads the tensor after the trigger and before it comes
   back (its next SWAP_IN or RECOMPUTE): the paper's "or at the end of the
   corresponding TUA". The planner issues swap-outs only after that access, so for its
   plans this is always the copy's end.
6. RELEASE: - at its time: after op ``trigger`` ends (``delay`` 0), before the next op
   or stall starts.
7. Planned waits (stalls the planner chose, ``PlanSettings.stalls``): op ``b`` is
   *entered* (before its recompute stalls) no earlier than the copy end of every
   SWAP_OUT with ``before == b`` (a synchronous swap-out: its bytes are free before op
   ``b``), and *starts* no earlier than the copy end of every SWAP_IN with
   ``before == b`` (a late swap-in: op ``b`` waits for it). A wait delays op ``b`` and
   everything after it, as a recompute stall does.

Order of changes at one instant: copy completions (SWAP_OUT frees) first; then, step
by step along the compute channel, a step's start (+) before its end (-); events
issued with ``delay == 0`` after op ``k`` go after op ``k``'s end and before the next
step, in ``EVENT_ORDER`` (RELEASEs before SWAP_INs); an event with ``delay > 0`` that lands exactly on a
step boundary frees first or allocates last; changes with the same key free first.
The peak is the largest running total, so a zero-latency op still holds its inputs
and outputs together.

The executor mirrors this: allocate an op's outputs before running it (in place for
``Liveness.in_place``); after op ``k`` completes, perform its delay-0 RELEASEs, then
its RECOMPUTEs (re-run the generating op, keep only the tensor), then start the next
op; allocate a swap-in when its copy starts; free a swapped-out tensor when its copy
completes (rule 5). Tensors are immutable, so a host copy stays valid: a later
RELEASE + SWAP_IN of the same tensor needs no second SWAP_OUT. ``Plan.host_at_start``
tensors are on the host when an iteration starts: the updated tensors swapped out in
the optimizer phase (never swapped back in) become them for the next iteration; before
the first iteration under a plan, the executor moves them to the host.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from .liveness import analyse_liveness
from .rules import op_changes, recompute_outputs, stall_latency
from ..graph.sequence import EVENT_ORDER, EVENT_RANK, AccessSequence, Event, EventKind

PeakKey = tuple[float, float]   # (time, rank) of a change point: where the peak is

# Ranks order the ledger's changes at one instant (the rules above). Compute step ``s``
# (an op or a recompute stall) starts at rank 2s + 1 and ends at 2s + 2; an event issued
# with delay 0 after it changes the ledger at 2s + 2 + ISSUED[kind], before step s + 1
# starts, in EVENT_ORDER (graph/sequence.py: the one order of simultaneous events).
FIRST = -1e18            # before everything else at the same instant
LAST = 1e18              # after everything else at the same instant
START_RANK = 2 * FIRST   # the iteration-start totals, before even FIRST
ISSUED = {kind: (EVENT_RANK[kind] + 1) / (len(EVENT_ORDER) + 1) for kind in EVENT_ORDER}
_ISSUED = np.array([ISSUED[kind] for kind in EVENT_ORDER])   # indexed by EVENT_RANK
# event_arrays() codes a RELEASE/SWAP event's kind as its EVENT_RANK
_RELEASE, _SWAP_OUT, _SWAP_IN = (EVENT_RANK[k] for k in (EventKind.RELEASE, EventKind.SWAP_OUT,
                                                         EventKind.SWAP_IN))


def start_rank(step):
    """Rank of compute step ``step``'s start (an int or an array of them)."""
    return 2.0 * step + 1


def end_rank(step):
    """Rank of compute step ``step``'s end."""
    return 2.0 * step + 2


def issued_rank(step, kind: EventKind):
    """Rank of the change a delay-0 event of ``kind`` causes after step ``step`` (-1: the
    iteration start)."""
    return 2.0 * step + 2 + ISSUED[kind]


@dataclass(frozen=True)
class Peak:
    bytes: int                 # largest device footprint over the iteration
    time: float                # seconds from iteration start (stalls included)
    op: int                    # last op started at or before the peak (the paper's LUA); -1 if none
    resident: frozenset[int]   # tensors on the device at the peak
    duration: float            # iteration time including recompute stalls and waits


@dataclass
class Timeline:
    """The ledger's change points sorted by (time, rank); ``usage`` is the total after each."""

    times: np.ndarray
    ranks: np.ndarray
    deltas: np.ndarray
    tensors: np.ndarray        # tensor id of each change, -1 for the iteration-start total
    usage: np.ndarray
    op_start: np.ndarray       # effective op start/end (stalls included)
    op_end: np.ndarray
    op_step: np.ndarray        # compute-step index of each op (ops and recomputes)
    op_entry: np.ndarray       # when each op is entered: after its swap-out waits, before its recompute stalls
    waited: float = 0.0        # seconds of planned waits (rule 7) in total

    def peak_index(self) -> int:
        return int(np.argmax(self.usage)) if len(self.usage) else 0

    def key(self, i: int) -> tuple[float, float]:
        return float(self.times[i]), float(self.ranks[i])

    def free(self, start: tuple[float, float], end: tuple[float, float] | None,
             nbytes: int, tensor: int) -> None:
        """Take ``nbytes`` off the curve from key ``start`` to key ``end`` (None: to the end)."""
        i = self._position(start, first=True)
        j = self._position(end, first=False) if end else len(self.usage)
        before_i = self.usage[i - 1] if i else 0
        before_j = self.usage[j - 1] if j else 0
        cols = ("times", "ranks", "deltas", "tensors", "usage")
        new_i = (start[0], start[1], -nbytes, tensor, before_i)
        new_j = (end[0], end[1], nbytes, tensor, before_j) if end else None
        for name, vi, vj in zip(cols, new_i, new_j or new_i):
            setattr(self, name, _insert2(getattr(self, name), i, j, vi, vj if end else None))
        self.usage[i:j + 1] -= nbytes

    def _position(self, key: tuple[float, float], first: bool) -> int:
        """Where a change with this key goes: before equal keys (frees) or after them."""
        t, r = key
        lo, hi = np.searchsorted(self.times, t, "left"), np.searchsorted(self.times, t, "right")
        return int(lo + np.searchsorted(self.ranks[lo:hi], r, "left" if first else "right"))


def _insert2(a: np.ndarray, i: int, j: int, vi, vj) -> np.ndarray:
    """``a`` with ``vi`` inserted before a[i] and, if not None, ``vj`` before a[j] (i <= j)."""
    out = np.empty(len(a) + 1 + (vj is not None), dtype=a.dtype)
    out[:i], out[i] = a[:i], vi
    if vj is None:
        out[i + 1:] = a[i:]
    else:
        out[i + 1:j + 1], out[j + 1], out[j + 2:] = a[i:j], vj, a[j:]
    return out


def host_at_start(seq: AccessSequence, events) -> frozenset[int]:
    """Initial tensors whose first swap event is a SWAP_IN: they start on the host."""
    first: dict[int, EventKind] = {}
    for e in sorted(events, key=lambda e: (e.trigger, e.delay)):
        if e.kind in (EventKind.SWAP_IN, EventKind.SWAP_OUT) and e.tensor in seq.initial:
            first.setdefault(e.tensor, e.kind)
    return frozenset(t for t, k in first.items() if k is EventKind.SWAP_IN)


def analyse_peak(seq: AccessSequence, events) -> Peak:
    """Algorithm 1: the peak of the ledger described in the module docstring.

    >>> from dbml.scheduler.graph.sequence import TensorInfo, TensorKind, Op, Phase
    >>> t = [TensorInfo(i, f"t{i}", 4, TensorKind.ACTIVATION) for i in range(3)]
    >>> ops = (Op(0, "a", (0,), (1,), 0.0, 1.0, Phase.FORWARD), Op(1, "b", (1,), (2,), 1.0, 2.0, Phase.FORWARD))
    >>> seq = AccessSequence("j", tuple(t), ops, frozenset({0}), outputs=frozenset({2}))
    >>> p = analyse_peak(seq, [Event(1, 0.0, EventKind.RELEASE, 1)])
    >>> p.bytes, p.op, sorted(p.resident)   # op b holds its input, its output and t0
    (12, 1, [0, 1, 2])
    """
    tl = build_timeline(seq, tuple(events))
    if len(tl.usage) == 0:
        return Peak(seq.workspace, 0.0, -1, frozenset(), 0.0)
    p = tl.peak_index()
    resident = _resident_after(tl, p)
    return Peak(int(tl.usage[p]), float(tl.times[p]), op_at(tl, p), resident,
                float(tl.op_end[-1]) if len(tl.op_end) else 0.0)


def op_at(tl: Timeline, p: int) -> int:
    """Index of the last op whose start is at or before change point ``p``."""
    t, r = tl.key(p)
    started = (tl.op_start < t) | ((tl.op_start == t) & (start_rank(tl.op_step) <= r))
    return int(np.count_nonzero(started)) - 1


def _resident_after(tl: Timeline, p: int) -> frozenset[int]:
    resident: set[int] = set()
    for t, d in zip(tl.tensors[: p + 1].tolist(), tl.deltas[: p + 1].tolist()):
        if t < 0:
            continue
        if d > 0:
            resident.add(t)
        elif d < 0:
            resident.discard(t)
    return frozenset(resident)


@dataclass(frozen=True)
class Static:
    """What the ledger needs from a sequence that no plan changes (computed once per job)."""

    nbytes: np.ndarray
    op_start: np.ndarray
    op_end: np.ndarray
    change_op: np.ndarray      # op start changes: op index, delta, tensor
    change_delta: np.ndarray
    change_tensor: np.ndarray
    initial: np.ndarray        # initial tensor ids, ascending


def static_ledger(seq: AccessSequence) -> Static:
    nbytes = np.array([t.nbytes for t in seq.tensors], dtype=np.int64)
    rows = [(k, d, t) for k, changes in enumerate(op_changes(seq)) for t, d in changes]   # rule 2: rules.py
    op_i, delta, tensor = (np.array(c, dtype=np.int64) for c in zip(*rows)) if rows else [np.zeros(0, np.int64)] * 3
    return Static(nbytes, np.array([op.start for op in seq.ops], dtype=float),
                  np.array([op.end for op in seq.ops], dtype=float), op_i, delta, tensor,
                  np.array(sorted(seq.initial), dtype=np.int64))


def event_arrays(seq: AccessSequence, events) -> tuple[np.ndarray, ...]:
    """(trigger, delay, tensor, kind as EVENT_RANK, hold, before) of the RELEASE/SWAP events,
    for the ledger."""
    ev = [e for e in events if e.kind is not EventKind.RECOMPUTE]
    n = len(ev)
    return (np.fromiter((e.trigger for e in ev), np.int64, n), np.fromiter((e.delay for e in ev), float, n),
            np.fromiter((e.tensor for e in ev), np.int64, n),
            np.fromiter((EVENT_RANK[e.kind] for e in ev), np.int64, n), _swap_out_holds(seq, ev, events),
            np.fromiter((e.before for e in ev), np.int64, n))


def _swap_out_holds(seq: AccessSequence, ev, events) -> np.ndarray:
    """Per event: for a SWAP_OUT, the last op that reads its tensor after the trigger and
    before the tensor comes back (its next SWAP_IN or RECOMPUTE); -1 if none or not a
    swap-out. The device copy is freed no earlier than that op's end (rule 5)."""
    live = analyse_liveness(seq)
    back: dict[int, list[int]] = {}
    for e in events:
        if e.kind in (EventKind.SWAP_IN, EventKind.RECOMPUTE):
            back.setdefault(e.tensor, []).append(e.before)
    holds = np.full(len(ev), -1, dtype=np.int64)
    for i, e in enumerate(ev):
        if e.kind is not EventKind.SWAP_OUT:
            continue
        returns = [b for b in back.get(e.tensor, []) if b > e.trigger]
        acc = live.accesses[e.tensor]
        lo, hi = bisect.bisect_right(acc, e.trigger), bisect.bisect_left(acc, min(returns, default=1 << 62))
        if hi > lo:
            holds[i] = acc[hi - 1]
    return holds


def build_timeline(seq: AccessSequence, events: tuple[Event, ...], static: Static | None = None,
                   on_host: frozenset[int] | None = None,
                   arrays: tuple[np.ndarray, ...] | None = None) -> Timeline:
    """The ledger's change points for these events. ``static``, ``on_host`` and the
    RELEASE/SWAP events' ``arrays`` may be passed in when known; ``events`` then need
    hold only the RECOMPUTEs."""
    static = static or static_ledger(seq)
    on_host = host_at_start(seq, events) if on_host is None else on_host
    recomputes = sorted(e for e in events if e.kind is EventKind.RECOMPUTE)
    arrays = event_arrays(seq, events) if arrays is None else arrays
    steps = _compute_steps(seq, recomputes, static, arrays)
    op_start, op_end, op_step = steps.op_start, steps.op_end, steps.op_step
    op_starts = (op_start[static.change_op], start_rank(op_step[static.change_op]),
                 static.change_delta, static.change_tensor)
    changes = [steps.stall_changes, _initial_change(seq, on_host, static), op_starts,
               _event_changes(seq, arrays, op_end, op_step, static.nbytes, steps.op_entry)]
    times, ranks, deltas, tensors = (np.concatenate(c) for c in zip(*changes))
    order = np.lexsort((deltas, ranks, times))  # simultaneous changes: frees first
    times, ranks, deltas, tensors = times[order], ranks[order], deltas[order], tensors[order]
    return Timeline(times, ranks, deltas, tensors, np.cumsum(deltas), op_start, op_end, op_step,
                    steps.op_entry, steps.waited)


def _arrays(rows):
    if not rows:
        return (np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    t, r, d, x = zip(*rows)
    return (np.array(t, dtype=float), np.array(r, dtype=float),
            np.array(d, dtype=np.int64), np.array(x, dtype=np.int64))


def _initial_change(seq, on_host, static):
    on_device = static.initial[~np.isin(static.initial, list(on_host))] if on_host else static.initial
    tensors = np.concatenate(([-1], on_device))
    deltas = np.concatenate(([seq.workspace], static.nbytes[on_device])).astype(np.int64)
    return np.zeros(len(tensors)), np.full(len(tensors), START_RANK), deltas, tensors


@dataclass(frozen=True)
class _Steps:
    op_entry: np.ndarray
    op_start: np.ndarray
    op_end: np.ndarray
    op_step: np.ndarray
    stall_changes: tuple
    waited: float


def _compute_steps(seq, recomputes, static, arrays) -> _Steps:
    """Effective op times with recompute stalls and planned waits (rule 7), and the
    stalls' ledger changes."""
    n = len(seq.ops)
    by_before: dict[int, list[Event]] = {}
    for e in recomputes:
        if e.trigger != e.before - 1 or e.delay != 0.0:
            raise ValueError(f"job {seq.job!r}: RECOMPUTE of tensor {e.tensor} must have "
                             f"trigger == before - 1 and delay 0, got {e}")
        by_before.setdefault(e.before, []).append(e)
    stall = np.zeros(n)
    count = np.zeros(n, dtype=np.int64)
    for b, es in by_before.items():
        stall[b] = sum(stall_latency(seq, e) for e in es)
        count[b] = len(es)
    shift = np.cumsum(stall)
    op_start, op_end = static.op_start + shift, static.op_end + shift
    wait_entry, wait_start = _waits(seq, arrays, op_start, op_end, stall, static.nbytes)
    waited = 0.0
    if wait_entry is not None:
        waits = wait_entry + wait_start
        waited = float(waits.sum())
        moved = np.cumsum(waits)
        op_start, op_end = op_start + moved, op_end + moved
    op_entry = op_start - stall - (wait_start if wait_entry is not None else 0.0)
    if n > 1:   # never before the previous op's end (float rounding of the subtraction)
        op_entry[1:] = np.maximum(op_entry[1:], op_end[:-1])
    op_step = np.arange(n, dtype=np.int64) + np.cumsum(count)
    rows = []
    for b, es in by_before.items():
        t0 = float(op_entry[b])
        for m, e in enumerate(es):
            outs = recompute_outputs(seq, e)
            s = op_step[b] - len(es) + m
            rows += [(t0, start_rank(s), seq.tensors[o].nbytes, o) for o in outs]
            t0 += stall_latency(seq, e)
            rows += [(t0, end_rank(s), -seq.tensors[o].nbytes, o) for o in outs if o != e.tensor]
    return _Steps(op_entry, op_start, op_end, op_step, _arrays(rows), waited)


WAIT_TOL = 1e-12   # seconds: a copy ending this little after its op's start is on time (rounding)


def _waits(seq, arrays, op_start, op_end, stall, nbytes):
    """Rule 7: per op, the wait before its entry (synchronous swap-outs) and before its
    start (late swap-ins); (None, None) if nothing waits. Waits only delay later ops, so
    a copy on time without them stays on time: only the late ones are walked, in op order."""
    trig, delay, tensor, kind, _, before = arrays
    waiting = (before >= 0) & ((kind == _SWAP_IN) | (kind == _SWAP_OUT))
    if not waiting.any():
        return None, None
    b = np.where(waiting, before, 0)
    ends = np.where(trig >= 0, op_end[np.maximum(trig, 0)], 0.0) + delay + nbytes[tensor] / seq.copy_bandwidth
    is_in = kind == _SWAP_IN
    need = np.where(is_in, op_start[b], op_start[b] - stall[b])
    late = np.flatnonzero(waiting & (ends > need + WAIT_TOL))
    if not len(late):
        return None, None
    n = len(op_start)
    wait_entry, wait_start = np.zeros(n), np.zeros(n)
    ops_w: list[int] = []       # ops that wait so far, ascending
    total: list[float] = []     # waits at ops up to and including ops_w[i]
    for i in sorted(late.tolist(), key=lambda i: (before[i], bool(is_in[i]))):
        op, k = int(before[i]), int(trig[i])
        j = bisect.bisect_right(ops_w, k)
        end = ends[i] + (total[j - 1] if j and k >= 0 else 0.0)
        j = bisect.bisect_right(ops_w, op - 1)
        moved = total[j - 1] if j else 0.0
        if is_in[i]:
            wait = end - (need[i] + moved + wait_entry[op] + wait_start[op])
            if wait > WAIT_TOL:
                wait_start[op] += wait
        else:
            wait = end - (need[i] + moved + wait_entry[op])
            if wait > WAIT_TOL:
                wait_entry[op] += wait
        if ops_w and ops_w[-1] == op:
            total[-1] = moved + wait_entry[op] + wait_start[op]
        elif wait_entry[op] or wait_start[op]:
            ops_w.append(op)
            total.append(moved + wait_entry[op] + wait_start[op])
    return wait_entry, wait_start


def event_time(e: Event, op_end: np.ndarray) -> float:
    return (float(op_end[e.trigger]) if e.trigger >= 0 else 0.0) + e.delay


def event_rank(e: Event, op_step: np.ndarray, adds: bool) -> float:
    """Rank of the change an event causes at its issue time (see the module docstring)."""
    if e.delay != 0.0:
        return LAST if adds else FIRST
    step = int(op_step[e.trigger]) if e.trigger >= 0 else -1
    return issued_rank(step, e.kind)


def _event_changes(seq, arrays, op_end, op_step, nbytes, op_entry):
    trig, delay, tensor, kind, hold, before = arrays   # kind: EVENT_RANK of RELEASE, SWAP_OUT, SWAP_IN
    issued = np.where(trig >= 0, op_end[np.maximum(trig, 0)], 0.0) + delay
    step = np.where(trig >= 0, op_step[np.maximum(trig, 0)], -1)
    swap_in, swap_out = kind == _SWAP_IN, kind == _SWAP_OUT
    rank = np.where(delay != 0.0, np.where(swap_in, LAST, FIRST), 2.0 * step + 2 + _ISSUED[kind])
    b = nbytes[tensor]
    copied = issued + b / seq.copy_bandwidth
    held = op_end[np.maximum(hold, 0)]
    waits = swap_out & (hold >= 0) & (held > copied)   # still read after the copy ends
    # a synchronous swap-out frees by the time its op is entered (they differ by rounding only)
    synchronous = swap_out & (before >= 0)
    copied = np.where(synchronous, np.minimum(copied, op_entry[np.where(synchronous, before, 0)]), copied)
    times = np.where(swap_out, np.where(waits, held, copied), issued)
    # a swap-out that waits for a read frees as a RELEASE issued after that read would
    held_rank = issued_rank(op_step[np.maximum(hold, 0)], EventKind.RELEASE)
    ranks = np.where(swap_out, np.where(waits, held_rank, FIRST), rank)
    return times, ranks, np.where(swap_in, b, -b), tensor
