"""The latency predictor: calibration, persistence, held-out evaluation, prediction on
captured graphs, fallbacks, and device utilisation."""

from __future__ import annotations

import json
import math
import os
import types
from dataclasses import replace
import warnings

import pytest
import torch

from dbml.scheduler.latency import calibrate as calibration
from dbml.scheduler.latency import predictor as predictor_mod
from dbml.scheduler.latency.calibrate import ConvLayer, ConvProbes, LoadGenerator, CalibrationPlan, calibrate, load_or_calibrate
from dbml.scheduler.graph.capture import capture
from dbml.scheduler.latency.estimate import RooflineModel
from dbml.scheduler.latency.opfeatures import CONV_FEATURES, FEATURE_NAMES, conv_features, op_features, op_kind
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.latency.predictor import (FORMAT, fingerprint, heldout_report, load_predictor, predictor_path,
                                      split_heldout)
from dbml.scheduler.latency import utilisation
from dbml.scheduler.latency.utilisation import device_utilisation, utilisation_source

# One tiny model per family, a few conv probes, small steps, two load levels, a short training.
TINY = CalibrationPlan(models=1, levels=(0.0, 1.0), steps=150, copy_sizes=(1 << 14, 1 << 18), flops_cap=2e6, seconds=20,
            conv_probes=4)


def uses_calibration(test):
    """Marks a test that uses ``calibrated`` (a tiny calibration, ~20 s, once per module)."""
    return pytest.mark.slow(pytest.mark.calibrates(test))


@pytest.fixture(scope="module")
def calibrated():
    events = []
    p = calibrate("cpu", plan=TINY, save=False, progress=lambda d, n, s: events.append((d, n, s)))
    return p, events


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DBML_CACHE_DIR", str(tmp_path))
    return tmp_path


def _captured_nodes(model, x):
    torch.manual_seed(0)
    step = capture(model, torch.nn.functional.cross_entropy, OptimizerSpec("adam"),
                   (x, torch.randint(0, 4, (x.shape[0],))))
    return [n for n in step.graph.nodes if n.op == "call_function"]


def mlp_nodes():
    return _captured_nodes(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)),
                           torch.randn(8, 16))


def cnn_nodes():
    return _captured_nodes(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                                               torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                               torch.nn.Linear(4 * 4 * 4, 4)), torch.randn(4, 3, 8, 8))


@uses_calibration
def test_calibration_covers_training_ops_and_reports_progress(calibrated):
    p, events = calibrated
    for kind in ("aten.addmm.default", "aten.mm.default", "aten.convolution.default",
                 "aten.convolution_backward.default", "aten.native_batch_norm_backward.default",
                 "aten.threshold_backward.default", "aten.addcdiv.default", "aten.embedding.default"):
        assert kind in p.vocab, kind
    assert [d for d, _, _ in events] == sorted(d for d, _, _ in events)
    assert events[-1][0] == events[-1][1] and all(d <= n for d, n, _ in events)
    assert p.copy_bandwidth["h2d"] > 0 and p.copy_bandwidth["d2h"] > 0
    assert p.machine.copy_bandwidth == min(p.copy_bandwidth["h2d"], p.copy_bandwidth["d2h"])
    s = p.samples
    probed = {s.kinds[i] for i in range(len(s)) if s.probe[i]}
    assert probed == {"aten.convolution.default", "aten.convolution_backward.default"}
    assert p.meta["models"] == 4 and p.meta["probe_samples"] == sum(s.probe) > 0


@uses_calibration
def test_predictor_file_round_trips(calibrated, cache):
    p, _ = calibrated
    path = p.save()
    assert path == predictor_path("cpu") and path.parent == cache
    torch.load(path, weights_only=True)           # plain tensors only
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["fingerprint"] == fingerprint("cpu")
    loaded = load_predictor("cpu")
    assert loaded is not None
    for u in (0.0, 0.7):
        p.utilisation = loaded.utilisation = u
        nodes = cnn_nodes()
        assert [loaded.predict(n) for n in nodes] == [p.predict(n) for n in nodes]
    assert loaded.report().rows == p.report().rows
    assert loaded.machine == p.machine


