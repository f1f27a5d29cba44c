"""Complete scheduling (TENSILE Algorithm 3, and beyond): access sequences + budget -> plans.

Activity analysis first (liveness.py), then, while the global peak (the sum of the
jobs' peaks) exceeds the budget, one change per round at some job's peak:

* a swap that makes nothing wait (swap.py), the largest tensor first: it costs no time;
* when none fits the copy channel (``choice="cost"``), the option with the
  least added time per byte freed among the largest tensors at the peak: a swap with
  planned waits (stalls.py; ``stalls``) or a recompute (recompute.py: its generating
  op's latency; MSPS is the same order). Each round tries a stall-free swap again first.
* ``choice="paper"`` keeps the paper's order: swap until no swap fits, then recompute
  by MSPS until none qualifies (``resume_swapping=True`` goes back to swapping after
  each recompute), then, with ``stalls``, the cheapest option as above.

``PlanSettings()`` (``BEYOND``, the default) plans stalls and chooses by cost;
``PlanSettings(stalls=False, choice="paper")`` (``PAPER``) is the paper's algorithm: no
planned swap may make compute wait. ``stop_when_fits=False`` restores the paper's loop, which swaps
until nothing more can be swapped and recomputes only while the peak exceeds the budget.
No step raises the peak (a change that would is undone), so when the budget cannot be
met the peak the loop ended at is the least budget it can meet
(``InfeasibleBudget.min_budget``).

The passes read one job's PlanState (state.py) and return a Proposal: swap.py's
``propose_swap`` / ``propose_later_swap``, stalls.py's ``propose_stalling_swap``,
recompute.py's ``propose_recompute``. The loop here, :func:`schedule`, is the only code
that commits one (or undoes one that moved ops).

>>> from dbml.scheduler.graph.sequence import AccessSequence, TensorInfo, TensorKind, Op, Phase
>>> t = (TensorInfo(0, "x", 4, TensorKind.BATCH), TensorInfo(1, "y", 4, TensorKind.ACTIVATION))
>>> seq = AccessSequence("j", t, (Op(0, "relu", (0,), (1,), 0.0, 1.0, Phase.FORWARD),), frozenset({0}))
>>> plan(seq, 8, policy="none").peak_bytes
8
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .channel import Channel
from .gaps import CROSS, RECOMPUTED, SWAPPED, candidates
from .liveness import analyse_liveness
from .recompute import propose_recompute, recompute_candidates
from .rules import recompute_wins
from .stalls import propose_again, propose_later_swap_in, propose_stalling_swap, resident_at_peak
from .state import PlanState, Proposal
from .swap import propose_later_swap, propose_swap
from ..errors import InfeasibleBudget, PlanningError, SchedulerError
from ..graph.sequence import AccessSequence, Plan

PLAN_POLICIES = ("tensile", "none")
CHOICES = ("cost", "paper")


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
    # When no swap fits without making compute wait, plan one that does (least added
    # time); False (PAPER) = the paper's rule: no planned swap may delay compute.
    stalls: bool = True
    # "cost": once no stall-free swap fits, each round takes the option with the least
    # added time per byte freed (stalling swap or recompute); "paper": swap, then
    # recompute by MSPS, then (with stalls) the cheapest.
    choice: str = "cost"
    # How many of the largest tensors at the peak (and of the best recomputes) are
    # priced per round: bounds planning time on graphs with thousands of tensors.
    priced: int = 12
    # A recompute may first remake up to this many of its op's inputs that are gone at
    # that point, each from its own inputs (recompute.py: a chain from resident tensors,
    # as checkpointing recomputes a block); 0 = the paper's: every input resident.
    recompute_chain: int = 8
    # Where a plan's copies stall, plan again recomputing, rather than copying, a tensor
    # whose regeneration takes less than this times its one-way copy time
    # (rules.recompute_wins: fewer FLOPs per byte than the achieved FLOP rate over the
    # tier's bandwidth), and keep the plan with less added time; 0 = never (the waits
    # alone price a swap).
    recompute_ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.choice not in CHOICES:
            raise ValueError(f"PlanSettings: unknown choice {self.choice!r}; use one of {CHOICES}")


# PlanSettings(**PAPER): the paper's algorithm, kept reachable and measured beside the
# default (the benchmark's dbml-tensile@… rows).
PAPER = dict(stalls=False, choice="paper", recompute_chain=0, recompute_ratio=0.0)
# PlanSettings(**BEYOND) = PlanSettings(): dbml's default, planned stalls and the choice of
# swap or recompute by cost (the benchmark's dbml-stalls@… rows).
BEYOND = dict(stalls=True, choice="cost", recompute_chain=8, recompute_ratio=1.0)


def plan(seq: AccessSequence, budget_bytes: int, policy: str = "tensile",
         settings: PlanSettings | None = None) -> Plan:
    """Plan one job within ``budget_bytes``; raises InfeasibleBudget when it cannot fit."""
    return plan_jobs([seq], budget_bytes, settings, policy)[seq.job]


def plan_jobs(seqs: Sequence[AccessSequence], budget_bytes: int,
              settings: PlanSettings | None = None, policy: str = "tensile") -> dict[str, Plan]:
    """Plan all jobs jointly: the sum of their peaks must fit ``budget_bytes``."""
    if policy not in PLAN_POLICIES:
        raise ValueError(f"plan(): unknown policy {policy!r}; use one of {PLAN_POLICIES}")
    if len({s.job for s in seqs}) != len(seqs):
        raise ValueError(f"plan_jobs(): job names must be unique, got {[s.job for s in seqs]}")
    settings = settings or PlanSettings()
    jobs = schedule(seqs, budget_bytes, settings, policy)
    plans = _plans(jobs, policy)
    if _tier_priced(settings, policy) and any(state.curve.waited > 0 for state in jobs):
        # its copies stall: channel time is scarce, so plan again recomputing first what
        # regenerates faster than it copies (rules.recompute_wins), and keep the better
        again = _plans(schedule(seqs, budget_bytes, settings, policy, by_tier=True), policy)
        plans = min((plans, again), key=lambda ps: (max(sum(p.peak_bytes for p in ps.values()), budget_bytes),
                                                     sum(p.extra_time for p in ps.values())))
    reached = sum(p.peak_bytes for p in plans.values())
    for fallback in _fallbacks(settings, policy) if reached > budget_bytes else ():
        again = _plans(schedule(seqs, budget_bytes, fallback, policy), policy)
        if sum(p.peak_bytes for p in again.values()) < reached:
            plans, reached = again, sum(p.peak_bytes for p in again.values())
        if reached <= budget_bytes:
            break
    if reached > budget_bytes:
        # The peak never rises, so the loop never saw it fit and ran as it would for a
        # budget of 0: what it reached is the least budget it can meet.
        raise InfeasibleBudget(", ".join(repr(s.job) for s in seqs), budget_bytes, reached)
    return plans


def _fallbacks(settings: PlanSettings, policy: str):
    """Where dbml's planning (``choice="cost"``) ends above the budget: the same without
    recompute chains, then without recomputes. Where compute is fast beside the tier, a
    chain's recompute is cheap, and the loop took chains whose regenerated inputs, held
    together at the stall, made peaks it could not lower: a transformer's least budget was
    38 % of its peak with chains, 21 % without, 14 % without recomputes (11 % with
    compute 10x slower, any of the three). The paper's algorithm (``choice="paper"``) is
    kept as it is."""
    if policy == "none" or settings.choice != "cost" or not settings.recompute:
        return
    if settings.recompute_chain:
        yield dataclasses.replace(settings, recompute_chain=0)
    yield dataclasses.replace(settings, recompute=False)


def _plans(jobs: list[PlanState], policy: str) -> dict[str, Plan]:
    return {state.seq.job: state.plan(policy) for state in jobs}


def _tier_priced(settings: PlanSettings, policy: str) -> bool:
    """The tier's ratio prices recomputation (``recompute_ratio``) in this planning."""
    return policy != "none" and settings.choice == "cost" and settings.recompute and settings.recompute_ratio > 0


