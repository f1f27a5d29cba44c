"""PlanState: one job's plan under construction, and Proposal: a pass's proposed change.

The passes (swap.py, recompute.py) read a PlanState and return a Proposal, or None; only
the Algorithm 3 loop (planner.py) changes a PlanState, by :meth:`PlanState.commit` (and,
for a recompute that raised the global peak, :meth:`PlanState.undo`). A PlanState holds
the events so far, the ledger curve they give (peak.py's Timeline, kept up to date
incrementally), the copy channel's intervals, and the gaps' status. Its errors
(PlanningError: a broken invariant, so a bug) say what broke; the planner adds the job
and the pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .channel import TOL, Channel
from .gaps import CROSS, PINNED, RECOMPUTED, SWAPPED, GapKeys, Gaps, find_gaps, gap_keys
from .liveness import Liveness, analyse_liveness, release_events
from .peak import (FIRST, START_RANK, PeakKey, Timeline, analyse_peak, build_timeline, event_arrays,
                   event_rank, event_time, host_at_start, op_at, static_ledger)
from .rules import stall_latency
from ..errors import PlanningError
from ..graph.sequence import AccessSequence, Event, EventKind, Plan, event_order


@dataclass(frozen=True)
class Proposal:
    """Take gap ``gap``'s tensor off the device with ``events``; the gap becomes ``status``
    (SWAPPED or RECOMPUTED) and the gaps in ``pins`` PINNED (a recompute's inputs, which
    must stay resident). ``cost``: the seconds it is expected to add to the iteration (a
    recompute's stall, a stalling swap's waits). ``stalls``: a swap planned by stalls.py,
    whose events may make ops wait."""

    gap: int
    events: tuple[Event, ...]
    status: int
    pins: tuple[int, ...] = ()
    cost: float = 0.0
    stalls: bool = False
    drop: tuple[Event, ...] = ()   # events of the gap's earlier swap that these replace

    @property
    def moves_ops(self) -> bool:
        """It may delay ops (a recompute, a stalling swap): the curve is rebuilt when it
        is committed, and it can be undone."""
        return self.status == RECOMPUTED or self.stalls


def recomputable(seq: AccessSequence, live: Liveness, t: int) -> bool:
    """Deterministic, generated in the iteration, not an output, no output-producing op."""
    g = live.gen[t]
    if g < 0 or seq.tensors[t].not_replayable or seq.ops[g].not_replayable:
        return False
    return not any(o in seq.outputs for o in seq.ops[g].outputs)


class PlanState:
    """One job's plan under construction: events, the ledger curve, the copy channel."""

    def __init__(self, seq: AccessSequence, channel: Channel, shared: bool = False):
        self.seq, self.channel, self.shared = seq, channel, shared
        self.live: Liveness = analyse_liveness(seq)
        self.gaps: Gaps = find_gaps(seq)
        self.events: list[Event] = list(release_events(seq))
        self.first_swap = len(self.events)             # events before it are releases
        self.recomputes: list[Event] = []              # the RECOMPUTEs among the events
        self.host_ready: dict[int, float] = {}         # tensor -> time its host copy is complete
        self.swapped: set[int] = set()                 # tensors swapped out (the max swap rate)
        self.on_host: set[int] = set()                 # initial tensors that start on the host
        self.copies: list[tuple[float, float]] = []    # this job's intervals on the channel
        self.static = static_ledger(seq)
        self.curve: Timeline = build_timeline(seq, tuple(self.events), self.static, frozenset())
        self.vanilla_peak = self.peak_bytes()
        # The planner's memory of what failed: the peak key at which a gap's swap last
        # failed (the channel only fills up, so it fails there again), and the gaps a
        # recompute is not tried for again (their inputs only ever get scarcer).
        self.failed_t = np.full(len(self.gaps.tensor), np.nan)
        self.failed_r = np.full(len(self.gaps.tensor), np.nan)
        self.stall_t = np.full(len(self.gaps.tensor), np.nan)   # ... and where a stalling swap did
        self.stall_r = np.full(len(self.gaps.tensor), np.nan)
        self.rejected = np.zeros(len(self.gaps.tensor), dtype=bool)
        # caches: gap keys until a stall moves the ops; RELEASE/SWAP event arrays converted
        # so far (count, arrays); the gaps' statuses before the last recompute commit
        self._gap_keys: GapKeys | None = None
        self._arrays_cache: tuple = (0, None)
        self._undo: tuple | None = None   # what the last commit that moved ops changed
        self._repaired = False            # ... and whether its rebuild issued copies later
        self.gap_events: dict[int, tuple[Event, ...]] = {}   # a swapped gap -> its events
        self.margin = 0.0   # PlanSettings.swap_in_margin: a swap-in ends this early, or is waited for

    # --- reading ----------------------------------------------------------------------

    def peak_bytes(self) -> int:
        return int(self.curve.usage.max()) if len(self.curve.usage) else self.seq.workspace

    def peak_key(self) -> PeakKey:
        return self.curve.key(self.curve.peak_index())

    def peak_op(self) -> int:
        """The last op started at or before the peak (-1: none)."""
        return op_at(self.curve, self.curve.peak_index())

    def op_end(self, op: int) -> float:
        return float(self.curve.op_end[op]) if op >= 0 else 0.0

    def gap_keys(self) -> GapKeys:
        if self._gap_keys is None:
            self._gap_keys = gap_keys(self.gaps, self.curve)
        return self._gap_keys

    @cached_property
    def recomputable(self) -> np.ndarray:
        """Per tensor: :func:`recomputable` (computed when recomputation is first tried)."""
        return np.array([recomputable(self.seq, self.live, t) for t in range(len(self.seq.tensors))],
                        dtype=bool)

    @cached_property
    def regen_latency(self) -> np.ndarray:
        """Per tensor: the latency of its generating op (the stall a recompute costs)."""
        gen = np.maximum(np.array(self.live.gen), 0)
        return np.array([op.latency for op in self.seq.ops] or [0.0])[gen]

    def plan(self, policy: str) -> Plan:
        events = tuple(sorted(self.events, key=event_order))
        peak = analyse_peak(self.seq, events)
        # recompute stalls, then the planned waits (summed apart: a plan without waits
        # keeps exactly the figure it always had)
        extra = sum(stall_latency(self.seq, e) for e in events if e.kind is EventKind.RECOMPUTE)
        waited = self.curve.waited
        return Plan(self.seq.job, events, peak.bytes, self.vanilla_peak, extra + waited if waited else extra,
                    policy, host_at_start(self.seq, events))

    # --- committing -------------------------------------------------------------------

    def commit(self, p: Proposal) -> bool:
        """Apply a proposal. A swap that delays nothing always applies, incrementally; one
        that moves ops (a recompute, a stalling swap) only if the curve can be rebuilt
        with it (False, changing nothing, if it cannot)."""
        if p.status not in (SWAPPED, RECOMPUTED):
            raise PlanningError(f"a proposal for gap {p.gap} has status {p.status}")
        if p.moves_ops:
            return self._commit_moving(p)
        self._commit_swap(p)
        return True

    def undo(self, p: Proposal) -> None:
        """Take back ``p``, the last proposal committed, one that moved ops."""
        if self._undo is None or self._undo[0] is not p:
            raise PlanningError(f"undo of gap {p.gap}, not the last proposal that moved ops")
        _, status, events, gap_events, host_ready, swapped, on_host = self._undo
        self._undo = None
        self.gaps.status[[p.gap, *p.pins]] = status
        self.gap_events, self.host_ready, self.swapped, self.on_host = gap_events, host_ready, swapped, on_host
        if not (p.drop or self._repaired):
            self._pop_events(len(p.events))   # keep the converted arrays
        else:
            self.events, self._arrays_cache = events, (0, None)
        if p.status == RECOMPUTED:
            self.recomputes.pop()
        self.rebuild()

    def _commit_moving(self, p: Proposal) -> bool:
        self._undo = (p, self.gaps.status[[p.gap, *p.pins]].copy(), list(self.events), dict(self.gap_events),
                      dict(self.host_ready), set(self.swapped), set(self.on_host))
        self._repaired = False
        if p.drop:
            self._replace_events(p.drop, p.events)
        else:
            self.events += p.events
        self.gaps.status[p.gap] = p.status
        self.gaps.status[list(p.pins)] = PINNED
        if p.status == RECOMPUTED:
            self.recomputes.append(_recompute(p))
        else:
            self.gap_events[p.gap] = p.events
            _note_swap(self, p)
        if self.rebuild(repair=True):
            return True
        self.undo(p)
        return False

    def _replace_events(self, old: tuple[Event, ...], new: tuple[Event, ...]) -> None:
        """Swap a gap's events for others (a swap planned again), converting the event
        arrays afresh at the next rebuild."""
        for e in old:
            self.events.remove(e)
        self.events += new
        self._arrays_cache = (0, None)

    def _commit_swap(self, p: Proposal) -> None:
        """Add a gap's events; take the tensor off the curve and put its copies on the channel."""
        self.events += p.events
        self.gaps.status[p.gap] = SWAPPED
        self.gap_events[p.gap] = p.events
        removal, addition = None, None
        for e in p.events:
            t0 = event_time(e, self.curve.op_end)
            d = self.seq.copy_time(e.tensor)
            if e.kind is EventKind.RELEASE:
                removal = (t0, event_rank(e, self.curve.op_step, False))
            elif e.kind is EventKind.SWAP_OUT:
                self._copy(t0, t0 + d)
                removal = (t0 + d, FIRST)
                self.host_ready[e.tensor] = t0 + d
                self.swapped.add(e.tensor)
            elif e.kind is EventKind.SWAP_IN:
                self._copy(t0, t0 + d)
                addition = (t0, event_rank(e, self.curve.op_step, True))
        t, nbytes = int(self.gaps.tensor[p.gap]), int(self.gaps.nbytes[p.gap])
        if self.gaps.kind[p.gap] == CROSS:
            o = int(self.gaps.other[p.gap])
            self.curve.free((0.0, START_RANK), addition, self.seq.tensors[o].nbytes, o)
            self.curve.free(removal, None, nbytes, t)
            self.host_ready[o] = 0.0
            self.on_host.add(o)
        else:
            self.curve.free(removal, addition, nbytes, t)

    def _copy(self, start: float, end: float) -> None:
        if not self.channel.fits(start, end):
            raise PlanningError(f"swap planning put a copy at [{start}, {end}) over another on "
                                f"the channel (after {len(self.copies)} copies)")
        self.channel.add(start, end)
        self.copies.append((start, end))

    def rebuild(self, repair: bool = False) -> bool:
        """Recompute the curve and this job's copies from the events (after a stall or a
        wait moved them); False if the copies now collide (the caller undoes).

        On a job's own channel a recompute stall shifts every later copy alike, but a new
        wait can shorten a later one (the op waited for a copy that now ends in time),
        moving copies issued after it less than copies issued before. With ``repair``, a
        copy that now overlaps an earlier one is issued later, and the curve rebuilt."""
        for _ in range(REPAIRS if repair and not self.shared else 1):
            curve = build_timeline(self.seq, tuple(self.recomputes), self.static,
                                   frozenset(self.on_host), self._event_arrays())
            at = [i for i in range(self.first_swap, len(self.events))
                  if self.events[i].kind in (EventKind.SWAP_IN, EventKind.SWAP_OUT)]
            copies = [(t0, t0 + self.seq.copy_time(self.events[i].tensor), i)
                      for i in at for t0 in [event_time(self.events[i], curve.op_end)]]
            late = _overlaps(sorted(copies))
            if self.margin and not late:
                late = _within_margin(self.events, curve, copies, self.margin)
            if not late:
                return self._take(curve, copies)
            if self.shared or not repair:
                return False
            self._delay_events(late)
        return False

    def _take(self, curve: Timeline, copies: list) -> bool:
        ready = {self.events[i].tensor: end for _, end, i in copies if self.events[i].kind is EventKind.SWAP_OUT}
        copies = sorted((start, end) for start, end, _ in copies)
        if not self.shared:
            self.channel.replace(copies)
            self.curve, self.copies, self._gap_keys = curve, copies, None
            self.host_ready.update(ready)   # a stall moved the swap-outs after it
            return True
        for c in self.copies:
            self.channel.remove(*c)
        if not all(self.channel.fits(*c) for c in copies):
            for c in self.copies:
                self.channel.add(*c)
            return False
        self.curve, self.copies, self._gap_keys = curve, [], None
        self.host_ready.update(ready)
        for c in copies:
            self._copy(*c)
        return True

    def _delay_events(self, late: dict[int, float]) -> None:
        """Issue the events at these positions later by these seconds."""
        changed = {}
        for i, extra in late.items():
            e = self.events[i]
            self.events[i] = changed[e] = Event(e.trigger, e.delay + extra, e.kind, e.tensor, e.before)
        self._repaired = True
        for gap, evs in self.gap_events.items():
            if any(e in changed for e in evs):
                self.gap_events[gap] = tuple(changed.get(e, e) for e in evs)
        self._arrays_cache = (0, None)

    def _pop_events(self, k: int) -> None:
        """Drop the last ``k`` events (an undone recompute), keeping the array cache."""
        done, arrays = self._arrays_cache
        dropped = self.events[len(self.events) - k:]
        del self.events[len(self.events) - k:]
        if done > len(self.events) and arrays is not None:
            rows = sum(e.kind is not EventKind.RECOMPUTE for e in dropped[:done - len(self.events)])
            self._arrays_cache = (len(self.events), tuple(a[:len(a) - rows] for a in arrays))

    def _event_arrays(self):
        """Arrays of the RELEASE/SWAP events, converting only those added since last time."""
        done, arrays = self._arrays_cache
        if done > len(self.events):
            done, arrays = 0, None
        new = event_arrays(self.seq, self.events[done:])
        arrays = new if arrays is None else tuple(np.concatenate(p) for p in zip(arrays, new))
        self._arrays_cache = (len(self.events), arrays)
        return arrays


