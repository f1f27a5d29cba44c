"""Timeline simulation of a classification: which gaps are swapped, which recomputed ->
the events that perform it, its peak (peak.py's ledger) and its iteration time.

The planners that choose by simulated time (pooch.py, swapadvisor.py) decide *what*
leaves the device; this pass decides *when*, the same way for both, and returns events
the executor performs unchanged. A *choice* is two sets of gap indices (gaps.py): gaps
whose tensor is swapped to the host, and inner gaps whose tensor is released and
recomputed. One sweep along the ops lays them out:

* compute runs the ops in the captured order; before op ``b`` run the recompute stalls
  of the gaps closing at ``b`` (the generating op again, its inputs resident);
* one copy channel (the executor's copy thread) runs one copy at a time. A swap-out is
  placed in the first free slot after the access that opens its gap (a RELEASE when the
  tensor's host copy is still valid); a swap-in in the latest free slot that ends before
  the access that closes it, or, if none, in the first free slot after, late: the op
  waits for it (peak.py's rule 7). Copies placed earlier in the sweep keep their slots;
* a swap-out may be *synchronous* (``sync``: op ``w`` is not entered until its copy has
  ended) and a swap-in issued no earlier than the end of op ``after`` — the two repairs
  below;
* a cross-iteration gap: the updated tensor swapped out after its last access, ending by
  the iteration's end (a gap where it cannot is dropped, the tensor kept), the old one
  swapped in before its first access.

Memory is peak.py's ledger of these events, the one the executor keeps. With
``repairs``, a peak over the budget is repaired where the choice allows it: a swapped
tensor still on the device at the peak because its swap-out has not ended is made
synchronous for the op at the peak, one whose swap-in started before it is swapped in
after that op — so compute waits for the memory, as PoocH's simulation of memory
management has it, instead of the peak growing. The simulated time is the last op's end
with every stall and wait.

A recompute needs its generating op's inputs on the device: a recompute whose input is
swapped or recomputed across its closing access, or released before it, and any recompute
of a tensor that ``state.recomputable`` refuses (random ops, ops writing into inputs),
is dropped (the tensor is kept) before the sweep.

>>> from dbml.scheduler.synthetic import training_sequence
>>> prep = prepare(training_sequence("j", 60, seed=1))
>>> out = simulate(prep, frozenset(), frozenset())
>>> out.peak == prep.vanilla, out.time == prep.seq.duration
(True, True)
"""

from __future__ import annotations

import bisect
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .channel import TOL
from .gaps import CROSS, INNER, OPEN, PINNED, SWAPPED, Gaps, candidates, find_gaps, gap_keys
from .liveness import Liveness, analyse_liveness, release_events
from .peak import Static, Timeline, build_timeline, host_at_start, op_at, static_ledger
from .recompute import _dies_before   # recompute.py's rule (it reads only .seq and .live)
from .state import recomputable
from ..graph.sequence import AccessSequence, Event, EventKind, Plan, event_order

__all__ = ["Prepared", "Outcome", "prepare", "simulate", "exposed", "resident_at", "at_peak", "to_plan", "Trials"]

# A swap-in starts this long after its host copy is complete: peak.py and the replay sum
# event times along different paths, and a swap-in that started a rounding error before
# its own swap-out freed the device copy would count the tensor twice.
AFTER_COPY = 1e-9
# Copies shorter than this are not planned (such a gap is kept): they free a few bytes (a
# step counter), and a swap-in that short, ending as its op starts, is one instant with
# it on a clock of nanoseconds (the replay checker's).
MIN_COPY = 2e-9


@dataclass(frozen=True)
class Prepared:
    """What every simulation of one sequence shares (computed once by :func:`prepare`)."""

    seq: AccessSequence
    live: Liveness
    gaps: Gaps
    static: Static
    releases: tuple[Event, ...]
    recomputable: np.ndarray     # per tensor
    copy: np.ndarray             # per gap: seconds one copy of its tensor takes
    vanilla: int                 # release-only peak
    latency: tuple[float, ...]   # per op


