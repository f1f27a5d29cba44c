"""Latencies on networks calibration did not see: the zoo's networks in calibration, the
whole-iteration scale, the baseline's shrunk slopes, the fallback's typical bandwidth,
and the held-out evaluation (benchmarks/latency_eval.py)."""

from __future__ import annotations

import math

import pytest
import torch

from dbml.errors import InvalidArgument
from dbml.core.latency import ZOO_CONFIGS, ZOO_FAMILIES, calibration_work, family_of, zoo_workloads
from dbml.scheduler.graph.capture import capture
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.latency import calibrate as calibration
from dbml.scheduler.latency.calibrate import CalibrationPlan, calibrate, workloads
from dbml.scheduler.latency.estimate import Machine
from dbml.scheduler.latency.iteration import SCALE_RANGE, fit_iteration_scale, predicted_step_seconds
from dbml.scheduler.latency.opfeatures import LOG_BYTES, LOG_FLOPS, N_FEATURES, op_features, op_kind
from dbml.scheduler.latency.predictor import Samples, fit_predictor, load_predictor
from dbml.scheduler.latency.samples import baseline_log, fit_baseline, typical_bandwidth

MACHINE = Machine(peak_flops=1e10, memory_bandwidth=1e10, copy_bandwidth=1e9, op_overhead=1e-6)
COPIES = {"h2d": 1e9, "d2h": 1e9, "h2d_latency": 0.0, "d2h_latency": 0.0, "device": 1e10}


# -- the whole-iteration scale ----------------------------------------------------------

def test_iteration_fit_recovers_scale_and_per_node_cost():
    # measured = 1.7 * predicted + 20 us per node, networks of different sizes and mixes
    points = [(f"net{i}", p, n, 1.7 * p + 20e-6 * n) for i, (p, n) in
              enumerate([(0.001, 135), (0.08, 980), (0.6, 1441), (0.02, 4000)])]
    scale, per_node = fit_iteration_scale(points)
    assert scale == pytest.approx(1.7, rel=1e-6) and per_node == pytest.approx(20e-6, rel=1e-6)


def test_iteration_fit_keeps_scale_at_least_one_and_per_node_cost_non_negative():
    assert fit_iteration_scale([]) == (1.0, 0.0)
    assert fit_iteration_scale([("a", 1.0, 10, 2.0), ("b", 4.0, 1000, 8.0)]) == (pytest.approx(2.0), 0.0)
    # small networks slowed by their node count: the free fit wants a negative scale
    points = [("mlp", 0.0016, 135, 0.022), ("transformer", 0.014, 466, 0.05), ("vgg", 0.07, 980, 0.16)]
    scale, per_node = fit_iteration_scale(points)
    assert scale == 1.0 and 50e-6 < per_node < 200e-6
    assert fit_iteration_scale([("a", 1.0, 0, 1e4)]) == (SCALE_RANGE[1], 0.0)   # no nodes: a scale alone


def _samples() -> Samples:
    """Hand-made calibration rows: mm scales with FLOPs, relu with bytes."""
    s = Samples()
    for i in range(12):
        f = [0.0] * N_FEATURES
        f[LOG_FLOPS], f[LOG_BYTES] = 10 + i, 8 + i
        s.add("aten.mm.default", f, 0.0, 1e-6 + 2 ** (10 + i) / 1e10, 0.0)
        g = [0.0] * N_FEATURES
        g[LOG_BYTES] = 10 + i
        s.add("aten.relu.default", g, 0.0, 1e-6 + 2 ** (10 + i) / 5e9, 0.0)
    return s


@pytest.fixture(scope="module")
def mlp_graph():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    return capture(model, torch.nn.functional.cross_entropy, OptimizerSpec("adam"), (x, y)).gm


@pytest.mark.slow
def test_predictor_applies_the_iteration_scale_and_keeps_it(mlp_graph, tmp_path):
    p = fit_predictor(_samples(), "cpu", MACHINE, COPIES, steps=20, fallback_bandwidth=2e9)
    p.utilisation = 0.0
    nodes = [n for n in mlp_graph.graph.nodes if n.op == "call_function"]
    ops = predicted_step_seconds(p.predict_op, mlp_graph)
    assert predicted_step_seconds(p.predict, mlp_graph) == pytest.approx(ops)   # no scale learned: 1, 0
    p.iteration_scale, p.node_overhead = 2.5, 1e-5
    p.meta.update(iteration_scale=2.5, node_overhead=1e-5)
    assert predicted_step_seconds(p.predict, mlp_graph) == pytest.approx(2.5 * ops + 1e-5 * len(nodes))
    loaded = load_predictor("cpu", path=p.save(tmp_path / "p.pt"))
    assert (loaded.iteration_scale, loaded.node_overhead) == (2.5, 1e-5)
    assert loaded.fallback.machine.memory_bandwidth == 2e9
    assert loaded.floor.machine == Machine(MACHINE.peak_flops, MACHINE.memory_bandwidth, MACHINE.copy_bandwidth, 0.0)


@pytest.mark.slow
def test_unknown_kinds_fall_back_at_the_typical_bandwidth_and_no_op_beats_the_roofline(mlp_graph):
    p = fit_predictor(_samples(), "cpu", MACHINE, COPIES, steps=20, fallback_bandwidth=1e8)
    p.utilisation = 0.0
    unknown = next(n for n in mlp_graph.graph.nodes if op_kind(n) == "aten.addmm.default")   # not in _samples
    assert p.predict_op(unknown) == pytest.approx(p.fallback.predict(unknown))
    assert p.fallback.predict(unknown) > p.floor.predict(unknown)    # 1e8 B/s against the machine's 1e10
    for n in mlp_graph.graph.nodes:
        if op_kind(n) in p.vocab:
            assert p.predict_op(n) >= p.floor.predict(n)


