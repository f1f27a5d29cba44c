"""The fast path (``execute/codegen.py``): a plan that binds nothing runs as one generated
function. It gives eager's results bit for bit and the interpreter's books (peaks,
releases, the device ledger's global peak); it measures op latencies in sampled
iterations, and plan updating still works from them; a plan with events hands the job
back to the interpreter at the next iteration boundary, and a plan binding nothing again
hands it back to the fast path."""

from __future__ import annotations

import copy

import pytest
import torch

from dbml.scheduler.errors import ExecutionError
from dbml.scheduler.execute import codegen
from dbml.scheduler.execute.codegen import MEASURE_EVERY, MEASURE_FIRST
from dbml.scheduler.execute.executor import Executor, check_event_log
from dbml.scheduler.execute.program import SKIP
from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.execute.updating import LatencyTracker, UpdateSettings
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.latency.estimate import RooflineModel
from dbml.scheduler.multijob.ledger import DeviceLedger
from dbml.scheduler.multijob.scheduler import MemoryScheduler
from dbml.scheduler.plan import planner as planner_mod
from helpers import assert_same, batches, cnn, eager_state, mlp, state_of

loss_fn = torch.nn.functional.cross_entropy
LARGE = 1 << 40   # a budget that binds nothing

pytestmark = pytest.mark.usefixtures("one_thread")


def data_for(model_fn, n: int = 4):
    """``n`` full batches and a last, smaller one (a second graph)."""
    shape = (32,) if model_fn is mlp else (3, 12, 12)
    full = batches(n, 16, shape, seed=3)
    return full + batches(1, 5, shape, seed=4)


def train(model, spec, data, **kw):
    runner = ScheduledStep(copy.deepcopy(model), loss_fn, spec, latency_model=RooflineModel(), **kw)
    torch.manual_seed(1)
    losses = [runner.step(x, y) for x, y in data]
    runner.finish()
    return runner, losses


def fast_iterations(runner) -> int:
    return sum(e.totals.get("fast_iterations", 0) for e in runner.executors())


def seeded(model_fn):
    torch.manual_seed(0)
    return model_fn()