def prepare(seq: AccessSequence) -> Prepared:
    live = analyse_liveness(seq)
    gaps = find_gaps(seq)
    static = static_ledger(seq)
    releases = release_events(seq)
    ok = np.array([recomputable(seq, live, t) for t in range(len(seq.tensors))], dtype=bool)
    copy = np.array([seq.copy_time(int(t)) for t in gaps.tensor], dtype=float)
    vanilla = int(build_timeline(seq, releases, static).usage.max()) if seq.ops else seq.workspace
    return Prepared(seq, live, gaps, static, releases, ok, copy, vanilla, tuple(op.latency for op in seq.ops))


@dataclass(frozen=True)
class Outcome:
    events: tuple[Event, ...]     # sorted by event_order
    peak: int                     # peak.py's ledger of the events
    time: float                   # simulated iteration seconds, stalls and waits included
    swap: frozenset[int]          # the gaps swapped, as performed (invalid ones dropped)
    recompute: frozenset[int]     # the gaps recomputed, as performed
    copied: float                 # seconds the copy channel is busy
    waits: tuple[int, ...] = ()   # gaps whose copy compute waited on (late swap-ins, synchronous swap-outs)
    copies: tuple = field(default=(), repr=False)   # (start, end, gap, is swap-in) per copy
    timeline: Timeline | None = field(default=None, repr=False, compare=False)


def simulate(prep: Prepared, swap: frozenset[int], recompute: frozenset[int] = frozenset(),
             budget: int | None = None, repairs: int = 0) -> Outcome:
    """The events, peak and time of swapping ``swap`` and recomputing ``recompute`` (gap
    indices); up to ``repairs`` rounds of the repairs above while the peak exceeds ``budget``."""
    swap = {g for g in swap if prep.copy[g] >= MIN_COPY}
    recompute = valid_recomputes(prep, swap, set(recompute))
    sync: dict[int, int] = {}
    after: dict[int, int] = {}
    done = 0
    while True:
        sweep = _Sweep(prep, swap, recompute, sync, after)
        sweep.run()
        if sweep.unfinished:   # cross-iteration swap-outs that cannot end by the iteration's end
            swap -= sweep.unfinished
            continue
        events = tuple(sorted(sweep.events, key=event_order))
        tl = build_timeline(prep.seq, events, prep.static)
        peak = int(tl.usage.max()) if len(tl.usage) else prep.seq.workspace
        if budget is None or peak <= budget or done >= repairs or not _repair(prep, tl, sweep, peak - budget):
            break
        done += 1
    time = float(tl.op_end[-1]) if len(tl.op_end) else 0.0
    return Outcome(events, peak, time, frozenset(swap), frozenset(recompute),
                   sum(e - s for s, e, _, _ in sweep.copies), tuple(sweep.waited), tuple(sweep.copies), tl)


def valid_recomputes(prep: Prepared, swap: set[int], recompute: set[int]) -> set[int]:
    """The recomputes that can be performed: inner gaps of recomputable tensors whose
    generating op's inputs are all on the device before the gap's closing access."""
    gaps, seq = prep.gaps, prep.seq
    away = swap | recompute
    out = set()
    for g in sorted(recompute - swap):
        t, b = int(gaps.tensor[g]), int(gaps.hi[g])
        if gaps.kind[g] != INNER or not prep.recomputable[t]:
            continue
        inputs = seq.ops[prep.live.gen[t]].inputs
        if all(not _dies_before(prep, u, b) and not _away_at(prep, u, b, away) for u in inputs):
            out.add(g)
    return out


def _away_at(prep: Prepared, u: int, b: int, away: set[int]) -> bool:
    """Tensor ``u`` is off the device just before op ``b`` under a gap in ``away``."""
    gaps = prep.gaps
    for g in gaps.of_tensor(u):
        if g not in away:
            continue
        lo, hi = int(gaps.lo[g]), int(gaps.hi[g])
        if gaps.kind[g] == CROSS:
            if (u == gaps.other[g] and b <= hi) or (u == gaps.tensor[g] and lo < b):
                return True
        elif lo < b <= hi:
            return True
    return False


