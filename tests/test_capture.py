"""Capture, annotations, the access sequence, latency estimates and PeakMeter."""

from __future__ import annotations

import copy

import pytest
import torch

from dbml.scheduler import PeakMeter, live_tensors, measure_peak
from dbml.scheduler.graph.access import build_sequence, op_nodes
from dbml.scheduler.graph.capture import capture, init_state
from dbml.scheduler.graph.graphs import GraphCache
from dbml.scheduler.latency.estimate import Machine, RooflineModel, node_flops
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.graph.sequence import Phase, TensorKind
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.latency import estimate

from helpers import assert_same, batches, loss_fn, state_of

MACHINE = Machine(peak_flops=5e9, memory_bandwidth=5e9, copy_bandwidth=2e9, op_overhead=5e-6)


def mlp():
    """Smaller than helpers.mlp: the tests below name its layers and sizes."""
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                               torch.nn.Linear(32, 4))


def cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                               torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 5 * 5, 4))


def batch(n=8, shape=(16,)):
    return batches(1, n, shape, classes=4)[0]


@pytest.fixture(scope="module")
def captured():
    torch.manual_seed(0)
    return capture(mlp(), loss_fn, OptimizerSpec("adam"), batch())


def run_graph(c, model, spec, batches):
    """Execute the captured graph with fx's own Interpreter (independent of our executor)."""
    params = [p.detach().clone() for p in model.parameters()]
    flat = params + [b.clone() for b in model.buffers()] + \
        [t for p in params for t in init_state(spec, p).values()]
    for x, y in batches:
        out = torch.fx.Interpreter(c.gm).run(*flat, x, y)
        for o, ph in c.updates.items():
            flat[ph] = out[o]
    return flat


@pytest.mark.parametrize("model_fn,shape,kind", [(mlp, (16,), "adam"), (cnn, (3, 5, 5), "sgd"),
                                                  (mlp, (16,), "adamw")])
def test_captured_graph_reproduces_eager_bit_for_bit(model_fn, shape, kind):
    """Forward, backward and the optimizer, dropout masks and BatchNorm buffers included."""
    torch.set_num_threads(1)
    spec = OptimizerSpec(kind, lr=0.05, weight_decay=0.01)
    torch.manual_seed(0)
    model = model_fn()
    data = batches(3, 8, shape, classes=4)
    c = capture(copy.deepcopy(model), loss_fn, spec, data[0])
    eager = copy.deepcopy(model)
    step = EagerStep(eager, loss_fn, spec)
    torch.manual_seed(1)
    for x, y in data:
        step.step(x, y)
    torch.manual_seed(1)
    flat = run_graph(c, model, spec, data)
    want = state_of(eager)
    assert_same(flat[:len(want)], want)


def test_capture_allocates_no_real_memory_and_leaves_model_alone():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
    before = [p.detach().clone() for p in model.parameters()]
    data = batch(64, (512,))
    with PeakMeter(discover=False) as meter:
        capture(model, loss_fn, OptimizerSpec("adam"), data)
    assert meter.peak_bytes < 64 * 1024   # real tensors would be megabytes (fake tensors only)
    assert_same(before, list(model.parameters()))


def test_inputs_outputs_and_updates(captured):
    keys = [p.meta["dbml_key"] for p in captured.placeholders()]
    kinds = [p.meta["dbml_kind"] for p in captured.placeholders()]
    assert keys[:4] == [("param", "0.weight"), ("param", "0.bias"), ("param", "3.weight"), ("param", "3.bias")]
    assert keys[-2:] == [("batch", "x"), ("batch", "y")]
    assert kinds.count(TensorKind.PARAM) == 4 and kinds.count(TensorKind.OPT_STATE) == 12
    # every parameter and every optimizer state is replaced by an output
    replaced = set(captured.updates.values())
    assert replaced == {i for i, k in enumerate(kinds) if k in (TensorKind.PARAM, TensorKind.OPT_STATE)}
    # no in-place copies back into inputs remain
    assert not any(n.target is torch.ops.aten.copy_.default for n in captured.graph.nodes)


def test_phases_are_ordered_and_random_ops_marked(captured):
    phases = [n.meta["dbml_phase"] for n in op_nodes(captured)]
    order = {Phase.FORWARD: 0, Phase.BACKWARD: 1, Phase.OPTIMIZER: 2}
    assert [order[p] for p in phases] == sorted(order[p] for p in phases)
    assert set(phases) == set(order)
    random = [n for n in captured.graph.nodes if n.meta.get("dbml_random")]
    assert [n.target for n in random] == [torch.ops.aten.bernoulli.p]
    assert random[0].meta["dbml_phase"] is Phase.FORWARD


def test_views_share_their_base_storage(captured):
    for node in captured.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "is_view", False):
            base = node.args[0]
            assert node.meta["dbml_storage"] == base.meta["dbml_storage"]
            assert node.meta["dbml_nbytes"] == 0
    addmm = next(n for n in captured.graph.nodes if n.target is torch.ops.aten.addmm.default)
    assert addmm.meta["dbml_nbytes"] == 8 * 32 * 4


