"""Policy "vdnn" (vDNN-conv, plan/vdnn.py): convolutions' input feature maps go to the host
after their forward use and come back one layer ahead in backward; results stay
bit-identical to eager, it offloads exactly the convolutions' inputs, and it lowers the
measured peak below release-only's."""

from __future__ import annotations

import copy

import pytest
import torch

from dbml.scheduler.execute.executor import check_event_log
from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.graph.sequence import EventKind, Phase
from dbml.scheduler.plan.vdnn import convolutions
from helpers import assert_same, batches, deep_narrow, job_of, state_of

loss_fn = torch.nn.functional.cross_entropy
pytestmark = pytest.mark.usefixtures("one_thread")


def conv_net() -> torch.nn.Sequential:
    """Four conv-bn-relu blocks (the second strided) on 3x16x16 images, then a linear head."""
    layers, c = [], 3
    for i, width in enumerate((8, 16, 16, 16)):
        layers += [torch.nn.Conv2d(c, width, 3, stride=2 if i == 1 else 1, padding=1),
                   torch.nn.BatchNorm2d(width), torch.nn.ReLU()]
        c = width
    return torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 10))


def conv_inputs(model: torch.nn.Module) -> int:
    """What vDNN-conv offloads, counted from the model: one input feature map per
    convolution, each read again by its backward, but the first one's, which is the batch
    (its caller holds it through the step: a host copy would free nothing)."""
    return sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) - 1


def train(runner, data):
    torch.manual_seed(1)
    losses = [runner.step(x, y) for x, y in data]
    runner.finish()
    return losses


@pytest.fixture(scope="module")
def conv_runs():
    """The conv net trained 3 steps eagerly, under "vdnn" (event log kept) and under "none"."""
    spec = OptimizerSpec("sgd", lr=0.05, momentum=0.9)
    data = batches(3, b=16, shape=(3, 16, 16))
    torch.manual_seed(0)
    model = conv_net()
    eager, vdnn, none = (copy.deepcopy(model) for _ in range(3))
    runs = {"eager": (eager, train(EagerStep(eager, loss_fn, spec), data))}
    for name, m in (("vdnn", vdnn), ("none", none)):
        runner = ScheduledStep(m, loss_fn, spec, policy=name, log=name == "vdnn")
        runs[name] = (m, train(runner, data), runner)
    return model, runs


@pytest.mark.slow   # ~0.6 s: out of the -m 'not slow' inner loop (under a minute)
def test_vdnn_is_bit_identical_to_eager(conv_runs):
    _, runs = conv_runs
    eager, want = runs["eager"]
    model, got, _ = runs["vdnn"]
    assert_same(got, want)
    assert_same(state_of(model), state_of(eager))


def test_vdnn_swaps_out_each_convolution_input_once_per_iteration(conv_runs):
    model, runs = conv_runs
    runner = runs["vdnn"][2]
    stats = runner.stats()
    offloads = conv_inputs(model)
    assert stats["iterations"] == 3
    assert stats["swap_outs"] == 3 * offloads
    assert stats["swap_ins"] == 3 * offloads
    assert stats["passive_swaps"] == 0 and stats["recomputes"] == 0
    assert not check_event_log(runner.executors()[0].event_log)
    (plan,), (seq,) = runner.plans.values(), runner.sequences.values()
    assert plan.policy == "vdnn" and plan.host_at_start == frozenset()
    outs = [e for e in plan.events if e.kind is EventKind.SWAP_OUT]
    convs = convolutions(seq)
    assert len(convs) == offloads + 1 and all(b is not None for _, b in convs)
    assert {e.tensor for e in outs} == {conv.inputs[0] for conv, _ in convs[1:]}   # not the batch
    assert all(seq.ops[e.trigger].phase is Phase.FORWARD for e in outs)
    # one layer ahead: layer i's input comes back as layer i + 1's backward starts
    ins = {e.tensor: e for e in plan.events if e.kind is EventKind.SWAP_IN}
    for (conv, backward), (_, next_backward) in zip(convs[1:], convs[2:]):
        assert ins[conv.inputs[0]].trigger == next_backward.index - 1
        assert ins[conv.inputs[0]].before == backward.index


def test_vdnn_peak_is_below_release_only(conv_runs):
    _, runs = conv_runs
    vdnn, none = runs["vdnn"][2].stats(), runs["none"][2].stats()
    assert none["swaps"] == 0
    assert vdnn["measured_peak_bytes"] < none["measured_peak_bytes"]
    assert vdnn["planned_peak_bytes"] < vdnn["vanilla_peak_bytes"] == none["vanilla_peak_bytes"]
    # the plan's peak is the limit: a late offload makes compute wait, not the peak grow
    assert vdnn["measured_peak_bytes"] <= vdnn["planned_peak_bytes"]
    assert vdnn["measured_peak_bytes"] == pytest.approx(vdnn["planned_peak_bytes"], rel=0.05)


