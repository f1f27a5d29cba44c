"""Planning time of TENSILE Algorithm 3 on synthetic training-shaped access sequences.

    python benchmarks/bench_planning.py            # ResNet-50 and Inception-V4 sizes
    python benchmarks/bench_planning.py --quick    # small sizes, for a smoke run

The sequences (dbml.scheduler.synthetic, shared with the planner's tests) mimic a
captured training step: a forward pass of conv/bn/relu blocks (with residual adds), the
loss, a backward pass that reads the saved activations and parameters in reverse, and an
Adam update per parameter. Sizes and latencies are drawn from a seeded RNG.
"""

from __future__ import annotations

import argparse
import time

from dbml.scheduler.graph.sequence import EventKind
from dbml.scheduler.plan.planner import InfeasibleBudget, PlanSettings, plan
from dbml.scheduler.synthetic import training_sequence


def bench(name: str, n_ops: int, fractions=(0.75, 0.5), bandwidth: float = 12e9,
          settings: PlanSettings | None = None, label: str = "") -> list[dict]:
    """Plan one synthetic sequence at each budget fraction; print and return the figures."""
    seq = training_sequence(name, n_ops, seed=1, bandwidth=bandwidth)
    vanilla = plan(seq, 1 << 62, policy="none").peak_bytes
    rows = []
    for f in fractions:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            p = plan(seq, int(f * vanilla), settings=settings)
            outcome = (f"peak {p.peak_bytes / 2**20:8.1f} MB, {p.count(EventKind.SWAP_OUT)} swap-outs, "
                       f"{p.count(EventKind.RECOMPUTE)} recomputes, +{p.extra_time * 1e3:.1f} ms")
        except InfeasibleBudget as err:
            p, outcome = None, f"infeasible, min {err.min_budget / vanilla:.0%} of vanilla"
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append({"name": name, "ops": len(seq.ops), "fraction": f, "seconds": dt, "cpu": cpu, "plan": p})
        print(f"{name:17s} {len(seq.ops):5d} ops {bandwidth / 1e9:4.1f} GB/s {label:10s} budget {f:.0%} "
              f"of {vanilla / 2**20:8.1f} MB: {outcome}; plan {dt:.3f} s ({cpu:.3f} s CPU)", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sequences only")
    args = ap.parse_args()
    sizes = [("small", 300)] if args.quick else [("resnet50-like", 3000), ("inceptionv4-like", 8000)]
    for name, n in sizes:
        bench(name, n)                                                      # targets: < 1 s, < 5 s
        bench(name, n, settings=PlanSettings(stop_when_fits=False), label="exhaust")  # the paper's loop
        bench(name, n, fractions=(0.75,), bandwidth=2e9, label="slow-copy")  # recomputation too


if __name__ == "__main__":
    main()
