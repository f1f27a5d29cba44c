"""Real memory: what each method adds to a fresh process, measured from outside it (issue 29).

The "single" section measures every method in one process by a tensor tracker; a
process's real memory (its resident set) cannot be split that way. Here every
(workload, method) runs in a fresh ``python -m benchmarks.budgets_real --one ...`` process:
it builds the model and batch, warms up (:func:`warm_up`, the same for every method:
one-time library set-up is nobody's), then measures from before the method is built to
after its last iteration what the process added to its resident memory
(:mod:`dbml.scheduler.procmem`: the kernel's high-water mark less the start), the
median seconds of the iterations after the first, the tracker's peak where the method
has one, and a digest of the trained weights.

Methods: ``plain`` (a PyTorch loop by hand: torch.optim's Adam), ``eager`` (dbml's eager
reference, the bit-identity reference), ``dbml-none``, ``dbml-stalls@P`` (dbml's default
planner, ``planner.BEYOND``) and ``dbml-tensile@P`` (the paper's, ``planner.PAPER``) with
``memory_budget`` = P of plain's real memory and swaps going to a spill file on disk (the
CPU's slow tier), and the peers ``checkpoint``, ``offload`` (``save_on_cpu``) and
``compile`` (torch.compile's activation memory budget). A dbml row is bit-identical when
its digest equals eager's, and within its budget when its real memory is.

``python -m benchmarks.budgets_real --workloads mlp,transformer --iters 4`` prints a markdown
table and writes JSON beside the other results.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

__all__ = ["run_one", "run", "main", "METHODS", "SHARES"]

SHARES = (0.5, 0.25)
METHODS = ("plain", "eager", "dbml-none", *(f"dbml-{p}@{int(s * 100)}%" for p in ("stalls", "tensile") for s in SHARES),
           "checkpoint", "offload", "compile")


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def _runner(method: str, model, x, y, budget: int | None, spill_dir: str):
    from dbml.scheduler.execute.devices import CpuDevice
    from dbml.scheduler.execute.runner import ScheduledStep
    from dbml.scheduler.execute.spill import SpillFile
    from dbml.scheduler.execute.step import EagerStep
    from dbml.scheduler.plan.planner import BEYOND, PAPER, PlanSettings
    from .methods import SPEC, loss_fn
    from . import peers

    if method == "plain":
        return peers.PeerStep(model, SPEC)
    if method == "eager":
        return EagerStep(model, loss_fn, SPEC)
    if method.startswith("dbml-"):
        policy = "none" if method == "dbml-none" else "tensile"
        settings = PlanSettings(**(PAPER if method.startswith("dbml-tensile") else BEYOND))
        return ScheduledStep(model, loss_fn, SPEC, policy=policy, budget_bytes=budget, planner_settings=settings,
                             device=CpuDevice(spill=SpillFile(spill_dir, method)))
    return peers.make_peer(method, model, SPEC, x, y)


def warm_up() -> None:
    """What every method's process does before it is measured: one convolution step
    (oneDNN's one-time set-up) and the import of torch's compiler stack (``torch._dynamo``,
    fx's symbolic shapes, functorch's partitioners: 40-50 MB and ~2 s). dbml's capture
    imports it (through torch's ShapeEnv) and so do the compile and checkpoint peers: it is
    a cost of torch per process, paid once, like importing torch itself, and
    ``import_bytes`` in each row says how much it was."""
    warm = torch.nn.Conv2d(3, 4, 3)
    warm(torch.randn(1, 3, 8, 8)).sum().backward()
    for name in ("torch._dynamo", "torch._functorch.partitioners", "torch.fx.experimental.symbolic_shapes"):
        importlib.import_module(name)


def run_one(workload: str, method: str, budget: int | None, iters: int, spill_dir: str) -> dict:
    """In this (fresh) process: the method's real memory, time and weights."""
    from dbml.scheduler import procmem
    from .workloads import workload as get
    w = get(workload)
    model = w.model()
    x, y = w.batch_tensors()
    before = procmem.rss_bytes()
    warm_up()
    imported = procmem.rss_bytes()
    times, losses = [], []
    with procmem.watch() as real:
        runner = _runner(method, model, x, y, budget, spill_dir)
        torch.manual_seed(1)
        for _ in range(iters):
            t0 = time.perf_counter()
            losses.append(float(runner.step(x, y)))
            times.append(time.perf_counter() - t0)
        stats = runner.stats() if hasattr(runner, "stats") else {}
        if hasattr(runner, "finish"):
            runner.finish()
    model_of = getattr(runner, "model", model)
    digest = _digest([*model_of.parameters(), *model_of.buffers()])
    if hasattr(runner, "close"):
        runner.close()
    return {"workload": workload, "method": method, "budget": budget, "real_bytes": real.result.added,
            "real_exact": real.result.exact, "tracked_peak": stats.get("measured_peak_bytes"),
            "spilled_peak": stats.get("spilled_peak_bytes"), "swaps": stats.get("swaps"),
            "recomputes": stats.get("recomputes"), "seconds": statistics.median(times[1:] or times),
            "first_seconds": times[0], "digest": digest, "losses": losses, "import_bytes": imported - before}


def _child(workload: str, method: str, budget: int | None, iters: int, spill_dir: str, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.budgets_real", "--one", workload, method, str(budget or 0), str(iters),
           spill_dir]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             cwd=Path(__file__).resolve().parent.parent)
    except subprocess.TimeoutExpired:
        return {"workload": workload, "method": method, "budget": budget, "error": f"over {timeout:.0f} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"workload": workload, "method": method, "budget": budget, "error": tail[:300]}
    return json.loads(lines[-1])


def run(workloads, methods=METHODS, iters: int = 4, timeout: float = 900) -> list[dict]:
    """Every method of every workload in its own process; budgets from plain's real memory."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="dbml-realmem-") as spill_dir:
        for w in workloads:
            base = _child(w, "plain", None, iters, spill_dir, timeout)
            eager = _child(w, "eager", None, iters, spill_dir, timeout) if "eager" in methods else {}
            rows += [base] + ([eager] if eager else [])
            for m in methods:
                if m in ("plain", "eager"):
                    continue
                budget = None
                if "@" in m:
                    if "real_bytes" not in base:
                        rows.append({"workload": w, "method": m, "error": "no plain baseline"})
                        continue
                    budget = int(base["real_bytes"] * int(m.split("@")[1].rstrip("%")) / 100)
                row = _child(w, m, budget, iters, spill_dir, timeout)
                if m.startswith("dbml") and "digest" in row and eager.get("digest"):
                    row["bit_identical"] = row["digest"] == eager["digest"]
                rows.append(row)
            for r in rows:
                if r.get("workload") == w and "real_bytes" in r and base.get("real_bytes"):
                    r["real_vs_plain"] = r["real_bytes"] / base["real_bytes"]
                    r["eor"] = r["seconds"] / base["seconds"]
                    if r.get("budget"):
                        r["within_budget"] = r["real_bytes"] <= r["budget"]
    return rows


def table(rows: list[dict]) -> str:
    out = ["| workload | method | budget MB | real MB | real/plain | tracked MB | spilled MB | s/iter | EOR | "
           "bit-identical | within budget |", "|---" * 11 + "|"]

    def mb(v):
        return "" if v is None else f"{v / 2**20:.1f}"
    for r in rows:
        if "error" in r:
            out.append(f"| {r['workload']} | {r['method']} | {mb(r.get('budget'))} | error: {r['error']} |||||||")
            continue
        out.append(f"| {r['workload']} | {r['method']} | {mb(r.get('budget'))} | {mb(r['real_bytes'])} | "
                   f"{r.get('real_vs_plain', 0):.2f} | {mb(r.get('tracked_peak'))} | {mb(r.get('spilled_peak'))} | "
                   f"{r['seconds']:.3f} | {r.get('eor', 0):.2f} | {r.get('bit_identical', '')} | "
                   f"{r.get('within_budget', '')} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.budgets_real", description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="mlp,transformer")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--one", nargs=5, metavar=("WORKLOAD", "METHOD", "BUDGET", "ITERS", "SPILL_DIR"),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        w, m, b, n, d = args.one
        print(json.dumps(run_one(w, m, int(b) or None, int(n), d)))
        return 0
    t0 = time.time()
    load = os.getloadavg()
    rows = run(args.workloads.split(","), tuple(args.methods.split(",")), args.iters)
    text = table(rows)
    print(text)
    print(f"load average at start {load[0]:.1f}, at end {os.getloadavg()[0]:.1f}; {time.time() - t0:.0f} s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d")
    (out / f"{stamp}-budgets-real.json").write_text(json.dumps({"rows": rows, "load": load}, indent=1))
    (out / f"{stamp}-budgets-real.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
