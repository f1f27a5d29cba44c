"""Chunked optimizer updates (scheduler/graph/chunks.py): a large parameter and its
optimizer state held in pieces, updated piece by piece; results bit-identical to eager
torch.optim, the tensor-granularity floor lower."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from dbml.scheduler.execute.jobstate import initial_state
from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.graph.access import build_sequence
from dbml.scheduler.graph.capture import capture
from dbml.scheduler.graph.chunks import chunk_spans, unit_layout
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.latency.estimate import RooflineModel
from dbml.scheduler.plan.planner import InfeasibleBudget, tensor_granularity_floor
from helpers import assert_same, state_of

loss_fn = torch.nn.functional.cross_entropy
pytestmark = pytest.mark.usefixtures("one_thread")

CHUNK = 4096   # bytes: the 96x96 weight in nine pieces, the 96x32 one in three, 10x96 whole


class Net(torch.nn.Module):
    """A big weight, a small one, a frozen parameter, BatchNorm buffers and a tied head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(32, 96)
        self.norm = torch.nn.BatchNorm1d(96)
        self.frozen = torch.nn.Parameter(torch.randn(96, 96), requires_grad=False)
        self.out = torch.nn.Linear(96, 10)
        self.hidden = torch.nn.Linear(96, 96)
        self.hidden2 = self.hidden          # the same module twice: one tied parameter

    def forward(self, x):
        h = torch.relu(self.norm(self.embed(x)))
        h = torch.tanh(self.hidden(h) @ self.frozen / 96)
        return self.out(self.hidden2(h))


def batches(n=4, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 32, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(n)]


def train(runner, data):
    torch.manual_seed(1)
    losses = [runner.step(x, y) for x, y in data]
    runner.finish()
    return losses


def test_spans_cover_the_parameter_in_aligned_pieces():
    spans = chunk_spans(100_000, 4, 64 * 1024)
    assert spans[0][0] == 0 and spans[-1][1] == 100_000
    assert all(a == b for (_, a), (b, _) in zip(spans, spans[1:]))
    assert all(a % 1024 == 0 and (b - a) * 4 <= 64 * 1024 for a, b in spans)
    assert len(spans) == 7   # 400,000 bytes over 64 KiB
    assert chunk_spans(100_000, 4, None) is None and chunk_spans(100_000, 4, 400_000) is None


def test_layout_splits_only_large_trainable_parameters():
    torch.manual_seed(0)
    model = Net()
    layout = unit_layout(model, CHUNK)
    names = [n for n, _ in model.named_parameters()]
    pieces = {names[p] for p, span in layout.units if span is not None}
    assert pieces == {"hidden.weight", "embed.weight"}   # 'frozen' is as large but has no update
    assert len(layout.of_param(names.index("hidden.weight"))) == 9
    assert len(layout.of_param(names.index("embed.weight"))) == 3
    assert len(layout.units) == len(names) + 8 + 2 and len(layout.trained) == len(layout.units) - 1


@pytest.mark.slow
def test_capture_holds_pieces_as_separate_inputs():
    torch.manual_seed(0)
    model = Net()
    spec = OptimizerSpec("adam", update_chunk_bytes=CHUNK)
    captured = capture(model, loss_fn, spec, batches(1)[0])
    keys = captured.input_keys
    pieces = [k for k in keys if k[:2] == ("param", "embed.weight")]
    assert len(pieces) == 3 and all(len(k) == 3 for k in pieces)
    assert ("param", "out.weight") in keys   # below the size: whole
    assert [k[3] for k in keys if k[:3] == ("state", "embed.weight", "exp_avg")] == [k[2] for k in pieces]
    storages = [n.meta["dbml_storage"] for n, k in zip(captured.placeholders(), keys) if k[:2] == ("param", "embed.weight")]
    assert len(set(storages)) == 3
    assert any(n.target is torch.ops.aten.cat.default for n in captured.graph.nodes)
    assert len(initial_state(model, spec).values) == len(keys) - 2   # all but the batch
    whole = capture(model, loss_fn, dataclasses.replace(spec, update_chunk_bytes=None), batches(1)[0])
    assert not any(n.target is torch.ops.aten.cat.default for n in whole.graph.nodes)


SPECS = [OptimizerSpec("adam", lr=0.01, update_chunk_bytes=CHUNK),
         OptimizerSpec("adam", lr=0.01, weight_decay=0.1, update_chunk_bytes=CHUNK),
         OptimizerSpec("adamw", lr=0.01, weight_decay=0.1, update_chunk_bytes=CHUNK),
         OptimizerSpec("sgd", lr=0.05, momentum=0.9, weight_decay=0.01, update_chunk_bytes=CHUNK),
         OptimizerSpec("adagrad", lr=0.05, weight_decay=0.01, update_chunk_bytes=CHUNK),
         OptimizerSpec("sgd", lr=0.05, momentum=0.9, l1=0.01, update_chunk_bytes=CHUNK),
         OptimizerSpec("adam", lr=0.01, l1=0.01, update_chunk_bytes=CHUNK)]


