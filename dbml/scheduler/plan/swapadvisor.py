"""SwapAdvisor (Huang et al., ASPLOS 2020, papers/swapadvisor.txt): a genetic algorithm
over swap choices, each individual judged by simulating it.

SwapAdvisor searches three things at once: the operator schedule, the memory allocation
(the size classes of a memory pool) and, from those by Belady's rule, the swaps. Here:

* the op order is fixed: dbml's executor runs the ops in the captured order (plans'
  triggers and the generated fast path are by op index), so the chromosome has no
  schedule part;
* no allocation is searched: the executor allocates each tensor exactly (a released
  buffer is reused only for the same size, execute/pool.py) and the ledger counts exact
  bytes, so a pool of size classes would only round sizes up;
* what is left, the swap choice, is the chromosome itself: one gene per gap (gaps.py) of
  every tensor a plan may move — activations, and parameters and optimizer state across
  iterations (the paper's double pass: parameters that start an iteration on the host) —
  on: the tensor leaves the device after the access opening the gap and is back before
  the one closing it. SwapAdvisor never recomputes; neither does this planner.

The GA, as the paper's:

* the first generation: the swap planner's choice by Belady's rule (:func:`belady`: the
  ops scanned with the budget as capacity; under pressure the resident tensor used
  furthest in the future is evicted, among those last used at least its copy time
  ago), every gene on (the safest, as PoocH starts), and ``population - 2`` mutants of
  the first (the paper draws the first generation at random: a random swap set is almost
  never within a budget, nor fast);
* each generation, pairs of parents cross over at a random point of the op order (genes
  in the order of the op that opens their gap): two children, mutated (each gene flipped
  with probability ``mutation``) and repaired where over the budget (the resident tensors
  at the child's peak used furthest in the future swapped too, Belady's rule again, up
  to ``repairs`` times);
* each individual is simulated (simulate.py: compute, one copy channel, peak.py's
  ledger; memory repairs make compute wait for memory) and its time ``t`` is the
  simulated iteration time, plus ``copy_cost`` times the seconds its copies take (a copy
  the model hides still costs the host: on a CPU a memcpy on the cores compute uses),
  times ``1 + penalty * excess / budget`` when over the budget;
* ``population`` survivors are drawn by softmax of ``(T_best - t) / T_best`` (eq. 1);
  the best individual always survives (elitism: the softmax alone may lose it), and the
  answer is the fittest individual within the budget ever simulated.

The search ends after ``generations`` or ``time_limit`` seconds. It is deterministic
given ``seed`` when the generation count ends it; a time limit that binds first makes it
depend on the machine's speed. SwapAdvisor swaps out and in on two copy streams at once;
dbml's executor has one copy thread: one channel.

>>> from dbml.scheduler.synthetic import training_sequence
>>> seq = training_sequence("j", 60, seed=1)
>>> vanilla = swapadvisor_plan(seq, 1 << 40).peak_bytes
>>> p = swapadvisor_plan(seq, int(0.7 * vanilla), SwapAdvisorSettings(generations=3, time_limit=None))
>>> p.policy, p.peak_bytes <= 0.7 * vanilla
('swapadvisor', True)
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass


from .gaps import CROSS, INNER
from .simulate import Outcome, Prepared, Trials, at_peak, prepare, to_plan
from ..errors import InfeasibleBudget
from ..graph.sequence import AccessSequence, Plan

__all__ = ["SwapAdvisorSettings", "swapadvisor_plan", "genes", "belady"]


@dataclass(frozen=True)
class SwapAdvisorSettings:
    seed: int = 0
    population: int = 12        # N_p
    generations: int = 40
    # Per gene. The paper's 10 % is per node of a schedule mutated around the original
    # order; flipping a tenth of every swap gene undoes any plan.
    mutation: float = 0.01
    repairs: int = 3            # Belady repairs of an over-budget child
    sim_repairs: int = 24       # simulate.py's memory repairs per simulation
    copy_cost: float = 0.05     # seconds of time per second of copying (the hidden copies' cost)
    penalty: float = 10.0       # over the budget: t * (1 + penalty * excess / budget)
    cross_iteration: bool = True
    time_limit: float | None = 5.0


def swapadvisor_plan(seq: AccessSequence, budget_bytes: int, settings: SwapAdvisorSettings | None = None) -> Plan:
    """The fittest swap choice within ``budget_bytes`` the GA found, as a plan; raises
    InfeasibleBudget (with the least peak it reached) when none fits."""
    settings = settings or SwapAdvisorSettings()
    prep = prepare(seq)
    trials = Trials(prep, budget_bytes, settings.sim_repairs, 1 << 62, None)
    if prep.vanilla <= budget_bytes:
        return to_plan(prep, trials(frozenset()), "swapadvisor")
    best = _evolve(trials, genes(prep, settings.cross_iteration), settings)
    if not trials.fits(best):
        raise InfeasibleBudget(repr(seq.job), budget_bytes, trials.least)
    return to_plan(prep, best, "swapadvisor")


def genes(prep: Prepared, cross_iteration: bool = True) -> list[int]:
    """The gaps a chromosome switches, in the order of the op that opens them: every gap
    but a graph output's within the iteration (it is never released)."""
    seq, gaps = prep.seq, prep.gaps
    keep = [g for g in range(len(gaps.tensor))
            if (gaps.kind[g] == INNER and int(gaps.tensor[g]) not in seq.outputs)
            or (gaps.kind[g] == CROSS and cross_iteration)]
    return sorted(keep, key=lambda g: (int(gaps.lo[g]), g))