@uses_calibration
def test_unknown_fingerprint_yields_none_and_calibrates(calibrated, cache, monkeypatch):
    p, _ = calibrated
    assert load_predictor("cpu") is None           # nothing cached yet
    p.save()
    assert load_predictor("cpu") is not None
    other = dict(fingerprint("cpu"), torch="0.0.0")
    monkeypatch.setattr(predictor_mod, "fingerprint", lambda device="cpu", threads=None: other)
    assert load_predictor("cpu") is None           # another torch: another (missing) file
    p.save(predictor_path("cpu"))                  # a file at that key holding the old fingerprint
    assert load_predictor("cpu") is None           # the metadata is checked, not only the name
    calls = []
    monkeypatch.setattr(calibration, "calibrate", lambda device="cpu", quick=False, progress=None:
                        calls.append(quick) or p)
    assert load_or_calibrate("cpu", quick=True) is p and calls == [True]


@uses_calibration
@pytest.mark.parametrize("old", [{"format": FORMAT - 1, "fingerprint": {"format": FORMAT - 1}, "features": None},
                                 {"features": FEATURE_NAMES[:-1]}],
                         ids=["older format", "feature layout changed without a format bump"])
def test_predictor_of_another_feature_layout_is_stale_and_recalibrated(calibrated, cache, monkeypatch, old):
    """A predictor saved by an older dbml (features laid out otherwise) must not be loaded:
    its network would read today's feature vector with yesterday's meanings."""
    p, _ = calibrated
    path = p.save()
    assert load_predictor("cpu") is not None
    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    meta.update({k: v for k, v in old.items() if k != "fingerprint"})
    meta["fingerprint"].update(old.get("fingerprint", {}))
    meta_path.write_text(json.dumps(meta))   # an old file found at today's path
    assert load_predictor("cpu") is None
    calls = []
    monkeypatch.setattr(calibration, "calibrate", lambda device="cpu", quick=False, progress=None:
                        calls.append(quick) or p)
    assert load_or_calibrate("cpu") is p and calls == [False]