def schedule(seqs: Sequence[AccessSequence], budget: int, settings: PlanSettings,
             policy: str = "tensile", by_tier: bool = False) -> list[PlanState]:
    """Algorithm 3's loop: one swap (or recompute) per round until the peak fits or
    nothing more can be placed. The passes propose; only this loop commits.
    ``by_tier``: a tensor that regenerates faster than the tier copies it
    (``rules.recompute_wins``) is recomputed rather than swapped, even where its swap
    would stall nothing (its copies would take channel time that later swaps need), and
    such a recompute goes before any swap that stalls."""
    shared = Channel()
    jobs = [PlanState(s, shared if settings.shared_channel else Channel(), settings.shared_channel)
            for s in seqs]
    for state in jobs:
        state.margin = settings.swap_in_margin
    if policy == "none":
        return jobs
    history = [_global_peak(jobs)]
    phase = _SWAP
    while phase is not None:
        peak = history[-1]
        if peak <= budget and (settings.stop_when_fits or phase is not _SWAP):
            break
        if phase is _SWAP:
            if not _swap_round(jobs, settings, recompute_first=by_tier):
                phase = _RECOMPUTE if settings.choice == "paper" and settings.recompute else _after_paper(settings)
        elif phase is _RECOMPUTE:
            if not _recompute_round(jobs, peak, settings.recompute_chain):
                phase = _after_paper(settings)
            elif settings.resume_swapping:
                phase = _SWAP   # the peak moved: swaps may fit again
        elif not (_swap_round(jobs, settings, settings.min_gain * peak, by_tier)
                  or _cheapest_round(jobs, settings, peak, by_tier)):
            phase = None
        history.append(_global_peak(jobs))
        if _stalled(history, settings):
            if phase is _CHEAPEST or _after_paper(settings) is None:
                break
            phase, history = _CHEAPEST, history[-1:]   # small swaps only: price the big ones
    return jobs