def test_a_model_without_convolutions_gets_no_swaps():
    spec = OptimizerSpec("sgd", lr=0.01)
    data = batches(2, b=8, shape=(64,))
    torch.manual_seed(0)
    model = deep_narrow()
    eager, vdnn = copy.deepcopy(model), copy.deepcopy(model)
    want = train(EagerStep(eager, loss_fn, spec), data)
    runner = ScheduledStep(vdnn, loss_fn, spec, policy="vdnn")
    assert_same(train(runner, data), want)
    assert_same(state_of(vdnn), state_of(eager))
    stats = runner.stats()
    assert stats["swaps"] == 0 and stats["planned_peak_bytes"] == stats["vanilla_peak_bytes"]
    assert all(e.kind is EventKind.RELEASE for p in runner.plans.values() for e in p.events)


@pytest.mark.slow   # ~1.2 s: out of the -m 'not slow' inner loop (under a minute)
def test_vdnn_takes_no_budget_and_no_shared_planner():
    runner = ScheduledStep(conv_net(), loss_fn, OptimizerSpec("sgd", lr=0.1), policy="vdnn", budget_bytes=1)
    x, y = batches(1, b=4, shape=(3, 16, 16))[0]
    runner.step(x, y)   # a budget of one byte is no limit: vDNN has none
    assert runner.stats()["swap_outs"] == 3   # 4 convolutions, the first one's input the batch
    with pytest.raises(ValueError, match="policy 'vdnn' plans alone"):
        ScheduledStep(conv_net(), loss_fn, OptimizerSpec("sgd", lr=0.1), policy="vdnn", planner=lambda s: None)


def test_late_prefetches_are_the_plans_extra_time():
    """The docstring's two-op net: x (8 bytes) goes out after the convolution (t = 1 s) and
    is prefetched after op 1 (t = 2 s) for the backward at t = 3 s. At 8 B/s each copy takes
    1 s: out 1-2, in 2-3, in time. At 4 B/s: out 1-3, in 3-5, so the backward waits 2 s."""
    import dataclasses
    from dbml.scheduler.graph.sequence import AccessSequence, Op, TensorInfo, TensorKind
    from dbml.scheduler.plan.vdnn import vdnn_plan
    t = [TensorInfo(0, "x", 8, TensorKind.ACTIVATION), TensorInfo(1, "w", 4, TensorKind.PARAM),
         TensorInfo(2, "convolution", 8, TensorKind.ACTIVATION), TensorInfo(3, "relu", 8, TensorKind.ACTIVATION),
         TensorInfo(4, "g", 4, TensorKind.ACTIVATION)]
    ops = (Op(0, "convolution", (0, 1), (2,), 0, 1, Phase.FORWARD), Op(1, "relu", (2,), (3,), 1, 2, Phase.FORWARD),
           Op(2, "sum", (3,), (), 2, 3, Phase.BACKWARD),
           Op(3, "convolution_backward", (3, 0, 1), (4,), 3, 4, Phase.BACKWARD))
    seq = AccessSequence("j", tuple(t), ops, frozenset({0, 1}), outputs=frozenset({4}), copy_bandwidth=8.0)
    assert vdnn_plan(seq).extra_time == 0.0
    assert vdnn_plan(dataclasses.replace(seq, copy_bandwidth=4.0)).extra_time == 2.0


def test_module_doctest():
    import doctest
    from dbml.scheduler.plan import vdnn
    result = doctest.testmod(vdnn)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.slow
def test_train_policy_vdnn_from_sql_matches_eager(con):
    import numpy as np
    import pyarrow as pa
    rng = np.random.default_rng(0)
    pixels = rng.standard_normal((300, 64)).astype(np.float32)
    con.register("arr", pa.table({"pixels": pa.array(list(pixels), pa.list_(pa.float32(), 64)),
                                  "y": rng.integers(0, 3, 300)}))
    con.execute("CREATE TABLE images AS SELECT * FROM arr")
    args = "label := 'y', arch := 'cnn', shape := [1, 8, 8], options := '{\"width\": 4}', epochs := 1, seed := 3"
    run = {p: job_of(con, con.sql(f"SELECT train('{p}', 'images', {args}, policy := '{p}')").fetchall()[0][0])
           for p in ("eager", "vdnn")}
    weights = {p: con.sql(f"SELECT weights FROM dbml_weights WHERE name = '{p}'").fetchall()[0][0] for p in run}
    assert weights["vdnn"] == weights["eager"] and run["vdnn"]["final_loss"] == run["eager"]["final_loss"]
    assert run["vdnn"]["swaps"] > 0 and run["vdnn"]["measured_peak_bytes"] < run["vdnn"]["vanilla_peak_bytes"]
