"""Plan updating (TENSILE IV-E): measured latencies drive replans, exactly as the
threshold implies; new plans take effect at iteration boundaries only; results stay
bit-identical to eager; the ``planner=`` hook and plan hand-over from outside."""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch

import nets

from dbml.scheduler.plan import planner as planner_mod
from dbml.scheduler.execute.executor import Executor, check_event_log
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.graph.sequence import EventKind
from dbml.scheduler.execute.updating import LatencyTracker, UpdateSettings, drift, ewma, retime
from helpers import assert_same, eager_state

loss_fn = torch.nn.functional.cross_entropy
L = 1e-4          # every op's estimated latency (ConstModel)
SLOW_FROM = 3     # the first iteration in which the slowed op is slow


pytestmark = pytest.mark.usefixtures("one_thread")


class ConstModel:
    """Every op takes L seconds: the estimates the first plan is made from."""

    def predict(self, node) -> float:
        return L


def mlp():
    return nets.mlp(depth=3)


def batches(n):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(n)]


def budget_for(model, spec, x, y, fraction=0.6) -> int:
    r = ScheduledStep(copy.deepcopy(model), loss_fn, spec, policy="none")
    r.step(x, y)
    return int(r.stats()["vanilla_peak_bytes"] * fraction)


def fake_measurements(monkeypatch, slow_op: int | None, factor: float):
    """Executor.op_latencies reports the estimates exactly, except that from iteration
    SLOW_FROM on op ``slow_op`` takes ``factor`` times the whole estimated sum longer."""
    def op_latencies(self):
        n = self.n_ops
        out = [L] * n
        if slow_op is not None and self.totals["iterations"] >= SLOW_FROM:
            out[slow_op] += factor * n * L
        return out
    monkeypatch.setattr(Executor, "op_latencies", op_latencies)
    monkeypatch.setattr(Executor, "copy_bandwidth", lambda self: None)   # no bandwidth observed


def expected_changes(n_ops, n_iter, slow_op, factor, settings) -> list[int]:
    """The oracle: iterations (1-based) that start under a new plan, by the paper's rule
    recomputed here: EWMA per op, replan when |s' - s| / s > threshold."""
    avg, ref, changes = [L] * n_ops, n_ops * L, []
    for i in range(1, n_iter + 1):
        measured = [L] * n_ops
        if slow_op is not None and i >= SLOW_FROM:
            measured[slow_op] += factor * n_ops * L
        avg = [settings.beta * m + (1 - settings.beta) * a for a, m in zip(avg, measured)]
        if settings.enabled and abs(sum(avg) - ref) / ref > settings.threshold:
            changes.append(i + 1)
            ref = sum(avg)
    return [c for c in changes if c <= n_iter]


def run(model, spec, data, budget, **kw):
    m = copy.deepcopy(model)
    runner = ScheduledStep(m, loss_fn, spec, budget_bytes=budget, latency_model=ConstModel(), log=True, **kw)
    torch.manual_seed(1)
    losses = [runner.step(x, y) for x, y in data]
    runner.finish()
    return runner, list(m.parameters()) + list(m.buffers()), losses


def first_matmul(runner) -> int:
    seq = next(iter(runner.sequences.values()))
    return next(op.index for op in seq.ops if op.name.startswith("addmm"))


N = 7


def scenario(n: int):
    """Adam, ``n`` batches, a seeded MLP, a budget it must be scheduled in, and eager's result."""
    spec = OptimizerSpec("adam", lr=0.01)
    data = batches(n)
    torch.manual_seed(0)
    model = mlp()
    budget = budget_for(model, spec, *data[0])
    eager, losses = eager_state(model, spec, data)
    return spec, data, model, budget, eager, losses


@functools.lru_cache(maxsize=None)
def adam_workload():
    """Shared by the threshold cases: model, data, budget, eager reference, op to slow."""
    spec, data, model, budget, eager, eager_losses = scenario(N)
    probe = ScheduledStep(copy.deepcopy(model), loss_fn, spec, budget_bytes=budget, latency_model=ConstModel())
    probe.step(*data[0])
    slow, n_ops = first_matmul(probe), len(next(iter(probe.sequences.values())).ops)
    return spec, data, model, budget, eager, eager_losses, slow, n_ops