_SWAP, _RECOMPUTE, _CHEAPEST = "swap", "recompute", "cheapest"   # the loop's phases


def _after_paper(settings: PlanSettings) -> str | None:
    """Where the loop goes when the paper's phases have nothing left to place."""
    cheapest = settings.stalls or (settings.choice == "cost" and settings.recompute)
    return _CHEAPEST if cheapest else None


def _global_peak(jobs: list[PlanState]) -> int:
    return sum(state.peak_bytes() for state in jobs)


def _stalled(history: list[int], settings: PlanSettings) -> bool:
    """Algorithm 3 line 4: the peak fell by less than ``min_gain`` of itself over the last
    ``patience`` rounds. (The authors compare only the last two rounds; with several
    points at the peak level one swap often leaves the peak unchanged, so a window.)"""
    if len(history) <= settings.patience:
        return False
    return history[-settings.patience - 1] - history[-1] < settings.min_gain * history[-1]


def _swap_round(jobs: list[PlanState], settings: PlanSettings, min_bytes: float = 0,
                recompute_first: bool = False) -> bool:
    """Swap the largest tensor at any job's peak that can be swapped (of ``min_bytes`` at
    least); False if none can. ``recompute_first``: recompute it instead where that wins
    (``rules.recompute_wins``) and keeps the global peak from rising."""
    streams = [_swap_options(j, state, settings, min_bytes) for j, state in enumerate(jobs)
               if _may_swap(state, settings)]
    peak = _global_peak(jobs)
    for _, j, gap, p_t, p_r in heapq.merge(*streams):
        state = jobs[j]
        if recompute_first and _recompute_instead(jobs, state, gap, settings, peak):
            return True
        with _context(state, "swap", gap):
            proposal = propose_swap(state, gap, (p_t, p_r), settings.swap_in_margin)
            if proposal is not None:
                _commit_swap(state, proposal, settings)
                return True
        state.failed_t[gap], state.failed_r[gap] = p_t, p_r
    return False


