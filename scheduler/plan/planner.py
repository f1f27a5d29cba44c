"""Complete scheduling (TENSILE Algorithm 3): access sequences + budget -> plans.

Activity analysis first (liveness.py), then, while the global peak (the sum of the
jobs' peaks) exceeds the budget: swap the largest tensor at any job's peak
(swap.py); once no swap can be placed, recompute the tensor with the highest MSPS
at any job's peak (recompute.py) until none qualifies. ``stop_when_fits=False``
restores the paper's loop, which swaps until nothing more can be swapped and
recomputes only while the peak exceeds the budget; ``resume_swapping=True`` goes back
to swapping after each recompute. No step raises the peak, so when the budget cannot
be met the peak the loop ended at is the least budget it can meet
(``InfeasibleBudget.min_budget``).

>>> from dbml.scheduler.graph.sequence import AccessSequence, TensorInfo, TensorKind, Op, Phase
>>> t = (TensorInfo(0, "x", 4, TensorKind.BATCH), TensorInfo(1, "y", 4, TensorKind.ACTIVATION))
>>> seq = AccessSequence("j", t, (Op(0, "relu", (0,), (1,), 0.0, 1.0, Phase.FORWARD),), frozenset({0}))
>>> plan(seq, 8, policy="none").peak_bytes
8
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from .liveness import Liveness, analyse_liveness, release_events
from .peak import (FIRST, Timeline, analyse_peak, build_timeline, event_arrays, event_rank, event_time,
                   host_at_start, static_ledger)
from .recompute import recompute_candidates, schedule_recompute
from ..graph.sequence import AccessSequence, Event, EventKind, Plan, event_order
from .swap import CROSS, START_RANK, SWAPPED, Channel, Gaps, candidates, find_gaps, gap_keys, schedule_swap
from ..errors import InfeasibleBudget

POLICIES = ("tensile", "none")


@dataclass(frozen=True)
class PlanSettings:
    # Stop as soon as the global peak fits; False = the paper's swap-to-exhaustion loop.
    stop_when_fits: bool = True
    # Max swapping rate: the fraction of a job's tensors it may swap (the authors' code:
    # weight x #tensors). Lower means higher priority: the job's iterations slow less.
    max_swap_rate: float = 1.0
    swap_rates: Mapping[str, float] = field(default_factory=dict)   # per-job overrides
    # One copy channel shared by all jobs, their iterations aligned at time 0 (the paper
    # models one per job). The model is then optimistic only about alignment.
    shared_channel: bool = False
    # Algorithm 2 line 34: after a swap, also swap the tensor in before each later access.
    swap_later_accesses: bool = True
    # Swap updated parameters / optimizer states out in the optimizer phase and in before
    # their first use next iteration.
    cross_iteration: bool = True
    recompute: bool = True
    # After each recompute, go back to swapping at the new peak (the paper never returns
    # to swapping once a swap round fails).
    resume_swapping: bool = False
    # Seconds a swap-in must finish before the op that reads it (the paper: 0).
    swap_in_margin: float = 0.0
    # Algorithm 3 line 4: stop when the last `patience` rounds lowered the peak by less
    # than `min_gain` of it (bounds planning time on long plateaus).
    patience: int = 100
    min_gain: float = 0.0005


class JobSchedule:
    """One job's plan under construction: events, the ledger curve, the copy channel."""

    def __init__(self, seq: AccessSequence, channel: Channel, shared: bool = False):
        self.seq, self.channel, self.shared = seq, channel, shared
        self.live: Liveness = analyse_liveness(seq)
        self.gaps: Gaps = find_gaps(seq, self.live)
        self.events: list[Event] = list(release_events(seq))
        self._first_swap = len(self.events)            # events before it are releases
        self.recomputes: list[Event] = []
        self._arrays_cache: tuple = (0, None)
        self.host_ready: dict[int, float] = {}
        self.swapped: set[int] = set()
        self.copies: list[tuple[float, float]] = []   # this job's intervals on the channel
        self.failed_t = np.full(len(self.gaps.tensor), np.nan)   # peak key a gap's swap
        self.failed_r = np.full(len(self.gaps.tensor), np.nan)   # last failed at
        self.static = static_ledger(seq, self.live)
        self.on_host: set[int] = set()     # initial tensors that start on the host
        self.curve: Timeline = build_timeline(seq, tuple(self.events), self.live, self.static, frozenset())
        self.vanilla_peak = self.peak_bytes()
        self._gap_keys = None   # gaps' opening/closing keys, until a stall moves the ops
        self.recomputable = self.regen_latency = self.rejected = None   # filled by recompute.py

    def gap_keys(self):
        if self._gap_keys is None:
            self._gap_keys = gap_keys(self)
        return self._gap_keys

    def peak_bytes(self) -> int:
        return int(self.curve.usage.max()) if len(self.curve.usage) else self.seq.workspace

    def peak_key(self) -> tuple[float, float]:
        return self.curve.key(self.curve.peak_index())

    def op_end(self, op: int) -> float:
        return float(self.curve.op_end[op]) if op >= 0 else 0.0

    def event_at(self, x: float, kind: EventKind, t: int, lo: int, hi: int) -> Event:
        """The event issued at time ``x``: after the last op ended by then, within (lo, hi)."""
        trigger = int(np.searchsorted(self.curve.op_end, x, "right")) - 1
        trigger = min(max(trigger, lo), hi - 1)
        delay = max(x - self.op_end(trigger), 0.0)
        if kind is EventKind.SWAP_IN:   # rounding must not make it finish late
            d, deadline = self.seq.copy_time(t), x + self.seq.copy_time(t)
            while delay > 0 and self.op_end(trigger) + delay + d > deadline:
                delay = float(np.nextafter(delay, -np.inf))
        return Event(trigger, delay, kind, t, hi if kind is EventKind.SWAP_IN else -1)

    def commit(self, gap: int, events: list[Event]) -> None:
        """Add a gap's events; take the tensor off the curve and put its copies on the channel."""
        self.events += events
        self.gaps.status[gap] = SWAPPED
        removal, addition = None, None
        for e in events:
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
        t, nbytes = int(self.gaps.tensor[gap]), int(self.gaps.nbytes[gap])
        if self.gaps.kind[gap] == CROSS:
            o = int(self.gaps.other[gap])
            self.curve.free((0.0, START_RANK), addition, self.seq.tensors[o].nbytes, o)
            self.curve.free(removal, None, nbytes, t)
            self.host_ready[o] = 0.0
            self.on_host.add(o)
        else:
            self.curve.free(removal, addition, nbytes, t)

    def _copy(self, start: float, end: float) -> None:
        if not self.channel.fits(start, end):
            raise AssertionError(f"job {self.seq.job!r}: swap planning put a copy at [{start}, {end}) "
                                 f"over another on the channel (after {len(self.copies)} copies)")
        self.channel.add(start, end)
        self.copies.append((start, end))

    def rebuild(self) -> bool:
        """Recompute the curve and this job's copies from the events (after a recompute
        stall moved them); False, changing nothing, if the copies now collide with
        another job's on a shared channel."""
        curve = build_timeline(self.seq, tuple(self.recomputes), self.live, self.static,
                               frozenset(self.on_host), self._event_arrays())
        swaps = [e for e in self.events[self._first_swap:] if e.kind in (EventKind.SWAP_IN, EventKind.SWAP_OUT)]
        copies = [(t0, t0 + self.seq.copy_time(e.tensor)) for e in swaps for t0 in [event_time(e, curve.op_end)]]
        if not self.shared:   # own channel: a stall keeps the copies apart (all shift alike)
            copies.sort()
            self.channel.starts, self.channel.ends = [c[0] for c in copies], [c[1] for c in copies]
            self.curve, self.copies, self._gap_keys = curve, copies, None
            return True
        for c in self.copies:
            self.channel.remove(*c)
        if not all(self.channel.fits(*c) for c in copies):
            for c in self.copies:
                self.channel.add(*c)
            return False
        self.curve, self.copies, self._gap_keys = curve, [], None
        for c in copies:
            self._copy(*c)
        return True

    def pop_events(self, k: int) -> None:
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
        new = event_arrays(self.events[done:], self.live)
        arrays = new if arrays is None else tuple(np.concatenate(p) for p in zip(arrays, new))
        self._arrays_cache = (len(self.events), arrays)
        return arrays

    def plan(self, policy: str) -> Plan:
        events = tuple(sorted(self.events, key=event_order))
        peak = analyse_peak(self.seq, events, self.live)
        extra = sum(self.seq.ops[self.live.gen[e.tensor]].latency
                    for e in events if e.kind is EventKind.RECOMPUTE)
        return Plan(self.seq.job, events, peak.bytes, self.vanilla_peak, extra, policy,
                    host_at_start(self.seq, events))


