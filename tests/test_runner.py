"""ScheduledStep end to end with the real planner: scheduling never changes results,
the budget holds, predicted and measured peaks agree, and the switches work."""

from __future__ import annotations

import copy
import re

import pytest
import torch

import nets

from dbml.scheduler.execute.executor import check_event_log
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.plan.planner import InfeasibleBudget
from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.graph.sequence import EventKind, Phase
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.execute.updating import UpdateSettings
from helpers import assert_same, state_of, vanilla_peak

loss_fn = torch.nn.functional.cross_entropy
TOLERANCE = 0.05   # predicted vs measured peak


pytestmark = pytest.mark.usefixtures("one_thread")


def mlp():
    return nets.mlp(depth=4)


cnn = nets.cnn


def deep_narrow():
    layers = [m for _ in range(8) for m in (torch.nn.Linear(64, 64), torch.nn.Tanh())]
    return torch.nn.Sequential(*layers, torch.nn.Linear(64, 10))


SHAPES = {mlp: (64, (32,)), cnn: (16, (3, 12, 12)), deep_narrow: (4, (64,))}


def data_for(model_fn, n=5, last=None):
    b, shape = SHAPES[model_fn]
    g = torch.Generator().manual_seed(3)
    sizes = [b] * n + ([last] if last else [])
    return [(torch.randn(s, *shape, generator=g), torch.randint(0, 10, (s,), generator=g)) for s in sizes]


def train(runner, data, seed=1):
    torch.manual_seed(seed)
    losses = [runner.step(x, y) for x, y in data]
    runner.finish()
    return losses


def trained_eagerly(model_fn, spec, data):
    """A seeded model trained eagerly on ``data``, an untouched copy to schedule, and the
    eager losses."""
    torch.manual_seed(0)
    model = model_fn()
    eager, sched = copy.deepcopy(model), copy.deepcopy(model)
    return eager, sched, train(EagerStep(eager, loss_fn, spec), data)


@pytest.mark.slow
@pytest.mark.parametrize("model_fn", [mlp, cnn], ids=["mlp", "cnn_bn"])
@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_tensile_at_half_the_peak_is_bit_identical(model_fn, kind):
    spec = OptimizerSpec(kind, lr=0.01)
    data = data_for(model_fn, 5, last=5)   # five full batches and a last, smaller one
    torch.manual_seed(0)
    model = model_fn()
    eager, none, sched = (copy.deepcopy(model) for _ in range(3))
    budget = vanilla_peak(model_fn, spec, *data[0]) // 2

    want = train(EagerStep(eager, loss_fn, spec), data)
    got_none = train(ScheduledStep(none, loss_fn, spec, policy="none"), data)
    runner = ScheduledStep(sched, loss_fn, spec, policy="tensile", budget_bytes=budget, log=True)
    got = train(runner, data)

    assert_same(state_of(sched), state_of(eager))
    assert_same(state_of(none), state_of(eager))
    assert_same(got, want)
    assert_same(got_none, want)
    stats = runner.stats()
    assert stats["graphs"] == 2 and stats["iterations"] == 6
    assert stats["swaps"] + stats["recomputes"] > 0              # it did schedule
    assert stats["measured_peak_bytes"] <= budget
    assert stats["reserved_peak_bytes"] <= budget   # the reuse pool stays within it too
    assert abs(stats["measured_peak_bytes"] - stats["planned_peak_bytes"]) <= TOLERANCE * stats["planned_peak_bytes"]
    for ex in runner.executors():
        assert check_event_log(ex.event_log) == []
        assert ex.peak_bytes <= budget


@pytest.mark.slow
def test_dropout_trains_and_is_never_recomputed():
    spec = OptimizerSpec("adam", lr=0.01)
    data = data_for(mlp, 3)
    torch.manual_seed(0)
    model = mlp()
    eager, sched = copy.deepcopy(model), copy.deepcopy(model)
    floor = _min_budget(mlp, spec, data[0])
    want = train(EagerStep(eager, loss_fn, spec), data)
    runner = ScheduledStep(sched, loss_fn, spec, budget_bytes=floor, log=True)
    got = train(runner, data)
    assert_same(state_of(sched), state_of(eager))
    assert_same(got, want)
    seq, plan = next(iter(runner.sequences.values())), next(iter(runner.plans.values()))
    random = {t.id for t in seq.tensors if t.not_replayable}
    dropout = [op for op in seq.ops if op.not_replayable and op.phase is Phase.FORWARD and op.name.startswith("bernoulli")]
    assert dropout and all(set(op.outputs) <= random for op in dropout)
    assert not any(e.kind is EventKind.RECOMPUTE and e.tensor in random for e in plan.events)
    logged = [e for ex in runner.executors() for e in ex.event_log if e[0] == "recompute"]
    assert not any(e[2] in random for e in logged)