def _recompute_instead(jobs: list[PlanState], state: PlanState, gap: int, settings: PlanSettings, peak: int) -> bool:
    """Commit a recompute of the gap's tensor if it wins over copying it and keeps the
    global peak from rising (else the gap is left to be swapped)."""
    gaps = state.gaps
    t = int(gaps.tensor[gap])
    if gaps.kind[gap] == CROSS or not state.recomputable[t] or state.rejected[gap] \
            or not recompute_wins(float(state.regen_latency[t]), int(gaps.nbytes[gap]), state.seq.copy_bandwidth,
                                  settings.recompute_ratio):
        return False
    with _context(state, "recompute instead of a swap", gap):
        p = propose_recompute(state, gap, settings.recompute_chain)
        if p is None or not _wins(state, p, settings) or not state.commit(p):
            return False
        if _global_peak(jobs) <= peak:
            return True
        state.undo(p)
    return False


def _wins(state: PlanState, p: Proposal, settings: PlanSettings) -> bool:
    """A recompute proposal (its whole chain's stall) wins over copying its tensor."""
    return p.status == RECOMPUTED and recompute_wins(p.cost, int(state.gaps.nbytes[p.gap]), state.seq.copy_bandwidth,
                                                      settings.recompute_ratio)


def _commit_swap(state: PlanState, proposal: Proposal, settings: PlanSettings) -> None:
    """Commit a swap and, with ``swap_later_accesses``, the same tensor's later gaps."""
    state.commit(proposal)
    _commit_later_swaps(state, proposal, settings)


def _commit_later_swaps(state: PlanState, proposal: Proposal, settings: PlanSettings) -> None:
    gap = proposal.gap
    if state.gaps.kind[gap] == CROSS or not settings.swap_later_accesses:
        return
    t, after = int(state.gaps.tensor[gap]), int(state.gaps.hi[gap])
    for later in state.gaps.of_tensor(t):
        p = propose_later_swap(state, later, t, after, settings.swap_in_margin)
        if p is not None:
            state.commit(p)


def _swap_options(j: int, state: PlanState, settings: PlanSettings, min_bytes: float = 0):
    """(-bytes, job, gap, peak time, peak rank) for the job's candidates, largest first."""
    p_t, p_r = state.peak_key()
    gaps = candidates(state.gaps, state.gap_keys(), (p_t, p_r))
    if min_bytes:
        gaps = gaps[state.gaps.nbytes[gaps] >= min_bytes]
    # the channel only fills up: what failed at this very peak point fails again
    gaps = gaps[(state.failed_t[gaps] != p_t) | (state.failed_r[gaps] != p_r)]
    for gap in map(int, gaps):   # lazily: the first usually succeeds
        if state.gaps.kind[gap] != CROSS or settings.cross_iteration:
            yield (-int(state.gaps.nbytes[gap]), j, gap, p_t, p_r)


def _may_swap(state: PlanState, settings: PlanSettings) -> bool:
    """The job's max swapping rate: its share of tensors swapped so far is under the cap."""
    rate = settings.swap_rates.get(state.seq.job, settings.max_swap_rate)
    return len(state.swapped) < math.ceil(rate * len(state.seq.tensors))