class _Busy:
    """The copy channel's busy time as merged blocks (copies are only ever added here, so
    touching ones merge: a saturated channel is one block, not thousands of copies to
    walk past). The free slots are channel.py's, which keeps each copy for removal."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def add(self, start: float, end: float) -> None:
        i = bisect.bisect_left(self.starts, start)
        if i and self.ends[i - 1] >= start - TOL:   # touches the block before
            i -= 1
            start = self.starts[i]
        j = i
        while j < len(self.starts) and self.starts[j] <= end + TOL:   # ... and those after
            end = max(end, self.ends[j])
            j += 1
        self.starts[i:j], self.ends[i:j] = [start], [end]

    def earliest(self, lo: float, d: float) -> float:
        """Earliest x >= lo with [x, x + d) free."""
        x = lo
        i = max(bisect.bisect_right(self.starts, lo) - 1, 0)
        while i < len(self.starts) and self.starts[i] < x + d:
            x = max(x, self.ends[i])
            i += 1
        return x

    def latest(self, lo: float, hi: float, d: float) -> float | None:
        """Latest x >= lo with [x, x + d) free and x + d <= hi."""
        x = hi - d
        j = bisect.bisect_left(self.starts, hi) - 1
        while j >= 0 and self.ends[j] > x and x >= lo:
            x = min(x, self.starts[j] - d)
            j -= 1
        return x if x >= lo else None


class _Sweep:
    """One pass along the ops: compute times, copy slots, events (module docstring)."""

    def __init__(self, prep: Prepared, swap: set[int], recompute: set[int], sync: dict[int, int],
                 after: dict[int, int]):
        self.prep, self.swap, self.recompute, self.sync, self.after = prep, swap, recompute, sync, after
        gaps = prep.gaps
        self.outs, self.ins, self.recs, self.waits_for = (defaultdict(list) for _ in range(4))
        for g in sorted(swap, key=lambda g: (int(gaps.lo[g]), g)):
            self.outs[int(gaps.lo[g])].append(g)
            self.ins[int(gaps.hi[g])].append(g)
        for g in sorted(recompute, key=lambda g: int(gaps.tensor[g])):
            self.recs[int(gaps.hi[g])].append(g)
        for g, w in sync.items():
            self.waits_for[w].append(g)
        self.outputs = prep.seq.outputs
        self.channel = _Busy()
        self.end: list[float] = []
        self.events: list[Event] = list(prep.releases)
        self.host: dict[int, float] = {}        # tensor -> its host copy is complete
        self.out_end: dict[int, float] = {}     # gap -> its swap-out's copy end
        self.copies: list[tuple[float, float, int, bool]] = []
        self.waited: list[int] = []
        self.unfinished: set[int] = set()
        for g in swap:   # an old tensor swapped in across iterations starts on the host
            if gaps.kind[g] == CROSS:
                self.host[int(gaps.other[g])] = 0.0

    def run(self) -> None:
        self._swap_outs(-1)
        for k, latency in enumerate(self.prep.latency):
            prev = self.end[k - 1] if k else 0.0
            entry = prev
            for g in self.waits_for.get(k, ()):
                if self.out_end.get(g, 0.0) > entry + TOL:
                    self.waited.append(g)
                entry = max(entry, self.out_end.get(g, 0.0))
            start = entry
            for g in self.recs.get(k, ()):
                t = int(self.prep.gaps.tensor[g])
                start += self.prep.latency[self.prep.live.gen[t]]
                self.events += [Event(int(self.prep.gaps.lo[g]), 0.0, EventKind.RELEASE, t),
                                Event(k - 1, 0.0, EventKind.RECOMPUTE, t, k)]
            ready = start
            for g in self.ins.get(k, ()):
                ends = self._swap_in(g, k, start)
                if ends > start + TOL:
                    self.waited.append(g)
                ready = max(ready, ends)
            self.end.append(ready + latency)
            self._swap_outs(k)
        last = self.end[-1] if self.end else 0.0
        self.unfinished = {g for g, e in self.out_end.items() if self.prep.gaps.kind[g] == CROSS and e > last}

    def _at(self, x: float, upto: int) -> tuple[int, float]:
        """(trigger, delay) of an event issued at time ``x``, after one of the ops before ``upto``."""
        trigger = bisect.bisect_right(self.end, x, 0, upto) - 1
        return trigger, max(0.0, x - (self.end[trigger] if trigger >= 0 else 0.0))

    def _swap_outs(self, k: int) -> None:
        """The gaps opening at op ``k``: a RELEASE where the host copy is still valid, else
        a swap-out in the channel's first free slot after op ``k`` (``k = -1``: the start)."""
        now = self.end[k] if k >= 0 else 0.0
        gaps = self.prep.gaps
        for g in self.outs.get(k, ()):
            t = int(gaps.tensor[g])
            # (a graph output is never released: it is swapped out again)
            if k >= 0 and self.host.get(t, math.inf) <= now and gaps.kind[g] == INNER and t not in self.outputs:
                self.events.append(Event(k, 0.0, EventKind.RELEASE, t))
                continue
            d = float(self.prep.copy[g])
            x = self.channel.earliest(now, d)
            self.channel.add(x, x + d)
            delay = x - now
            ends = (now + delay) + d    # as peak.py sums it
            self.events.append(Event(k, delay, EventKind.SWAP_OUT, t, self.sync.get(g, -1)))
            self.host[t], self.out_end[g] = ends, ends
            self.copies.append((x, x + d, g, False))

    def _swap_in(self, g: int, k: int, start: float) -> float:
        """Tensor of gap ``g`` back for op ``k`` (which could start at ``start``): the latest
        free slot that ends by then, else the first one after, late. Returns the copy's end."""
        gaps, seq = self.prep.gaps, self.prep.seq
        t = int(gaps.other[g]) if gaps.kind[g] == CROSS else int(gaps.tensor[g])
        lo = int(gaps.lo[g]) if gaps.kind[g] == INNER else -1
        floor = max(self.end[lo] if lo >= 0 else 0.0, self.end[self.after[g]] if g in self.after else 0.0)
        if self.host.get(t, 0.0) > 0.0:
            floor = max(floor, self.host[t] + AFTER_COPY)
        d = seq.copy_time(t)
        x = self.channel.latest(floor, start, d)
        if x is None:
            x = self.channel.earliest(max(floor, start - d), d)
        self.channel.add(x, x + d)
        trigger, delay = self._at(x, k)
        self.events.append(Event(trigger, delay, EventKind.SWAP_IN, t, k))
        self.copies.append((x, x + d, g, True))
        return x + d


