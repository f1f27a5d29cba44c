"""Concurrent jobs (sections "concurrent" and "mixed"): the paper's Table IV on zoo models.

1-4 jobs of one workload launched at once, and the paper's mixed workload: several zoo
models launched at random (seeded) times. Each job trains ``iters`` iterations with Adam on
its own thread. Three runs with the same launch times, interleaved over ``repeats`` rounds:

* ``eager``: every job eager PyTorch, concurrently, unscheduled (the paper's V);
* ``sequential``: the same jobs eager, one after another;
* ``dbml-tensile``: every job a ScheduledStep planned jointly by one MemoryScheduler within
  ``fraction`` of the sum of the jobs' vanilla peaks (admission, hand-over, replans).

Memory: each job's vanilla peak is measured by the benchmark's tracker (:mod:`.memtrack`) on
one eager iteration; their sum is the paper's vanilla global peak. dbml's global peak is the
device ledger's (every job's executors report each allocation and free to it): the tracker
follows one thread, and these jobs run on several.

    MSR = (sum of vanilla peaks - global peak) / sum     EOR = dbml time / eager time
"""

from __future__ import annotations

import copy
import random
import statistics
import threading
import time
from dataclasses import dataclass

import torch

from dbml.scheduler.errors import InfeasibleBudget
from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.execute.updating import UpdateSettings
from dbml.scheduler.multijob.scheduler import MemoryScheduler

from .methods import SPEC, eager_entry, loss_fn
from .workloads import Workload, workload

__all__ = ["Job", "concurrent_rows", "make_jobs", "run_threads"]


@dataclass
class Job:
    name: str
    w: Workload
    start: float
    iters: int
    model: torch.nn.Module
    x: torch.Tensor
    y: torch.Tensor
    vanilla: int


def _job(name: str, w: Workload, start: float, iters: int, seed: int) -> Job:
    x, y = w.batch_tensors(None, seed)
    model = w.model(seed)
    probe = eager_entry(model)
    for _ in range(2):
        probe.step(x, y)
    probe.measure(x, y, record=False)
    return Job(name, w, start, iters, model, x, y, probe.tracker.device_peak_bytes)


def make_jobs(names: list[str], iters: int, seed: int, spread: float) -> list[Job]:
    """Jobs of the named workloads; with ``spread`` > 0, launched at random times within it."""
    rng = random.Random(seed)
    starts = sorted(rng.uniform(0, spread) for _ in names) if spread > 0 else [0.0] * len(names)
    return [_job(f"{n}{i}", workload(n), starts[i], iters, seed + i) for i, n in enumerate(names)]


def run_threads(jobs, make, after=None, first: list | None = None) -> float:
    """Start each job's runner on its own thread at its launch time; wall seconds until
    all are done. A job has ``name``, ``start``, ``iters``, ``x`` and ``y``; ``make(job)``
    builds its runner (on the job's thread, timed); ``after(job, runner)`` runs once it is
    done; ``first`` gets each job's first-iteration seconds (building the runner included)."""
    errors: list[BaseException] = []
    t0 = time.perf_counter()

    def work(job):
        try:
            delay = job.start - (time.perf_counter() - t0)
            if delay > 0:
                time.sleep(delay)
            t1 = time.perf_counter()
            runner = make(job)
            runner.step(job.x, job.y)
            if first is not None:
                first.append(time.perf_counter() - t1)
            for _ in range(job.iters - 1):
                runner.step(job.x, job.y)
            if after is not None:
                after(job, runner)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(j,), name=f"job-{j.name}") for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def _eager(job: Job) -> EagerStep:
    return EagerStep(copy.deepcopy(job.model), loss_fn, SPEC, measured_steps=0)


def _sequential(jobs: list[Job]) -> float:
    total = 0.0
    for j in jobs:   # timed as _run_threads times a job: from building its runner
        t0 = time.perf_counter()
        runner = _eager(j)
        for _ in range(j.iters):
            runner.step(j.x, j.y)
        total += time.perf_counter() - t0
    return total