def _recompute_round(jobs: list[PlanState], peak: int, chain: int = 0) -> bool:
    """Recompute the highest-MSPS tensor at any job's peak that keeps the peak from rising."""
    options = []
    for j, state in enumerate(jobs):
        with _context(state, "recompute candidates"):
            options += [(-msps, j, gap) for msps, gap in recompute_candidates(state)]
    for _, j, gap in sorted(options):
        state = jobs[j]
        with _context(state, "recompute", gap):
            proposal = propose_recompute(state, gap, chain)
            if proposal is not None and state.commit(proposal):
                if _global_peak(jobs) <= peak:
                    return True
                state.undo(proposal)   # its stall's other outputs raised the peak
        state.rejected[gap] = True     # never tried again: it only gets worse
    return False


def _cheapest_round(jobs: list[PlanState], settings: PlanSettings, peak: int, by_tier: bool = False) -> bool:
    """Commit the option with the least added seconds per byte freed at some job's peak
    (a stalling swap, a recompute) that lowers the global peak, or moves it off the op it
    was at (an option that leaves it there, only its copies moved, is no progress: a swap
    planned again so came back every round, each time a rounding error later, until the
    loop gave up, and an MLP's plan stopped at 67 MB where 50 MB plans exist); ``by_tier``:
    a recompute that wins over copying (``_tier``) before any swap that stalls."""
    options = []
    for j, state in enumerate(jobs):
        with _context(state, "cheapest options"):
            options += [(_tier(state, p, settings) if by_tier else 0, cost, -nbytes, j, n, p)
                        for n, (cost, nbytes, p) in enumerate(_priced(state, settings))]
    # tensors too small to count as progress (``min_gain``) only when nothing else is left:
    # a free swap of 4 bytes is cheapest per byte, and does nothing for the peak
    material = [o for o in options if -o[2] >= settings.min_gain * peak]
    at = [state.peak_op() for state in jobs]   # each job's peak op this round (a refused option is undone)
    for _, _, _, j, _, p in sorted(material or options, key=lambda o: o[:5]):
        state = jobs[j]
        with _context(state, "recompute" if p.status == RECOMPUTED else "stalling swap", p.gap):
            if state.commit(p):
                now = _global_peak(jobs)
                if now < peak or (now == peak and state.peak_op() != at[j]):
                    if p.status != RECOMPUTED:
                        _commit_later_swaps(state, p, settings)
                    return True
                state.undo(p)   # its waits or its stall's outputs raised the peak
        _reject(state, p)
    return False


def _tier(state: PlanState, p: Proposal, settings: PlanSettings) -> int:
    """0 for what goes before any unhidden copy: a swap that makes nothing wait, and a
    recompute that regenerates its tensor faster than the tier copies it
    (``rules.recompute_wins``: a full channel's copy costs its whole time, not only the
    waits it adds where it is placed); 1 for the rest. Within a tier: seconds per byte."""
    if p.status == RECOMPUTED:
        return 0 if _wins(state, p, settings) else 1
    return 0 if p.cost <= 0 else 1


def _priced(state: PlanState, settings: PlanSettings) -> list[tuple[float, int, Proposal]]:
    """(seconds per byte, bytes, proposal) for the job's options at its peak: stalling
    swaps of its largest tensors there, and its best recomputes."""
    out = []
    key, op = state.peak_key(), state.peak_op()
    if settings.stalls and _may_swap(state, settings):
        gaps = candidates(state.gaps, state.gap_keys(), key)
        gaps = gaps[(state.stall_t[gaps] != key[0]) | (state.stall_r[gaps] != key[1])]
        if not settings.cross_iteration:
            gaps = gaps[state.gaps.kind[gaps] != CROSS]
        for gap in map(int, gaps[:settings.priced]):
            p = propose_stalling_swap(state, gap, key, op, settings.swap_in_margin)
            if p is None:
                state.stall_t[gap], state.stall_r[gap] = key
            else:
                nbytes = int(state.gaps.nbytes[gap])
                out.append((p.cost / max(nbytes, 1), nbytes, p))
    if settings.stalls and len(state.gap_events):
        out += _priced_again(state, settings, key, op)
    if settings.recompute:
        for _, gap in sorted(recompute_candidates(state), reverse=True)[:settings.priced]:
            p = propose_recompute(state, gap, settings.recompute_chain)
            if p is None:
                state.rejected[gap] = True
                continue
            nbytes = int(state.gaps.nbytes[gap])
            out.append((p.cost / max(nbytes, 1), nbytes, p))
    return out


