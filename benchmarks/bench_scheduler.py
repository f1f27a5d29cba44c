"""Single-job scheduler benchmark on CPU: TENSILE's MSR / EOR / CBR against eager PyTorch.

Vanilla (V) is eager PyTorch, ``loss.backward(); optimizer.step()`` (scheduler.step.EagerStep):
its memory peak VMP is measured exactly with :class:`~dbml.scheduler.execute.measure.PeakMeter`
(every live storage: parameters, gradients, optimizer state, batch, activations), its
time VTC by the wall clock. The scheduled runs (E) report the executor's ledger (the
CPU "device memory", see scheduler/execute/devices.py) as EMP and the wall clock as ETC.

    MSR = (VMP - EMP) / VMP      EOR = ETC / VTC      CBR = MSR / EOR

Budgets are fractions of VMP (75 %, 50 %) and the smallest budget the planner can meet.
Also reported: the interpreter overhead of policy ``none`` (no scheduling, release after
last use) against eager, and the tensor-granularity floor (the largest set of tensors a
single op needs at once: no tensor-level scheduler can go below it).

All configurations run interleaved, iteration by iteration, so that load from other
processes affects them alike; times are medians.

    python benchmarks/bench_scheduler.py [--iters 10] [--threads 1] [--batch 16]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch

from dbml.scheduler.graph.access import build_sequence
from dbml.scheduler.graph.capture import capture
from dbml.scheduler.latency.estimate import RooflineModel
from dbml.scheduler.execute.measure import PeakMeter, live_tensors
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.plan.planner import InfeasibleBudget, tensor_granularity_floor
from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.execute.step import EagerStep

loss_fn = torch.nn.functional.cross_entropy


def mlp() -> torch.nn.Module:
    layers = [torch.nn.Linear(784, 1024), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(1024, 10))


class Block(torch.nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.c2, self.b2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


def resnet() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1, bias=False), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        Block(32), Block(32), torch.nn.MaxPool2d(2), Block(32), Block(32),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))


WORKLOADS = {"MLP": (mlp, (784,)), "ResNet": (resnet, (3, 32, 32))}


def make_batch(batch: int, shape, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *shape, generator=g), torch.randint(0, 10, (batch,), generator=g)


def eager_peak(model, spec, x, y) -> int:
    step = EagerStep(model, loss_fn, spec)
    for _ in range(3):   # optimizer state exists; past EagerStep's own measured steps
        step.step(x, y)
    # the list of base tensors is a temporary: the meter keeps weak references only
    with PeakMeter(live_tensors(model, step.optimizer, x, y)) as meter:
        step.step(x, y)
    return meter.peak_bytes


def smallest_budget(model_fn, spec, x, y) -> int:
    try:
        ScheduledStep(model_fn(), loss_fn, spec, budget_bytes=1).step(x, y)
    except InfeasibleBudget as e:
        return e.min_budget
    return 1


def timed_rounds(runners: dict, x, y, iters: int, warmup: int = 3):
    """Median wall seconds and main-thread CPU seconds per iteration of each runner,
    run interleaved (CPU time is robust to other processes' load; it leaves out the copy
    thread, so it is the measure of interpreter overhead, not of swapping)."""
    for _ in range(warmup):
        for r in runners.values():
            r.step(x, y)
    wall: dict[str, list[float]] = {k: [] for k in runners}
    cpu: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(iters):
        for k, r in runners.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            r.step(x, y)
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.thread_time() - c0)
    return ({k: statistics.median(v) for k, v in wall.items()},
            {k: statistics.median(v) for k, v in cpu.items()})


def bench_workload(name: str, batch: int, iters: int) -> list[dict]:
    model_fn, shape = WORKLOADS[name]
    spec = OptimizerSpec("adam", lr=1e-3)
    x, y = make_batch(batch, shape)
    torch.manual_seed(0)
    model = model_fn()
    vmp = eager_peak(copy.deepcopy(model), spec, x, y)
    seq = build_sequence(capture(copy.deepcopy(model), loss_fn, spec, (x, y)), RooflineModel())
    floor = tensor_granularity_floor(seq)
    min_budget = smallest_budget(lambda: copy.deepcopy(model), spec, x, y)

    runners = {"eager": EagerStep(copy.deepcopy(model), loss_fn, spec),
               "none": ScheduledStep(copy.deepcopy(model), loss_fn, spec, policy="none")}
    budgets = {"75%": int(0.75 * vmp), "50%": int(0.5 * vmp), "min": min_budget}
    skipped = {}
    for label, budget in budgets.items():
        if budget < min_budget:
            skipped[label] = budget
            continue
        runners[label] = ScheduledStep(copy.deepcopy(model), loss_fn, spec, budget_bytes=budget)
    times, cpu = timed_rounds(runners, x, y, iters)
    vtc = times["eager"]
    rows = [dict(workload=name, config="eager", budget=None, peak=vmp, time=vtc, msr=0.0, eor=1.0,
                 cbr=None, swaps=0, recomputes=0, passive=0.0, plan_s=0.0, floor=floor,
                 cpu=cpu["eager"])]
    for label, r in runners.items():
        if label == "eager":
            continue
        st = r.stats()
        emp = st["measured_peak_bytes"]
        msr, eor = (vmp - emp) / vmp, times[label] / vtc
        rows.append(dict(workload=name, config=label, budget=budgets.get(label), peak=emp,
                         planned=st["planned_peak_bytes"], time=times[label], msr=msr, eor=eor,
                         cbr=msr / eor if label != "none" else None,
                         swaps=st["swaps"] // max(st["iterations"], 1),
                         recomputes=st["recomputes"] // max(st["iterations"], 1),
                         passive=(st["passive_swaps"] + st["late_swap_ins"]) / max(st["iterations"], 1),
                         plan_s=st["plan_seconds"],
                         floor=floor, cpu=cpu[label]))
        r.close()
    for label, budget in skipped.items():
        rows.append(dict(workload=name, config=label, budget=budget, infeasible=min_budget, floor=floor))
    return rows


def _mb(n) -> str:
    return "-" if n is None else f"{n / 2**20:7.2f}"


def print_table(rows: list[dict]) -> None:
    head = (f"{'workload':8} {'config':6} {'budget MB':>9} {'peak MB':>8} {'plan MB':>8} {'ms/iter':>8} "
            f"{'MSR':>6} {'EOR':>6} {'CBR':>6} {'swaps':>5} {'recomp':>6} {'late':>4} {'plan s':>6}")
    print("(swaps, recomp, late: per iteration; late = swap-ins compute had to wait for, or make itself)")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "infeasible" in r:
            print(f"{r['workload']:8} {r['config']:6} {_mb(r['budget']):>9}   infeasible: smallest feasible "
                  f"budget {_mb(r['infeasible']).strip()} MB")
            continue
        cbr = "-" if r["cbr"] is None else f"{r['cbr']:.3f}"
        print(f"{r['workload']:8} {r['config']:6} {_mb(r['budget']):>9} {_mb(r['peak']):>8} "
              f"{_mb(r.get('planned')):>8} {1e3 * r['time']:8.2f} {r['msr']:6.3f} {r['eor']:6.3f} {cbr:>6} "
              f"{r['swaps']:5d} {r['recomputes']:6d} {r['passive']:4.1f} {r['plan_s']:6.2f}")
    for name in dict.fromkeys(r["workload"] for r in rows):
        rs = [r for r in rows if r["workload"] == name]
        eager = next(r for r in rs if r["config"] == "eager")
        none = next((r for r in rs if r["config"] == "none"), None)
        line = f"{name}: tensor-granularity floor {_mb(eager['floor']).strip()} MB " \
               f"({eager['floor'] / eager['peak']:.1%} of VMP)"
        if none:
            line += (f"; interpreter overhead (policy none / eager): wall {none['eor']:.3f}x, "
                     f"main-thread CPU {none['cpu'] / eager['cpu']:.3f}x")
        print(line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.workloads.split(","):
        rows += bench_workload(name, args.batch, args.iters)
    print(f"single job, CPU, batch {args.batch}, Adam, {args.threads} thread(s), "
          f"median of {args.iters} interleaved iterations; V = eager PyTorch")
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
