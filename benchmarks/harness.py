"""``python -m dbml bench``: where dbml stands against eager PyTorch, the paper and PyTorch's own tools.

One run measures, in one process (see each module for how):

* section "single" (:mod:`.single`): every workload under every method: eager; dbml's
  policies none, tensile at 75/50/35 % of the vanilla peak and at the smallest feasible
  budget, capuchin at 50 %, vdnn; PyTorch's checkpoint, activation offload, torch.compile's
  memory budget, Rockmate; on this CPU and, with ``--emulate``, at a GPU's copy-to-compute
  ratio (:mod:`.emulate`);
* "coldstart": the first iteration of tensile (planned from the latency model before it)
  against capuchin (passive first), at 50 %;
* "planning": capture and planning seconds per workload;
* "concurrent" and "mixed" (:mod:`.multi`): 1-4 concurrent jobs and the mixed workload;
* "batch": one workload at batch sizes 4-64;
* "tune" (:mod:`.tune`): one hyperparameter search serial, packed by dbml, unscheduled and
  in Ray Tune, under one device budget;
* "realmem" (:mod:`.realmem`): the real memory (RSS high-water mark, each in a fresh process)
  a ``policy := 'none'`` job adds against a plain PyTorch loop of the same model, batch and Adam.

Results go to ``<out>/<date>-<machine>.json`` with a markdown table and PNG plots
(:mod:`.report`). ``--quick`` (CI's smoke test, minutes): the MLP and the transformer only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import socket
import sys
import time
from pathlib import Path

import torch

from . import emulate
from .multi import concurrent_rows, make_jobs
from .single import ALL_METHODS, Context, run_single
from .methods import SPEC, loss_fn
from .workloads import QUICK, WORKLOADS, workload

__all__ = ["main", "run", "parser", "RESULTS"]

RESULTS = Path(__file__).resolve().parent / "results"
BATCH_METHODS = ("eager", "dbml-tensile@50%", "checkpoint", "offload")
SECTIONS = ("single", "coldstart", "planning", "concurrent", "mixed", "batch", "latency", "fastpath", "inference",
            "tune", "realmem")
NOT_QUICK = ("latency", "tune")   # held-out calibrations: half an hour; tune: Ray Tune's start alone is minutes


# --quick leaves out the default planner at its two smallest budgets: under the emulated
# GPU's slow copies they stall for most of an iteration (the MLP at 100x eager), which
# alone took a minute of CI's smoke test; the full run measures them. It leaves out the
# seeds' other planners too: their searches take seconds to tens of seconds per workload
# and mode (PoocH on the emulated transformer: 134 simulations of ~0.1 s); name them in
# --methods to measure them quickly.
NOT_QUICK_METHODS = ("dbml-stalls@35%", "dbml-stalls@min", "dbml-pooch@50%", "dbml-swapadvisor@50%")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dbml bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the MLP and the transformer only, few iterations (minutes)")
    p.add_argument("--workloads", help=f"comma-separated, from {', '.join(WORKLOADS)}")
    p.add_argument("--methods", help=f"comma-separated, from {', '.join(ALL_METHODS)} (default all; --quick: all "
                                     f"but {', '.join(NOT_QUICK_METHODS)})".replace("%", "%%"))
    p.add_argument("--out", default=str(RESULTS), help=f"results folder (default {RESULTS})")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="PyTorch threads (default: all cores)")
    p.add_argument("--emulate", default="a6000",
                   help=f"GPU profiles to emulate, comma-separated, or 'none' ({', '.join(emulate.PROFILES)})")
    p.add_argument("--iters", type=int, help="timed iterations per method (default 3; quick 2)")
    p.add_argument("--sections", help=f"which sections to run (default {','.join(SECTIONS)}; "
                                       f"--quick leaves out {','.join(NOT_QUICK)})")
    p.add_argument("--seed", type=int, default=0)
    return p


def latency_model(threads: int):
    """The latency model every method plans with, frozen per op (``FrozenLatency``)."""
    from dbml.scheduler.latency.estimate import RooflineModel
    from dbml.scheduler.latency.predictor import load_predictor
    predictor = load_predictor("cpu", threads=threads)
    if predictor is not None:
        return FrozenLatency(predictor), "predictor"
    return FrozenLatency(RooflineModel()), \
        "roofline (no predictor for this thread count: python -m dbml install --threads N)"


class FrozenLatency:
    """A latency model whose every op is predicted once: the predictor reads the machine's
    load, so two plans of one graph (a probe for the smallest budget, a row at a budget)
    could see different latencies, and a budget found feasible fail a moment later. Frozen,
    every method of a workload plans from the same latencies, and the smallest feasible
    budget is monotone: no budget below it plans."""

    def __init__(self, base):
        import weakref
        self.base = base
        self._cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # graph -> node name -> s

    def predict(self, node) -> float:
        per_graph = self._cache.setdefault(node.graph, {})
        if node.name not in per_graph:
            per_graph[node.name] = self.base.predict(node)
        return per_graph[node.name]

    def __getattr__(self, name):   # anything else the model offers (a predictor's report, its machine)
        return getattr(self.base, name)


def machine() -> dict:
    import duckdb
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else None
    name = re.sub(r"[^a-z0-9]+", "-", f"{socket.gethostname().split('.')[0]}-{os.cpu_count()}c".lower()).strip("-")
    return {"name": name, "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem, 1) if mem else None,
            "torch": torch.__version__, "duckdb": duckdb.__version__, "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def unaffected(rows: list[dict], workload: str, mode: str) -> list[dict]:
    """The CPU rows of methods that make no host copies, labelled for ``mode``: the copy
    throttle does not apply to them, so they are not run again (their note says so)."""
    from .single import EMULABLE
    note = "not emulated: no host copies, so the GPU-ratio throttle does not apply (CPU figures)"
    return [{**r, "mode": mode, "note": f"{note}; {r['note']}" if r.get("note") else note}
            for r in rows if r["section"] == "single" and r["workload"] == workload and r["mode"] == "cpu"
            and r["method"] not in EMULABLE]


def _coldstart(rows: list[dict]) -> list[dict]:
    keep = ("dbml-tensile@50%", "dbml-capuchin@50%")
    return [{**r, "section": "coldstart"} for r in rows if r["section"] == "single" and r["method"] in keep]


def _planning(w, ctx: Context, log) -> dict:
    """Capture seconds for ``w`` (its first capture in this process: the single section
    then shares it, as dbml's jobs of one configuration do), the tensor-granularity floor,
    and the smallest budget the planner meets with each latency model (planning only)."""
    from dbml.scheduler.execute.runner import ScheduledStep
    from dbml.scheduler.plan.planner import plan, tensor_granularity_floor
    from .methods import SPEC, loss_fn
    x, y = w.batch_tensors(None, ctx.seed)
    t0 = time.perf_counter()
    none = ScheduledStep(w.model(ctx.seed), loss_fn, SPEC, policy="none", latency_model=ctx.lm,
                         share_graphs=(w.name, int(x.shape[0])))
    none.prepare(x, y)
    capture = time.perf_counter() - t0
    seq = next(iter(none.sequences.values()))
    row = {"section": "planning", "workload": w.name, "method": "dbml-capture", "family": "dbml", "mode": "cpu",
           "batch": w.batch, "jobs": 1, "threads": ctx.threads, "capture_seconds": capture, "ops": len(seq.ops),
           "floor_bytes": tensor_granularity_floor(seq), "vanilla_peak_bytes": plan(seq, 1 << 62, policy="none").peak_bytes,
           "error": None, "note": f"latency model: {ctx.lm_name}"}
    for name, model in _latency_models(ctx):
        row[f"min_budget_{name}_bytes"], row[f"plan_{name}_seconds"] = _min_budget(none, x, y, model)
    none.close()
    log(f"  {w.name}: capture {capture:.1f} s, {row['ops']} ops, floor {row['floor_bytes'] / 2**20:.1f} MiB, "
        + ", ".join(f"{k}: {v / 2**20:.1f} MiB" for k, v in row.items() if k.startswith("min_budget")))
    return row


def _latency_models(ctx: Context) -> list[tuple]:
    from dbml.scheduler.latency.estimate import RooflineModel
    return [("roofline", RooflineModel())] + ([("predictor", ctx.lm)] if ctx.lm_name == "predictor" else [])


def _min_budget(step, x, y, model) -> tuple[int, float]:
    """The smallest budget the planner meets for the step's graph under ``model``'s
    latencies: plan at budget 0 and read InfeasibleBudget's ``min_budget``."""
    from dbml.scheduler.errors import InfeasibleBudget
    from dbml.scheduler.graph.access import build_sequence
    from dbml.scheduler.plan.planner import plan
    seq = build_sequence(step.graphs.get(x, y), model, "floor")
    t0 = time.perf_counter()
    try:
        reached = plan(seq, 0).peak_bytes   # only a graph with nothing to move fits 0
    except InfeasibleBudget as e:
        reached = e.min_budget
    return reached, time.perf_counter() - t0


def run(args) -> dict:
    threads = args.threads or os.cpu_count()
    torch.set_num_threads(threads)
    names = args.workloads.split(",") if args.workloads else list(QUICK if args.quick else WORKLOADS)
    ws = [workload(n) for n in names]
    methods = tuple(args.methods.split(",")) if args.methods else \
        tuple(m for m in ALL_METHODS if not (args.quick and m in NOT_QUICK_METHODS))
    unknown = set(methods) - set(ALL_METHODS)
    if unknown:
        raise SystemExit(f"--methods: unknown {', '.join(sorted(unknown))}; methods are {', '.join(ALL_METHODS)}")
    profiles = [] if args.emulate in ("", "none") else [emulate.profile(p) for p in args.emulate.split(",")]
    sections = set(args.sections.split(",") if args.sections else
                   [s for s in SECTIONS if not (args.quick and s in NOT_QUICK)])
    lm, lm_name = latency_model(threads)
    iters = args.iters or (2 if args.quick else 3)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731 - progress lines
    ctx = Context(threads, lm, lm_name, iters=iters, warmup=1 if args.quick else 2, seed=args.seed, log=log,
                  record={ws[0].name if args.quick else "resnet50"})
    started = time.time()
    results = {"date": datetime.date.today().isoformat(), "machine": machine(),
               "command": "python -m dbml bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else []),
               "load_average": {"before": list(os.getloadavg())}, "quick": args.quick, "threads": threads,
               "emulate": [p.name for p in profiles], "latency_model": lm_name, "rows": [], "timelines": {},
               "notes": [], "emulation": {}}
    rows = results["rows"]
    for w in ws:
        _checkpoint(results, args)
        if "planning" in sections:
            rows.append(_planning(w, ctx, log))
        if sections & {"single", "coldstart"}:
            log(f"{w.name}: {w.describe()}, cpu")
            r, t = run_single(w, ctx, methods=methods)
            rows += r
            results["timelines"].update(t)
            eager_s = next((row["seconds"] for row in r if row["method"] == "eager" and row.get("seconds")), None)
            for p in profiles:
                t_gpu, t_cpu = _iteration_times(w, p, threads, eager_s)
                ctx.emulate, ctx.bandwidth = p, emulate.emulated_bandwidth(p, t_gpu, t_cpu)
                results["emulation"].setdefault(p.name, {"profile": p.source, "efficiency": p.efficiency,
                                                         "launch": p.launch, "workloads": {}})
                results["emulation"][p.name]["workloads"][w.name] = {
                    "bandwidth": ctx.bandwidth, "gpu_iteration_s": t_gpu, "cpu_iteration_s": t_cpu}
                log(f"{w.name}: emulated {p.name} (copies at {ctx.bandwidth / 1e6:.0f} MB/s: an iteration "
                    f"{t_gpu * 1e3:.2f} ms there, {t_cpu * 1e3:.0f} ms here)")
                r, t = run_single(w, ctx, mode=f"emulated:{p.name}", methods=methods)
                rows += r + unaffected(rows, w.name, f"emulated:{p.name}")
                results["timelines"].update(t)
    if "coldstart" in sections:
        rows += _coldstart(rows)
    _checkpoint(results, args)
    _multi(args, sections, ctx, rows, log)
    if "fastpath" in sections:
        rows += _fastpath(args.quick, log)
    if "inference" in sections:
        from . import infer
        for w in ws:
            log(f"inference: {w.name}, {infer.ROWS} rows, eager no_grad against dbml at {infer.BUDGET:.0%} of its "
                f"activations")
            rows += infer.rows_for(w, iters)
    if "latency" in sections:
        rows += _latency(names, iters, log)
    if "tune" in sections:
        from . import tune
        rows += tune.run(args.quick, log)
    if "realmem" in sections:
        from . import realmem
        for w in ws:
            log(f"realmem: {w.name}, plain PyTorch loop against dbml policy none, each in a fresh process")
            rows += realmem.rows_for(w, threads=threads)
    if "batch" in sections:
        w = workload("mlp" if args.quick else "resnet50")
        for b in ((8, 32) if args.quick else (4, 8, 16, 32, 64)):
            log(f"batch {b}: {w.name}")
            r, _ = run_single(w, ctx, methods=[m for m in BATCH_METHODS if m in methods], batch=b, section="batch")
            rows += r
            _checkpoint(results, args)
    results["load_average"]["after"] = list(os.getloadavg())
    results["seconds"] = time.time() - started
    return results


def _iteration_times(w, p, threads: int, eager_seconds: float | None = None) -> tuple[float, float]:
    """(seconds of one iteration on ``p``'s GPU by its achieved roofline, on this CPU by
    eager PyTorch: the CPU rows' median, measured interleaved with every method under the
    same load, else the least of 5 steps after a warm-up): the emulated bandwidth's ratio."""
    import copy

    from dbml.scheduler.execute.step import EagerStep
    from dbml.scheduler.graph.graphs import GraphCache
    model = w.model()
    x, y = w.batch_tensors()
    captured = GraphCache(copy.deepcopy(model), loss_fn, SPEC, job="emulate", share=(w.name, int(x.shape[0]))).get(x, y)
    t_gpu = emulate.gpu_iteration_seconds(p, captured.graph)
    if eager_seconds:
        return t_gpu, eager_seconds
    runner = EagerStep(model, loss_fn, SPEC, measured_steps=0)
    runner.step(x, y)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        runner.step(x, y)
        times.append(time.perf_counter() - t0)
    return t_gpu, min(times)


def _fastpath(quick: bool, log) -> list[dict]:
    """Per-step time of a job whose budget binds nothing against eager (:mod:`.fastpath`)."""
    from . import fastpath
    log("fastpath: eager against dbml with nothing to schedule, small MLPs first")
    small = ("tabular-20x64x64-b256", "dbml-default-mlp-b64")   # --quick: the small MLPs the goal names
    rows = fastpath.run(cases=small if quick else None, steps=40 if quick else 200)
    return [{**r, "section": "fastpath", "mode": "cpu", "family": "eager" if r["runner"] == "eager" else "dbml",
             "method": "eager" if r["runner"] == "eager" else f"dbml-{r['runner']}", "eor": r["ratio_to_eager"],
             "load_average": round(r["load_average"], 2)} for r in rows]


def _latency(names: list[str], iters: int, log) -> list[dict]:
    """Whole-iteration estimates on held-out architectures (:mod:`.latency_eval`)."""
    from . import latency_eval
    log("latency: held-out calibrations (quick and full plans)")
    rows = latency_eval.run(tuple(names), plans=("quick", "full"), iterations=iters, progress=log)
    bulky = ("times_s", "util", "fallback_kinds")
    return [{**{k: v for k, v in r.items() if k not in bulky}, "section": "latency", "mode": "cpu",
             "architecture": r["family"], "family": "dbml", "method": f"{r['latency_model']}/{r['calibration']}",
             "fallbacks": len(r["fallback_kinds"])} for r in rows]


def _checkpoint(results: dict, args) -> None:
    """The rows so far, as ``<out>/partial.json`` (a long run that fails late loses nothing)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "partial.json").write_text(json.dumps(results, indent=1, default=str))


def _multi(args, sections: set, ctx: Context, rows: list, log) -> None:
    iters, repeats = (3, 1) if args.quick else (5, 2)
    if "concurrent" in sections:
        name = "mlp" if args.quick else "transformer"
        for n in ((1, 2) if args.quick else (1, 2, 3, 4)):
            log(f"concurrent: {n} x {name}")
            jobs = make_jobs([name] * n, iters, args.seed, 0.0)
            rows += concurrent_rows(jobs, "concurrent", f"{n} x {name}", 0.5, repeats, ctx.lm, ctx.threads)
    if "mixed" in sections:
        mix = ["mlp", "transformer", "mlp"] if args.quick else ["mlp", "transformer", "resnet50", "mlp",
                                                                 "transformer", "densenet121"]
        log(f"mixed: {', '.join(mix)}")
        jobs = make_jobs(mix, iters, args.seed + 100, 1.0 if args.quick else 3.0)
        rows += concurrent_rows(jobs, "mixed", "mixed", 0.6, repeats, ctx.lm, ctx.threads)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    results = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "partial.json").unlink(missing_ok=True)
    try:
        from . import report
        paths = report.write(results, out)
    except ImportError:
        stem = f"{results['date']}-{results['machine']['name']}"
        path = out / f"{stem}.json"
        path.write_text(json.dumps(results, indent=1, default=str))
        paths = {"json": str(path)}
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
