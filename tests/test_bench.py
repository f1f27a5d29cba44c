"""python -m dbml bench: the GPU-ratio emulation, the workloads, and the --quick run end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from dbml.bench import emulate
from dbml.bench.workloads import QUICK, WORKLOADS, workload

REQUIRED = ("section", "workload", "method", "mode", "batch", "jobs", "threads", "budget_bytes",
            "vanilla_peak_bytes", "peak_bytes", "vanilla_seconds", "seconds", "msr", "eor", "cbr",
            "first_iteration_eor", "swaps", "recomputes")


def test_emulated_bandwidth_keeps_the_gpu_copy_to_compute_ratio():
    p = emulate.profile("a6000")
    t_gpu, t_cpu = 0.002, 0.5           # one iteration on the GPU (roofline), on this CPU (measured)
    bw = emulate.emulated_bandwidth(p, t_gpu, t_cpu)
    b = 4e6                             # a copy of B bytes: its share of an iteration must be the GPU's
    assert (b / bw) / t_cpu == pytest.approx((b / p.pcie) / t_gpu)


def test_the_gpu_iteration_is_its_achieved_roofline_plus_launches():
    import torch.fx as fx
    p = emulate.profile("a6000")
    g = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(8, 8))).graph
    op = next(n for n in g.nodes if n.op == "call_function" or n.op == "call_module")
    assert emulate.gpu_machine(p).peak_flops == p.flops * p.efficiency and op is not None
    # a graph without aten ops: every call costs the view latency, no launch is charged twice
    assert emulate.gpu_iteration_seconds(p, g) >= 0
    with pytest.raises(ValueError, match="unknown GPU profile 'a7000'; profiles are a6000"):
        emulate.profile("a7000")


def test_throttled_device_copies_no_faster_than_its_bandwidth():
    device = emulate.ThrottledCpuDevice(bandwidth=100e6)          # 100 MB/s
    src = torch.arange(2_000_000, dtype=torch.uint8)             # 2 MB: at least 20 ms each way
    t0 = time.perf_counter()
    host = device.copy_out(src, None)
    out_s = time.perf_counter() - t0
    dst = device.alloc(src.numel())
    t0 = time.perf_counter()
    device.copy_in(host, dst)
    in_s = time.perf_counter() - t0
    assert out_s >= 0.02 and in_s >= 0.02
    assert torch.equal(dst, src)


def test_emulated_latency_model_changes_only_the_copy_bandwidth():
    from dbml.scheduler.latency.estimate import RooflineModel
    base = RooflineModel()
    lm = emulate.EmulatedLatency(base, 1e6)
    assert lm.machine.copy_bandwidth == 1e6
    assert lm.machine.peak_flops == base.machine.peak_flops


@pytest.mark.slow
def test_quick_workloads_build_and_match_their_batches():
    for name in QUICK:
        w = workload(name)
        x, y = w.batch_tensors()
        out = w.model()(x)
        assert out.shape == (w.batch, 10) and y.shape == (w.batch,)
    assert set(WORKLOADS) >= {"vgg16", "resnet50", "densenet121", "inception_v3", "inception_v4", "transformer",
                              "mlp"}
    with pytest.raises(ValueError, match="--workloads: unknown workload 'resnet5'"):
        workload("resnet5")


@pytest.mark.slow
def test_quick_bench_runs_and_every_dbml_row_matches_eager_within_budget(tmp_path):
    # the sections this test reads; the inference and realmem sections' rows are tested where they
    # are made (tests/test_forward_memory.py, tests/test_bench_realmem.py): 48 s more here. The
    # peers but torch.compile: it is tested where it is made (tests/test_bench_peers.py), 17 s here
    from dbml.bench.harness import NOT_QUICK_METHODS
    from dbml.bench.single import ALL_METHODS
    methods = [m for m in ALL_METHODS if m not in NOT_QUICK_METHODS and m != "compile"]
    proc = subprocess.run([sys.executable, "-m", "dbml", "bench", "--quick", "--out", str(tmp_path),
                           "--sections", "single,coldstart,planning,concurrent,mixed,batch,fastpath",
                           "--methods", ",".join(methods)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [path] = tmp_path.glob("*.json")
    results = json.loads(path.read_text())
    assert {"date", "machine", "load_average", "rows", "threads", "command"} <= set(results)
    rows = results["rows"]
    for r in rows:
        if r["section"] in ("single", "batch", "concurrent", "mixed", "coldstart"):
            assert set(REQUIRED) <= set(r), (r["method"], set(REQUIRED) - set(r))
    single = [r for r in rows if r["section"] == "single"]
    assert {r["mode"] for r in single} == {"cpu", "emulated:a6000"}
    assert {r["workload"] for r in single} == set(QUICK)
    dbml_rows = [r for r in single + [r for r in rows if r["section"] == "batch"] if r["family"] == "dbml"]
    ran = [r for r in dbml_rows if r["error"] is None]
    assert ran, "no dbml row ran"
    for r in ran:
        assert r["bit_identical"] is True, r
        assert r["peak_bytes"] > 0 and r["seconds"] > 0
        # the budget is a limit: the tracker's peak within it in every row, the smallest
        # budgets included, no tolerance (issue 22)
        assert r["within_budget"] is True and (r["budget_bytes"] is None or r["peak_bytes"] <= r["budget_bytes"]), r
    # the budgets that could not be met say why
    for r in dbml_rows:
        if r["error"] is not None:
            assert "infeasible" in r["error"] or "unavailable" in r["error"].lower(), r
    assert any(r["section"] == "coldstart" for r in rows)
    assert any(r["section"] == "mixed" for r in rows)
    assert (tmp_path / path.name.replace(".json", ".md")).exists()


def test_the_inference_sections_dbml_row_runs_in_chunks_within_its_budget():
    """The inference section (left out of the quick run above): eager no_grad on every row against
    dbml's chunks within a budget of a quarter of eager's activations."""
    from dbml.bench import infer
    from dbml.bench.workloads import workload
    eager, chunked = infer.rows_for(workload("mlp"), iters=1)
    assert eager["method"] == "eager" and chunked["section"] == "inference" and chunked.get("error") is None
    assert chunked["within_budget"] is True and chunked["peak_bytes"] < eager["peak_bytes"]


def test_help_lists_workloads_and_methods():
    from dbml.bench import harness
    text = harness.parser().format_help()
    assert "inception_v4" in text and "dbml-tensile@35%" in text and "--emulate" in text