def plan(seq: AccessSequence, budget_bytes: int, policy: str = "tensile",
         settings: PlanSettings | None = None) -> Plan:
    """Plan one job within ``budget_bytes``; raises InfeasibleBudget when it cannot fit."""
    return plan_jobs([seq], budget_bytes, settings, policy)[seq.job]


def plan_jobs(seqs: Sequence[AccessSequence], budget_bytes: int,
              settings: PlanSettings | None = None, policy: str = "tensile") -> dict[str, Plan]:
    """Plan all jobs jointly: the sum of their peaks must fit ``budget_bytes``."""
    if policy not in POLICIES:
        raise ValueError(f"plan(): unknown policy {policy!r}; use one of {POLICIES}")
    if len({s.job for s in seqs}) != len(seqs):
        raise ValueError(f"plan_jobs(): job names must be unique, got {[s.job for s in seqs]}")
    settings = settings or PlanSettings()
    jobs = _schedule(seqs, budget_bytes, settings, policy)
    plans = {js.seq.job: js.plan(policy) for js in jobs}
    reached = sum(p.peak_bytes for p in plans.values())
    if reached > budget_bytes:
        # The peak never rises, so the loop never saw it fit and ran as it would for a
        # budget of 0: what it reached is the least budget it can meet.
        raise InfeasibleBudget(", ".join(repr(s.job) for s in seqs), budget_bytes, reached)
    return plans