def test_typical_bandwidth_is_the_median_of_large_flopless_ops():
    s = _samples()
    assert typical_bandwidth(s) == pytest.approx(5e9, rel=0.01)   # relu rows of >= 1 MiB; mm has FLOPs
    assert typical_bandwidth(Samples()) is None


def test_baseline_slopes_of_a_sparsely_seen_kind_shrink_toward_the_pooled_ones():
    s = _samples()
    # layer_norm_backward seen at two nearly equal sizes, its timings noisy: a steep slope
    for log_bytes, seconds in ((20.0, 3e-4), (20.1, 9e-4)):
        f = [0.0] * N_FEATURES
        f[LOG_BYTES] = log_bytes
        for _ in range(3):
            s.add("aten.native_layer_norm_backward.default", f, 0.0, seconds, 0.0)
    vocab = {k: i for i, k in enumerate(sorted(set(s.kinds)))}
    feats = torch.tensor(s.features)
    log_t = torch.tensor(s.latency, dtype=torch.float64).log().float()
    coef = fit_baseline(s.kinds, feats, torch.zeros(len(s)), log_t, vocab)
    far = torch.zeros(1, N_FEATURES)
    far[0, LOG_BYTES] = 24.0     # 16x the bytes seen
    k = torch.tensor([vocab["aten.native_layer_norm_backward.default"]])
    predicted = float(baseline_log(coef, k, far, torch.zeros(1)).exp())
    assert predicted < 0.05, f"{predicted:.3g} s for 16x the bytes of a 0.3-0.9 ms op"


# -- the zoo's networks in calibration --------------------------------------------------

def test_zoo_workloads_cover_every_family_and_leave_one_out():
    full = zoo_workloads("full")
    assert {w.family for w in full} == {f"zoo:{f}" for f in ZOO_FAMILIES}
    assert all(w.iteration is not None and w.optimizer == "adam" for w in full)
    assert {family_of(arch) for arch, *_ in ZOO_CONFIGS["quick"]} <= set(ZOO_FAMILIES)
    without = zoo_workloads("full", exclude=("transformer", "vgg"))
    assert {w.family for w in without} == {f"zoo:{f}" for f in ZOO_FAMILIES} - {"zoo:transformer", "zoo:vgg"}
    with pytest.raises(InvalidArgument, match="unknown family 'vggg'"):
        zoo_workloads("full", exclude=("vggg",))


def test_calibration_work_spreads_the_zoo_among_the_synthetic_models():
    work = calibration_work("cpu", quick=True)
    synthetic = workloads(calibration.PLANS["quick"], "cpu")
    zoo = [i for i, w in enumerate(work) if getattr(w, "family", "").startswith("zoo:")]
    assert len(work) == len(synthetic) + len(ZOO_CONFIGS["quick"]) and len(zoo) == len(ZOO_CONFIGS["quick"])
    assert zoo[0] == 0 and zoo[-1] < len(work) - 1 and max(b - a for a, b in zip(zoo, zoo[1:])) > 1


@pytest.mark.slow
def test_a_zoo_workload_is_captured_once_for_its_ops_and_its_real_steps():
    w = next(w for w in zoo_workloads("quick") if w.family == "zoo:mlp")
    prep = calibration._prepare(w, torch.device("cpu"), set())
    try:
        assert prep.graph is not None and prep.nodes
        assert prep.step.runner.graphs.shared_hits == 1    # the runner reused calibration's capture
        kinds = {op_kind(n) for n in prep.graph.graph.nodes} - {None}
        assert {kind for kind, _ in prep.nodes} == kinds
        assert all(len(f) == N_FEATURES for _, f in prep.nodes)
    finally:
        prep.step.close()


# -- calibrating (slow) -------------------------------------------------------------------

TINY = CalibrationPlan(models=1, levels=(0.0, 1.0), steps=150, copy_sizes=(1 << 14, 1 << 18), flops_cap=2e6,
                       seconds=40, conv_probes=4, passes=2)


@pytest.mark.slow
@pytest.mark.calibrates
def test_calibration_with_the_zoo_learns_its_kinds_and_the_iteration_scale():
    zoo = [w for w in zoo_workloads("quick") if w.family in ("zoo:mlp", "zoo:transformer")]
    p = calibrate("cpu", plan=TINY, save=False, work=workloads(TINY, "cpu") + zoo)
    for kind in ("aten.gelu.default", "aten.gelu_backward.default", "aten.native_layer_norm.default",
                 "aten.embedding.default"):
        assert kind in p.vocab, kind
    points = p.meta["step_points"]
    assert len(points) == 2 * len(TINY.levels) and p.samples.steps
    assert p.meta["iteration_scale"] == p.iteration_scale and SCALE_RANGE[0] <= p.iteration_scale <= SCALE_RANGE[1]
    # the two terms are the fit over the measured steps (their quality is latency_eval's to measure)
    # (to the last bits: the points were stored and read back, the fit's sums may round apart)
    assert (p.iteration_scale, p.node_overhead) == pytest.approx(fit_iteration_scale(points), rel=1e-12)
    assert all(predicted > 0 and nodes > 0 and measured > 0 for _, predicted, nodes, measured in points)


@pytest.mark.slow
def test_latency_eval_measures_and_predicts_with_the_roofline():
    from dbml.bench import latency_eval

    rows = latency_eval.run(("mlp",), plans=(), iterations=2, progress=lambda line: None)
    (row,) = rows
    assert row["latency_model"] == "roofline" and row["family"] == "mlp" and row["within_goal"] is None
    assert row["measured_s"] > 0 and math.isclose(row["ratio"], row["predicted_s"] / row["measured_s"])
    assert "mlp" in latency_eval.format_rows(rows)
