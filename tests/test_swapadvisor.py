"""Policy "swapadvisor" (plan/swapadvisor.py): SwapAdvisor's genetic algorithm over swap
choices, seeded by Belady's rule and judged by simulation. Its plans pass the replay
checker within the budget, it is deterministic given its seed, it never does worse than
the Belady plan it starts from, it never recomputes, it raises InfeasibleBudget below
what it can reach, and training under it is bit-identical to eager within the budget."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbml.scheduler.errors import InfeasibleBudget
from dbml.scheduler.execute.executor import check_event_log
from dbml.scheduler.graph.sequence import EventKind
from dbml.scheduler.plan.simulate import prepare, simulate
from dbml.scheduler.plan.swapadvisor import SwapAdvisorSettings, belady, genes, swapadvisor_plan
from dbml.scheduler.synthetic import training_sequence
from helpers import assert_same, state_of, trained_under
from sequences import chain, check_plan, random_sequences

loss_fn = torch.nn.functional.cross_entropy
FAST = SwapAdvisorSettings(generations=4, population=6, time_limit=None)


def test_belady_evicts_the_tensor_used_furthest_in_the_future():
    """chain(): over 110 bytes at op 3 the resident tensors besides op 3's own are t0 (a
    parameter, read by op 1 only: no gap holds op 3) and t1, next read by op 7."""
    seq = chain(bandwidth=100.0)
    prep = prepare(seq)
    chosen = belady(prep, 110, genes(prep))
    assert [int(prep.gaps.tensor[g]) for g in chosen] == [1]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_the_same_seed_gives_the_same_plan():
    seq = training_sequence("j", 60, seed=4, bandwidth=2e8)
    budget = int(0.6 * prepare(seq).vanilla)
    a, b = (swapadvisor_plan(seq, budget, FAST) for _ in range(2))
    assert a == b
    check_plan(seq, a, budget)


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_the_search_never_does_worse_than_its_belady_seed():
    seq = training_sequence("j", 60, seed=5, bandwidth=1e8)
    prep = prepare(seq)
    budget = int(0.6 * prep.vanilla)
    s = dataclasses.replace(FAST, generations=8)
    start = simulate(prep, belady(prep, budget, genes(prep)), budget=budget, repairs=s.sim_repairs)
    plan = swapadvisor_plan(seq, budget, s)
    check_plan(seq, plan, budget)
    if start.peak <= budget:   # the seed fits: elitism keeps it or a fitter one
        assert seq.duration + plan.extra_time <= start.time + s.copy_cost * start.copied


@pytest.mark.parametrize("bandwidth, fraction", [(12e9, 0.6), (2e8, 0.75), (3e7, 0.6)])
def test_synthetic_training_sequences(bandwidth, fraction):
    seq = training_sequence("j", 60, seed=3, bandwidth=bandwidth)
    budget = int(fraction * prepare(seq).vanilla)
    plan = swapadvisor_plan(seq, budget, FAST)
    check_plan(seq, plan, budget)
    assert plan.count(EventKind.SWAP_OUT) > 0 and plan.count(EventKind.RECOMPUTE) == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=random_sequences(), frac=st.floats(0.0, 1.0), seed=st.integers(0, 3))
@pytest.mark.slow   # ~0.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_random_sequences_plan_within_the_budget_or_raise(seq, frac, seed):
    budget = int(frac * prepare(seq).vanilla)
    try:
        plan = swapadvisor_plan(seq, budget, dataclasses.replace(FAST, seed=seed))
    except InfeasibleBudget as e:
        assert e.min_budget > budget
        return
    check_plan(seq, plan, budget)
    assert plan.count(EventKind.RECOMPUTE) == 0


def test_an_infeasible_budget_raises():
    with pytest.raises(InfeasibleBudget, match=r"jobs 'j' cannot fit a budget of 60 bytes .* smallest feasible "
                                               r"budget is 103 bytes"):
        swapadvisor_plan(chain(bandwidth=100.0), 60, FAST)


def test_the_time_limit_ends_the_search():
    seq = training_sequence("j", 60, seed=4, bandwidth=2e8)
    budget = int(0.6 * prepare(seq).vanilla)
    plan = swapadvisor_plan(seq, budget, SwapAdvisorSettings(generations=10**6, time_limit=0.5))
    check_plan(seq, plan, budget)


@pytest.fixture(scope="module")
def trained():
    """A 4-layer MLP trained 3 Adam steps eagerly and under "swapadvisor" at half its peak."""
    return trained_under("swapadvisor", planner_settings=dataclasses.replace(FAST, generations=3))


@pytest.mark.usefixtures("one_thread")
def test_training_under_swapadvisor_is_bit_identical_to_eager_within_the_budget(trained):
    (eager, want), (model, got, runner), budget = trained
    assert_same(got, want)
    assert_same(state_of(model), state_of(eager))
    stats = runner.stats()
    assert stats["policy"] == "swapadvisor" and stats["iterations"] == 3
    assert stats["measured_peak_bytes"] <= stats["planned_peak_bytes"] <= budget
    assert stats["swaps"] > 0 and stats["recomputes"] == 0 and stats["passive_swaps"] == 0
    assert not check_event_log(runner.executors()[0].event_log)


def test_module_doctest():
    import doctest
    from dbml.scheduler.plan import swapadvisor
    result = doctest.testmod(swapadvisor)
    assert result.attempted > 0 and result.failed == 0
