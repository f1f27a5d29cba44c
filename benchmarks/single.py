"""One job, every method, one workload: the benchmark's main table (section "single").

All methods run in one process, interleaved iteration by iteration (the order rotates every
round) so that load from other processes hits them alike:

1. eager PyTorch alone, to measure the vanilla peak (the budgets are fractions of it);
2. the smallest budget TENSILE's planner can meet;
3. every method built from the same initial weights, then ``warmup`` rounds (the first
   iteration of each, after ``prepare``, is its cold start), one round measuring memory
   (every method under the same tracker, :mod:`.memtrack`; not timed), ``iters`` timed
   rounds;
4. rows: median seconds, EOR against eager's median, MSR from the tracked peaks, and for
   dbml rows whether the weights and losses equal eager's bit for bit.

In emulated mode (``mode="emulated:<profile>"``) dbml's copies run on a throttled device
and the offload peer's copies sleep as long as the GPU ratio says (:mod:`.emulate`); the
methods without host copies are not re-run (their rows say so).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

import torch

from dbml.scheduler.errors import InfeasibleBudget
from dbml.scheduler.plan.planner import BEYOND, PAPER, PlanSettings

from . import emulate
from .methods import (Entry, bit_identical, dbml_entry, eager_entry, failed, peer_entry, smallest_budget)
from .workloads import Workload

__all__ = ["Context", "ALL_METHODS", "EMULABLE", "run_single", "TENSILE_BUDGETS"]

SETTINGS = {"tensile": PlanSettings(**PAPER), "stalls": PlanSettings(**BEYOND)}   # the paper's; dbml's default
MEMORY_SHARE = 0.5   # of this machine's RAM for one group of runners
TENSILE_BUDGETS = (("75%", 0.75), ("50%", 0.50), ("35%", 0.35), ("min", None))
# dbml's default planner (planned stalls, swap or recompute by cost); dbml-tensile@… is the paper's
STALLS = tuple(f"dbml-stalls@{b}" for b in ("50%", "35%", "min"))
PEERS = ("checkpoint", "offload", "compile", "rockmate")
# the seeds' other planners (policies pooch and swapadvisor) within half of eager's peak
SEARCHED = ("dbml-pooch@50%", "dbml-swapadvisor@50%")
ALL_METHODS = ("eager", "dbml-none", *(f"dbml-tensile@{b}" for b, _ in TENSILE_BUDGETS), *STALLS, "dbml-capuchin@50%",
               "dbml-vdnn", *SEARCHED, *PEERS)
# methods that copy to the host, which the GPU-ratio emulation throttles
EMULABLE = ("eager", *(f"dbml-tensile@{b}" for b, _ in TENSILE_BUDGETS), *STALLS, "dbml-capuchin@50%", "dbml-vdnn",
            *SEARCHED, "offload")


@dataclass
class Context:
    threads: int
    lm: object                       # the latency model dbml plans with (CPU)
    lm_name: str
    iters: int = 3
    warmup: int = 2
    seed: int = 0
    emulate: emulate.Profile | None = None
    bandwidth: float | None = None   # the emulated copy bandwidth, bytes/s
    record: set = field(default_factory=set)   # workload names whose memory timelines are kept
    log: object = None               # a callable(str) for progress lines
    smallest: dict = field(default_factory=dict)   # (workload, batch, mode) -> smallest feasible budget


def _build(names, w: Workload, model, x, y, vanilla: int, ctx: Context, mode: str) -> list[Entry]:
    emulated = mode != "cpu"
    share = (w.name, int(x.shape[0]))

    def device():   # one per runner: each has its own copy thread and host pool
        return emulate.ThrottledCpuDevice(ctx.bandwidth) if emulated else "cpu"

    lm = emulate.EmulatedLatency(ctx.lm, ctx.bandwidth) if emulated else ctx.lm
    smallest = {}   # per planner: the smallest feasible budget

    def least(kind: str) -> int:
        key = (*share, mode, kind)
        if key not in ctx.smallest:
            ctx.smallest[key] = smallest_budget(model, x, y, share, lm, device(), SETTINGS[kind])
        smallest[kind] = ctx.smallest[key]
        return smallest[kind]
    entries = []
    for name in names:
        if name == "eager":
            entries.append(eager_entry(model))
        elif name == "dbml-none":
            entries.append(dbml_entry(name, model, policy="none", budget=None, share=share, lm=lm))
        elif name.startswith(("dbml-tensile@", "dbml-stalls@")):
            kind, fraction = name[5:].split("@")[0], dict(TENSILE_BUDGETS)[name.split("@")[1]]
            floor = least(kind)
            budget = floor if fraction is None else int(fraction * vanilla)
            if budget < floor:
                entries.append(failed(name, "dbml", f"infeasible: the smallest feasible budget is "
                                      f"{floor / 2**20:.1f} MiB ({floor / vanilla:.0%} of vanilla)", budget))
                continue
            entries.append(_tensile(name, model, x, y, budget, fraction is None, share, lm, device, SETTINGS[kind]))
        elif name == "dbml-capuchin@50%":
            entries.append(dbml_entry(name, model, policy="capuchin", budget=int(0.5 * vanilla), share=share,
                                      lm=lm, device=device()))
        elif name == "dbml-vdnn":
            entries.append(dbml_entry(name, model, policy="vdnn", budget=None, share=share, lm=lm, device=device()))
        elif name in SEARCHED:   # planned now, as the tensile rows are: an infeasible budget is the row's error
            entries.append(_tensile(name, model, x, y, int(0.5 * vanilla), False, share, lm, device,
                                    policy=name[5:].split("@")[0]))
        else:
            kw = {"copy_seconds": emulate.copy_seconds(ctx.bandwidth)} if emulated else {}
            if name == "rockmate":
                kw["budget_bytes"] = int(0.5 * vanilla)
            entries.append(peer_entry(name, model, x, y, **kw))
    for e in entries:
        e.smallest = smallest.get("stalls" if e.method.startswith("dbml-stalls") else "tensile")
    return entries


def _tensile(name: str, model, x, y, budget: int, smallest: bool, share, lm, device, settings=None,
             policy: str = "tensile") -> Entry:
    """A tensile entry (or another planner's: ``policy``), planned now. At the smallest
    budget, the planner's latency model can change its mind between two plans (the
    predictor reads the machine's load), so a budget found feasible a moment ago may
    fail: take the new smallest, a few times."""
    for _ in range(5 if smallest else 1):
        e = dbml_entry(name, model, policy=policy, budget=budget, share=share, lm=lm, device=device(),
                       settings=settings)
        if not e.ok:
            return e
        try:
            t0 = time.perf_counter()
            e.runner.prepare(x, y)
            e.setup_seconds, e.prepared = time.perf_counter() - t0, True
            return e
        except InfeasibleBudget as err:
            e.close()
            if not smallest:
                return failed(name, "dbml", f"infeasible: {err}", budget)
            budget = max(err.min_budget, int(budget * 1.002) + 1)
    return failed(name, "dbml", f"infeasible: no plan at the smallest budget after 5 tries ({budget} B)", budget)


def _vanilla(model, x, y) -> int:
    probe = eager_entry(model)
    for _ in range(2):      # the optimizer state exists from the first step on
        probe.step(x, y)
    probe.measure(x, y, record=False)
    return probe.tracker.device_peak_bytes


def _rounds(entries: list[Entry], x, y, ctx: Context, record: bool, w: Workload) -> None:
    live = [e for e in entries if e.ok]

    def guarded(e: Entry, fn) -> None:
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - one method failing must not end the run
            e.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            e.close()
            if ctx.log:
                ctx.log(f"  {w.name} {e.method}: {e.error}")

    for _ in range(ctx.warmup):
        for e in [e for e in live if e.ok]:
            guarded(e, lambda e=e: e.step(x, y))
    for e in [e for e in live if e.ok]:
        guarded(e, lambda e=e: e.measure(x, y, record))
    for i in range(ctx.iters):
        order = [e for e in live if e.ok]
        order = order[i % len(order):] + order[:i % len(order)] if order else order
        for e in order:
            guarded(e, lambda e=e: e.seconds.append(e.step(x, y)))


def run_single(w: Workload, ctx: Context, *, mode: str = "cpu", methods=ALL_METHODS, batch: int | None = None,
               section: str = "single") -> tuple[list[dict], dict]:
    """Rows (one per method) and memory timelines of ``w`` under ``mode``."""
    x, y = w.batch_tensors(batch, ctx.seed)
    model = w.model(ctx.seed)
    torch.manual_seed(ctx.seed)
    vanilla = _vanilla(model, x, y)
    if mode != "cpu":
        methods = [m for m in methods if m in EMULABLE]
    record = w.name in ctx.record
    rows, timelines = [], {}
    for i, group in enumerate(_groups(methods, vanilla)):
        entries = _build(group, w, model, x, y, vanilla, ctx, mode)
        try:
            if i == 0 or any(e.ok for e in entries if e.method != "eager"):
                _rounds(entries, x, y, ctx, record, w)
            eager = next(e for e in entries if e.method == "eager")
            rows += [_row(e, eager, w, x, vanilla, ctx, mode, section) for e in entries if i == 0 or e is not eager]
        finally:
            for e in entries:
                e.close()
        timelines.update({f"{w.name}/{e.method}/{mode}": e.tracker.timeline for e in entries
                          if record and e.tracker is not None and e.tracker.timeline})
    return rows, timelines


def _groups(methods, vanilla: int) -> list[list[str]]:
    """The methods in groups that fit in memory together, each with eager (its EOR's
    denominator and the weights it is compared with). Every runner holds a model, its
    gradients and optimizer state: VGG-16's dozen would need 25 GiB."""
    others = [m for m in methods if m != "eager"]
    room = int(MEMORY_SHARE * _ram_bytes()) // max(int(1.3 * vanilla), 1) - 1
    size = max(1, min(len(others), room))
    return [["eager", *others[i:i + size]] for i in range(0, len(others), size)] or [["eager"]]


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _row(e: Entry, eager: Entry, w: Workload, x, vanilla: int, ctx: Context, mode: str, section: str) -> dict:
    row = {"section": section, "workload": w.name, "method": e.method, "family": e.family, "mode": mode,
           "batch": int(x.shape[0]), "jobs": 1, "threads": ctx.threads, "budget_bytes": e.budget,
           "vanilla_peak_bytes": vanilla, "peak_bytes": None, "host_peak_bytes": None, "ledger_peak_bytes": None,
           "vanilla_seconds": None, "seconds": None, "msr": None, "eor": None, "cbr": None,
           "first_iteration_eor": None, "setup_seconds": None, "swaps": None, "recomputes": None,
           "bit_identical": None, "within_budget": None, "error": e.error, "note": None,
           "smallest_feasible_bytes": e.smallest, "latency_model": ctx.lm_name}
    if not e.ok or not e.seconds or e.tracker is None:
        row["error"] = row["error"] or "no measurement"
        return row
    vtc = statistics.median(eager.seconds)
    peak = e.tracker.device_peak_bytes
    seconds = statistics.median(e.seconds)
    msr, eor = (vanilla - peak) / vanilla, seconds / vtc
    st = e.stats()
    row.update(peak_bytes=peak, host_peak_bytes=e.tracker.host_peak_bytes, ledger_peak_bytes=e.ledger_peak,
               vanilla_seconds=vtc, seconds=seconds, msr=msr, eor=eor,
               cbr=msr / eor if e.family != "eager" and e.method != "dbml-none" else None,
               swaps=st.get("swaps"), recomputes=st.get("recomputes"), note=st.get("note"))
    if e.family == "dbml":
        row["first_iteration_eor"] = e.first_seconds / vtc
        row["setup_seconds"] = e.setup_seconds
        row["plan_seconds"] = st.get("plan_seconds")
        row["late_swap_ins"] = st.get("late")
        row["bit_identical"] = bit_identical(e, eager)
        row["within_budget"] = e.budget is None or peak <= e.budget
    return row
