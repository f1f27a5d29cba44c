"""The on-disk graph cache: a stored step loads equal to a fresh capture and trains bit for
bit as eager does; the key changes with what determines the graph and only with that; a
damaged, mismatched or hostile file is ignored (recaptured), never executed."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.graph import store
from dbml.scheduler.graph.access import build_sequence
from dbml.scheduler.graph.capture import capture
from dbml.scheduler.graph.graphkey import Undescribable, graph_key
from dbml.scheduler.graph.graphs import GraphCache
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.latency.estimate import Machine, RooflineModel
from helpers import assert_same, batches, cnn, loss_fn, mlp, state_of

pytestmark = pytest.mark.usefixtures("one_thread")

ROOFLINE = RooflineModel(Machine(peak_flops=5e9, memory_bandwidth=5e9, copy_bandwidth=2e9, op_overhead=5e-6))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The graph cache in a fresh folder (never the user's ~/.cache)."""
    monkeypatch.setenv("DBML_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DBML_GRAPH_CACHE", "1")
    return tmp_path / "graphs"


class Tied(torch.nn.Module):
    """An embedding that is also the output layer's weight, a module registered twice."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 16)
        self.again = self.embed
        self.mix = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 20, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(torch.relu(self.mix(self.again(x))).mean(1))


def tied():
    return Tied()


CASES = {   # model, batch shape, token inputs?
    "mlp_dropout": (mlp, (32,), False),
    "cnn_batchnorm": (cnn, (3, 12, 12), False),
    "tied": (tied, (6,), True),
}


def data_for(case: str, n: int = 3):
    model_fn, shape, tokens = CASES[case]
    data = batches(n, 8, shape, classes=10)
    if tokens:
        g = torch.Generator().manual_seed(5)
        data = [(torch.randint(0, 20, (8, *shape), generator=g), torch.randint(0, 20, (8,), generator=g))
                for _ in range(n)]
    torch.manual_seed(0)
    return model_fn(), data


def train(runner, data):
    torch.manual_seed(1)
    losses = [runner.step(x, y) for x, y in data]
    runner.finish()
    return losses


def assert_same_graph(a, b):
    """Node for node: names, targets, arguments, annotations, and the fake values' layouts
    and storage sizes; and the same step fields."""
    assert a.updates == b.updates and a.input_keys == b.input_keys and a.meta == b.meta
    assert len(a.graph.nodes) == len(b.graph.nodes)
    for u, v in zip(a.graph.nodes, b.graph.nodes):
        assert (u.op, u.name, u.target, repr(u.args), repr(u.kwargs)) == \
            (v.op, v.name, v.target, repr(v.args), repr(v.kwargs))
        # repr: types too (a Phase, not the string it equals)
        assert repr(sorted((k, x) for k, x in u.meta.items() if k.startswith("dbml"))) == \
            repr(sorted((k, x) for k, x in v.meta.items() if k.startswith("dbml")))
        assert _layout(u.meta.get("val")) == _layout(v.meta.get("val")), u.format_node()


def _layout(val):
    if isinstance(val, torch.Tensor):
        return (val.dtype, tuple(val.shape), val.stride(), val.storage_offset(), val.device,
                val.untyped_storage().nbytes())
    if isinstance(val, (list, tuple)):
        return [_layout(x) for x in val]
    return type(val).__name__ if isinstance(val, (torch.SymFloat, torch.SymInt)) else val


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.slow   # ~3.3 s: out of the -m 'not slow' inner loop (under a minute)
def test_loaded_step_equals_capture_and_trains_like_eager(cache, case, kind):
    spec = OptimizerSpec(kind, lr=0.01)
    model, data = data_for(case)
    first = GraphCache(copy.deepcopy(model), loss_fn, spec)
    fresh = first.get(*data[0])
    assert first.disk_hits == 0 and first.uncached is None and len(list(cache.iterdir())) == 1

    second = GraphCache(copy.deepcopy(model), loss_fn, spec)   # another job, as another process would
    loaded = second.get(*data[0])
    assert second.disk_hits == 1 and loaded is not fresh
    assert_same_graph(fresh, loaded)
    assert loaded.gm.code.split("def forward")[1] == fresh.gm.code.split("def forward")[1]  # same code, on demand
    assert repr(build_sequence(fresh, ROOFLINE)) == repr(build_sequence(loaded, ROOFLINE))

    eager = copy.deepcopy(model)
    want = train(EagerStep(eager, loss_fn, spec), data)
    for policy in ("none", "tensile"):
        sched = copy.deepcopy(model)
        runner = ScheduledStep(sched, loss_fn, spec, policy=policy, latency_model=ROOFLINE)
        got = train(runner, data)
        assert runner.graphs.disk_hits == 1
        assert_same(got, want)
        assert_same(state_of(sched), state_of(eager))


def test_key_follows_what_determines_the_graph(cache):
    spec = OptimizerSpec("adam")
    x, y = batches(1, 8, (3, 12, 12))[0]
    torch.manual_seed(0)
    base = graph_key(cnn(), loss_fn, spec, x, y)
    torch.manual_seed(1)
    assert graph_key(cnn(), loss_fn, spec, x, y) == base     # other weights, same graph

    def changed(edit):
        m = cnn()
        edit(m)
        return graph_key(m, loss_fn, spec, x, y)

    assert changed(lambda m: setattr(m[0], "stride", (2, 2))) != base
    assert changed(lambda m: setattr(m[1], "eps", 1e-3)) != base
    assert changed(lambda m: m[0].weight.requires_grad_(False)) != base
    assert changed(lambda m: setattr(m[0], "bias", None)) != base
    assert changed(lambda m: m.to(memory_format=torch.channels_last)) != base
    assert graph_key(cnn(), torch.nn.functional.nll_loss, spec, x, y) != base
    assert graph_key(cnn(), loss_fn, OptimizerSpec("adam", lr=2e-3), x, y) != base
    assert graph_key(cnn(), loss_fn, spec, x[:4], y[:4]) != base
    assert graph_key(cnn(), loss_fn, spec, x, y, {"some_option": 2}) != base


def test_models_that_cannot_be_described_are_captured_every_time(cache):
    x, y = batches(1, 8, (32,))[0]
    hooked = mlp()
    hooked[0].register_forward_hook(lambda mod, inp, out: out * 2)
    with pytest.raises(Undescribable, match="forward hooks"):
        graph_key(hooked, loss_fn, OptimizerSpec("sgd"), x, y)
    ns: dict = {}
    exec("import torch\nclass NoSource(torch.nn.Linear):\n    pass\n", ns)   # noqa: S102 - a class without a file
    with pytest.raises(Undescribable, match="no source"):
        graph_key(ns["NoSource"](32, 10), loss_fn, OptimizerSpec("sgd"), x, y)
    graphs = GraphCache(hooked, loss_fn, OptimizerSpec("sgd"))
    graphs.get(x, y)
    assert "forward hooks" in graphs.uncached and not cache.exists()


def _saved(cache, model, spec, x, y) -> tuple:
    GraphCache(copy.deepcopy(model), loss_fn, spec).get(x, y)
    (path,) = cache.iterdir()
    return path, json.loads(path.read_text())


def _reload(model, spec, x, y) -> GraphCache:
    graphs = GraphCache(copy.deepcopy(model), loss_fn, spec)
    graphs.get(x, y)
    return graphs


@pytest.mark.parametrize("damage", ["truncated", "other key", "foreign op", "python target", "bad ref",
                                    "bad dtype", "format"])
@pytest.mark.slow   # ~2.4 s: out of the -m 'not slow' inner loop (under a minute)
def test_damaged_or_hostile_files_are_ignored_and_replaced(cache, damage):
    spec = OptimizerSpec("sgd")
    model, data = data_for("mlp_dropout", 1)
    path, doc = _saved(cache, model, spec, *data[0])
    text = path.read_text()
    node = next(i for i, n in enumerate(doc["nodes"]) if n[0] == "call_function" and isinstance(n[2], list))
    if damage == "truncated":
        text = text[: len(text) // 2]
    else:
        if damage == "other key":
            doc["key"] = "0" * 64
        elif damage == "foreign op":
            doc["nodes"][node][2] = ["myns", "evil", "default"]
        elif damage == "python target":
            doc["nodes"][node][2] = "os.system"
        elif damage == "bad ref":
            doc["nodes"][node][3] = [{"node": 10 ** 6}]
        elif damage == "bad dtype":
            placeholder = doc["nodes"][0]
            placeholder[6] = {"tensor": ["__class__", *placeholder[6]["tensor"][1:]]}
        elif damage == "format":
            doc["format"] = store.FORMAT + 1
        text = json.dumps(doc)
    path.write_text(text)
    graphs = _reload(model, spec, *data[0])
    assert graphs.disk_hits == 0 and graphs.uncached.startswith("ignored")
    assert _reload(model, spec, *data[0]).disk_hits == 1   # the recapture rewrote it


def test_unknown_targets_are_not_stored():
    model, data = data_for("mlp_dropout", 1)
    captured = capture(model, loss_fn, OptimizerSpec("sgd"), data[0])
    node = next(n for n in captured.graph.nodes if n.op == "call_function")
    node.target = print
    with pytest.raises(store.StoreError, match="cannot store call target"):
        store.encode(captured)


def test_switched_off_writes_nothing(cache, monkeypatch):
    monkeypatch.setenv("DBML_GRAPH_CACHE", "0")
    model, data = data_for("mlp_dropout", 1)
    graphs = GraphCache(model, loss_fn, OptimizerSpec("sgd"))
    graphs.get(*data[0])
    assert not cache.exists() and graphs.disk_hits == 0
