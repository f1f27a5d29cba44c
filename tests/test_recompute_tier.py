"""Recomputation priced by the tier's ratio (issue 29, part 3).

``rules.recompute_wins``: regenerating a tensor beats an unhidden copy when it costs fewer
FLOPs per byte than the device's achieved FLOP rate over the tier's bandwidth. Where a
plan's copies stall, the planner plans again by that rule and keeps the plan with less
added time: on the disk tier (450 MB/s) a real captured network then recomputes where at
a RAM copy's 8 GB/s it swaps, and the plans stay exact ledgers and bit-identical."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from dbml.scheduler.execute.devices import CpuDevice
from dbml.scheduler.execute.executor import ExecState, Executor, Program, check_event_log
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.graph.access import build_sequence
from dbml.scheduler.graph.capture import capture, init_state
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.graph.sequence import EventKind
from dbml.scheduler.latency.estimate import Machine, RooflineModel
from dbml.scheduler.plan import planner
from dbml.scheduler.plan.planner import PAPER, PlanSettings, plan
from dbml.scheduler.plan.rules import recompute_wins
from dbml.zoo import Inputs, build
from helpers import assert_identical
from sequences import chain, check_plan

RC, SI = EventKind.RECOMPUTE, EventKind.SWAP_IN
DISK, RAM = 450e6, 8e9
CPU = Machine(peak_flops=30e9, memory_bandwidth=5e9, copy_bandwidth=RAM, op_overhead=5e-6)   # a few tens of GFLOP/s
SPEC = OptimizerSpec("adam", lr=1e-3)


def test_the_rule_is_the_ratio_of_flop_rate_to_bandwidth():
    # a ReLU over 8 MiB: 16 MiB through 5 GB/s, 3.4 ms; copying 8 MiB: 19 ms to disk, 0.3 ms over PCIe 5
    relu = 2 * (8 << 20) / 5e9
    assert recompute_wins(relu, 8 << 20, DISK) and not recompute_wins(relu, 8 << 20, 25e9)
    # a 3x3 convolution, 64 -> 64 channels: 1,152 FLOP per output float, 288 FLOP/byte; at
    # 30 GFLOP/s over 450 MB/s (67 FLOP/byte) it is copied, not recomputed
    conv = 288 * (8 << 20) / 30e9
    assert not recompute_wins(conv, 8 << 20, DISK)
    assert not recompute_wins(relu, 8 << 20, DISK, ratio=0.0)   # the setting turns it off


def test_paper_is_unpriced_and_the_default_prices_by_the_tier():
    assert PlanSettings(**PAPER).recompute_ratio == 0 and PlanSettings().recompute_ratio == 1.0
    p = plan(chain(bandwidth=1.0), 110, settings=PlanSettings())
    assert p.count(RC) == 1 and p.extra_time == 1.0


def _resnet():
    torch.manual_seed(0)
    return build("resnet18", Inputs("image", shape=(3, 32, 32)), 10, {"width": 0.25})


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)


@pytest.fixture(scope="module")
def resnet():
    model = _resnet()
    captured = capture(copy.deepcopy(model), torch.nn.functional.cross_entropy, SPEC, _batch())
    return model, captured, build_sequence(captured, RooflineModel(CPU), copy_bandwidth=DISK)


@pytest.mark.slow
def test_on_the_disk_tier_a_captured_resnet_recomputes_and_waits_less(resnet):
    """ResNet-18 (width 0.25, 32x32, batch 32) at a quarter of its peak: copies to disk
    stall, and recomputing what regenerates faster than it copies (BatchNorm and ReLU,
    chains through them) halves the added time; at 8 GB/s every copy hides, nothing is
    recomputed."""
    _, _, seq = resnet
    budget = int(0.25 * plan(seq, 1 << 62, policy="none").peak_bytes)
    priced = plan(seq, budget)
    unpriced = plan(seq, budget, settings=PlanSettings(recompute_ratio=0))
    for p in (priced, unpriced):
        check_plan(seq, p, budget)
    assert priced.count(RC) > 0
    assert priced.extra_time < 0.75 * unpriced.extra_time
    (state,) = planner.schedule([seq], budget, PlanSettings(), by_tier=True)
    assert state.plan("tensile") == priced   # the plan kept is the one planned by the tier
    ram = dataclasses.replace(seq, copy_bandwidth=RAM)
    fast = plan(ram, budget)
    check_plan(ram, fast, budget)
    assert fast.count(RC) == 0 and fast.extra_time == 0


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_the_disk_tier_plan_runs_bit_identically_within_its_peak(resnet):
    model, captured, seq = resnet
    budget = int(0.25 * plan(seq, 1 << 62, policy="none").peak_bytes)
    p = plan(seq, budget)
    assert p.count(RC) > 0
    loss_fn = torch.nn.functional.cross_entropy
    data = [_batch(s) for s in range(2)]
    eager = copy.deepcopy(model)
    step = EagerStep(eager, loss_fn, SPEC)
    want = [step.step(x, y) for x, y in data]

    m = copy.deepcopy(model)
    params = [q.detach() for q in m.parameters()]
    state = ExecState(params + [b.detach() for b in m.buffers()]
                      + [t for q in params for t in init_state(SPEC, q).values()])
    ex = Executor(Program(captured, seq), p, CpuDevice(), log=True, budget_bytes=p.peak_bytes)
    try:
        losses, peaks = [], []
        for x, y in data:
            losses.append(ex.run(state, x, y))
            peaks.append(ex.iteration_peak)
    finally:
        ex.close()
    assert all(torch.equal(a, b) for a, b in zip(losses, want))
    n = len(params) + len(list(m.buffers()))
    for i in range(n):   # what the plan left on the host comes back for the comparison
        if state.values[i] is None:
            like = captured.placeholders()[i].meta["val"]
            flat = state.host.pop(i)
            state.values[i] = torch.empty(0, dtype=like.dtype).set_(flat.untyped_storage(), 0, like.shape, like.stride())
    assert_identical(state.values[:n], [q.detach() for q in eager.parameters()] + list(eager.buffers()))
    assert check_event_log(ex.event_log) == []
    assert max(peaks) <= p.peak_bytes
    assert ex.totals["recomputes"] == p.count(RC) * len(data) and ex.totals["passive_recomputes"] == 0
