"""The passive-mode peer, ``policy="capuchin"``: the first iteration runs with no plan,
only the budget, evicting least recently used tensors on demand and swapping them back
in on demand; later iterations run a plan made from what it measured. Results are
bit-identical to eager and the budget holds in every iteration."""

from __future__ import annotations

import copy

import pytest
import torch

import nets

from dbml.scheduler.execute.evictor import PassiveEvictor
from dbml.scheduler.execute.executor import Executor, check_event_log
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.plan.planner import plan
from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.graph.sequence import EventKind
from dbml.scheduler.execute.step import EagerStep
from helpers import state_of, vanilla_peak

loss_fn = torch.nn.functional.cross_entropy


pytestmark = pytest.mark.usefixtures("one_thread")


def mlp():
    return nets.mlp(depth=3)


cnn = nets.cnn


SHAPES = {mlp: (64, (32,)), cnn: (16, (3, 12, 12))}


def batches(model_fn, n):
    b, shape = SHAPES[model_fn]
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(b, *shape, generator=g), torch.randint(0, 10, (b,), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("model_fn, kind", [pytest.param(mlp, "adam", marks=pytest.mark.slow), (cnn, "sgd")],
                         ids=["mlp_adam", "cnn_bn_sgd"])
@pytest.mark.slow   # ~0.6 s: out of the -m 'not slow' inner loop (under a minute)
def test_capuchin_is_bit_identical_passive_first_then_planned(model_fn, kind):
    spec = OptimizerSpec(kind, lr=0.01, **({"momentum": 0.9} if kind == "sgd" else {}))
    data = batches(model_fn, 5)
    torch.manual_seed(0)
    model = model_fn()
    eager_model, sched_model = copy.deepcopy(model), copy.deepcopy(model)
    budget = vanilla_peak(model, spec, *data[0]) // 2

    eager = EagerStep(eager_model, loss_fn, spec)
    torch.manual_seed(1)
    want = [eager.step(x, y) for x, y in data]
    eager.finish()

    runner = ScheduledStep(sched_model, loss_fn, spec, policy="capuchin", budget_bytes=budget, log=True)
    torch.manual_seed(1)
    got, per_iter = [], []
    for x, y in data:
        got.append(runner.step(x, y))
        ex = runner.executors()[0]
        per_iter.append((dict(ex.counts), ex.iteration_peak))
    runner.finish()

    assert all(torch.equal(a, b) for a, b in zip(state_of(sched_model), state_of(eager_model)))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    first, _ = per_iter[0]
    assert first["passive_swap_outs"] > 0 and first["passive_swaps"] > 0   # evicted, brought back
    assert first["swap_outs"] == 0                                          # no plan yet
    later = [c["passive_swap_outs"] + c["passive_swaps"] for c, _ in per_iter[1:]]
    assert all(n < first["passive_swap_outs"] + first["passive_swaps"] for n in later)
    assert sum(c["swap_outs"] for c, _ in per_iter[1:]) > 0                 # planned swaps now
    assert all(peak <= budget for _, peak in per_iter)
    stats = runner.stats()
    assert stats["measured_peak_bytes"] <= budget and stats["reserved_peak_bytes"] <= budget
    assert stats["passive_swaps"] == sum(c["passive_swap_outs"] + c["passive_swaps"] for c, _ in per_iter)
    assert check_event_log(runner.executors()[0].event_log) == []
    # the plan in effect came from the TENSILE planner over the measured sequence
    plans = runner.iteration_plans
    assert plans[0].count(EventKind.SWAP_OUT) == 0 and plans[1].count(EventKind.SWAP_OUT) > 0
    assert plans[1].peak_bytes <= budget


@pytest.mark.slow
def test_capuchin_plans_from_the_observed_latencies(monkeypatch):
    """The plan of iteration 2 is made from iteration 1's measurements, not estimates."""
    spec = OptimizerSpec("adam", lr=0.01)
    data = batches(mlp, 2)
    torch.manual_seed(0)
    model = mlp()
    budget = vanilla_peak(model, spec, *data[0]) // 2
    observed = {}

    def op_latencies(self):
        observed.setdefault("lat", [1e-4 * (1 + (k % 7)) for k in range(self.n_ops)])
        return list(observed["lat"])

    monkeypatch.setattr(Executor, "op_latencies", op_latencies)
    seen, made = [], []

    def hook(seq):
        seen.append(seq)
        made.append(plan(seq, budget))
        return made[-1]

    runner = ScheduledStep(model, loss_fn, spec, policy="capuchin", budget_bytes=budget, planner=hook)
    torch.manual_seed(1)
    runner.step(*data[0])
    assert len(seen) == 1                 # planned at the end of the passive iteration, once
    assert [op.latency for op in seen[0].ops] == pytest.approx(observed["lat"])
    runner.step(*data[1])
    assert len(seen) == 1
    assert runner.iteration_plans[0] is not made[0] and runner.iteration_plans[1] is made[0]


def test_capuchin_needs_a_budget():
    with pytest.raises(ValueError, match="capuchin.*budget_bytes"):
        ScheduledStep(mlp(), loss_fn, OptimizerSpec("sgd"), policy="capuchin")


def test_passive_eviction_takes_the_least_recently_used_first(monkeypatch):
    """Each passive swap-out evicts the evictor's victims in its order, and that order
    is the least recently accessed first (ties: the largest), never a tensor the op
    needs or the loss."""
    spec = OptimizerSpec("sgd", lr=0.01)
    data = batches(mlp, 1)
    torch.manual_seed(0)
    model = mlp()
    budget = vanilla_peak(model, spec, *data[0]) // 2
    runner = ScheduledStep(model, loss_fn, spec, policy="capuchin", budget_bytes=budget, log=True)
    seen = []
    original = PassiveEvictor.make_room

    def spy(self, nbytes, k, budget, keep=()):
        victims = self.victims(k, keep)
        logged = len(self.log)
        original(self, nbytes, k, budget, keep)
        evicted = [e.tensor for e in self.log[logged:] if e.kind == "passive_swap_out"]
        seen.append((k, keep, victims, evicted))

    monkeypatch.setattr(PassiveEvictor, "make_room", spy)
    torch.manual_seed(1)
    runner.step(*data[0])
    ex = runner.executors()[0]
    prog = ex.prog
    evictions = [s for s in seen if s[3]]
    assert evictions
    for k, keep, victims, evicted in evictions:
        assert evicted == victims[:len(evicted)]
        order = [(prog.last_access_before(s, k), -prog.nbytes[s]) for s in victims]
        assert order == sorted(order)
        needed = set(prog.req[k]) if k < ex.n_ops else set()
        assert not set(victims) & (needed | set(keep) | {prog.loss_sid})
    assert sum(len(s[3]) for s in seen) == ex.counts["passive_swap_outs"]
