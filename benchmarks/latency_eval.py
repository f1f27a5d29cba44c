"""Held-out evaluation of the latency models: whole-iteration estimates on architectures
calibration never saw.

    python -m dbml.bench.latency_eval                      # quick and full calibration
    python -m dbml.bench.latency_eval --plans quick        # quick only (~30 s per family)
    python -m dbml.bench.latency_eval --workloads vgg16,mlp --threads 1

For each of the benchmark's workloads (:mod:`.workloads`: the zoo's networks at the
benchmark's sizes, batch 16, Adam), the whole iteration is measured as a job runs it
(``ScheduledStep``, no budget: the median of ``iterations`` steps after a warm-up), and
predicted as the planner sees it: the sum of the latency model's per-node estimates over
the captured step, at the device utilisation read just before the measurement. Models:

* ``roofline``: the runtime's roofline estimator (no calibration);
* ``predictor``: calibrated (quick and/or full plan) WITHOUT the workload's architecture
  family: its zoo networks are left out of calibration (``dbml.core.latency.ZOO_FAMILIES``;
  VGG, ResNet, DenseNet, Inception v3+v4, transformer, MLP), so every figure is on a
  held-out architecture. One calibration per family and plan serves its workloads.
* ``predictor-synthetic`` (``--synthetic``, quick plan): calibrated on the synthetic
  models alone, as before the zoo's networks were added (no iteration scale): the
  figures to compare with (one calibration serves every workload).

Each row: predicted and measured seconds, their ratio, the ratio before the iteration
scale, the op kinds that fell back to the roofline, and whether the ratio is within the
issue's goal (±20 %, quick calibration ±35 %). :func:`run` returns the rows (the bench
harness's section); ``main`` prints them and writes ``benchmarks/out/latency_eval.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from collections import Counter
from pathlib import Path

import torch

from dbml.core.latency import calibration_work, family_of
from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.latency.calibrate import calibrate
from dbml.scheduler.latency.estimate import RooflineModel
from dbml.scheduler.latency.iteration import predicted_step_seconds
from dbml.scheduler.latency.utilisation import device_utilisation

from .workloads import WORKLOADS

__all__ = ["run", "measure", "GOALS", "main"]

GOALS = {"full": 0.20, "quick": 0.35}     # |predicted / measured - 1| at most
SPEC = OptimizerSpec("adam", lr=1e-3)
OUT = Path(__file__).resolve().parent / "out" / "latency_eval.json"


def measure(name: str, iterations: int = 3, device: str = "cpu") -> dict:
    """The workload's captured step, its measured iteration (median seconds of
    ``iterations`` steps after one warm-up), the utilisation before them, and the
    roofline's estimate."""
    w = WORKLOADS[name]
    x, y = w.batch_tensors()
    runner = ScheduledStep(copy.deepcopy(w.model()), torch.nn.functional.cross_entropy, SPEC, policy="none",
                           device=device, job=f"latency_eval {name}")
    try:
        t0 = time.perf_counter()
        captured = runner.graphs.get(x, y)
        capture_s = time.perf_counter() - t0
        runner.step(x, y)
        util = device_utilisation(device)
        times = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            runner.step(x, y)
            times.append(time.perf_counter() - t0)
    finally:
        runner.close()
    return {"workload": name, "family": family_of(w.arch), "graph": captured.gm, "util": util,
            "measured_s": statistics.median(times), "times": times, "capture_s": capture_s,
            "roofline_s": predicted_step_seconds(RooflineModel(device=device).predict, captured.gm)}


def _row(m: dict, model: str, plan: str, predicted: float, unscaled: float, fallbacks: Counter,
         extra: dict | None = None) -> dict:
    ratio = predicted / m["measured_s"]
    goal = GOALS.get(plan)
    return {"workload": m["workload"], "family": m["family"], "latency_model": model, "calibration": plan,
            "held_out": m["family"] if model.startswith("predictor") else None,
            "predicted_s": predicted, "measured_s": m["measured_s"], "ratio": ratio,
            "unscaled_ratio": unscaled / m["measured_s"], "fallback_kinds": dict(fallbacks),
            "times_s": m["times"], "util": m["util"],
            "within_goal": None if goal is None else abs(ratio - 1) <= goal, **(extra or {})}


