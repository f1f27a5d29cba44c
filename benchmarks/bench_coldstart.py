"""Cold start and plan updating on CPU: TENSILE against the passive-mode peer (Capuchin).

1. First-iteration EOR at a budget of 50 % of the unscheduled (eager) peak, or the
   smallest feasible budget where 50 % is infeasible (printed). TENSILE plans before
   the first iteration from latency estimates (the predictor when
   ``load_predictor("cpu")`` returns one, else the roofline model: printed); Capuchin
   (``policy="capuchin"``) runs its first iteration with no plan, evicting on demand.
   The first iteration is timed once the runner is prepared (``ScheduledStep.prepare``:
   graph captured, latencies estimated, executor built, and for TENSILE the plan made,
   all before the first batch, as dbml does while DuckDB reads the rows) and divided by
   eager's steady-state iteration time. "incl. setup" adds the preparation after the
   capture (latency estimates, executor, TENSILE's planning), "incl. capture" the
   capture too. Paper: TENSILE 1.25-1.47, Capuchin 5.8-10.2 (GPU).
2. Whole-run EOR of TENSILE with plan updating (defaults: beta 0.9, threshold 0.3),
   with it and the copy-bandwidth correction (``UpdateSettings(copy_bandwidth=True)``),
   and without, over ``--iters`` iterations from a cold start (planning and replans
   included), against eager over the same iterations; Capuchin alongside. "steady EOR"
   is the median iteration after the first.

EOR = time / eager time. The machine is shared and noisy: configurations run
interleaved, cold starts are repeated ``--repeats`` times, figures are medians, and the
load average is printed before and after.

    python benchmarks/bench_coldstart.py [--iters 30] [--repeats 5] [--threads 1] [--batch 16]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_scheduler import WORKLOADS, eager_peak, make_batch  # noqa: E402

from dbml.scheduler.latency.estimate import RooflineModel  # noqa: E402
from dbml.scheduler.graph.optim import OptimizerSpec  # noqa: E402
from dbml.scheduler.plan.planner import InfeasibleBudget  # noqa: E402
from dbml.scheduler.latency.predictor import load_predictor  # noqa: E402
from dbml.scheduler.execute.runner import ScheduledStep  # noqa: E402
from dbml.scheduler.execute.step import EagerStep  # noqa: E402
from dbml.scheduler.execute.updating import UpdateSettings  # noqa: E402

loss_fn = torch.nn.functional.cross_entropy


def latency_model():
    predictor = load_predictor("cpu")
    if predictor is not None:
        return predictor, "predictor (load_predictor('cpu'))"
    return RooflineModel(), "roofline estimator (no predictor installed for cpu)"


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def choose_budget(model, spec, x, y, lm) -> tuple[int, str, int]:
    """50% of the eager peak, or the smallest budget TENSILE can plan with ``lm``'s latencies."""
    vmp = eager_peak(copy.deepcopy(model), spec, x, y)
    try:
        ScheduledStep(copy.deepcopy(model), loss_fn, spec, budget_bytes=1, latency_model=lm).prepare(x, y)
        floor = 1
    except InfeasibleBudget as e:
        floor = e.min_budget
    half = vmp // 2
    if half >= floor:
        return half, "50% of the eager peak", vmp
    return floor, f"smallest feasible ({floor / vmp:.0%} of the eager peak; 50% is infeasible)", vmp


def cold_starts(model, spec, x, y, budget, lm, repeats: int) -> dict[str, list[float]]:
    """Per repeat, interleaved: eager steady state, and each method's first iteration
    (graph captured beforehand) and its capture time."""
    out: dict[str, list[float]] = {k: [] for k in ("eager", "eager_first", "tensile", "capuchin", "capture")}
    for _ in range(repeats):
        eager = EagerStep(copy.deepcopy(model), loss_fn, spec, measured_steps=0)   # no peak meter
        out["eager_first"].append(timed(lambda: eager.step(x, y)))
        eager.step(x, y)
        out["eager"].append(statistics.median(timed(lambda: eager.step(x, y)) for _ in range(3)))
        for policy in ("tensile", "capuchin"):
            r = ScheduledStep(copy.deepcopy(model), loss_fn, spec, policy=policy, budget_bytes=budget,
                              latency_model=lm)
            out["capture"].append(timed(lambda: r.graphs.get(x, y)))
            out.setdefault(f"{policy}_setup", []).append(timed(lambda: r.prepare(x, y)))
            out[policy].append(timed(lambda: r.step(x, y)))
            if policy == "capuchin":
                out.setdefault("passive", []).append(r.stats()["passive_swaps"])
            else:
                out.setdefault("plan_s", []).append(r.stats()["plan_seconds"])
            r.close()
    return out