def test_probe_features_match_the_captured_layer():
    """A probed conv layer is featurised exactly as the same layer in a captured step."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(6, 5, 1, stride=2), torch.nn.Flatten(), torch.nn.Linear(5 * 16, 4))
    step = capture(model, torch.nn.functional.cross_entropy, OptimizerSpec("sgd"),
                   (torch.randn(2, 3, 8, 8), torch.randint(0, 4, (2,))))
    captured = {(op_kind(n), tuple(op_features(n))) for n in step.gm.graph.nodes
                if op_kind(n) in ("aten.convolution.default", "aten.convolution_backward.default")}
    layers = (ConvLayer(2, 3, 8, 6, 3, 1, input_grad=False), ConvLayer(2, 6, 8, 5, 1, 2, input_grad=True))
    prep = calibration._prepare(ConvProbes(layers, "probes"), torch.device("cpu"), set())
    assert {(kind, tuple(f)) for kind, f in prep.nodes} == captured and len(captured) == 4
    calls = prep.calls()
    assert [len(c[1]) for c in calls] == [9, 11, 9, 11]
    for fn, args, kwargs in calls:   # real tensors of the probed shapes: the calls run
        fn(*args, **kwargs)


def test_conv_features_spell_out_geometry_and_gradients():
    nodes = cnn_nodes()
    conv = {n.target: conv_features(n) for n in nodes if op_kind(n) and "convolution" in op_kind(n)}
    forward = dict(zip(CONV_FEATURES, conv[torch.ops.aten.convolution.default]))
    backward = dict(zip(CONV_FEATURES, conv[torch.ops.aten.convolution_backward.default]))
    # Conv2d(3, 4, 3, padding=1) on a batch of 4 8x8 images: the first layer, no input gradient
    assert forward["conv_batch"] == math.log2(5) and forward["conv_in_channels"] == 2.0
    assert forward["conv_kernel"] == math.log2(10) and forward["conv_out_pixels"] == math.log2(65)
    assert [backward[f] for f in ("conv_grad_input", "conv_grad_weight", "conv_grad_bias")] == [0.0, 1.0, 1.0]
    assert [forward[f] for f in ("conv_grad_input", "conv_grad_weight", "conv_grad_bias")] == [0.0, 0.0, 0.0]
    assert all(v == 0.0 for n in nodes if op_kind(n) == "aten.addmm.default" for v in conv_features(n))
    if torch.backends.mkldnn.is_available():   # batch 4 goes to oneDNN, a small batch-1 image does not
        assert forward["conv_library"] == 1.0
        one = _captured_nodes(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Flatten(),
                                                  torch.nn.Linear(4 * 8 * 8, 4)), torch.randn(1, 3, 8, 8))
        assert [conv_features(n)[-1] for n in one if op_kind(n) == "aten.convolution.default"] == [0.0]


def test_block_size_comes_from_a_warm_call(monkeypatch):
    """A cold first call (caches, kernel selection) must not size the timed blocks: sized
    by one, a 20 us convolution was timed one cold call at a time. The clock is a fake
    one the op advances (a cold call 1/64 s, a warm one 1/16384 s): no sleeping, no
    dependence on how busy the machine is."""
    now, calls = [0.0], []

    def op():
        calls.append(now[0])
        now[0] += 2.0 ** -6 if len(calls) == 1 else 2.0 ** -14
    monkeypatch.setattr(calibration, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    n = calibration._block_calls(op, (), {}, torch.device("cpu"), block_s=2.0 ** -10)
    assert len(calls) == 2 and n == 16     # block / warm call; sized by the cold call it would be 1


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("DBML_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert predictor_mod.cache_dir() == tmp_path / "xdg" / "dbml"
    monkeypatch.setenv("DBML_CACHE_DIR", str(tmp_path / "own"))
    assert predictor_path("cpu").parent == tmp_path / "own"


@uses_calibration
def test_heldout_shapes_are_disjoint_from_training(calibrated):
    p, _ = calibrated
    s = p.samples
    train, test = split_heldout(s)
    assert train and test and sorted(train + test) == list(range(len(s)))
    assert not {s.shape_key(i) for i in train} & {s.shape_key(i) for i in test}
    # every load level of a held-out shape is held out
    assert {s.shape_key(i) for i in test} == {s.shape_key(i) for i in range(len(s))} - {s.shape_key(i) for i in train}
    # the report is computed on the held-out rows (recomputing it on them gives it back)
    assert [tuple(r) for r in heldout_report(p, s, test)] == [tuple(r) for r in p.report().rows]
    row = p.report().rows[0]
    assert row.samples == sum(k == row.op for k in s.kinds)
    assert p.model_bytes <= 5e6


@uses_calibration
def test_predictions_on_captured_graphs_are_positive_finite_and_the_networks(calibrated):
    p, _ = calibrated
    p.utilisation = 0.5
    for nodes in (mlp_nodes(), cnn_nodes()):
        before = sum(p.fallbacks.values())
        times = [p.predict(n) for n in nodes]
        assert all(t > 0 and math.isfinite(t) for t in times)
        kinds = {op_kind(n) for n in nodes} - {None}
        assert kinds <= set(p.vocab) | set(p.fallbacks)
        unknown = [n for n in nodes if op_kind(n) is not None and op_kind(n) not in p.vocab]
        assert sum(p.fallbacks.values()) == before + len(unknown)   # the known kinds were not roofline's
    assert p.predict(next(n for n in cnn_nodes() if op_kind(n) == "aten.convolution.default")) > 0
    # the network answers, not the roofline: its prediction depends on the device's load. Asked
    # of the network itself: predict() takes the larger of it and the roofline's floor
    # (ROOFLINE_FLOOR), which a small product's prediction can be under at both loads
    addmm = next(n for n in mlp_nodes() if op_kind(n) == "aten.addmm.default")
    kind, features = op_kind(addmm), op_features(addmm)
    assert p.predict_features(kind, features, 1.0) != p.predict_features(kind, features, 0.0)
    p.utilisation = 1.0
    assert p.predict_op(addmm) >= p.predict_features(kind, features, 1.0)


@uses_calibration
def test_unknown_ops_fall_back_to_roofline_and_are_counted(calibrated):
    p, _ = calibrated
    p.utilisation = 0.0
    nodes = _captured_nodes(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)),
                            torch.randn(8, 16))
    unknown = [n for n in nodes if op_kind(n) is not None and op_kind(n) not in p.vocab]
    assert {op_kind(n) for n in unknown} >= {"aten.tanh.default", "aten.tanh_backward.default"}
    before = sum(p.fallbacks.values())
    # the calibrated machine's roofline, at the typical bandwidth of FLOP-less ops where calibration timed some
    roofline = RooflineModel(replace(p.machine, memory_bandwidth=p.meta["fallback_bandwidth"] or
                                     p.machine.memory_bandwidth))
    for n in unknown:
        assert p.predict_op(n) == roofline.predict(n) > 0
    assert sum(p.fallbacks.values()) == before + len(unknown)
    for n in unknown:   # a whole iteration's share of it
        assert p.predict(n) == pytest.approx(p.iteration_scale * roofline.predict(n) + p.node_overhead)
    assert p.report().fallbacks["aten.tanh.default"] >= 1


@pytest.mark.parametrize("runnable, cores, want", [(1, 2, 0.0), (3, 2, 0.5), (5, 2, 2 / 3), (2, 8, 1 / 9)])
def test_cpu_utilisation_is_pressure_from_the_run_queue(monkeypatch, runnable, cores, want):
    """R runnable threads besides the reader on C cores read R / (R + C), from a fake run
    queue (the machine's real load plays no part)."""
    monkeypatch.setattr(utilisation, "runnable_threads", lambda: runnable)   # the reader included
    monkeypatch.setattr(utilisation.os, "cpu_count", lambda: cores)
    assert device_utilisation("cpu", window=0.001) == pytest.approx(want)
    assert utilisation_source("cpu") == "proc-loadavg"


def test_cpu_utilisation_is_a_fraction_and_sees_load():
    """Live: one load thread per core must show. The bound asks for one runnable load
    thread on average, 1 / (1 + cores), not all of them (they take turns at the GIL);
    other processes' load only raises the reading, so a busy machine cannot fail it."""
    assert 0.0 <= device_utilisation("cpu") <= 1.0
    assert utilisation_source("cpu") in ("proc-loadavg", "rusage")
    with LoadGenerator("cpu") as load:
        load.level = 1.0
        loaded = max(device_utilisation("cpu", window=0.05) for _ in range(3))
    assert 1 / (1 + os.cpu_count()) <= loaded <= 1.0


def test_cuda_utilisation_degrades_cleanly(monkeypatch):
    if not torch.cuda.is_available():
        with pytest.warns(RuntimeWarning, match="cannot be read"):
            assert device_utilisation("cuda:0") == 0.0
        assert utilisation_source("cuda") == "none"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def no_nvml(device=None):
        raise ModuleNotFoundError("pynvml")
    monkeypatch.setattr(torch.cuda, "utilization", no_nvml)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert device_utilisation("cuda:1") == 0.0
    monkeypatch.setattr(torch.cuda, "utilization", lambda device=None: 37)
    assert device_utilisation("cuda:0") == pytest.approx(0.37)


def test_bmm_probes_featurise_as_attention_captures_them():
    """Batched matmuls timed on their own (issue 22: bmm's held-out R^2 was 0.45 from the
    attention models' few shapes): a probe's node has the features capture gives
    ``q @ k.transpose`` of the same shapes, transposed operand included."""
    from dbml.scheduler.latency.workloads import BmmLayer, PLANS, workloads
    q, k = torch.randn(6, 5, 4), torch.randn(6, 7, 4)
    step = capture(_Scores(), torch.nn.functional.cross_entropy, OptimizerSpec("sgd"), (q, torch.randint(0, 7, (6,))))
    captured = {tuple(op_features(n)) for n in step.gm.graph.nodes if op_kind(n) == "aten.bmm.default"}
    prep = calibration._prepare(ConvProbes((BmmLayer(6, 5, 4, 7, right_t=True),), "probes"), torch.device("cpu"), set())
    [(kind, features)] = prep.nodes
    assert kind == "aten.bmm.default" and tuple(features) in captured
    [(fn, args, kwargs)] = prep.calls()
    assert fn(*args, **kwargs).shape == (6, 5, 7)
    plan = PLANS["quick"]
    layers = [layer for w in workloads(plan) if isinstance(w, ConvProbes) for layer in w.layers]
    assert sum(isinstance(layer, BmmLayer) for layer in layers) == plan.bmm_probes


class _Scores(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.k = torch.nn.Parameter(torch.randn(6, 7, 4))

    def forward(self, q):
        return (q @ self.k.transpose(1, 2)).sum(1)


def test_the_install_table_prints_relative_errors_not_a_meaningless_r2():
    """An op kind whose held-out latencies barely vary gets R^2 = -3919.9 with predictions
    within a few per cent: the table prints the median relative errors (network, baseline)."""
    from dbml.scheduler.latency.predictor import OpReport, PredictorReport
    rows = [OpReport("aten.relu.default", 120, -3919.92, -12.5, 0.031, 0.2), OpReport("aten.mm.default", 80, 0.97, 0.9, 0.08)]
    text = PredictorReport(rows, {}, 40_000, 31.0, {}, {}).format()
    assert "-3919" not in text and "r2" not in text.split("\n")[1]
    assert [line.split()[-2:] for line in text.split("\n")[2:4]] == [["3.1%", "20.0%"], ["8.0%", "-"]]
    assert "dbml_predictor" in text