@pytest.mark.slow
@pytest.mark.parametrize("threshold, want", [(0.3, [SLOW_FROM + 1]), (0.95, [SLOW_FROM + 2]), (2.0, [])])
def test_drift_triggers_exactly_the_replans_the_threshold_implies(monkeypatch, threshold, want):
    spec, data, model, budget, eager, eager_losses, slow, n_ops = adam_workload()

    settings = UpdateSettings(beta=0.9, threshold=threshold)
    # by hand: the slow op adds the whole sum; after one iteration the average has moved
    # 0.9 of that, after two 0.99, then 0.999: 0.3 fires once, 0.95 a step later, 2.0 never
    assert expected_changes(n_ops, N, slow, 1.0, settings) == want
    fake_measurements(monkeypatch, slow, 1.0)
    runner, got, losses = run(model, spec, data, budget, update=settings)

    plans = runner.iteration_plans
    changes = [i + 1 for i in range(1, N) if plans[i] is not plans[i - 1]]
    assert changes == want
    assert runner.stats()["replans"] == len(want) == runner.stats()["plan_changes"]
    if want:
        seq = next(iter(runner.sequences.values()))   # the sequence the plan in effect came from
        assert seq.ops[slow].latency > 0.85 * n_ops * L        # made from the measured latencies
        assert plans[-1] is next(iter(runner.plans.values()))
        assert any(e.kind is EventKind.SWAP_OUT for e in plans[-1].events)
    assert_same(got, eager)
    assert_same(losses, eager_losses)
    stats = runner.stats()
    assert stats["measured_peak_bytes"] <= budget
    assert all(check_event_log(ex.event_log) == [] for ex in runner.executors())


def test_no_drift_no_replans_and_the_switch(monkeypatch):
    spec = OptimizerSpec("sgd", lr=0.05, momentum=0.9)
    data = batches(5)
    torch.manual_seed(0)
    model = mlp()
    budget = budget_for(model, spec, *data[0])
    eager, _ = eager_state(model, spec, data)
    fake_measurements(monkeypatch, None, 0.0)
    runner, got, _ = run(model, spec, data, budget)
    assert runner.stats()["replans"] == 0
    assert all(p is runner.iteration_plans[0] for p in runner.iteration_plans)
    assert_same(got, eager)
    # drift, but updating switched off: no replans either
    fake_measurements(monkeypatch, 0, 5.0)
    off, got_off, _ = run(model, spec, data, budget, update=UpdateSettings(enabled=False))
    assert off.stats()["replans"] == 0 and len({id(p) for p in off.iteration_plans}) == 1
    assert_same(got_off, eager)


@pytest.mark.slow
def test_offered_plan_waits_for_the_iteration_boundary(monkeypatch):
    """A plan offered while an iteration runs is not used by it, only by the next."""
    spec, data, model, budget, eager, _ = scenario(4)
    fake_measurements(monkeypatch, None, 0.0)
    runner = ScheduledStep(copy.deepcopy(model), loss_fn, spec, budget_bytes=budget, latency_model=ConstModel())
    seen = []
    original_run = Executor.run

    def run_and_offer(self, state, x, y):
        if len(runner.iteration_plans) == 2:   # during the second iteration
            seq = next(iter(runner.sequences.values()))
            runner.offer_plan(planner_mod.plan(seq, budget, settings=planner_mod.PlanSettings(**planner_mod.PAPER)))
        out = original_run(self, state, x, y)
        seen.append(self.plan)                 # the plan this iteration ran under, at its end
        return out

    monkeypatch.setattr(Executor, "run", run_and_offer)
    torch.manual_seed(1)
    for x, y in data:
        runner.step(x, y)
    runner.finish()
    p = runner.iteration_plans
    assert p[0] is p[1] and seen[1] is p[1]            # not adopted mid-iteration
    assert p[2] is not p[1] and p[2] is p[3] and seen[2] is p[2]
    assert runner.stats()["plan_changes"] == 1 and runner.stats()["replans"] == 0
    assert_same(list(runner.model.parameters()) + list(runner.model.buffers()), eager)


