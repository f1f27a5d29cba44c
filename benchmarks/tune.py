"""Section "tune" (issue 23): one hyperparameter search run four ways under one device budget.

The search: a tabular MLP on a generated table (16 features, a binary label), a grid of
32 trials (quick: 8) over ``lr``, ``hidden`` and ``batch_size``, the same trials for every
method, no pruning (so every method trains the same 32 models and their best objectives
compare), objective ``val_loss``.

* ``serial``: ``tune(parallel := 1)``, one trial at a time (never fused);
* ``packed``: ``tune()`` with ``parallel`` left to admission, under the device budget, every
  trial its own job (``search.FUSE_TRIALS`` off);
* ``packed+fused``: the same with fusion (issue 23 part 3, ``dbml.search.fusion``): the trials that
  differ only in ``lr`` (here: the four of each ``hidden`` and ``batch_size``) trained as one
  stacked model, one job, as many stacked as fit the budget unscheduled;
* ``packed+fused+median``: the same with the median pruner (fewer epochs, not the same
  models; a pruned trial leaves its fusion at an epoch boundary);
* ``packed+median``: packed, unfused, with the median pruner;
* ``packed-by-admission``: packed with admission alone deciding (``search.PACK_WITHOUT_SWAPS``
  off): trials are added while none waits for memory, the joint plan swapping to fit them;
* ``unscheduled``: the trials as ``policy := 'none'`` jobs (release after last use, no plan,
  no admission, not fused), ``parallel`` of them at once: what packing without a
  scheduler does to the same budget;
* ``ray``: Ray Tune (``pip install 'ray[tune]'``) running the same trials in plain PyTorch
  with fractional CPUs, ``parallel`` at once; recorded as unavailable without Ray. Its
  peak is estimated: the most that its trials' own measured eager peaks (``EagerStep``)
  add up to while they run together (Ray has no device budget to keep).

The budget is ``BUDGET_FACTOR`` (2) times the measured peak of the grid's largest trial
trained alone, so a few trials fit at once; every trial's graphs, and every fusion's, are
captured once before any method is timed. Figures per row: seconds, trials per hour, ``speedup_vs_serial``,
best objective, the device ledger's measured peak (``peak_bytes``) and ``within_budget``.
``python -m dbml bench --sections tune``; ``run(quick, log) -> rows``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import dbml
from dbml.search import engine as search
from dbml.scheduler.multijob.registry import device_ledger

FEATURES = 16
# the device budget, as a multiple of the largest trial's measured peak alone: room for a
# few small trials at once, for two of the largest
BUDGET_FACTOR = 2
GRID = {"lr": [1e-3, 3e-3, 1e-2, 3e-2], "hidden": [[32], [64, 32], [128, 64], [256, 128]], "batch_size": [32, 128]}
QUICK_GRID = {"lr": [3e-3, 3e-2], "hidden": [[32], [128, 64]], "batch_size": [32, 128]}


def _table(con, rows: int) -> None:
    cols = ", ".join(f"(hash(range, {i}) % 1000 / 1000.0) AS f{i}" for i in range(FEATURES))
    con.execute(f"CREATE OR REPLACE TABLE bench_tune AS SELECT *, (f0 + f1 * f2 > 0.6)::INT AS y "
                f"FROM (SELECT {cols} FROM range({rows}))")


METHODS = {"serial": dict(parallel=1, pruner="none"), "packed": dict(pruner="none"),
           "packed+fused": dict(pruner="none"), "packed+fused+median": dict(pruner="median"),
           "packed+median": dict(pruner="median"), "packed-by-admission": dict(pruner="none")}


def run(quick: bool = False, log=print, ray: bool = True, methods: list[str] | None = None,
        repeats: int = 1) -> list[dict]:
    """The section's rows: each of ``methods`` (default: all, then ``unscheduled`` and Ray)
    ``repeats`` times, the repeats interleaved (serial, packed, ..., serial, ...) so that a
    change of the machine's load falls on every method alike; ``speedup_vs_serial`` against
    the median of the serial runs."""
    grid = QUICK_GRID if quick else GRID
    epochs, n_rows = (2, 1000) if quick else (4, 4000)
    trials = len(grid["lr"]) * len(grid["hidden"]) * len(grid["batch_size"])
    con = dbml.connect(latency_model="roofline", progress="off")
    con.execute("SET enable_progress_bar = false")
    _table(con, n_rows)
    fixed = dict(label="y", arch="mlp", epochs=epochs, seed=0, validation=0.2)
    largest = {"lr": grid["lr"][0], "hidden": grid["hidden"][-1], "batch_size": grid["batch_size"][-1]}
    alone = dbml.train(con, "bench_pilot", "bench_tune", policy="tensile", **fixed, **largest)
    budget = BUDGET_FACTOR * alone["measured_peak_bytes"]
    con.execute("SET VARIABLE dbml_memory_budget = ?", [str(budget)])
    space = {k: {"choice": v} for k, v in grid.items()}
    log(f"tune: {trials} trials of an MLP, {epochs} epochs on {n_rows} rows; budget {budget / 1e6:.2f} MB "
        f"({BUDGET_FACTOR}x the largest trial's {alone['measured_peak_bytes'] / 1e6:.2f} MB)")
    # every trial's graphs, and every fusion's, captured once before any method is timed (the
    # graph cache), so the first method measured does not pay the captures for the others
    for method in ("warmup", "warmup+fused"):
        _search(con, method, space, fixed, dict(pruner="none"), log, fuse="fused" in method)
    base = dict(workload=f"mlp-{trials}-trials", budget_bytes=budget, trials=trials, section="tune", mode="cpu",
                threads=1)
    rows = []
    for repeat in range(repeats):
        for method in methods or METHODS:
            search.PACK_WITHOUT_SWAPS = method != "packed-by-admission"
            try:
                rows.append({**base, "repeat": repeat,
                             **_search(con, method, space, fixed, METHODS[method], log, fuse="fused" in method,
                                     repeat=repeat)})
            finally:
                search.PACK_WITHOUT_SWAPS = True
    if methods is not None:
        return _speedups(rows, con)
    parallel = max(2, max(r.get("max_concurrent") or 0 for r in rows if "fused" not in r["method"]))
    rows.append({**base, **_search(con, "unscheduled", space, {**fixed, "policy": "none"},
                                   dict(parallel=parallel, pruner="none"), log)})
    if ray:
        rows.append({**base, **_ray(con, grid, fixed, parallel, budget, log)})
    return _speedups(rows, con)


def _speedups(rows: list[dict], con) -> list[dict]:
    con.close()
    serial = statistics.median([r["seconds"] for r in rows if r["method"] == "serial"] or [math.nan])
    for r in rows:
        r["speedup_vs_serial"] = serial / r["seconds"] if r.get("seconds") and not math.isnan(serial) else None
    return rows


def medians(rows: list[dict]) -> list[dict]:
    """Per method: the median seconds, trials per hour and speedup over its repeats, the
    worst peak, and the load averages seen."""
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        runs = [r for r in rows if r["method"] == method and r.get("seconds")]
        if not runs:
            continue
        out.append({"method": method, "runs": len(runs),
                    "seconds": statistics.median(r["seconds"] for r in runs),
                    "seconds_all": [round(r["seconds"], 1) for r in runs],
                    "trials_per_hour": statistics.median(r["trials_per_hour"] for r in runs),
                    "speedup_vs_serial": statistics.median(r["speedup_vs_serial"] or math.nan for r in runs),
                    "finished": runs[0]["finished"], "pruned": [r["pruned"] for r in runs],
                    "jobs": [r.get("jobs") for r in runs], "best_objective": min(r["best_objective"] for r in runs
                                                                              if r["best_objective"] is not None),
                    "peak_bytes": max(r["peak_bytes"] for r in runs),
                    "within_budget": all(r["within_budget"] for r in runs),
                    "load_average": [r.get("load_average") for r in runs]})
    return out


def _search(con, method: str, space: dict, fixed: dict, args: dict, log, fuse: bool = False, repeat: int = 0) -> dict:
    """One tune() of the grid as ``method`` (``fuse``: with fusion): its figures, how many
    jobs held device memory at once, and the load average over its run."""
    name = f"bench_{method.replace('+', '_').replace('-', '_')}_{repeat}"   # a new search each run (a name resumes)
    counts, peaks, stop = [], [], __import__("threading").Event()
    ledger = device_ledger("cpu")

    def sample():   # the ledger's peak is its busy period's: one trial alone starts a new one
        while not stop.wait(0.01):
            counts.append(sum(b > 0 for b in ledger.accounts().values()))
            peaks.append(ledger.peak_bytes)

    watcher = __import__("threading").Thread(target=sample, daemon=True)
    watcher.start()
    started, fusing = time.perf_counter(), search.FUSE_TRIALS
    search.FUSE_TRIALS = fuse
    try:
        rows = dbml.tune(con, name, "bench_tune", space=space, sampler="grid", **fixed, **args)
        error = None
    except dbml.DbmlError as e:
        rows, error = [], str(e)
    finally:
        seconds = time.perf_counter() - started
        search.FUSE_TRIALS = fusing
        stop.set()
        watcher.join()
    peak = max([*peaks, ledger.peak_bytes])
    finished = [r["objective"] for r in rows if r["status"] == "finished"]
    out = {"method": method, "family": "dbml" if method != "unscheduled" else "unscheduled", "seconds": seconds,
           "trials_per_hour": len(rows) / seconds * 3600, "finished": len(finished),
           "pruned": sum(r["status"] == "pruned" for r in rows), "best_objective": min(finished, default=None),
           "peak_bytes": peak, "within_budget": peak <= int(con.execute(
               "SELECT getvariable('dbml_memory_budget')").fetchall()[0][0]),
           "max_concurrent": max(counts, default=0), "parallel": args.get("parallel"), "error": error,
           "jobs": len({r["job_id"] for r in rows if r["job_id"] is not None}),
           "load_average": round(os.getloadavg()[0], 2)}
    log(f"tune: {method}: {seconds:.1f} s, {out['finished']} finished in {out['jobs']} jobs, best "
        f"{out['best_objective']}, peak {peak / 1e6:.2f} MB, at most {out['max_concurrent']} jobs at once, "
        f"load {out['load_average']}")
    return out


def _ray(con, grid: dict, fixed: dict, parallel: int, budget: int, log) -> dict:
    """Ray Tune on the same grid, ``parallel`` trials at once on fractional CPUs."""
    try:
        import ray
        from ray import tune as ray_tune
    except ImportError as e:
        return {"method": "ray", "family": "ray", "error": f"Ray Tune is not installed ({e.name}): "
                                                          f"pip install 'ray[tune]'"}
    data = _arrays(con)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        trainable = ray_tune.with_resources(ray_tune.with_parameters(_ray_trial, data=data, fixed=fixed),
                                            {"cpu": os.cpu_count() / parallel})
        started = time.perf_counter()
        results = ray_tune.Tuner(
            trainable, param_space={k: ray_tune.grid_search(v) for k, v in grid.items()},
            tune_config=ray_tune.TuneConfig(metric="val_loss", mode="min", max_concurrent_trials=parallel),
            run_config=ray_tune.RunConfig(verbose=0, storage_path=os.path.abspath("/tmp/dbml-ray-tune"))).fit()
        seconds = time.perf_counter() - started
    finally:
        ray.shutdown()
    frames = [r.metrics for r in results if r.metrics]
    peak = _concurrent_peak([(m["started"], m["ended"], m["peak_bytes"]) for m in frames])
    best = min((m["val_loss"] for m in frames), default=None)
    log(f"tune: ray: {seconds:.1f} s, {len(frames)} finished, best {best}, estimated peak {peak / 1e6:.2f} MB")
    return {"method": "ray", "family": "ray", "seconds": seconds, "trials_per_hour": len(frames) / seconds * 3600,
            "finished": len(frames), "pruned": 0, "best_objective": best, "peak_bytes": peak,
            "within_budget": peak <= budget, "parallel": parallel, "error": None,
            "note": "peak estimated: the most its trials' eager peaks add up to at once"}


def _arrays(con) -> dict:
    """The table standardised as dbml does (mean, population std), split 80/20 by a hash."""
    import numpy as np
    cols = [f"f{i}" for i in range(FEATURES)]
    table = con.execute(f"SELECT {', '.join(cols)}, y, hash(rowid) % 5 = 0 AS val FROM bench_tune").fetchnumpy()
    x = np.stack([table[c] for c in cols], axis=1).astype("float32")
    x = (x - x.mean(0)) / x.std(0)
    val = table["val"].astype(bool)
    y = table["y"].astype("int64")
    return {"x": x[~val], "y": y[~val], "vx": x[val], "vy": y[val]}


def _ray_trial(config: dict, data: dict, fixed: dict) -> None:
    """One trial in a Ray worker: the zoo's MLP trained with plain PyTorch (EagerStep, which
    measures its peak), the validation loss reported after each epoch."""
    import numpy as np
    import torch
    from ray import tune as ray_tune

    from dbml.scheduler import OptimizerSpec
    from dbml.scheduler.execute.step import EagerStep
    from dbml.zoo import build
    from dbml.zoo.inputs import Inputs

    started = time.time()
    torch.set_num_threads(1)
    torch.manual_seed(fixed["seed"])
    model = build("mlp", Inputs("tabular", features=FEATURES), 2, {"hidden": tuple(config["hidden"])})
    step = EagerStep(model, torch.nn.functional.cross_entropy, OptimizerSpec("adam", lr=config["lr"]))
    x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
    vx, vy = torch.from_numpy(data["vx"]), torch.from_numpy(data["vy"])
    rng = np.random.default_rng(fixed["seed"])
    for epoch in range(fixed["epochs"]):
        order = torch.from_numpy(rng.permutation(len(y)))
        for i in range(0, len(y), config["batch_size"]):
            rows = order[i:i + config["batch_size"]]
            step.step(x[rows], y[rows])
        with torch.no_grad():
            val_loss = float(torch.nn.functional.cross_entropy(model(vx), vy))
        last = epoch + 1 == fixed["epochs"]
        ray_tune.report({"val_loss": val_loss, "epoch": epoch + 1, "peak_bytes": step.peak_bytes,
                         "started": started, "ended": time.time() if last else None})


def _concurrent_peak(spans: list[tuple[float, float, int]]) -> int:
    """The largest sum of ``bytes`` over spans (start, end, bytes) open at one moment."""
    events = sorted([(s, b) for s, _, b in spans] + [(e, -b) for _, e, b in spans], key=lambda t: (t[0], t[1]))
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


if __name__ == "__main__":
    import sys
    parser = argparse.ArgumentParser(description="tune section: one search run several ways under one budget")
    parser.add_argument("--quick", action="store_true", help="the small grid (8 trials, 2 epochs, 1,000 rows)")
    parser.add_argument("--no-ray", action="store_true", help="leave Ray Tune out")
    parser.add_argument("--methods", help=f"comma-separated, of {', '.join(METHODS)} (default: all, "
                                          f"then unscheduled and Ray)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each method, interleaved")
    a = parser.parse_args()
    rows = run(quick=a.quick, log=lambda s: print(s, file=sys.stderr), ray=not a.no_ray,
               methods=a.methods.split(",") if a.methods else None, repeats=a.repeats)
    print(json.dumps({"rows": rows, "medians": medians(rows)}, indent=1, default=str))