def whole_runs(model, spec, x, y, budget, lm, iters: int, repeats: int) -> dict:
    """Whole runs from a cold start (capture excluded), interleaved iteration by iteration."""
    res: dict[str, list] = {}
    for _ in range(repeats):
        runners = {
            "eager": EagerStep(copy.deepcopy(model), loss_fn, spec, measured_steps=0),
            "tensile+update": ScheduledStep(copy.deepcopy(model), loss_fn, spec, budget_bytes=budget,
                                            latency_model=lm),
            "tensile+update+bw": ScheduledStep(copy.deepcopy(model), loss_fn, spec, budget_bytes=budget,
                                               latency_model=lm, update=UpdateSettings(copy_bandwidth=True)),
            "tensile": ScheduledStep(copy.deepcopy(model), loss_fn, spec, budget_bytes=budget,
                                     latency_model=lm, update=UpdateSettings(enabled=False)),
            "capuchin": ScheduledStep(copy.deepcopy(model), loss_fn, spec, policy="capuchin",
                                      budget_bytes=budget, latency_model=lm),
        }
        for r in runners.values():
            if isinstance(r, ScheduledStep):
                r.graphs.get(x, y)
        times: dict[str, list[float]] = {k: [] for k in runners}
        for _ in range(iters):
            for k, r in runners.items():
                times[k].append(timed(lambda: r.step(x, y)))
        total_e, med_e = sum(times["eager"]), statistics.median(times["eager"][1:])
        for k, r in runners.items():
            row = res.setdefault(k, {"whole": [], "steady": [], "replans": [], "peak": []})
            row["whole"].append(sum(times[k]) / total_e)
            row["steady"].append(statistics.median(times[k][1:]) / med_e)
            if isinstance(r, ScheduledStep):
                st = r.stats()
                row["replans"].append(st["replans"])
                row["peak"].append(st["measured_peak_bytes"])
                r.close()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--whole-repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm, lm_name = latency_model()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; "
          f"{os.cpu_count()} cores; torch threads {args.threads}; latency model: {lm_name}")
    med = statistics.median
    for name in args.workloads.split(","):
        model_fn, shape = WORKLOADS[name]
        spec = OptimizerSpec("adam", lr=1e-3)
        x, y = make_batch(args.batch, shape)
        torch.manual_seed(0)
        model = model_fn()
        budget, how, vmp = choose_budget(model, spec, x, y, lm)
        print(f"\n{name}, batch {args.batch}, adam: eager peak {vmp / 1e6:.2f} MB, "
              f"budget {budget / 1e6:.2f} MB = {how}")
        cs = cold_starts(model, spec, x, y, budget, lm, args.repeats)
        e = med(cs["eager"])
        e1 = med(cs["eager_first"])
        print(f"  first-iteration EOR (median of {args.repeats}; eager: steady state {e * 1e3:.1f} ms, "
              f"own first iteration {e1 * 1e3:.1f} ms):")
        print(f"    {'':9} {'vs steady':>9} {'vs first':>8} {'incl. setup':>11} {'incl. capture':>13}")
        for k, label, extra in (("tensile", "TENSILE", f"planning {med(cs['plan_s']) * 1e3:.0f} ms"),
                                ("capuchin", "Capuchin", f"{med(cs['passive']):.0f} passive swaps")):
            t, setup = med(cs[k]), med(cs[f"{k}_setup"])
            print(f"    {label:9} {t / e:9.2f} {t / e1:8.2f} {(t + setup) / e:11.2f} "
                  f"{(t + setup + med(cs['capture'])) / e:13.2f}  ({extra}; setup {setup * 1e3:.0f} ms)")
        wr = whole_runs(model, spec, x, y, budget, lm, args.iters, args.whole_repeats)
        print(f"  whole run, {args.iters} iterations from a cold start (median of {args.whole_repeats}):")
        print(f"    {'config':17} {'whole EOR':>9} {'steady EOR':>10} {'replans':>7} {'peak MB':>8}")
        for k, row in wr.items():
            reps = f"{med(row['replans']):7.0f}" if row["replans"] else f"{'-':>7}"
            peak = f"{max(row['peak']) / 1e6:8.2f}" if row["peak"] else f"{'-':>8}"
            print(f"    {k:17} {med(row['whole']):9.2f} {med(row['steady']):10.2f} {reps} {peak}")
    print(f"\nload average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
