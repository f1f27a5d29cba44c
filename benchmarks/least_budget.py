"""The planner's least feasible budget, as a share of the unscheduled peak, for machines
measured fast and slow (issue 33, round 8): it should not depend on how fast the roofline
happened to time its product.

Each workload's captured training step (``benchmarks/workloads.py``, Adam) is planned with
a preset roofline ``Machine`` (``--flops``, each; memory bandwidth 1.5e11 B/s) and the disk
tier's copy bandwidth (``--tier``, default 4e8 B/s, as the tests pin it), at a budget of one
byte: the planner's ``InfeasibleBudget.min_budget`` is then the least peak it reaches. The
planning seconds are printed beside it. Beside dbml's, the least budget where the step's
large weights are cut into the pieces that budget gives (``OptimizerSpec.within``, as
``runners.fit_pieces`` cuts a job's), captured again until the pieces cut no finer.

    python benchmarks/least_budget.py [--workloads mlp,transformer,vgg16] [--flops 3e11,3e10]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from benchmarks.workloads import workload  # noqa: E402
from dbml.scheduler.errors import InfeasibleBudget  # noqa: E402
from dbml.scheduler.graph.access import build_sequence  # noqa: E402
from dbml.scheduler.graph.graphs import GraphCache  # noqa: E402
from dbml.scheduler.graph.optim import OptimizerSpec  # noqa: E402
from dbml.scheduler.latency.estimate import Machine, RooflineModel  # noqa: E402
from dbml.scheduler.plan.planner import PAPER, PlanSettings, plan  # noqa: E402


def _least(seq, settings) -> int:
    try:
        return plan(seq, 1, settings=settings).peak_bytes
    except InfeasibleBudget as e:
        return e.min_budget


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="mlp,transformer,vgg16")
    p.add_argument("--flops", default="3e11,3e10", help="roofline flop/s to plan with, comma-separated")
    p.add_argument("--tier", type=float, default=4e8, help="the disk tier's bytes/s")
    args = p.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}; tier {args.tier:.0e} B/s")
    for name in args.workloads.split(","):
        w = workload(name)
        x, y = w.batch_tensors()
        captured = GraphCache(w.model(), torch.nn.functional.cross_entropy, OptimizerSpec("adam"), job=name).get(x, y)
        for flops in (float(f) for f in args.flops.split(",")):
            machine = RooflineModel(machine=Machine(flops, 1.5e11, 8.6e10, 1.9e-6))
            seq = build_sequence(captured, machine, name, copy_bandwidth=args.tier)
            vanilla = plan(seq, 1 << 42, policy="none").peak_bytes
            cells = []
            for label, settings in (("dbml", PlanSettings()), ("paper", PlanSettings(**PAPER))):
                t0 = time.perf_counter()
                least = _least(seq, settings)
                cells.append(f"{label} {least / vanilla:.3f} ({time.perf_counter() - t0:.1f} s)")
                if label == "dbml":
                    pieces, spec = least, OptimizerSpec("adam")
                    for _ in range(4):   # pieces cut to the budget reached, until they cut no finer
                        finer = spec.within(pieces)
                        if finer == spec:
                            break
                        spec = finer
                        cut = GraphCache(w.model(), torch.nn.functional.cross_entropy, spec, job=name).get(x, y)
                        pieces = min(pieces, _least(build_sequence(cut, machine, name, copy_bandwidth=args.tier),
                                                    settings))
                    cells.append(f"dbml, pieces cut to the budget {pieces / vanilla:.3f} "
                                 f"({spec.update_chunk_bytes >> 20} MiB)")
            print(f"{name:<12} {flops:.0e} flop/s  vanilla {vanilla / 1e6:7.1f} MB  " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