REPAIRS = 6   # rebuilds a commit may take to move its copies apart again


def _note_swap(state: PlanState, p: Proposal) -> None:
    """The tensors a stalling swap puts on the host (its host copies' times are set by
    the rebuild that follows)."""
    state.swapped.update(e.tensor for e in p.events if e.kind is EventKind.SWAP_OUT)
    if state.gaps.kind[p.gap] == CROSS:
        o = int(state.gaps.other[p.gap])
        state.host_ready[o] = 0.0
        state.on_host.add(o)


def _within_margin(events: list[Event], curve: Timeline, copies: list, margin: float) -> dict[int, float]:
    """Swap-ins that a shorter wait left ending less than ``margin`` before their op:
    issued later, to end as it starts (it waits for them, exactly as planned)."""
    late = {}
    for _, end, i in copies:
        e = events[i]
        if e.kind is EventKind.SWAP_IN:
            start = float(curve.op_start[e.before])
            if start - margin < end < start - TOL:
                late[i] = start - end
    return late


def _overlaps(copies: list) -> dict[int, float]:
    """For sorted (start, end, event position) copies: position -> seconds to issue it
    later so that no copy overlaps the one before it."""
    late, busy = {}, -np.inf
    for start, end, i in copies:
        if start < busy - TOL:
            late[i] = busy - start
            end += busy - start
        busy = max(busy, end)
    return late


def _recompute(p: Proposal) -> Event:
    """The RECOMPUTE event of a recompute proposal."""
    return next(e for e in p.events if e.kind is EventKind.RECOMPUTE)
