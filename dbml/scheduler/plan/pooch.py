"""PoocH (Kusumoto et al., "Profiling based out-of-core Hybrid method", papers/pooch.txt):
classify each layer's output as keep, swap or recompute by timeline simulation.

PoocH's classification, Section 4.4, on dbml's access sequence:

* the classified data are the *feature maps*: per tensor an op generates in the
  iteration (an activation, not a graph output), its longest gap (gaps.py) — for a
  forward output, from its last forward read to its backward read. The paper keeps
  parameters, optimizer state and buffers on the device (``PoochSettings(state=False)``);
  by default their gaps are classified too, keep or swap, across iterations included
  (the optimizer's outputs are op outputs of the captured step);
* a classification is judged by simulate.py: the timeline of compute and the copy
  channel, and peak.py's ledger for memory; it *fits* when the peak is within the budget;
* step 1, keep or swap: from every feature map swapped (the safest), the copies hidden
  under computation stay swapped; of the exposed ones (busy periods of the channel that
  made compute wait: L_O for swap-outs, L_I for swap-ins), every keep/swap assignment of
  L_I is tried (``exhaustive``: up to 2^|L_I| leaves; over it, L_I is scanned like L_O),
  and at each leaf L_O \\ L_I is scanned from the output layer (the last swap-out first),
  a map kept where the classification still fits and is no slower. The scan goes in
  blocks, halved where a block does not fit or is slower (the paper's one map at a
  time, batched: on the transformer all 739 maps are exposed under the emulated GPU,
  and one simulation takes ~0.05 s);
* step 2, swap or recompute: for each swapped map X, r(X) = recompute overhead / swap
  overhead, both measured against X kept with the other classes fixed; maps with
  r >= 1 stay swapped, the one with the least r < 1 is recomputed, and r is evaluated
  again, until none is left. The paper evaluates every r again after each pick; here
  a pick is taken once its fresh r is still the least of the (possibly stale) others
  (lazy greedy: the same pick whenever the others' r only grow). Maps whose copies are
  hidden have a swap overhead of 0: r is infinite without a simulation;
* beyond the paper (``keep_unneeded``): last, classes the budget does not need are
  undone: keep/swap/recompute maps, from the output layer, become keep where the
  classification still fits and is no slower (tried in blocks, halved where a block
  does not fit). The paper's search keeps hidden swaps (the model says they cost
  nothing), but on a CPU a copy is a memcpy on the cores compute uses.

The simulation differs from the paper's in three ways (simulate.py): swap-ins run in
the latest free slot of the channel before their use (the paper: as early as memory
allows; both start a swap-in no earlier than the memory it needs is free, which the
repairs ensure), one copy channel serves both directions (the executor's one copy
thread; the paper's GPUs copy both ways at once), and latencies come from the latency
model instead of profiled iterations. The search is bounded by ``max_simulations`` (a
deterministic cap) and ``time_limit`` (a safety stop that, when it binds, makes the
result depend on the machine's speed).

>>> from dbml.scheduler.synthetic import training_sequence
>>> seq = training_sequence("j", 60, seed=1)
>>> vanilla = pooch_plan(seq, 1 << 40).peak_bytes
>>> p = pooch_plan(seq, int(0.7 * vanilla))
>>> p.policy, p.peak_bytes <= 0.7 * vanilla
('pooch', True)
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from .gaps import CROSS, INNER
from .simulate import Outcome, Prepared, Trials, exposed, prepare, to_plan
from ..errors import InfeasibleBudget
from ..graph.sequence import AccessSequence, Plan, TensorKind

__all__ = ["PoochSettings", "pooch_plan", "feature_maps"]

STATE = (TensorKind.PARAM, TensorKind.OPT_STATE, TensorKind.BUFFER)


@dataclass(frozen=True)
class PoochSettings:
    # The paper classifies feature maps only (False). dbml's captured step generates the
    # parameters and optimizer state too (the optimizer's outputs), so by default their
    # gaps are classified as well, keep or swap, across iterations included: without
    # them no budget under the resident state fits (the MLP's: 84 % of its peak).
    state: bool = True
    # Step 1: |L_I| up to which every keep/swap assignment of L_I is a leaf of the search.
    exhaustive: int = 6
    # Step 2 (False: the paper's "swap-opt", keep or swap only).
    recompute: bool = True
    # Beyond the paper: undo the classes the budget does not need (module docstring).
    keep_unneeded: bool = True
    # Memory repairs per simulation (simulate.py): compute waits for memory.
    repairs: int = 24
    # Bounds on the search: simulations (deterministic), and seconds (None: no limit).
    max_simulations: int = 3000
    time_limit: float | None = 30.0


def pooch_plan(seq: AccessSequence, budget_bytes: int, settings: PoochSettings | None = None) -> Plan:
    """The classification with the least simulated time that fits ``budget_bytes``, as a
    plan; raises InfeasibleBudget when none fits, with the least peak the search reached
    (an estimate, as TENSILE's planner's: at that budget the search takes another path)."""
    settings = settings or PoochSettings()
    prep = prepare(seq)
    trials = Trials(prep, budget_bytes, settings.repairs, settings.max_simulations, settings.time_limit)
    if prep.vanilla <= budget_bytes:   # nothing to classify: every map kept
        return to_plan(prep, trials(frozenset()), "pooch")
    maps = feature_maps(prep, settings.state)
    start = trials(frozenset(maps))
    cur = _keep_or_swap(trials, start, maps, settings.exhaustive)
    if settings.recompute:
        cur = _swap_or_recompute(trials, cur)
    if settings.keep_unneeded:   # the maps step 1 did not try to keep: hidden swaps, and recomputes
        outs, ins = exposed(start)
        undo = (cur.swap - outs - ins) | cur.recompute
        cur = keep_while_fits(trials, cur, sorted(undo, key=lambda g: -_opens(prep, g)))
    if cur.peak > budget_bytes:
        raise InfeasibleBudget(repr(seq.job), budget_bytes, trials.least)
    return to_plan(prep, cur, "pooch")


def feature_maps(prep: Prepared, state: bool = False) -> list[int]:
    """The gaps PoocH classifies: per activation an op generates (not a graph output),
    its longest gap in time; with ``state``, every gap of the parameters, optimizer state
    and buffers too (their updated values' and the cross-iteration ones included). In
    order of the op that opens them."""
    seq, gaps = prep.seq, prep.gaps
    longest: dict[int, tuple[float, int]] = {}
    out = []
    for g in range(len(gaps.tensor)):
        t = int(gaps.tensor[g])
        kind = seq.tensors[t].kind
        if kind in STATE or gaps.kind[g] == CROSS or t in seq.updates:   # parameters and optimizer state
            if state:
                out.append(g)
        elif kind is TensorKind.ACTIVATION and t not in seq.outputs:
            span = seq.ops[int(gaps.hi[g])].start - (seq.ops[int(gaps.lo[g])].end if gaps.lo[g] >= 0 else 0.0)
            if span > longest.get(t, (-math.inf, -1))[0]:
                longest[t] = (span, g)
    out += [g for _, g in longest.values()]
    return sorted(out, key=lambda g: (_opens(prep, g), g))


def _opens(prep: Prepared, g: int) -> int:
    return int(prep.gaps.lo[g])


def _keep_or_swap(trials: Trials, start: Outcome, maps: list[int], exhaustive: int) -> Outcome:
    """Step 1 (module docstring), from every map swapped (``start``)."""
    outs, ins = exposed(start)
    from_output = lambda gs: sorted(gs, key=lambda g: -_opens(trials.prep, g))   # noqa: E731
    li = [g for g in maps if g in ins]
    lo_only = from_output(g for g in maps if g in outs and g not in ins)
    if len(li) > exhaustive:   # too many leaves: L_I scanned as L_O is
        return keep_while_fits(trials, keep_while_fits(trials, start, from_output(li)), lo_only)
    best, unfit = start, []
    for keep in (set(c) for r in range(len(li) + 1) for c in itertools.combinations(li, r)):
        if trials.exhausted():
            break
        if any(u <= keep for u in unfit):   # keeping more only needs more memory
            continue
        leaf = trials(start.swap - keep, start.recompute)
        if not trials.fits(leaf):
            unfit.append(keep)
            continue
        leaf = keep_while_fits(trials, leaf, lo_only)
        if trials.better(leaf, best):
            best = leaf
    return best


def _ratio(trials: Trials, cur: Outcome, g: int) -> float:
    """PoocH's r(X) for swapped gap ``g``: recompute overhead / swap overhead, each against
    ``g`` kept (infinite where recomputing it is not possible or does not fit)."""
    rec = trials(cur.swap - {g}, cur.recompute | {g})
    if g not in rec.recompute or (trials.fits(cur) and not trials.fits(rec)):
        return math.inf
    kept = trials(cur.swap - {g}, cur.recompute)
    swap_overhead = cur.time - kept.time
    if swap_overhead <= 0:
        return math.inf
    return (rec.time - kept.time) / swap_overhead


def _swap_or_recompute(trials: Trials, cur: Outcome) -> Outcome:
    """Step 2 (module docstring): recompute the swapped map with the least r < 1, again
    until none is left."""
    prep = trials.prep
    outs, ins = exposed(cur)
    hidden = lambda g: g not in ins and g not in outs   # noqa: E731 - swap overhead 0
    swapped = [g for g in sorted(cur.swap) if prep.gaps.kind[g] == INNER
               and prep.recomputable[int(prep.gaps.tensor[g])] and not hidden(g)]
    version = 0
    heap = [(r, -int(prep.gaps.nbytes[g]), g, version) for g in swapped if trials.left > 0
            for r in [_ratio(trials, cur, g)] if r < 1]
    heapq.heapify(heap)
    while heap and not trials.exhausted():
        r, size, g, seen = heapq.heappop(heap)
        if seen != version:   # stale: r against an older classification
            r = _ratio(trials, cur, g)
            if r >= 1:
                continue
            if heap and (r, size) > heap[0][:2]:
                heapq.heappush(heap, (r, size, g, version))
                continue
        out = trials(cur.swap - {g}, cur.recompute | {g})
        if trials.better(out, cur):
            cur, version = out, version + 1
    return cur


def keep_while_fits(trials: Trials, cur: Outcome, gaps: list[int]) -> Outcome:
    """Undo the classes of ``gaps`` (in order: a swapped or recomputed map becomes keep)
    where the classification still fits and is no slower: a block at a time, halved
    where the block does not."""
    blocks = [gaps]
    while blocks and not trials.exhausted():
        block = blocks.pop(0)
        drop = set(block)
        out = trials(cur.swap - drop, cur.recompute - drop)
        if trials.fits(out) and out.time <= cur.time:
            cur = out
        elif len(block) > 1:
            half = len(block) // 2
            blocks[:0] = [block[:half], block[half:]]
    return cur
