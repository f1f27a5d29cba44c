"""The latency predictor: calibration, persistence, held-out evaluation, prediction on
captured graphs, fallbacks, and device utilisation."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from dbml.scheduler import calibrate as calibration
from dbml.scheduler import predictor as predictor_mod
from dbml.scheduler.calibrate import LoadGenerator, Plan, calibrate, load_or_calibrate
from dbml.scheduler.capture import capture
from dbml.scheduler.estimate import RooflineModel
from dbml.scheduler.opfeatures import op_kind
from dbml.scheduler.optim import OptimizerSpec
from dbml.scheduler.predictor import (fingerprint, heldout_report, load_predictor, predictor_path,
                                      split_heldout)
from dbml.scheduler.utilisation import device_utilisation, utilisation_source

# One tiny model per family, small steps, two load levels, a short training.
TINY = Plan(models=1, levels=(0.0, 1.0), steps=150, copy_sizes=(1 << 14, 1 << 18), flops_cap=2e6, seconds=20)


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


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("DBML_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert predictor_mod.cache_dir() == tmp_path / "xdg" / "dbml"
    monkeypatch.setenv("DBML_CACHE_DIR", str(tmp_path / "own"))
    assert predictor_path("cpu").parent == tmp_path / "own"


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


def test_predictions_on_captured_graphs_are_positive_and_finite(calibrated):
    p, _ = calibrated
    p.utilisation = 0.5
    for nodes in (mlp_nodes(), cnn_nodes()):
        times = [p.predict(n) for n in nodes]
        assert all(t > 0 and math.isfinite(t) for t in times)
        kinds = {op_kind(n) for n in nodes} - {None}
        assert kinds <= set(p.vocab) | set(p.fallbacks)
    assert p.predict(next(n for n in cnn_nodes() if op_kind(n) == "aten.convolution.default")) > 0


def test_unknown_ops_fall_back_to_roofline_and_are_counted(calibrated):
    p, _ = calibrated
    p.utilisation = 0.0
    nodes = _captured_nodes(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)),
                            torch.randn(8, 16))
    unknown = [n for n in nodes if op_kind(n) is not None and op_kind(n) not in p.vocab]
    assert {op_kind(n) for n in unknown} >= {"aten.tanh.default", "aten.tanh_backward.default"}
    before = sum(p.fallbacks.values())
    roofline = RooflineModel(p.machine)
    for n in unknown:
        assert p.predict(n) == roofline.predict(n) > 0
    assert sum(p.fallbacks.values()) == before + len(unknown)
    assert p.report().fallbacks["aten.tanh.default"] >= 1


def test_cpu_utilisation_is_a_fraction_and_sees_load():
    assert 0.0 <= device_utilisation("cpu") <= 1.0
    assert utilisation_source("cpu") in ("proc-loadavg", "rusage")
    with LoadGenerator("cpu") as load:
        load.level = 1.0
        loaded = max(device_utilisation("cpu", window=0.05) for _ in range(3))
    # one load thread per core is runnable: at least half the "R / (R + C)" scale
    assert loaded >= 0.45


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