def resident_at(tl: Timeline, p: int, n_tensors: int) -> np.ndarray:
    """Per tensor: on the device after change point ``p`` of the timeline."""
    tensors, deltas = tl.tensors[:p + 1], tl.deltas[:p + 1]
    keep = tensors >= 0
    tensors, deltas = tensors[keep][::-1], deltas[keep][::-1]
    resident = np.zeros(n_tensors, dtype=bool)
    if len(tensors):
        seen, last = np.unique(tensors, return_index=True)   # each tensor's last change
        resident[seen] = deltas[last] > 0
    return resident


def at_peak(prep: Prepared, tl: Timeline, swap, pool=None) -> list[int]:
    """Gaps that hold the timeline's peak point with their tensor still on the device:
    of the swapped ones (``pool`` None), or of the gaps in ``pool`` not swapped."""
    gaps = prep.gaps
    status = np.full(len(gaps.tensor), PINNED if pool is not None else OPEN, dtype=np.int64)
    if pool is not None:
        status[list(pool)] = OPEN
    status[list(swap)] = SWAPPED
    view = Gaps(gaps.tensor, gaps.other, gaps.lo, gaps.hi, gaps.kind, gaps.nbytes, status, gaps.by_size)
    p = tl.peak_index()
    held = candidates(view, gap_keys(view, tl), tl.key(p), SWAPPED if pool is None else OPEN)
    resident = resident_at(tl, p, len(prep.seq.tensors))
    on = resident[gaps.tensor[held]] | ((gaps.other[held] >= 0) & resident[np.maximum(gaps.other[held], 0)])
    return [int(g) for g in held[on]]


