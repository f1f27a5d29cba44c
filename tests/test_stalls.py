"""Planned stalls and recompute by cost (issue 13, parts 2 and 3).

When no swap fits the copy channel without making compute wait, the planner plans the
least added time: a synchronous swap-out (op ``before`` waits for its copy), a late
swap-in (the op that reads it waits), or a recompute, priced per byte freed. The waits
are part of peak.py's exact ledger (rule 7): ``replay`` (tests/sequences.py) rebuilds
them independently, and the executor reproduces them, bit-identical to eager."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from dbml.scheduler import synthetic
from dbml.scheduler.execute.executor import ExecState, Executor, Program, check_event_log
from dbml.scheduler.execute.devices import CpuDevice
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.graph.access import build_sequence
from dbml.scheduler.graph.capture import capture, init_state
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.graph.sequence import Event, Plan
from dbml.scheduler.latency.estimate import Machine, RooflineModel
from dbml.scheduler.plan.liveness import release_events
from dbml.scheduler.plan.peak import analyse_peak, build_timeline
from dbml.scheduler.plan.planner import BEYOND, PAPER, InfeasibleBudget, PlanSettings, plan, tensor_granularity_floor
from helpers import assert_identical
from sequences import RC, SI, SO, check_plan, make_seq, random_sequences, replay

PAPER_SETTINGS = PlanSettings(**PAPER)
STALLS = PlanSettings(**BEYOND)   # what this file tests (not the default yet)


def _min_budget(seq, knobs=STALLS) -> int:
    try:
        return plan(seq, 0, settings=knobs).peak_bytes
    except InfeasibleBudget as err:
        return err.min_budget


# --- the ledger: rule 7 -----------------------------------------------------------------

def test_synchronous_swap_out_and_late_swap_in_delay_the_ops_that_wait():
    # t1 (40) made by op0, read by op4; copies take 4 s each (bandwidth 10)
    ops = [([0], [1], 1), ([0], [2], 1), ([2], [3], 1), ([3], [4], 1), ([1, 4], [5], 1)]
    seq = make_seq([1, 40, 30, 30, 1, 1], [0], ops, outputs={5}, bandwidth=10.0)
    events = (Event(0, 0.0, SO, 1, before=2), Event(2, 0.0, SI, 1, before=4)) + release_events(seq)
    tl = build_timeline(seq, events)
    # op2 is entered when the swap-out ends (1 + 4), op4 starts when the swap-in ends
    assert list(tl.op_entry) == [0.0, 1.0, 5.0, 6.0, 7.0]
    assert list(tl.op_start) == [0.0, 1.0, 5.0, 6.0, 10.0] and tl.waited == 3.0 + 3.0
    peak = analyse_peak(seq, events)
    # op1 holds t1 (its copy is not done): 1 + 40 + 30; op2 does not (1 + 30 + 30); the
    # swap-in, issued after op2, allocates t1 beside op3's t3 and t4: 1 + 40 + 30 + 1
    assert peak.bytes == 72 and peak.op == 3 and peak.duration == 11.0
    # the same copy not waited for is still running when the swap-in allocates t1 again
    unwaited = analyse_peak(seq, (Event(0, 0.0, SO, 1),) + events[1:])
    assert unwaited.bytes == 1 + 40 + 40 + 30 + 1 and unwaited.duration == 8.0
    assert replay(seq, Plan("j", tuple(sorted(events)), 0, 0)) == peak.bytes


def test_swap_with_stalls_where_the_paper_cannot_swap():
    # copies of t1 take 100 s: no swap fits without a wait; t1 is random, never recomputed
    ops = [([0], [1], 1, True), ([0], [2], 1)] + [([k], [k + 1], 1) for k in range(2, 7)] + [([1, 7], [8], 1)]
    seq = make_seq([1, 100, 1, 10, 10, 10, 1, 1, 1], [0], ops, outputs={8}, bandwidth=1.0, random_tensors={1})
    with pytest.raises(InfeasibleBudget):
        plan(seq, 110, settings=PAPER_SETTINGS)
    p = plan(seq, 110, settings=STALLS)
    check_plan(seq, p, 110)
    assert p.count(SO) == 1 and p.count(RC) == 0
    assert p.extra_time == pytest.approx(analyse_peak(seq, p.events).duration - seq.duration)
    assert p.extra_time >= 100.0   # at least one whole copy is waited for


def test_recompute_by_cost_beats_a_slow_swap_and_not_a_fast_one():
    # t1 (100) is cheap to recompute (1 s): with copies of 100 s the recompute costs less;
    # with fast copies a stall-free swap costs nothing
    from sequences import chain
    slow = plan(chain(bandwidth=1.0), 110, settings=STALLS)
    assert slow.count(RC) == 1 and slow.count(SO) == 0 and slow.extra_time == 1.0
    fast = plan(chain(bandwidth=100.0), 110, settings=STALLS)
    assert fast.count(SO) == 1 and fast.count(RC) == 0 and fast.extra_time == 0.0


def test_paper_choice_recomputes_by_msps_after_swapping():
    from sequences import chain
    p = plan(chain(bandwidth=1.0), 110, settings=PlanSettings(stalls=True, choice="paper"))
    assert p.count(RC) == 1
    with pytest.raises(ValueError, match="unknown choice 'cheap'"):
        PlanSettings(choice="cheap")


# --- reach -------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("n_ops, seed, bandwidth", [(60, 1, 12e9), (200, 2, 12e9), (300, 5, 2e9)])
def test_stalls_reach_smaller_budgets_than_the_paper(n_ops, seed, bandwidth):
    seq = synthetic.training_sequence("j", n_ops, seed=seed, bandwidth=bandwidth)
    paper, stalls = _min_budget(seq, PAPER_SETTINGS), _min_budget(seq)
    assert stalls < paper
    assert stalls >= tensor_granularity_floor(seq)
    p = plan(seq, stalls, settings=STALLS)
    check_plan(seq, p, stalls)
    assert p.extra_time > 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=random_sequences(), frac=st.floats(0.0, 1.0), choice=st.sampled_from(["cost", "paper"]))
@pytest.mark.slow
def test_random_plans_with_stalls_are_exact_ledgers(seq, frac, choice):
    knobs = PlanSettings(stalls=True, choice=choice)
    vanilla = plan(seq, 1 << 40, policy="none").peak_bytes
    budget = int(frac * vanilla)
    try:
        p = plan(seq, budget, settings=knobs)
    except InfeasibleBudget as err:
        assert tensor_granularity_floor(seq) <= err.min_budget
        budget = err.min_budget
        p = plan(seq, budget, settings=knobs)
    check_plan(seq, p, budget)
    timeline = build_timeline(seq, p.events)
    assert p.extra_time == pytest.approx(timeline.op_end[-1] - seq.duration, abs=1e-9) if seq.ops else True
    for e in p.events:
        if e.kind is RC:
            assert not seq.tensors[e.tensor].not_replayable


# --- the executor performs planned stalls --------------------------------------------------

SLOW_COPIES = Machine(peak_flops=5e9, memory_bandwidth=5e9, copy_bandwidth=2e8, op_overhead=5e-6)


def _cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10))


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_executor_runs_a_plan_with_stalls_bit_identically_within_its_peak():
    loss_fn, spec = torch.nn.functional.cross_entropy, OptimizerSpec("adam", lr=1e-2)
    g = torch.Generator().manual_seed(5)
    data = [(torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(3)]
    torch.manual_seed(0)
    model = _cnn()
    captured = capture(copy.deepcopy(model), loss_fn, spec, data[0])
    seq = build_sequence(captured, RooflineModel(SLOW_COPIES))
    budget = _min_budget(seq)
    assert budget < _min_budget(seq, PAPER_SETTINGS)
    p = plan(seq, budget, settings=STALLS)
    check_plan(seq, p, budget)
    synchronous = [e for e in p.events if e.kind is SO and e.before >= 0]
    assert p.extra_time > 0 and synchronous

    eager = copy.deepcopy(model)
    step = EagerStep(eager, loss_fn, spec)
    torch.manual_seed(1)
    want_losses = [step.step(x, y) for x, y in data]

    m = copy.deepcopy(model)
    params = [q.detach() for q in m.parameters()]
    state = ExecState(params + [b.detach() for b in m.buffers()]
                      + [t for q in params for t in init_state(spec, q).values()])
    ex = Executor(Program(captured, seq), p, CpuDevice(), log=True, budget_bytes=p.peak_bytes)
    torch.manual_seed(1)
    try:
        losses, peaks = [], []
        for x, y in data:
            losses.append(ex.run(state, x, y))
            peaks.append(ex.iteration_peak)
    finally:
        ex.close()
    assert all(torch.equal(a, b) for a, b in zip(losses, want_losses))
    n = len(params)
    for i in range(n):   # parameters the plan left on the host come back for the comparison
        if state.values[i] is None:
            like = captured.placeholders()[i].meta["val"]
            flat = state.host.pop(i)
            state.values[i] = torch.empty(0, dtype=like.dtype).set_(flat.untyped_storage(), 0, like.shape, like.stride())
    assert_identical(state.values[:n], [q.detach() for q in eager.parameters()])
    assert check_event_log(ex.event_log) == []
    assert max(peaks) <= p.peak_bytes
    assert max(peaks) >= 0.95 * p.peak_bytes
    assert ex.totals["passive_swaps"] == 0 and ex.totals["passive_recomputes"] == 0
    logged_waits = [e for e in ex.event_log if e[0] == "wait"]
    assert len(logged_waits) == len(synchronous) * len(data)