@pytest.mark.parametrize("spec", [pytest.param(s, marks=() if s.kind == "sgd" else pytest.mark.slow) for s in SPECS],
                         ids=["adam", "adam_wd", "adamw", "sgd_momentum", "adagrad", "sgd_l1", "adam_l1"])
def test_chunked_updates_are_bit_identical_to_eager(spec):
    data = batches()
    torch.manual_seed(0)
    model = Net()
    eager, sched = copy.deepcopy(model), copy.deepcopy(model)
    eager_runner = EagerStep(eager, loss_fn, spec)
    want = train(eager_runner, data)
    runner = ScheduledStep(sched, loss_fn, spec, policy="none", latency_model=RooflineModel())
    got = train(runner, data)
    assert any(span is not None for _, span in unit_layout(sched, CHUNK).units)   # it did chunk
    assert_same(got, want)
    assert_same(state_of(sched), state_of(eager))
    assert sched.hidden is sched.hidden2
    trained = [p for p in eager.parameters() if p.requires_grad]
    ours = runner.optimizer_state()
    assert len(ours) == len(trained)
    for mine, p in zip(ours, trained):
        theirs = eager_runner.optimizer.state[p]
        assert mine.keys() == {k for k in theirs if k != "momentum_buffer" or spec.momentum}
        assert_same([mine[k] for k in sorted(mine)], [theirs[k] for k in sorted(mine)])


def _min_budget(spec, batch):
    torch.manual_seed(0)
    with pytest.raises(InfeasibleBudget) as err:
        ScheduledStep(Net(), loss_fn, spec, budget_bytes=1, latency_model=RooflineModel()).step(*batch)
    return err.value.min_budget


@pytest.mark.slow
def test_chunked_under_a_tight_budget_is_bit_identical():
    spec = SPECS[0]
    data = batches()
    budget = _min_budget(spec, data[0])
    torch.manual_seed(0)
    model = Net()
    eager, sched = copy.deepcopy(model), copy.deepcopy(model)
    want = train(EagerStep(eager, loss_fn, spec), data)
    runner = ScheduledStep(sched, loss_fn, spec, budget_bytes=budget, latency_model=RooflineModel())
    got = train(runner, data)
    assert_same(got, want)
    assert_same(state_of(sched), state_of(eager))
    stats = runner.stats()
    assert stats["swaps"] + stats["recomputes"] > 0 and stats["measured_peak_bytes"] <= budget


def _floor(model, spec, batch):
    seq = build_sequence(capture(model, loss_fn, spec, batch), RooflineModel(), copy_bandwidth=1e10)
    return tensor_granularity_floor(seq)


@pytest.mark.slow   # ~1.0 s: out of the -m 'not slow' inner loop (under a minute)
def test_chunking_lowers_the_tensor_granularity_floor():
    """One 4 MiB weight dominates: whole, its Adam update holds three of it at once
    (its in-place update counted once); in 256 KiB pieces, rebuilding the weight (the
    pieces and the whole) is the busiest op."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    batch = (torch.randn(4, 1024), torch.randint(0, 10, (4,)))
    whole = _floor(model, OptimizerSpec("adam"), batch)
    chunked = _floor(model, OptimizerSpec("adam", update_chunk_bytes=256 * 1024), batch)
    weight = 1024 * 1024 * 4
    assert whole >= 3 * weight
    assert chunked <= 2 * weight + 64 * 1024


@pytest.mark.slow
def test_vgg_sized_fc_layer_is_bit_identical():
    """VGG-16's fc1 (25088 x 4096, 392 MiB) in 64 MiB pieces: Adam over two steps."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(25088, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10))
    data = [(torch.randn(2, 25088), torch.randint(0, 10, (2,))) for _ in range(2)]
    spec = OptimizerSpec("adam", lr=1e-3, update_chunk_bytes=64 << 20)
    eager, sched = model, copy.deepcopy(model)
    eager_runner = EagerStep(eager, loss_fn, spec)
    want = train(eager_runner, data)
    runner = ScheduledStep(sched, loss_fn, spec, policy="none", latency_model=RooflineModel())
    got = train(runner, data)
    assert len(unit_layout(sched, 64 << 20).of_param(0)) == 7
    assert_same(got, want)
    assert_same(state_of(sched), state_of(eager))
    mine, theirs = runner.optimizer_state()[0], eager_runner.optimizer.state[eager[0].weight]
    assert_same([mine["exp_avg"], mine["exp_avg_sq"]], [theirs["exp_avg"], theirs["exp_avg_sq"]])