def _repair(prep: Prepared, tl: Timeline, sweep: _Sweep, excess: int) -> bool:
    """Make swapped tensors on the device at the peak leave before it: a swap-out still
    running there is waited for by the op at the peak, a swap-in started before it is
    issued after that op. Largest first, until ``excess`` bytes are covered. False if
    none can be."""
    gaps = prep.gaps
    p = tl.peak_index()
    when, op = float(tl.times[p]), op_at(tl, p)
    covered = 0
    for g in at_peak(prep, tl, sweep.swap):
        if covered >= excess:
            break
        lo, hi = int(gaps.lo[g]), int(gaps.hi[g])
        leaving = lo < op if gaps.kind[g] == CROSS else sweep.out_end.get(g, -math.inf) > when
        if leaving:   # its swap-out has not ended: the op at the peak waits for it
            if not lo < op < sweep.sync.get(g, len(prep.seq.ops)):
                continue
            sweep.sync[g] = op
        else:         # it came back too early: after the op at the peak
            if not max(sweep.after.get(g, -1), -1) < op < hi:
                continue
            sweep.after[g] = op
        covered += int(gaps.nbytes[g])
    return covered > 0


def exposed(out: Outcome) -> tuple[frozenset[int], frozenset[int]]:
    """(swap-outs, swap-ins) not hidden by computation: the gaps of the copies in every
    busy period of the channel during which compute waited for one of its copies (PoocH's
    L_O and L_I)."""
    waited = set(out.waits)
    outs, ins = set(), set()
    period: list[tuple[int, bool]] = []
    busy, hit = -math.inf, False
    for start, end, g, is_in in sorted(out.copies) + [(math.inf, math.inf, -1, False)]:
        if start > busy + TOL:   # a new busy period
            if hit:
                for h, h_in in period:
                    (ins if h_in else outs).add(h)
            period, hit = [], False
        period.append((g, is_in))
        hit = hit or g in waited
        busy = max(busy, end)
    return frozenset(outs), frozenset(ins)


def to_plan(prep: Prepared, out: Outcome, policy: str) -> Plan:
    """The outcome as a plan: its events, its peak, the time its stalls and waits add."""
    seq = prep.seq
    return Plan(seq.job, out.events, out.peak, prep.vanilla, max(out.time - seq.duration, 0.0), policy,
                host_at_start(seq, out.events))


class Trials:
    """Simulations of classifications, memoised and counted; the least peak seen."""

    def __init__(self, prep: Prepared, budget: int, repairs: int, max_simulations: int,
                 time_limit: float | None):
        self.prep, self.budget, self.repairs = prep, budget, repairs
        self.left = max_simulations
        self.deadline = math.inf if time_limit is None else time.perf_counter() + time_limit
        self.cache: dict[tuple, Outcome] = {}
        self.least = math.inf

    def __call__(self, swap: frozenset[int], recompute: frozenset[int] = frozenset()) -> Outcome:
        key = (swap, recompute)
        if key not in self.cache:
            self.left -= 1
            out = simulate(self.prep, swap, recompute, self.budget, self.repairs)
            self.cache[key] = out
            self.least = min(self.least, out.peak)
        return self.cache[key]

    def exhausted(self) -> bool:
        return self.left <= 0 or time.perf_counter() > self.deadline

    def fits(self, out: Outcome) -> bool:
        return out.peak <= self.budget

    def better(self, a: Outcome, b: Outcome) -> bool:
        """``a`` before ``b``: less over the budget, then less time."""
        return (max(a.peak - self.budget, 0), a.time) < (max(b.peak - self.budget, 0), b.time)