def test_batchnorm_mutates_its_statistics_only_and_is_replayable():
    """BatchNorm writes its running statistics (and nothing else): replayed on copies of
    them, so its outputs may be recomputed; an op with a schema-declared write may not."""
    from dbml.scheduler.graph.access import replayable
    from dbml.scheduler.graph.capture import writes_statistics_only
    c = capture(cnn(), loss_fn, OptimizerSpec("sgd"), batch(4, (3, 5, 5)))
    bn = next(n for n in c.graph.nodes if n.target is torch.ops.aten.native_batch_norm.default)
    assert bn.meta["dbml_mutates"] and not bn.meta["dbml_random"] and writes_statistics_only(bn)
    seq = build_sequence(c, RooflineModel(MACHINE))
    assert not any(seq.tensors[t].not_replayable for t in seq.ops[op_nodes(c).index(bn)].outputs)
    g = torch.fx.Graph()
    x = g.placeholder("x")
    add_ = g.call_function(torch.ops.aten.add_.Tensor, (x, x))
    add_.meta["dbml_mutates"] = True
    assert not writes_statistics_only(add_) and not replayable(add_)


def test_graph_cache_new_batch_shape_new_graph():
    cache = GraphCache(mlp(), loss_fn, OptimizerSpec("sgd"))
    a = cache.get(*batch(8))
    assert cache.get(*batch(8)) is a
    b = cache.get(*batch(3))
    assert b is not a and len(cache) == 2
    x = next(p for p in b.placeholders() if p.meta["dbml_key"] == ("batch", "x"))
    assert tuple(x.meta["val"].shape) == (3, 16)


def test_access_sequence(captured):
    seq = build_sequence(captured, RooflineModel(MACHINE), "j1")
    assert seq.job == "j1" and len(seq.ops) == len(op_nodes(captured))
    assert all(a.end == b.start for a, b in zip(seq.ops, seq.ops[1:]))
    assert all(op.latency > 0 for op in seq.ops)
    assert seq.initial == frozenset(p.meta["dbml_storage"] for p in captured.placeholders())
    # tensors are storages: one per allocation, sizes from the fake values
    assert len(seq.tensors) == len(captured.meta["storage_owners"])
    gen = {}
    for op in seq.ops:
        for t in op.outputs:
            assert t not in gen and t not in seq.initial
            gen[t] = op.index
        assert all(t in seq.initial or gen.get(t, 1 << 30) <= op.index for t in op.inputs)
    assert set(seq.updates.values()) <= seq.initial and len(seq.updates) == 16
    loss = captured.output_node().args[0][0]
    assert loss.meta["dbml_storage"] in seq.outputs
    assert [t.name for t in seq.tensors if t.not_replayable and t.kind is TensorKind.ACTIVATION] == ["bernoulli"]
    assert seq.copy_bandwidth == MACHINE.copy_bandwidth


def test_roofline_estimates_grow_with_work(captured):
    model = RooflineModel(MACHINE)
    mm = [n for n in captured.graph.nodes if n.target is torch.ops.aten.addmm.default]
    assert node_flops(mm[0]) == 2 * 8 * 16 * 32
    assert model.predict(mm[0]) > model.predict(mm[1])  # 8x16x32 vs 8x32x4
    view = next(n for n in captured.graph.nodes if n.target is torch.ops.aten.t.default)
    assert model.predict(view) < model.predict(mm[1])


# -- PeakMeter --------------------------------------------------------------------------

def test_peak_meter_is_exact_on_a_known_program():
    a = torch.ones(1000)                       # 4000 bytes, alive before
    with PeakMeter([a]) as m:
        b = a * 2                              # 8000
        c = b + 1                              # 12000  <- peak
        del b                                  # 8000
        d = c.view(10, 100)                    # a view: nothing new
        e = d.sum()                            # 8004
        del c, d
        f = torch.empty(500) + e               # 4004 + 2000 + ... temporaries freed
    assert m.base_bytes == 4000
    assert m.peak_bytes == 12000
    assert f.numel() == 500


def test_peak_meter_counts_untracked_inputs_as_alive_throughout():
    x = torch.ones(1000)
    with PeakMeter() as m:
        y = torch.zeros(2000)                  # 8000
        del y
        z = x + 1                              # x discovered: alive from the start
    assert m.peak_bytes == 4000 + 8000 and z.numel() == 1000


def test_measure_peak_of_an_eager_step():
    """Parameters dominate: at the optimizer step the live set is parameters, gradients,
    exp_avg, exp_avg_sq and Adam's two temporaries for the largest parameter (~6 P).
    Last step's gradients are freed by zero_grad and must not be counted (7 P)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    step = EagerStep(model, loss_fn, OptimizerSpec("adam"))
    x, y = torch.randn(4, 256), torch.randint(0, 4, (4,))
    for _ in range(3):
        step.step(x, y)   # past EagerStep's own measured steps; optimizer state exists
    _, peak = measure_peak(lambda: step.step(x, y), live_tensors(model, step.optimizer, x, y))
    p = sum(t.numel() * 4 for t in model.parameters())
    assert 5.9 * p < peak < 6.3 * p


def test_capture_and_estimates_leave_the_global_generator_alone(monkeypatch):
    """Dropout masks match eager only if nothing else draws from the generator."""
    model, data = mlp(), batch()
    monkeypatch.setattr(estimate, "_MACHINES", {})   # measure the machine now, not from the cache
    torch.manual_seed(11)
    estimate.measure_machine()
    build_sequence(capture(model, loss_fn, OptimizerSpec("adam"), data), RooflineModel())
    got = torch.rand(3)
    torch.manual_seed(11)
    assert torch.equal(got, torch.rand(3))
