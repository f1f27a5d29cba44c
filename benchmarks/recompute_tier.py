"""Swap or recompute, priced by the tier (issue 29, part 3): what each planner frees how.

``python -m dbml.bench.recompute_tier [--workloads resnet18-w0.25,densenet121,transformer,resnet50]``

For each workload the benchmark's real captured step is planned at 50 % and 25 % of its
vanilla peak, with the copy channel at the disk tier's bandwidth (450 MB/s write, what
``O_DIRECT`` measured on the issue's machine) and at the access sequence's default
(8 GB/s, a RAM copy), by dbml's default planner (``BEYOND``, with
``PlanSettings.recompute_ratio``), by the same without the tier's rule (ratio 0) and by
the paper's (``PAPER``). Each row: bytes freed by
swaps (one per swap-in: a stretch the tensor spends off the device) and by recomputes (one
per RECOMPUTE), the planned extra seconds per iteration against the iteration, and the
planning time. Op latencies come from the roofline model on a fixed CPU (30 GFLOP/s,
5 GB/s memory, 5 us per op: a few tens of GFLOP/s, as the issue states) so that the table
does not move with this machine's load; the plans are checked exact by the tests, not here.
"""

from __future__ import annotations

import argparse
import copy
import time

from dbml.scheduler.graph.access import build_sequence
from dbml.scheduler.graph.capture import capture
from dbml.scheduler.graph.sequence import AccessSequence, EventKind, Plan
from dbml.scheduler.latency.estimate import Machine, RooflineModel
from dbml.scheduler.plan.planner import BEYOND, PAPER, InfeasibleBudget, PlanSettings, plan

from .methods import SPEC, loss_fn
from .workloads import workload

__all__ = ["CPU", "DISK", "RAM", "sequence", "freed", "rows", "main"]

CPU = Machine(peak_flops=30e9, memory_bandwidth=5e9, copy_bandwidth=8e9, op_overhead=5e-6)
DISK = 450e6    # bytes/s: the disk tier's write bandwidth (reads ~1.2 GB/s)
RAM = 8e9       # AccessSequence's default copy bandwidth
# dbml's default; the same without the tier's rule (recompute_ratio 0: waits alone price
# a swap, as before issue 29); the paper's algorithm
PLANNERS = {"beyond": PlanSettings(**BEYOND), "beyond-ratio0": PlanSettings(**{**BEYOND, "recompute_ratio": 0.0}),
            "paper": PlanSettings(**PAPER)}


# Beside the benchmark's workloads, one whose peak is mostly activations (the benchmark's big
# CNNs at batch 16 hold mostly parameters and Adam state, which only a copy frees): the
# zoo's ResNet-18 at width 0.25, 32x32, batch 32 (tests/test_recompute_tier.py's).
SMALL = {"resnet18-w0.25": ("resnet18", 32, {"width": 0.25}, 32)}


def sequence(name: str, bandwidth: float) -> AccessSequence:
    """The workload's captured step as the planner sees it at ``bandwidth``."""
    if name in SMALL:
        import torch

        from dbml.zoo import Inputs, build
        arch, size, options, batch = SMALL[name]
        torch.manual_seed(0)
        model = build(arch, Inputs("image", shape=(3, size, size)), 10, options)
        g = torch.Generator().manual_seed(0)
        xy = torch.randn(batch, 3, size, size, generator=g), torch.randint(0, 10, (batch,), generator=g)
    else:
        w = workload(name)
        model, xy = w.model(), w.batch_tensors()
    captured = capture(copy.deepcopy(model), loss_fn, SPEC, xy)
    return build_sequence(captured, RooflineModel(CPU), name, copy_bandwidth=bandwidth)


def freed(seq: AccessSequence, p: Plan) -> tuple[int, int]:
    """(bytes freed by swaps, bytes freed by recomputes) in a plan."""
    size = lambda e: seq.tensors[e.tensor].nbytes  # noqa: E731
    return (sum(size(e) for e in p.events if e.kind is EventKind.SWAP_IN),
            sum(size(e) for e in p.events if e.kind is EventKind.RECOMPUTE))


def rows(name: str, fracs=(0.5, 0.25), bandwidths=(DISK, RAM)) -> list[dict]:
    base = sequence(name, RAM)
    out = []
    for bw in bandwidths:
        seq = AccessSequence(**{**base.__dict__, "copy_bandwidth": bw})
        vanilla = plan(seq, 1 << 62, policy="none").peak_bytes
        for frac in fracs:
            for label, settings in PLANNERS.items():
                t0 = time.perf_counter()
                row = {"workload": name, "bandwidth": bw, "budget": frac, "planner": label}
                try:
                    p = plan(seq, int(frac * vanilla), settings=settings)
                except InfeasibleBudget as err:
                    out.append({**row, "infeasible": err.min_budget / vanilla})
                    continue
                swap, rc = freed(seq, p)
                out.append({**row, "swap_mb": swap / 1e6, "recompute_mb": rc / 1e6, "extra_s": p.extra_time,
                            "iteration_s": seq.duration, "plan_s": time.perf_counter() - t0,
                            "recomputes": p.count(EventKind.RECOMPUTE)})
    return out


def table(all_rows: list[dict]) -> str:
    lines = ["| workload | copies | budget | planner | freed by swap MB | freed by recompute MB | recompute share | "
             "recomputes | extra ms / iteration ms | plan s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in all_rows:
        head = f"| {r['workload']} | {r['bandwidth'] / 1e9:.2f} GB/s | {r['budget']:.0%} | {r['planner']} |"
        if "infeasible" in r:
            lines.append(f"{head} infeasible (least {r['infeasible']:.0%}) | | | | | |")
        else:
            share = r["recompute_mb"] / max(r["swap_mb"] + r["recompute_mb"], 1e-9)
            lines.append(f"{head} {r['swap_mb']:.1f} | {r['recompute_mb']:.1f} | {share:.0%} | {r['recomputes']} | "
                         f"{r['extra_s'] * 1e3:.0f} / {r['iteration_s'] * 1e3:.0f} | {r['plan_s']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="resnet18-w0.25,densenet121,transformer,resnet50")
    args = ap.parse_args(argv)
    print(table([r for n in args.workloads.split(",") for r in rows(n)]))


if __name__ == "__main__":
    main()