def _tensile(jobs: list[Job], budget: int, lm) -> tuple[float, dict]:
    ms = MemoryScheduler(budget)
    stats: dict[str, dict] = {}

    def make(j: Job):
        return ScheduledStep(copy.deepcopy(j.model), loss_fn, SPEC, job=j.name, latency_model=lm,
                             planner=ms.planner_for(j.name, wait=True), share_graphs=(j.w.name, j.w.batch),
                             update=UpdateSettings(max_plan_share=0.05))

    def after(j: Job, r: ScheduledStep):
        stats[j.name] = r.stats()
        r.close()
        ms.unregister(j.name)

    seconds = run_threads(jobs, make, after)
    n = sum(s["iterations"] for s in stats.values()) or 1
    return seconds, {"peak": ms.ledger.peak_bytes, "swaps": sum(s["swaps"] for s in stats.values()) / n,
                     "recomputes": sum(s["recomputes"] for s in stats.values()) / n,
                     "plan_seconds": ms.snapshot()["plan_seconds"]}


def concurrent_rows(jobs: list[Job], section: str, label: str, fraction: float, repeats: int, lm,
                    threads: int) -> list[dict]:
    vanilla = sum(j.vanilla for j in jobs)
    budget = int(fraction * vanilla)
    times: dict[str, list[float]] = {"eager": [], "sequential": [], "tensile": []}
    runs, note = [], None
    for _ in range(repeats):   # interleaved rounds: load from elsewhere affects all alike
        times["eager"].append(run_threads(jobs, _eager))
        times["sequential"].append(_sequential(jobs))
        try:
            seconds, st = _tensile(jobs, budget, lm)
        except InfeasibleBudget as e:
            budget = int(e.min_budget * 1.01)
            note = f"{fraction:.0%} infeasible: budget raised to 1.01 x the smallest feasible ({budget / 2**20:.1f} MiB)"
            seconds, st = _tensile(jobs, budget, lm)
        times["tensile"].append(seconds)
        runs.append(st)
    med = {k: statistics.median(v) for k, v in times.items()}
    peak = max(r["peak"] for r in runs)
    base = {"section": section, "workload": label, "mode": "cpu", "batch": jobs[0].w.batch, "jobs": len(jobs),
            "threads": threads, "vanilla_peak_bytes": vanilla, "vanilla_seconds": med["eager"],
            "first_iteration_eor": None, "error": None, "ledger_peak_bytes": None, "host_peak_bytes": None,
            "launch": [(j.w.name, round(j.start, 2)) for j in jobs]}
    rows = [{**base, "method": "eager", "family": "eager", "budget_bytes": None, "peak_bytes": None,
             "seconds": med["eager"], "msr": None, "eor": 1.0, "cbr": None, "swaps": 0, "recomputes": 0,
             "bit_identical": None, "within_budget": None, "note": "unscheduled, concurrent; peak not tracked"},
            {**base, "method": "sequential", "family": "eager", "budget_bytes": None, "peak_bytes": None,
             "seconds": med["sequential"], "msr": None, "eor": med["sequential"] / med["eager"], "cbr": None,
             "swaps": 0, "recomputes": 0, "bit_identical": None, "within_budget": None,
             "note": "eager, one job after another"}]
    msr, eor = (vanilla - peak) / vanilla, med["tensile"] / med["eager"]
    rows.append({**base, "method": f"dbml-tensile@{fraction:.0%}", "family": "dbml", "budget_bytes": budget,
                 "peak_bytes": peak, "ledger_peak_bytes": peak, "seconds": med["tensile"], "msr": msr, "eor": eor,
                 "cbr": msr / eor, "eor_sequential": med["tensile"] / med["sequential"],
                 "swaps": statistics.median(r["swaps"] for r in runs),
                 "recomputes": statistics.median(r["recomputes"] for r in runs),
                 "plan_seconds": statistics.median(r["plan_seconds"] for r in runs),
                 "bit_identical": None, "within_budget": peak <= budget,
                 "note": note or "global peak from the device ledger"})
    return rows
