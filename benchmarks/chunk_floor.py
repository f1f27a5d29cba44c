"""The tensor-granularity floor and the smallest feasible budget with and without
chunked optimizer updates (``OptimizerSpec.update_chunk_bytes``, scheduler/graph/chunks.py).

``python -m dbml.bench.chunk_floor [--time] [workload] [chunk MiB ...]`` (default vgg16;
``dp-mlp``: the MLP of hidden [2048, 2048] of ``dp_real_memory.py``;
None, 64 and 16 MiB) prints, per setting, the unplanned peak of the captured step, the floor, the
least budget today's planner meets (roofline latencies) and whether a plan at 35 % of the
unchunked peak exists. Every percentage is of the unchunked peak. ``--time``: instead,
the median step time of eager and of ``ScheduledStep(policy="none")`` per setting
(interleaved, one warm-up round): what chunking costs when no budget binds.
"""

from __future__ import annotations

import copy
import statistics
import sys
import time

import torch

from dbml.scheduler.errors import InfeasibleBudget
from dbml.scheduler.graph.access import build_sequence
from dbml.scheduler.graph.capture import capture
from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.latency.estimate import RooflineModel
from dbml.scheduler.plan.planner import plan, tensor_granularity_floor

from dbml.zoo import Inputs

from .workloads import Workload, workload

# not a bench workload: the MLP of benchmarks/dp_real_memory.py, whose 16 MiB weight is one
# piece at the default size (issue 33, ninth round)
EXTRA = {"dp-mlp": Workload("dp-mlp", "mlp", Inputs("tabular", features=2), {"hidden": (2048, 2048)}, batch=512)}


def _workload(name: str) -> Workload:
    return EXTRA.get(name) or workload(name)

MIB = 1 << 20


def _smallest(seq) -> int:
    try:
        return plan(seq, 1).peak_bytes
    except InfeasibleBudget as e:
        return e.min_budget


def measure(name: str, chunk_bytes: int | None) -> dict:
    w = _workload(name)
    model = w.model()
    x, y = w.batch_tensors()
    t0 = time.perf_counter()
    captured = capture(model, torch.nn.functional.cross_entropy,
                       OptimizerSpec("adam", lr=1e-3, update_chunk_bytes=chunk_bytes), (x, y))
    seq = build_sequence(captured, RooflineModel())
    t1 = time.perf_counter()
    out = dict(chunk=chunk_bytes, peak=plan(seq, 1 << 50, policy="none").peak_bytes,
               floor=tensor_granularity_floor(seq), smallest=_smallest(seq), capture_s=t1 - t0,
               ops=len(seq.ops))
    out["plan_s"] = time.perf_counter() - t1
    return out


def step_times(name: str, chunks: list[int | None], rounds: int = 4) -> dict[str, float]:
    """Median seconds per step: eager, and the unbudgeted scheduled step per setting.
    CPU seconds of the process (``time.process_time``), on one thread: on a shared
    machine wall time measures the neighbours."""
    torch.set_num_threads(1)
    w = _workload(name)
    model = w.model()
    x, y = w.batch_tensors()
    loss_fn = torch.nn.functional.cross_entropy
    runners = {"eager": EagerStep(copy.deepcopy(model), loss_fn, OptimizerSpec("adam", lr=1e-3))}
    for c in chunks:
        spec = OptimizerSpec("adam", lr=1e-3, update_chunk_bytes=c)
        runners[f"none, pieces {'whole' if c is None else f'{c / MIB:g} MiB'}"] = ScheduledStep(
            copy.deepcopy(model), loss_fn, spec, policy="none", latency_model=RooflineModel())
    times: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(rounds + 1):
        for k, runner in runners.items():
            t0 = time.process_time()
            runner.step(x, y)
            if r:   # round 0 warms up (and captures)
                times[k].append(time.process_time() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str]) -> None:
    timing = "--time" in argv
    argv = [a for a in argv if a != "--time"]
    name = argv[0] if argv else "vgg16"
    chunks = [None if a == "None" else int(float(a) * MIB) for a in argv[1:]] or [None, 64 * MIB, 16 * MIB]
    if timing:
        times = step_times(name, chunks)
        for k, t in times.items():
            print(f"{name} {k:>22}: {t:6.3f} s/step of CPU ({t / times['eager']:.3f}x eager)")
        return
    rows = [measure(name, c) for c in chunks]
    base = next((r["peak"] for r in rows if r["chunk"] is None), rows[0]["peak"])
    print(f"{name}: percentages of the unchunked peak {base / MIB:.1f} MiB")
    for r in rows:
        chunk = "whole" if r["chunk"] is None else f"{r['chunk'] / MIB:g} MiB"
        print(f"  pieces {chunk:>8}: peak {r['peak'] / MIB:7.1f} MiB ({r['peak'] / base:6.1%}), "
              f"floor {r['floor'] / MIB:7.1f} MiB ({r['floor'] / base:6.1%}), smallest feasible "
              f"{r['smallest'] / MIB:7.1f} MiB ({r['smallest'] / base:6.1%}), 35 % "
              f"{'feasible' if r['smallest'] <= 0.35 * base else 'infeasible'}; "
              f"{r['ops']} ops, capture {r['capture_s']:.1f} s, planning {r['plan_s']:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