@pytest.mark.slow
def test_planner_hook_is_used_for_first_plan_and_replans(monkeypatch):
    spec, data, model, budget, eager, _ = scenario(6)
    calls, made = [], []

    def hook(seq):
        calls.append(seq)
        made.append(planner_mod.plan(seq, budget))
        return made[-1]

    fake_measurements(monkeypatch, 0, 1.0)
    runner, got, _ = run(model, spec, data, None, planner=hook)
    assert len(calls) == 1 + runner.stats()["replans"] == 2   # the first plan, one replan
    assert runner.iteration_plans[0] is made[0] and runner.iteration_plans[-1] is made[1]
    assert calls[1].ops[0].latency > calls[0].ops[0].latency
    assert runner.stats()["measured_peak_bytes"] <= budget
    assert_same(got, eager)


def test_external_planner_version_is_checked_at_boundaries(monkeypatch):
    """An ExternalPlanner (a shared scheduler): a new ``version()`` is picked up, by
    ``latest(seq)``, at the next iteration boundary."""
    spec = OptimizerSpec("sgd", lr=0.05)
    data = batches(4)
    torch.manual_seed(0)
    model = mlp()
    budget = budget_for(model, spec, *data[0])
    eager, _ = eager_state(model, spec, data)

    class Shared:   # an ExternalPlanner
        ledger = None

        def __init__(self):
            self.v, self.budget = 1, budget

        def __call__(self, seq):
            return self.latest(seq)

        def version(self):
            return self.v

        def latest(self, seq):
            return planner_mod.plan(seq, self.budget)

        def made_from(self, seq):
            return seq

        def applied(self):
            pass

    shared = Shared()
    fake_measurements(monkeypatch, None, 0.0)
    runner = ScheduledStep(copy.deepcopy(model), loss_fn, spec, latency_model=ConstModel(), planner=shared)
    torch.manual_seed(1)
    runner.step(*data[0])
    runner.step(*data[1])
    shared.v, shared.budget = 2, int(budget * 0.8)     # the shared scheduler replanned
    runner.step(*data[2])
    runner.step(*data[3])
    runner.finish()
    p = runner.iteration_plans
    assert p[0] is p[1] and p[2] is not p[1] and p[2] is p[3]
    assert p[2].peak_bytes <= int(budget * 0.8) < budget
    assert runner.executors()[0].iteration_peak <= int(budget * 0.8)
    assert_same(list(runner.model.parameters()) + list(runner.model.buffers()), eager)


def test_tracker_and_retime_units():
    assert ewma([1.0, 2.0], [3.0, 2.0], 0.9) == pytest.approx([2.8, 2.0])
    assert drift(2.0, 3.0) == 0.5 and drift(2.0, 1.0) == 0.5
    with pytest.raises(ValueError, match="beta"):
        UpdateSettings(beta=0.0)
    from dbml.scheduler.graph.sequence import AccessSequence, Op, Phase
    seq = AccessSequence("j", (), tuple(Op(i, f"o{i}", (), (), i * 1.0, i + 1.0, Phase.FORWARD) for i in range(3)),
                         frozenset())
    t = LatencyTracker(seq, UpdateSettings(beta=1.0, threshold=0.5))
    assert not t.observe([1.0, 1.0, 2.0]) and t.observe([1.0, 1.0, 3.0])   # 4/3 -> 1/3, 5/3 -> 2/3
    r = retime(seq, t.latencies)
    assert [(o.start, o.end) for o in r.ops] == [(0.0, 1.0), (1.0, 2.0), (2.0, 5.0)]
    assert dataclasses.replace(r, ops=seq.ops) == seq
    t.rebase(r)
    assert t.reference == 5.0 and t.drift == 0.0


def test_copy_bandwidth_correction_is_a_setting():
    from dbml.scheduler.graph.sequence import AccessSequence, Op, Phase
    seq = AccessSequence("j", (), (Op(0, "a", (), (), 0.0, 1.0, Phase.FORWARD),), frozenset(), copy_bandwidth=1e9)
    paper = LatencyTracker(seq, UpdateSettings(beta=1.0, threshold=0.3))
    assert not paper.observe([1.0], bandwidth=0.5e9)          # the paper: latencies only
    ext = LatencyTracker(seq, UpdateSettings(beta=1.0, threshold=0.3, copy_bandwidth=True))
    assert ext.observe([1.0], bandwidth=0.5e9) and ext.bandwidth == 0.5e9
    assert retime(seq, ext.latencies, ext.bandwidth).copy_bandwidth == 0.5e9
    ext.rebase(retime(seq, ext.latencies, ext.bandwidth))
    assert not ext.observe([1.0], bandwidth=0.5e9) and ext.drift == 0.0