def _min_budget(model_fn, spec, batch) -> int:
    torch.manual_seed(0)
    with pytest.raises(InfeasibleBudget) as err:
        ScheduledStep(model_fn(), loss_fn, spec, budget_bytes=1).step(*batch)
    return err.value.min_budget


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.slow   # ~0.9 s: out of the -m 'not slow' inner loop (under a minute)
def test_cross_iteration_below_params_plus_state(kind):
    """A budget below parameters + optimizer state: updated tensors leave in the
    optimizer phase and are prefetched in the next iteration; results unchanged."""
    spec = OptimizerSpec(kind, lr=0.01)
    data = data_for(deep_narrow, 4)
    torch.manual_seed(0)
    model = deep_narrow()
    eager, sched = copy.deepcopy(model), copy.deepcopy(model)
    want = train(EagerStep(eager, loss_fn, spec), data)
    state_bytes = sum(p.numel() * 4 for p in model.parameters()) * (3 if kind == "adam" else 2)
    budget = int(state_bytes * 0.9)
    runner = ScheduledStep(sched, loss_fn, spec, budget_bytes=budget, log=True)
    got = train(runner, data)
    assert_same(state_of(sched), state_of(eager))
    assert_same(got, want)

    seq, plan = next(iter(runner.sequences.values())), next(iter(runner.plans.values()))
    assert plan.host_at_start, "nothing carried across iterations on the host"
    updated_out = [e for e in plan.events if e.kind is EventKind.SWAP_OUT and e.tensor in seq.updates
                   and seq.ops[e.trigger].phase is Phase.OPTIMIZER]
    assert {seq.updates[e.tensor] for e in updated_out} >= set(plan.host_at_start)
    prefetched = {e.tensor for e in plan.events if e.kind is EventKind.SWAP_IN}
    assert set(plan.host_at_start) <= prefetched
    stats = runner.stats()
    assert stats["measured_peak_bytes"] <= budget < state_bytes
    assert all(check_event_log(ex.event_log) == [] for ex in runner.executors())


def test_infeasible_budget_names_the_smallest_feasible_one():
    spec = OptimizerSpec("sgd", lr=0.01)
    data = data_for(cnn, 2)
    torch.manual_seed(0)
    runner = ScheduledStep(cnn(), loss_fn, spec, budget_bytes=1000)
    with pytest.raises(InfeasibleBudget, match=r"smallest feasible budget is \d+ bytes") as err:
        runner.step(*data[0])
    smallest = err.value.min_budget
    assert 1000 < smallest < vanilla_peak(cnn, spec, *data[0])
    ok = ScheduledStep(cnn(), loss_fn, spec, budget_bytes=smallest)
    train(ok, data)
    assert ok.stats()["measured_peak_bytes"] <= smallest


@pytest.mark.slow
def test_no_scheduler_switch_and_debug_summary(monkeypatch, capsys):
    spec = OptimizerSpec("adam")
    data = data_for(mlp, 1)
    monkeypatch.setenv("DBML_NO_SCHEDULER", "1")
    off = ScheduledStep(mlp(), loss_fn, spec, budget_bytes=1000)   # would be infeasible
    off.step(*data[0])
    assert off.policy == "none" and off.stats()["swaps"] == 0
    monkeypatch.delenv("DBML_NO_SCHEDULER")
    monkeypatch.setenv("DBML_DEBUG", "1")
    budget = vanilla_peak(mlp, spec, *data[0]) * 3 // 4
    on = ScheduledStep(mlp(), loss_fn, spec, budget_bytes=budget)
    on.step(*data[0])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(r"dbml\.scheduler\[job\]: peak [\d.]+ MB -> [\d.]+ MB, \d+ swaps, "
                        r"\d+ recomputes, plan \d+\.\d\d s", line), line
    stats = on.stats()
    for key in ("vanilla_peak_bytes", "planned_peak_bytes", "measured_peak_bytes", "swaps",
                "recomputes", "passive_swaps", "plan_seconds", "summary"):
        assert key in stats
    assert stats["summary"] in line


def test_finish_writes_weights_back_even_from_the_host():
    spec = OptimizerSpec("sgd", lr=0.1)
    data = data_for(deep_narrow, 2)
    torch.manual_seed(0)
    model = deep_narrow()
    eager, sched = copy.deepcopy(model), copy.deepcopy(model)
    train(EagerStep(eager, loss_fn, spec), data)
    budget = int(sum(p.numel() * 4 for p in model.parameters()) * 2 * 0.9)
    runner = ScheduledStep(sched, loss_fn, spec, budget_bytes=budget)
    torch.manual_seed(1)
    for x, y in data:
        runner.step(x, y)
    assert runner.state.host, "some state should be on the host between iterations"
    runner.finish()
    assert_same(state_of(sched), state_of(eager))


@pytest.mark.slow   # ~0.8 s: out of the -m 'not slow' inner loop (under a minute)
def test_frozen_parameters_stay_frozen_like_eager():
    """A parameter with requires_grad off gets no gradient in eager, so the optimizer
    leaves it (and creates no state for it): the captured step must do the same."""
    spec = OptimizerSpec("adam", lr=0.05)
    data = data_for(mlp, 3)
    torch.manual_seed(0)
    model = mlp()
    model[0].weight.requires_grad_(False)
    eager, sched = copy.deepcopy(model), copy.deepcopy(model)
    want = train(EagerStep(eager, loss_fn, spec), data)
    runner = ScheduledStep(sched, loss_fn, spec, policy="none")
    got = train(runner, data)
    assert_same(state_of(sched), state_of(eager))
    assert_same(got, want)
    assert torch.equal(sched[0].weight, model[0].weight)
    assert len(runner.optimizer_state()) == len(list(model.parameters())) - 1