def _predictor_rows(measured: list[dict], plan: str, device: str, synthetic: bool, progress) -> list[dict]:
    """Calibrate once per family of ``measured`` without it (``synthetic``: once, on the
    synthetic models alone, which hold no family); predict its workloads."""
    rows = []
    groups = [None] if synthetic else sorted({m["family"] for m in measured})
    for family in groups:
        t0 = time.perf_counter()
        work = None if synthetic else calibration_work(device, plan == "quick", exclude=(family,))
        predictor = calibrate(device, quick=plan == "quick", save=False, work=work)
        seconds = time.perf_counter() - t0
        for m in (m for m in measured if synthetic or m["family"] == family):
            predictor.utilisation = m["util"]
            predictor.fallbacks.clear()
            predicted = predicted_step_seconds(predictor.predict, m["graph"])
            unscaled = predicted_step_seconds(predictor.predict_op, m["graph"])
            rows.append(_row(m, "predictor-synthetic" if synthetic else "predictor", plan, predicted, unscaled,
                             Counter(predictor.fallbacks), {"iteration_scale": predictor.iteration_scale,
                                                            "node_overhead_s": predictor.node_overhead,
                                                            "calibration_s": seconds}))
        progress(format_rows([r for r in rows if r["held_out"] == family or synthetic]))
    return rows


def run(workloads: tuple[str, ...] = tuple(WORKLOADS), plans: tuple[str, ...] = ("quick", "full"),
        iterations: int = 3, device: str = "cpu", synthetic: bool = False, progress=print) -> list[dict]:
    """Rows of predicted against measured whole-iteration seconds (see the module
    docstring): roofline, then the predictor per plan calibrated without each family
    (and, with ``synthetic``, on the synthetic models alone). ``progress`` gets a line
    per measurement and the rows of each plan as they are done."""
    measured = []
    for name in workloads:
        measured.append(measure(name, iterations, device))
        progress(f"measured {name}: {measured[-1]['measured_s']:.3f} s/iteration")
    rows = [_row(m, "roofline", "-", m["roofline_s"], m["roofline_s"], Counter()) for m in measured]
    progress(format_rows(rows))
    for plan in plans:
        for alone in (False, True) if synthetic and plan == "quick" else (False,):
            rows += _predictor_rows(measured, plan, device, alone, progress)
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'workload':13} {'model':20} {'calib':5} {'predicted':>9} {'measured':>9} {'ratio':>6} "
             f"{'unscaled':>8} {'goal':>4}  fallbacks"]
    for r in rows:
        goal = {None: "", True: "ok", False: "miss"}[r["within_goal"]]
        lines.append(f"{r['workload']:13} {r['latency_model']:20} {r['calibration']:5} {r['predicted_s']:9.3f} "
                     f"{r['measured_s']:9.3f} {r['ratio']:6.2f} {r['unscaled_ratio']:8.2f} {goal:>4}  "
                     f"{', '.join(k.removeprefix('aten.') for k in sorted(r['fallback_kinds'])) or '-'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated (default: all)")
    p.add_argument("--plans", default="quick,full", help="calibration plans: quick, full or both")
    p.add_argument("--iterations", type=int, default=5, help="timed iterations per workload (median)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="PyTorch threads (default: all cores)")
    p.add_argument("--synthetic", action="store_true", help="also calibrate on the synthetic models alone")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    t0 = time.perf_counter()
    rows = run(tuple(args.workloads.split(",")), tuple(args.plans.split(",")), args.iterations,
               synthetic=args.synthetic)
    print(format_rows(rows))
    print(f"threads {args.threads}, load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after, "
          f"{time.perf_counter() - t0:.0f} s")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"rows": rows, "threads": args.threads, "load_average": [load, os.getloadavg()]},
                              indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