def _priced_again(state: PlanState, settings: PlanSettings, key, op: int) -> list:
    """Swapped gaps whose tensor is still on the device at the peak, planned again."""
    gaps = candidates(state.gaps, state.gap_keys(), key, SWAPPED)
    gaps = gaps[(state.stall_t[gaps] != key[0]) | (state.stall_r[gaps] != key[1])]
    resident = resident_at_peak(state)
    held = resident[state.gaps.tensor[gaps]] | ((state.gaps.other[gaps] >= 0) & resident[state.gaps.other[gaps]])
    out = []
    for gap in map(int, gaps[held][:settings.priced]):
        # planned anew, and with its swap-out kept and only its swap-in after the peak (the
        # new swap-out of the first can leave the tensor on the device at an earlier point)
        found = [p for p in (propose_again(state, gap, key, op, settings.swap_in_margin),
                             propose_later_swap_in(state, gap, key, op, settings.swap_in_margin)) if p is not None]
        if not found:
            state.stall_t[gap], state.stall_r[gap] = key
        nbytes = int(state.gaps.nbytes[gap])
        out += [(p.cost / max(nbytes, 1), nbytes, p) for p in found]
    return out


def _reject(state: PlanState, p: Proposal) -> None:
    """A proposal that could not be committed, or raised the peak: not tried again
    (a recompute: ever; a stalling swap: at this peak point)."""
    if p.status == RECOMPUTED:
        state.rejected[p.gap] = True
    else:
        state.stall_t[p.gap], state.stall_r[p.gap] = state.peak_key()


_BUGS = (PlanningError, AssertionError, IndexError, KeyError, TypeError, ValueError)


class _context:
    """Re-raise a planner bug with the job, the pass and what was committed before it
    (STYLE §7). A class, not @contextmanager: it is entered once per attempt."""

    def __init__(self, state: PlanState, what: str, gap: int | None = None):
        self.state, self.what, self.gap = state, what, gap

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, err, tb) -> bool:
        if not isinstance(err, _BUGS) or (isinstance(err, SchedulerError) and not isinstance(err, PlanningError)):
            return False
        st = self.state
        where = ""
        if self.gap is not None:
            t = int(st.gaps.tensor[self.gap])
            where = f" of gap {self.gap} (tensor {t} {st.seq.tensors[t].name!r}, ops {int(st.gaps.lo[self.gap])}-{int(st.gaps.hi[self.gap])})"
        raise PlanningError(f"job {st.seq.job!r}: the {self.what} pass{where} failed after "
                            f"{len(st.swapped)} tensors swapped and {len(st.recomputes)} recomputed: {err}") from err


def tensor_granularity_floor(seq: AccessSequence) -> int:
    """The least peak any plan at tensor granularity can reach: workspace plus, at the
    busiest op, its inputs and outputs together (an in-place update counted once), the
    graph outputs no plan moves there (the loss after its last read: not an update, no
    gap left) and the tensors the caller holds (the batch: never moved)."""
    live = analyse_liveness(seq)
    kept = [t for t in seq.outputs - set(seq.updates) if live.gen[t] >= 0]
    held_by_caller = {t.id for t in seq.tensors if t.caller_held}
    best = 0
    for op in seq.ops:
        done = {t for t in kept if live.gen[t] < op.index and live.last_access(t) < op.index}
        held = set(op.inputs) | set(op.outputs) | done | held_by_caller
        held -= {live.in_place[n] for n in op.outputs if n in live.in_place}
        best = max(best, sum(seq.tensors[t].nbytes for t in held))
    return best + seq.workspace