@pytest.mark.slow
def test_prepare_plans_before_the_first_batch_from_shapes_alone():
    spec = OptimizerSpec("adam", lr=0.01)
    data = data_for(cnn, 3)
    eager, sched, want = trained_eagerly(cnn, spec, data)
    runner = ScheduledStep(sched, loss_fn, spec, budget_bytes=vanilla_peak(cnn, spec, *data[0]) * 3 // 4,
                           update=UpdateSettings(enabled=False))
    x, y = data[0]
    runner.prepare(torch.empty_like(x), torch.empty_like(y))
    planned, seconds = runner.plans, runner.plan_seconds
    assert len(planned) == 1 and next(iter(planned.values())).count(EventKind.SWAP_OUT) > 0
    got = train(runner, data)
    assert runner.plans == planned and runner.stats()["iterations"] == 3 and runner.iteration_plans[0] is \
        next(iter(planned.values()))
    assert seconds > 0 and runner.stats()["graphs"] == 1
    assert_same(state_of(sched), state_of(eager))
    assert_same(got, want)


@pytest.mark.slow
def test_a_further_graph_no_plan_fits_runs_passively_within_the_jobs_limit():
    """The last, smaller batch's graph may find no plan beside other jobs (its faster ops
    hide fewer copies): it runs in passive mode, evicting on demand within the largest
    limit the job's planned graphs have, and the job goes on, bit-identical."""
    from dbml.scheduler.plan.planner import plan
    spec = OptimizerSpec("adam", lr=0.01)
    data = data_for(mlp, 3, last=8)
    eager, sched, want = trained_eagerly(mlp, spec, data)
    budget = vanilla_peak(mlp, spec, *data[0]) * 3 // 4

    def planner(seq, calls=[]):   # noqa: B006 - counts the graphs planned
        calls.append(seq)
        if len(calls) > 1 and len(seq.ops) and seq.tensors != calls[0].tensors:
            raise InfeasibleBudget(seq.job, budget // 10, budget)
        return plan(seq, budget)

    runner = ScheduledStep(sched, loss_fn, spec, planner=planner, update=UpdateSettings(enabled=False))
    got = train(runner, data)
    assert_same(state_of(sched), state_of(eager))
    assert_same(got, want)
    small = [g for g in runner.schedules().values() if g.passive]
    assert len(small) == 1 and small[0].executor.budget == runner.plans[next(iter(runner.plans))].peak_bytes
    assert runner.stats()["measured_peak_bytes"] <= budget


STATS_KEYS = ["policy", "budget_bytes", "vanilla_peak_bytes", "planned_peak_bytes", "measured_peak_bytes",
              "reserved_peak_bytes", "swaps", "swap_outs", "swap_ins", "recomputes", "passive_swaps",
              "passive_swap_ins", "passive_swap_outs", "late_swap_ins", "passive_recomputes", "setup_swaps",
              "budget_waits", "iterations", "graphs", "plan_seconds", "replans", "failed_replans",
              "deferred_replans", "replan_seconds", "plan_changes", "planned_extra_seconds", "summary"]


def test_both_runners_are_whole_step_runners():
    """The runtime calls prepare/close and sets latency_source on any StepRunner, and
    reads stats() (dbml's memory summary and the SQL views take these keys)."""
    spec = OptimizerSpec("sgd", lr=0.01)
    (x, y), = data_for(mlp, 1)
    for runner in (EagerStep(mlp(), loss_fn, spec), ScheduledStep(mlp(), loss_fn, spec)):
        assert runner.latency_source is None
        runner.latency_source = "roofline"
        runner.prepare(torch.empty_like(x), torch.empty_like(y))
        runner.step(x, y)
        runner.finish()
        runner.close()
        assert runner.latency_source == "roofline" and runner.stats()["measured_peak_bytes"] > 0
    stats = runner.stats()
    assert list(stats) == STATS_KEYS and stats["iterations"] == 1 and stats["graphs"] == 1
    assert stats["summary"] == runner.runner_stats().summary


def test_a_bare_callable_planner_never_changes_its_plans_by_itself():
    from dbml.scheduler.execute.planners import ExternalPlanner, FixedPlanner, LocalPlanner
    from dbml.scheduler.plan.planner import plan
    runner = ScheduledStep(mlp(), loss_fn, OptimizerSpec("sgd"), planner=lambda seq: plan(seq, 1 << 40))
    assert isinstance(runner.planner, FixedPlanner) and runner.planner.version() == 0
    assert isinstance(ScheduledStep(mlp(), loss_fn, OptimizerSpec("sgd")).planner, LocalPlanner)
    assert isinstance(runner.planner, ExternalPlanner)