def test_module_doctests():
    import doctest
    from dbml.scheduler.graph import chunks
    assert doctest.testmod(chunks).failed == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "16MiB"])
def test_spec_rejects_a_bad_chunk_size(bad):
    with pytest.raises(ValueError, match="update_chunk_bytes must be a positive int or None"):
        OptimizerSpec("adam", update_chunk_bytes=bad)


@pytest.mark.slow
def test_the_chunk_size_identifies_a_shared_capture():
    """Jobs that differ only in the setting must not share a captured graph."""
    from dbml.scheduler.graph.graphs import GraphCache
    torch.manual_seed(0)
    model = Net()
    x, y = batches(1)[0]
    chunked = GraphCache(model, loss_fn, OptimizerSpec("sgd", update_chunk_bytes=CHUNK), share="net").get(x, y)
    whole = GraphCache(model, loss_fn, OptimizerSpec("sgd", update_chunk_bytes=None), share="net").get(x, y)
    assert len(chunked.input_keys) > len(whole.input_keys)


@pytest.mark.parametrize("budget, pieces", [(None, 16 << 20), (1 << 40, 16 << 20), (128 << 20, 16 << 20),
                                            (127 << 20, 8 << 20), (67_300_000, 8 << 20), (20_000_000, 2 << 20),
                                            (1_000, 1 << 20)])
def test_a_small_budget_cuts_large_weights_into_smaller_pieces(budget, pieces):
    """Pieces of at most an eighth of the budget, a power of two, not under 1 MiB; a spec
    whose pieces are smaller already, or that keeps parameters whole, is kept."""
    assert OptimizerSpec("adam").within(budget).update_chunk_bytes == pieces
    assert OptimizerSpec("adam", update_chunk_bytes=CHUNK).within(budget).update_chunk_bytes == CHUNK
    assert OptimizerSpec("adam", update_chunk_bytes=None).within(budget).update_chunk_bytes is None


@pytest.mark.slow   # two jobs of a 4 MiB weight: ~3 s
def test_a_budget_below_a_whole_weights_update_trains_in_pieces_as_eager(tmp_path):
    """hidden [1024, 1024]: its 4 MiB weight's Adam update whole needs 12.6 MB of tensors
    (16.8 MB with the spill's bounce buffer); in the 1 MiB pieces a 14 MB budget gets, 8.4 MB.
    The job trains within its budget, bit for bit as eager PyTorch (it was refused before)."""
    import dbml
    from helpers import job_of, load, moons
    con = dbml.connect(str(tmp_path / "db.duckdb"), latency_model="roofline", progress="off")
    load(con, "moons", moons(1000))
    args = ("label := 'label', features := ['x1', 'x2'], hidden := [1024, 1024], epochs := 1, "
            "batch_size := 256")
    eager = con.execute(f"SELECT train('eager', 'moons', {args}, policy := 'eager')").fetchall()[0][0]
    budget = 14_000_000
    tight = job_of(con, con.execute(f"SELECT train('tight', 'moons', {args}, memory_budget := {budget})")
                   .fetchall()[0][0])
    assert tight["planned_peak_bytes"] <= budget and tight["measured_peak_bytes"] <= budget
    assert tight["final_loss"] == eager["final_loss"]
    weights = con.execute("SELECT name, weights FROM dbml_weights ORDER BY name").fetchall()
    assert weights[0][1] == weights[1][1]
    con.close()


@pytest.mark.parametrize("policy, budget, pieces", [("tensile", 14_000_000, 1 << 20),    # floor 12.6 MB whole: cut
                                                    ("tensile", 30_000_000, 16 << 20),   # plans whole within 30 MB
                                                    ("tensile", None, 16 << 20),         # the device's budget: GBs
                                                    ("eager", 14_000_000, 16 << 20)])    # eager PyTorch cuts nothing
def test_a_job_takes_smaller_pieces_only_where_its_budget_needs_them(policy, budget, pieces):
    """``runners.fit_pieces``: hidden [1024, 1024], batch 256; its 4 MiB weight is cut only
    where the step captured whole has a floor above what its first plan may use."""
    from dbml.core import models, runners
    from dbml.zoo.inputs import Inputs
    cfg = models.config("mlp", Inputs("tabular", features=2), 2, hidden=[1024, 1024])
    params = runners.RunnerParams("m", policy, 1, OptimizerSpec("adam"), budget, None, "roofline", 1, 0.5, 0.1,
                                  False)
    got, meta = runners.fit_pieces(cfg, loss_fn, params, "cpu", 256, torch.int64)
    assert got.optimizer.update_chunk_bytes == pieces
    # the whole step's meta sequence, captured and kept whole, is handed on (check_plan_fits reuses it)
    assert (meta is not None) == (policy == "tensile" and budget == 30_000_000)
    assert dataclasses.replace(got, optimizer=params.optimizer) == params   # nothing else changes
