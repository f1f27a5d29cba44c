"""Time to the first iteration of a repeated ``train()``, cold and warm graph cache.

Each run is a fresh process (as a second ``train()`` in a new session is): it builds the
workload's model, then times ``ScheduledStep``'s graph (captured, or loaded from the
on-disk cache), then ``prepare`` (the access sequence with its latency estimates, the
plan, the compiled program): their sum is when the first iteration starts. The first
step and, apart, one more ``build_sequence`` (prepare's share of it) are timed after. Cold: an empty cache folder;
warm: the folder the cold run filled. Roofline latency model (no calibration).

    python -m dbml.bench.bench_graph_cache --workloads resnet50 densenet121
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

__all__ = ["main"]


def child(name: str, policy: str, budget: int | None) -> dict:
    import torch

    from dbml.bench.workloads import workload
    from dbml.scheduler.execute.runner import ScheduledStep
    from dbml.scheduler.graph.access import build_sequence
    from dbml.scheduler.graph.optim import OptimizerSpec
    from dbml.scheduler.latency.estimate import RooflineModel

    w = workload(name)
    model = w.model()
    x, y = w.batch_tensors()
    lm = RooflineModel()   # measures the machine once, before the clock starts
    runner = ScheduledStep(model, torch.nn.functional.cross_entropy, OptimizerSpec("adam"), policy=policy,
                           budget_bytes=budget, latency_model=lm)
    t0 = time.perf_counter()
    captured = runner.graphs.get(x, y)
    t1 = time.perf_counter()
    runner.prepare(x, y)   # the access sequence (latency estimates), the plan, the program
    t2 = time.perf_counter()
    runner.step(x, y)
    t3 = time.perf_counter()
    build_sequence(captured, lm)   # prepare's share of it, timed again now that all is imported
    t4 = time.perf_counter()
    stats = runner.stats()
    return {"workload": name, "policy": policy, "nodes": len(captured.graph.nodes),
            "loaded": runner.graphs.disk_hits == 1, "graph_s": t1 - t0, "prepare_s": t2 - t1,
            "sequence_s": t4 - t3, "first_step_s": t3 - t2, "start_s": t2 - t0,
            "vanilla_peak_bytes": stats["vanilla_peak_bytes"]}


def _run(name: str, policy: str, budget: int | None, cache: str) -> dict:
    env = {**os.environ, "DBML_CACHE_DIR": cache, "DBML_GRAPH_CACHE": "1"}
    out = subprocess.run([sys.executable, "-m", "dbml.bench.bench_graph_cache", "--child", name, policy,
                          str(budget or 0)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", nargs="+", default=["resnet50", "densenet121"])
    p.add_argument("--budget", type=float, default=0.6, help="tensile's budget, a share of the vanilla peak")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        name, policy, budget = args.child
        print(json.dumps(child(name, policy, int(budget) or None)))
        return
    for name in args.workloads:
        budget = None
        for policy in ("none", "tensile"):
            with tempfile.TemporaryDirectory(prefix="dbml-graph-bench-") as cache:
                for run in ("cold", "warm"):
                    r = _run(name, policy, budget, cache)
                    print(f"{name:12s} {policy:8s} {run}: graph {r['graph_s']:6.2f} s "
                          f"({'loaded' if r['loaded'] else 'captured'}, {r['nodes']} nodes), "
                          f"prepare {r['prepare_s']:5.2f} s (of which sequence {r['sequence_s']:4.2f} s) "
                          f"-> first iteration starts after {r['start_s']:5.2f} s; "
                          f"first step {r['first_step_s']:5.2f} s", flush=True)
            budget = int(args.budget * r["vanilla_peak_bytes"])


if __name__ == "__main__":
    main()