class _Fitness:
    """An individual's ``t`` (module docstring); T_best so far, and the fittest individual
    within the budget seen so far (the answer, even where selection dropped it)."""

    def __init__(self, trials: Trials, settings: SwapAdvisorSettings):
        self.trials, self.settings, self.best = trials, settings, math.inf
        self.answer: tuple[float, Outcome] | None = None

    def __call__(self, out: Outcome) -> float:
        s, budget = self.settings, self.trials.budget
        t = out.time + s.copy_cost * out.copied
        if out.peak > budget:
            t *= 1 + s.penalty * (out.peak - budget) / max(budget, 1)
        elif self.answer is None or t < self.answer[0]:
            self.answer = (t, out)
        self.best = min(self.best, t)
        return t


def _evolve(trials: Trials, order: list[int], settings: SwapAdvisorSettings) -> Outcome:
    rng = random.Random(settings.seed)
    fitness = _Fitness(trials, settings)
    deadline = math.inf if settings.time_limit is None else time.perf_counter() + settings.time_limit
    seed = _repair(trials, trials(belady(trials.prep, trials.budget, order)), order, settings.repairs)
    pop = [seed, trials(frozenset(order))] + [
        _child(trials, _mutate(seed.swap, order, settings.mutation, rng), order, settings)
        for _ in range(settings.population - 2)]
    for _ in range(settings.generations):
        if time.perf_counter() > deadline:
            break
        parents = rng.sample(pop, len(pop))
        children = []
        for a, b in zip(parents[::2], parents[1::2]):
            for c in _crossover(a.swap, b.swap, order, rng):
                children.append(_child(trials, _mutate(c, order, settings.mutation, rng), order, settings))
        pop = _select(pop + children, settings.population, fitness, rng)
    for out in pop:
        fitness(out)
    return fitness.answer[1] if fitness.answer is not None else min(pop, key=fitness)


def _child(trials: Trials, swap: frozenset[int], order: list[int], settings: SwapAdvisorSettings) -> Outcome:
    return _repair(trials, trials(swap), order, settings.repairs)


def _crossover(a: frozenset[int], b: frozenset[int], order: list[int], rng: random.Random):
    """Two children: one takes ``b``'s genes before a random point and ``a``'s after it,
    the other the reverse (the paper's crossover of the allocation lists)."""
    cut = rng.randrange(1, len(order)) if len(order) > 1 else 0
    head, tail = set(order[:cut]), set(order[cut:])
    return (frozenset((b & head) | (a & tail)), frozenset((a & head) | (b & tail)))


def _mutate(swap: frozenset[int], order: list[int], p: float, rng: random.Random) -> frozenset[int]:
    flip = {g for g in order if rng.random() < p}
    return frozenset(swap ^ flip)


def _select(pool: list[Outcome], n: int, fitness: _Fitness, rng: random.Random) -> list[Outcome]:
    """The best, then ``n - 1`` more drawn without replacement by softmax of
    ``(T_best - t) / T_best`` (eq. 1). Duplicates count once."""
    unique = list({(o.swap, o.recompute): o for o in pool}.values())
    ts = [fitness(o) for o in unique]
    best = min(range(len(unique)), key=lambda i: (ts[i], i))
    weights = {i: math.exp((fitness.best - t) / fitness.best) if fitness.best > 0 else 1.0
               for i, t in enumerate(ts) if i != best}
    chosen = [unique[best]]
    while weights and len(chosen) < n:
        x, acc = rng.random() * sum(weights.values()), 0.0
        for i, w in weights.items():
            acc += w
            if acc >= x:
                break
        chosen.append(unique[i])
        del weights[i]
    return chosen