def _schedule(seqs, budget: int, settings: PlanSettings, policy: str) -> list[JobSchedule]:
    """Algorithm 3's loop: one swap (or recompute) per round until the peak fits or
    nothing more can be placed."""
    shared = Channel()
    jobs = [JobSchedule(s, shared if settings.shared_channel else Channel(), settings.shared_channel)
            for s in seqs]
    if policy == "none":
        return jobs
    history = [_global_peak(jobs)]
    swapping, recomputing = True, settings.recompute
    while swapping or recomputing:
        peak = history[-1]
        if peak <= budget and (settings.stop_when_fits or not swapping):
            break
        if swapping:
            swapping = _swap_round(jobs, settings)
        elif not _recompute_round(jobs, peak):
            break
        else:
            swapping = settings.resume_swapping   # the peak moved: swaps may fit again
        history.append(_global_peak(jobs))
        if _stalled(history, settings):
            break
    return jobs


def _global_peak(jobs: list[JobSchedule]) -> int:
    return sum(js.peak_bytes() for js in jobs)


def _stalled(history: list[int], settings: PlanSettings) -> bool:
    """Algorithm 3 line 4: the peak fell by less than ``min_gain`` of itself over the last
    ``patience`` rounds. (The authors compare only the last two rounds; with several
    points at the peak level one swap often leaves the peak unchanged, so a window.)"""
    if len(history) <= settings.patience:
        return False
    return history[-settings.patience - 1] - history[-1] < settings.min_gain * history[-1]


def _swap_round(jobs: list[JobSchedule], settings: PlanSettings) -> bool:
    """Swap the largest tensor at any job's peak that can be swapped; False if none can."""
    streams = [_swap_options(j, js, settings) for j, js in enumerate(jobs) if _may_swap(js, settings)]
    for _, j, gap, p_t, p_r in heapq.merge(*streams):
        js = jobs[j]
        if schedule_swap(js, gap, p_t, p_r, settings):
            return True
        js.failed_t[gap], js.failed_r[gap] = p_t, p_r
    return False


def _swap_options(j: int, js: JobSchedule, settings: PlanSettings):
    """(-bytes, job, gap, peak time, peak rank) for the job's candidates, largest first."""
    p_t, p_r = js.peak_key()
    gaps = candidates(js, p_t, p_r)
    # the channel only fills up: what failed at this very peak point fails again
    gaps = gaps[(js.failed_t[gaps] != p_t) | (js.failed_r[gaps] != p_r)]
    for gap in map(int, gaps):   # lazily: the first usually succeeds
        if js.gaps.kind[gap] != CROSS or settings.cross_iteration:
            yield (-int(js.gaps.nbytes[gap]), j, gap, p_t, p_r)


def _may_swap(js: JobSchedule, settings: PlanSettings) -> bool:
    """The job's max swapping rate: its share of tensors swapped so far is under the cap."""
    rate = settings.swap_rates.get(js.seq.job, settings.max_swap_rate)
    return len(js.swapped) < math.ceil(rate * len(js.seq.tensors))


def _recompute_round(jobs: list[JobSchedule], peak: int) -> bool:
    """Recompute the highest-MSPS tensor at any job's peak that keeps the peak from rising."""
    options = []
    for j, js in enumerate(jobs):
        options += [(-msps, j, gap) for msps, gap in recompute_candidates(js)]
    for _, j, gap in sorted(options):
        if schedule_recompute(jobs[j], gap, lambda: _global_peak(jobs) <= peak):
            return True
    return False


def summary(plan_: Plan, seconds: float | None = None) -> str:
    """One line for the debug log: "job 'a': peak 912 MB -> 431 MB, 37 swaps, 4 recomputes, plan 0.21 s"."""
    took = f", plan {seconds:.2f} s" if seconds is not None else ""
    return (f"job {plan_.job!r}: peak {plan_.vanilla_peak_bytes / 2**20:.0f} MB -> "
            f"{plan_.peak_bytes / 2**20:.0f} MB, {plan_.count(EventKind.SWAP_OUT)} swaps, "
            f"{plan_.count(EventKind.RECOMPUTE)} recomputes{took}")


def tensor_granularity_floor(seq: AccessSequence) -> int:
    """The least peak any plan at tensor granularity can reach: workspace plus, at the
    busiest op, its inputs and outputs together (an in-place update counted once) and the
    graph outputs generated before it that no plan moves (the loss: not an update)."""
    live = analyse_liveness(seq)
    kept = [t for t in seq.outputs - set(seq.updates) if live.gen[t] >= 0]
    best = 0
    for op in seq.ops:
        held = set(op.inputs) | set(op.outputs) | {t for t in kept if live.gen[t] < op.index}
        held -= {live.in_place[n] for n in op.outputs if n in live.in_place}
        best = max(best, sum(seq.tensors[t].nbytes for t in held))
    return best + seq.workspace