@pytest.mark.parametrize("model_fn", [mlp, pytest.param(cnn, marks=pytest.mark.slow)], ids=["mlp_dropout", "cnn_bn"])
@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("policy, budget", [("none", None), ("tensile", LARGE)], ids=["none", "tensile_unbound"])
@pytest.mark.slow   # ~1.5 s: out of the -m 'not slow' inner loop (under a minute)
def test_bit_identical_to_eager_with_the_interpreters_books(monkeypatch, model_fn, kind, policy, budget):
    spec = OptimizerSpec(kind, lr=0.01, momentum=0.9)
    model, data = seeded(model_fn), data_for(model_fn)
    want, want_losses = eager_state(model, spec, data)
    fast, losses = train(model, spec, data, policy=policy, budget_bytes=budget)
    assert fast_iterations(fast) == len(data) == fast.stats()["iterations"]
    assert_same(state_of(fast.model), want)
    assert_same(losses, want_losses)

    monkeypatch.setenv("DBML_NO_FASTPATH", "1")
    interpreted, _ = train(model, spec, data, policy=policy, budget_bytes=budget)
    assert fast_iterations(interpreted) == 0
    for a, b in zip(fast.executors(), interpreted.executors(), strict=True):
        assert (a.peak_bytes, a.iteration_peak) == (b.peak_bytes, b.iteration_peak)
        assert a.totals["releases"] == b.totals["releases"] > 0
        assert a.counts["releases"] == b.counts["releases"]
        # the reuse pool as the interpreter uses it: the same takes, the same ledger + pool peak
        assert (a.totals["reused_buffers"], a.reserved_peak) == (b.totals["reused_buffers"], b.reserved_peak)
    if kind == "adam" and model_fn is mlp:   # the update's 64 kB temporaries reuse buffers
        assert sum(e.totals["reused_buffers"] for e in fast.executors()) > 0
    st = fast.stats()
    assert st["measured_peak_bytes"] == st["planned_peak_bytes"] == interpreted.stats()["measured_peak_bytes"]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_a_plan_with_events_runs_interpreted_from_the_next_boundary_and_back():
    spec = OptimizerSpec("adam", lr=0.01)
    model, data = seeded(mlp), batches(6, 32, (32,), seed=5)
    want, want_losses = eager_state(model, spec, data)
    runner = ScheduledStep(copy.deepcopy(model), loss_fn, spec, budget_bytes=LARGE, latency_model=RooflineModel(),
                           update=UpdateSettings(enabled=False))
    torch.manual_seed(1)
    losses = [runner.step(*data[0]), runner.step(*data[1])]
    ex = runner.executors()[0]
    unbound, seq = runner.plans[next(iter(runner.plans))], next(iter(runner.sequences.values()))
    assert fast_iterations(runner) == 2 and ex.fast is not None
    swapping = planner_mod.plan(seq, unbound.peak_bytes // 2)
    assert swapping.count(codegen.EventKind.SWAP_OUT) > 0
    runner.offer_plan(swapping, seq)
    losses += [runner.step(*data[2]), runner.step(*data[3])]
    assert ex.fast is None and fast_iterations(runner) == 2       # interpreted, swapping
    assert runner.stats()["swaps"] > 0 and ex.iteration_peak <= swapping.peak_bytes
    runner.offer_plan(unbound, seq)
    on_host = bool(runner.state.host)   # kept there by the swapping plan: the interpreter brings it back
    losses += [runner.step(*data[4]), runner.step(*data[5])]
    assert ex.fast is not None and fast_iterations(runner) == 4 - on_host   # fast again
    runner.finish()
    assert_same(state_of(runner.model), want)
    assert_same(losses, want_losses)


def test_op_latencies_are_measured_in_sampled_iterations(monkeypatch):
    observed = []
    observe = LatencyTracker.observe
    monkeypatch.setattr(LatencyTracker, "observe", lambda self, m, b=None: observed.append(list(m)) or observe(self, m, b))
    spec, model = OptimizerSpec("sgd", lr=0.01), seeded(mlp)
    n = MEASURE_FIRST + 2 * MEASURE_EVERY + 1
    runner, _ = train(model, spec, batches(n, 32, (32,)), planner=unbound_planner,
                      update=UpdateSettings(enabled=False))
    want = MEASURE_FIRST + sum(1 for r in range(MEASURE_FIRST + 1, n + 1) if r % MEASURE_EVERY == 0)
    assert fast_iterations(runner) == n and len(observed) == want
    prog = runner.executors()[0].prog
    for latencies in observed:   # every op that runs was timed
        assert all(lat > 0 for k, lat in enumerate(latencies) if prog.kind[k] != SKIP)


L = 1e-4


class ConstModel:
    def predict(self, node) -> float:
        return L


def unbound_planner(seq):
    """A planner from outside (as a shared scheduler's): its plans may change with the
    latencies, so the runner keeps them up to date."""
    return planner_mod.plan(seq, LARGE)


def shared_alone():
    return MemoryScheduler(LARGE).planner_for("job")


@pytest.mark.parametrize("planner, budget, replans", [(lambda: unbound_planner, None, 1), (lambda: None, LARGE, 0),
                                                      (shared_alone, None, 0)],
                         ids=["from_outside", "alone", "alone_on_a_shared_device"])
def test_plan_updating_works_from_the_sampled_latencies(monkeypatch, planner, budget, replans):
    """An op slows from the third iteration: the drift is seen in a measured iteration,
    the job replans, and the new plan (binding nothing too) runs fast from the next. A
    job planned alone does not replan: its plan binds nothing whatever the latencies."""
    def op_latencies(self):
        out = [L] * self.n_ops
        if self.totals["iterations"] >= 3:
            out[0] += self.n_ops * L
        return out
    monkeypatch.setattr(Executor, "op_latencies", op_latencies)
    spec, model, data = OptimizerSpec("adam", lr=0.01), seeded(mlp), batches(8, 32, (32,))
    want, _ = eager_state(model, spec, data)
    runner = ScheduledStep(copy.deepcopy(model), loss_fn, spec, budget_bytes=budget, planner=planner(),
                           latency_model=ConstModel())
    torch.manual_seed(1)
    for x, y in data:
        runner.step(x, y)
    runner.finish()
    plans = runner.iteration_plans
    assert [i + 1 for i in range(1, len(plans)) if plans[i] is not plans[i - 1]] == [4] * replans
    assert runner.stats()["replans"] == replans and fast_iterations(runner) == len(data)
    slowed = next(iter(runner.sequences.values())).ops[0].latency > 0.85 * runner.executors()[0].n_ops * L
    assert slowed == bool(replans)
    assert_same(state_of(runner.model), want)


def test_the_device_ledger_sees_the_interpreters_global_peak(monkeypatch):
    """Alone on the device, and two jobs interleaved (every change reported): the same
    global peak, the same ledger + pool peak, the same bytes held after."""
    spec = OptimizerSpec("adam", lr=0.01)
    models = {"a": seeded(mlp), "b": torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.ReLU(),
                                                         torch.nn.Linear(512, 10))}
    data = batches(3, 32, (32,))

    def global_peaks():
        alone, both = DeviceLedger(), DeviceLedger()
        solo = ScheduledStep(copy.deepcopy(models["a"]), loss_fn, spec, policy="none", ledger=alone, job="a")
        jobs = [ScheduledStep(copy.deepcopy(m), loss_fn, spec, policy="none", ledger=both, job=name)
                for name, m in models.items()]
        for x, y in data:
            solo.step(x, y)
            for j in jobs:
                j.step(x, y)
        reused = solo.executors()[0].totals["reused_buffers"]
        return (alone.peak_bytes, alone.reserved_peak_bytes, both.peak_bytes, both.reserved_peak_bytes, reused,
                alone.current_bytes, both.current_bytes), fast_iterations(solo) + sum(fast_iterations(j) for j in jobs)

    books, fast = global_peaks()
    assert fast == 3 * len(data) and books[4] > 0   # the reuse pool was used
    monkeypatch.setenv("DBML_NO_FASTPATH", "1")
    assert global_peaks() == (books, 0)


