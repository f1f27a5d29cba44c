"""Concurrent jobs under one shared scheduler on CPU (TENSILE Table IV): global peak and time.

Workloads: 1, 2, 3 and 4 concurrent jobs of the same model, all launched at once; and a
mix of models of different shapes and sizes launched one by one at random (seeded)
times. Every job trains ``--iters`` iterations with Adam. Per workload, three runs with
the same launch times, interleaved over ``--repeats`` rounds (the machine is shared and
noisy; times are medians):

* ``eager``     every job eager PyTorch on its own thread, unscheduled (the paper's V);
* ``sequential`` the same jobs eager, one after another;
* ``tensile``   every job a ScheduledStep on its own thread, all planned jointly by one
  MemoryScheduler within a budget of ``--budget`` times the sum of the jobs' vanilla
  peaks, joining and leaving as they start and finish (admission, hand-over, replans).
  Jobs of the same model share one captured graph (``share_graphs``), as dbml's jobs
  of one model configuration do, and each model is captured once before the timed
  rounds (by the unscheduled run below; it takes 1-3 s per model, paid once per
  process and model: the warm-up column); drift replans take at most 5% of a job's time
  (``UpdateSettings.max_plan_share``, as dbml sets it).

Memory: the vanilla peak of each job is eager PyTorch's, measured exactly
(PeakMeter); their sum is the paper's vanilla global peak. TENSILE's global peak is
*measured*: the device ledger every job's executors report each allocation and free to
(scheduler/execute/measure.py DeviceLedger), the most all jobs held at one moment. Also measured,
for context: the unscheduled jobs' global peak on the same ledger (policy ``none``
ScheduledSteps run concurrently), which is below the sum where peaks do not coincide.

    MSR = (sum of vanilla peaks - global peak) / sum of vanilla peaks
    EOR = TENSILE's total time / eager's total time (concurrent; and vs sequential)
    CBR = MSR / EOR

Paper, mixed workload (GPU): MSR 0.157 at EOR 1.159 (CBR 0.135).

    python benchmarks/bench_concurrent.py [--iters 20] [--repeats 3] [--budget 0.6] [--seed 0]
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_scheduler import eager_peak, make_batch, mlp, resnet  # noqa: E402

from dbml.scheduler.latency.estimate import RooflineModel  # noqa: E402
from dbml.scheduler.multijob.ledger import DeviceLedger  # noqa: E402
from dbml.scheduler.graph.optim import OptimizerSpec  # noqa: E402
from dbml.scheduler.plan.planner import InfeasibleBudget, PlanSettings  # noqa: E402
from dbml.scheduler.latency.predictor import load_predictor  # noqa: E402
from dbml.scheduler.execute.runner import ScheduledStep  # noqa: E402
from dbml.scheduler.multijob.scheduler import MemoryScheduler  # noqa: E402
from dbml.scheduler.execute.step import EagerStep  # noqa: E402
from dbml.scheduler.execute.updating import UpdateSettings  # noqa: E402
from dbml.core.runners import MAX_PLAN_SHARE  # noqa: E402
from dbml.bench.multi import run_threads  # noqa: E402

loss_fn = torch.nn.functional.cross_entropy
SPEC = OptimizerSpec("adam", lr=1e-3)


def small_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 8 * 8, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def deep_mlp() -> torch.nn.Module:
    layers = [torch.nn.Linear(256, 512), torch.nn.ReLU()]
    for _ in range(7):
        layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(512, 10))


# name: (model, input shape, batch)
MODELS = {"ResNet": (resnet, (3, 32, 32), 16), "MLP": (mlp, (784,), 16),
          "CNN": (small_cnn, (3, 32, 32), 32), "DeepMLP": (deep_mlp, (256,), 64)}
SAME = "ResNet"
MIX = ("ResNet", "MLP", "CNN", "DeepMLP", "ResNet", "CNN")


class Job:
    def __init__(self, name: str, kind: str, start: float, iters: int, seed: int):
        model_fn, shape, batch = MODELS[kind]
        torch.manual_seed(seed)
        self.name, self.kind, self.start, self.iters = name, kind, start, iters
        self.model = model_fn()
        self.x, self.y = make_batch(batch, shape, seed)
        self.vanilla = eager_peak(copy.deepcopy(self.model), SPEC, self.x, self.y)


def eager_concurrent(jobs: list[Job]) -> float:
    return run_threads(jobs, lambda j: EagerStep(copy.deepcopy(j.model), loss_fn, SPEC, measured_steps=0))


def eager_sequential(jobs: list[Job]) -> float:
    total = 0.0
    for j in jobs:   # launch times do not apply: one after another
        runner = EagerStep(copy.deepcopy(j.model), loss_fn, SPEC, measured_steps=0)
        t0 = time.perf_counter()
        for _ in range(j.iters):
            runner.step(j.x, j.y)
        total += time.perf_counter() - t0
    return total


def unscheduled_global_peak(jobs: list[Job]) -> int:
    ledger = DeviceLedger()

    def make(j):
        return ScheduledStep(copy.deepcopy(j.model), loss_fn, SPEC, policy="none", job=j.name, ledger=ledger,
                             share_graphs=j.kind)

    run_threads(jobs, make, after=lambda j, r: r.close())
    return ledger.peak_bytes


def tensile_concurrent(jobs: list[Job], budget: int, lm, margin: float = 0.0) -> tuple[float, dict]:
    ms = MemoryScheduler(budget, PlanSettings(swap_in_margin=margin))
    stats: dict[str, dict] = {}

    def make(j):
        return ScheduledStep(copy.deepcopy(j.model), loss_fn, SPEC, job=j.name, latency_model=lm,
                             planner=ms.planner_for(j.name, wait=True), share_graphs=j.kind,
                             update=UpdateSettings(max_plan_share=MAX_PLAN_SHARE))

    def after(j, r):
        stats[j.name] = r.stats()
        r.close()
        ms.unregister(j.name)

    first: list[float] = []
    seconds = run_threads(jobs, make, after, first)
    snap = ms.snapshot()
    return seconds, {"peak": ms.ledger.peak_bytes, "reserved": ms.ledger.reserved_peak_bytes,
                     "swaps": sum(s["swaps"] for s in stats.values()),
                     "recomputes": sum(s["recomputes"] for s in stats.values()),
                     "late": sum(s["late_swap_ins"] + s["passive_swaps"] for s in stats.values()),
                     "replans": snap["replans"], "plan_s": snap["plan_seconds"],
                     "first_s": statistics.mean(first), "budget_waits": sum(s["budget_waits"] for s in stats.values())}


def workloads(iters: int, seed: int, spread: float) -> dict[str, list[Job]]:
    out = {f"{n} x {SAME}": [Job(f"{SAME.lower()}{i}", SAME, 0.0, iters, seed + i) for i in range(n)]
           for n in (1, 2, 3, 4)}
    rng = random.Random(seed)
    starts = sorted(rng.uniform(0, spread) for _ in MIX)
    out["mixed"] = [Job(f"{kind.lower()}{i}", kind, starts[i], iters, seed + 10 + i) for i, kind in enumerate(MIX)]
    return out


def bench(jobs: list[Job], fraction: float, repeats: int, lm, margin: float = 0.0) -> dict:
    vanilla = sum(j.vanilla for j in jobs)
    budget = int(fraction * vanilla)
    t0 = time.perf_counter()
    unscheduled = unscheduled_global_peak(jobs)   # also captures each model once (shared)
    warmup = time.perf_counter() - t0
    times: dict[str, list[float]] = {"eager": [], "sequential": [], "tensile": []}
    runs, note = [], ""
    for _ in range(repeats):   # interleaved, so load from elsewhere affects all alike
        times["eager"].append(eager_concurrent(jobs))
        times["sequential"].append(eager_sequential(jobs))
        try:
            seconds, st = tensile_concurrent(jobs, budget, lm, margin)
        except InfeasibleBudget as e:   # a job cannot fit even alone: the smallest budget it can
            budget, note = int(e.min_budget * 1.01), f"budget raised to 1.01 x the smallest feasible, {e}"
            seconds, st = tensile_concurrent(jobs, budget, lm, margin)
        times["tensile"].append(seconds)
        runs.append(st)
    med = {k: statistics.median(v) for k, v in times.items()}
    peak = max(r["peak"] for r in runs)
    msr = (vanilla - peak) / vanilla
    eor = med["tensile"] / med["eager"]
    return {"jobs": len(jobs), "vanilla": vanilla, "budget": budget, "unscheduled": unscheduled, "warmup": warmup,
            "peak": peak, "reserved": max(r["reserved"] for r in runs), "msr": msr, "eor": eor,
            "eor_seq": med["tensile"] / med["sequential"], "cbr": msr / eor, "times": med,
            "swaps": statistics.median(r["swaps"] for r in runs), "late": statistics.median(r["late"] for r in runs),
            "replans": statistics.median(r["replans"] for r in runs),
            "plan_s": statistics.median(r["plan_s"] for r in runs),
            "first_s": statistics.median(r["first_s"] for r in runs), "note": note}


def _mb(n: int) -> str:
    return f"{n / 2**20:8.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.6, help="fraction of the sum of the jobs' vanilla peaks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spread", type=float, default=2.0, help="mixed workload: launch times within this many s")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated workload names (e.g. 'mixed')")
    ap.add_argument("--margin", type=float, default=0.0,
                    help="PlanSettings.swap_in_margin, seconds (the paper's: 0)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    predictor = load_predictor("cpu")
    lm, how = (predictor, "predictor") if predictor is not None else (RooflineModel(), "roofline (no predictor)")
    load0 = os.getloadavg()[0]
    rows = {}
    for name, jobs in workloads(args.iters, args.seed, args.spread).items():
        if args.only and name not in args.only.split(","):
            continue
        rows[name] = bench(jobs, args.budget, args.repeats, lm, args.margin)
        r = rows[name]
        print(f"{name}: done ({r['times']['tensile']:.1f} s tensile)", file=sys.stderr)
    print(f"CPU, Adam, {args.iters} iterations per job, {args.threads} thread(s), median of {args.repeats} "
          f"interleaved rounds; budget {args.budget:.0%} of the sum of vanilla peaks; latencies: {how}; "
          f"swap-in margin {args.margin * 1e3:g} ms; "
          f"load average {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    mix = ", ".join(f"{j.kind}@{j.start:.2f}s" for j in workloads(1, args.seed, args.spread)["mixed"])
    print(f"mixed: {mix}")
    head = (f"{'workload':12} {'jobs':>4} {'sum V MB':>8} {'unsch MB':>8} {'budget':>8} {'peak MB':>8} "
            f"{'MSR':>6} {'eager s':>7} {'seq s':>7} {'tensile':>7} {'EOR':>6} {'EOR/seq':>7} {'CBR':>6} "
            f"{'swaps':>6} {'late':>5} {'replans':>7} {'plan s':>6} {'1st s':>6} {'warmup':>6}")
    print(head)
    print("-" * len(head))
    for name, r in rows.items():
        t = r["times"]
        print(f"{name:12} {r['jobs']:4d} {_mb(r['vanilla'])} {_mb(r['unscheduled'])} {_mb(r['budget'])} "
              f"{_mb(r['peak'])} {r['msr']:6.3f} {t['eager']:7.2f} {t['sequential']:7.2f} {t['tensile']:7.2f} "
              f"{r['eor']:6.3f} {r['eor_seq']:7.3f} {r['cbr']:6.3f} {r['swaps']:6.0f} {r['late']:5.0f} "
              f"{r['replans']:7.0f} {r['plan_s']:6.2f} {r['first_s']:6.2f} {r['warmup']:6.2f}")
        assert r["peak"] <= r["budget"], f"{name}: measured global peak {r['peak']} over the budget {r['budget']}"
        if r["note"]:
            print(f"  {name}: {r['note']}")
    print("unsch = the unscheduled jobs' measured global peak (same ledger); peak = TENSILE's measured "
          "global peak (always <= budget); swaps and late swap-ins summed over jobs and iterations; "
          "plan s = joint planning seconds; 1st s = a job's mean first iteration (graph capture, "
          "admission and hand-over waits, planning)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