def _repair(trials: Trials, out: Outcome, order: list[int], rounds: int) -> Outcome:
    """An over-budget individual also swaps the gaps holding its peak whose tensors are
    used furthest in the future (Belady), until their bytes cover the excess."""
    prep, pool = trials.prep, set(order)
    for _ in range(rounds):
        if trials.fits(out) or out.timeline is None:
            break
        now = float(out.timeline.times[out.timeline.peak_index()])
        held = at_peak(prep, out.timeline, out.swap, pool)
        held.sort(key=lambda g: (-_next_use(prep, g, now), -int(prep.gaps.nbytes[g]), g))
        add, covered = set(), 0
        for g in held:
            if covered >= out.peak - trials.budget:
                break
            add.add(g)
            covered += int(prep.gaps.nbytes[g])
        if not add:
            break
        out = trials(out.swap | add, out.recompute)
    return out


def _next_use(prep: Prepared, g: int, now: float) -> float:
    """Seconds from ``now`` to the access closing gap ``g`` (a cross-iteration gap's
    updated tensor: the next iteration)."""
    seq, gaps = prep.seq, prep.gaps
    start = seq.ops[int(gaps.hi[g])].start
    if gaps.kind[g] == CROSS and seq.ops[int(gaps.lo[g])].end <= now:
        start += seq.duration
    return start - now


def belady(prep: Prepared, budget: int, order: list[int]) -> frozenset[int]:
    """SwapAdvisor's swap planner: the ops in order, the budget as capacity; when an op's
    tensors do not fit, evict the resident tensor used furthest in the future (last used
    at least its copy time ago, where any is), swapping the gap it is evicted in."""
    seq, live = prep.seq, prep.live
    holding = _genes_by_tensor(prep, order)
    nbytes = [t.nbytes for t in seq.tensors]
    released: dict[int, list[int]] = {}
    for t, k in live.released.items():
        released.setdefault(k, []).append(t)
    on, off = set(seq.initial), set()
    used = seq.workspace + sum(nbytes[t] for t in on)
    chosen: set[int] = set()
    for k, op in enumerate(seq.ops):
        for t in op.inputs:
            if t in off:
                off.discard(t)
                on.add(t)
                used += nbytes[t]
        for n in op.outputs:
            on.add(n)
            used += nbytes[n]
            if n in live.in_place and live.in_place[n] in on:
                on.discard(live.in_place[n])
                used -= nbytes[live.in_place[n]]
        while used > budget:
            victim = _victim(prep, holding, on, k)
            if victim is None:
                break
            t, g = victim
            chosen.add(g)
            on.discard(t)
            off.add(t)
            used -= nbytes[t]
        for t in released.get(k, ()):
            if t in on:
                on.discard(t)
                used -= nbytes[t]
    return frozenset(chosen)


def _genes_by_tensor(prep: Prepared, order: list[int]) -> dict[int, list[int]]:
    gaps = prep.gaps
    out: dict[int, list[int]] = {}
    for g in order:
        out.setdefault(int(gaps.tensor[g]), []).append(g)
        if gaps.kind[g] == CROSS:
            out.setdefault(int(gaps.other[g]), []).append(g)
    return out


def _victim(prep: Prepared, holding: dict[int, list[int]], on: set[int], k: int) -> tuple[int, int] | None:
    """(tensor, gene) to evict before op ``k``: furthest next use, the recent ones last."""
    seq, gaps = prep.seq, prep.gaps
    op = seq.ops[k]
    busy = set(op.inputs) | set(op.outputs)
    best, best_key = None, None
    for t in on:
        if t in busy:
            continue
        for g in holding.get(t, ()):
            lo, hi = int(gaps.lo[g]), int(gaps.hi[g])
            if gaps.kind[g] == CROSS:
                old = t == int(gaps.other[g])
                if not (k < hi if old else lo < k):
                    continue
                next_use = hi if old else hi + len(seq.ops)
            else:
                if not lo < k < hi:
                    continue
                next_use = hi
            last = seq.ops[lo].end if lo >= 0 else 0.0
            recent = op.start - last < float(prep.copy[g])
            key = (not recent, next_use, seq.tensors[t].nbytes, -g)
            if best_key is None or key > best_key:
                best, best_key = (t, g), key
    return best