def test_a_failing_op_names_the_node_as_the_interpreter_does(monkeypatch):
    spec, model = OptimizerSpec("sgd", lr=0.01), seeded(mlp)
    x, y = batches(1, 8, (32,))[0]
    bad = torch.full_like(y, 99)   # no such class

    def message() -> str:
        runner = ScheduledStep(copy.deepcopy(model), loss_fn, spec, policy="none")
        runner.step(x, y)
        with pytest.raises(ExecutionError) as err:
            runner.step(x, bad)
        return str(err.value)

    fast = message()
    assert "nll_loss" in fast and "op " in fast
    monkeypatch.setenv("DBML_NO_FASTPATH", "1")
    assert message() == fast


def test_switches_the_event_log_and_passive_mode_keep_the_interpreter(monkeypatch):
    spec, model, data = OptimizerSpec("sgd", lr=0.01), seeded(mlp), batches(2, 32, (32,))
    logged, _ = train(model, spec, data, policy="none", log=True)
    ex = logged.executors()[0]
    assert fast_iterations(logged) == 0 and check_event_log(ex.event_log) == []
    assert sum(1 for e in ex.event_log if e[0] == "op") == 2 * ex.n_ops
    budget = logged.stats()["vanilla_peak_bytes"] * 2
    capuchin, _ = train(model, spec, data, policy="capuchin", budget_bytes=budget)
    assert fast_iterations(capuchin) == 0   # eviction stays armed: the interpreter defends the budget
    monkeypatch.setenv("DBML_NO_FASTPATH", "1")
    off, _ = train(model, spec, data, policy="none")
    assert fast_iterations(off) == 0 and off.executors()[0].fast is None


def test_generated_code_is_one_call_per_op_and_releases_by_del():
    spec, model = OptimizerSpec("adam", lr=0.01), seeded(mlp)
    runner, _ = train(model, spec, batches(1, 32, (32,)), policy="none")
    ex = runner.executors()[0]
    prog, slots = ex.prog, codegen.release_slots(ex.after)
    led = codegen.static_ledger(prog, slots)
    ops = sum(1 for k in prog.kind if k != SKIP)
    plain, _, _ = codegen.generate(prog, slots, led, timed=False, accounted=False)
    timed, _, _ = codegen.generate(prog, slots, led, timed=True, accounted=False)
    accounted, _, _ = codegen.generate(prog, slots, led, timed=False, accounted=True)
    assert "P()" not in plain and "A(" not in plain and "e[" not in plain
    assert timed.count("L[") == ops and timed.count("t0 = P()") == ops
    assert accounted.count("A(-") == led.releases == ex.totals["releases"]
    assert plain.count("del v") >= sum(1 for f in led.freed if f)
    assert codegen.release_slots([((codegen.EventKind.SWAP_OUT, 0, 0.0, 1),)]) is None
    assert codegen.release_slots([((codegen.EventKind.RELEASE, 0, 0.01, -1),)]) is None   # delayed
