"""The methods ``python -m dbml bench`` compares, behind one interface: :class:`Entry`.

An entry wraps a runner (eager PyTorch, a dbml :class:`ScheduledStep`, or one of PyTorch's
own tools from :mod:`.peers`), steps it, measures one iteration's memory with the one
tracker every method shares (:mod:`.memtrack`), and hands back what a result row needs.
A method that cannot run here becomes an entry holding only its error, so the row says why.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from dbml.scheduler.errors import InfeasibleBudget
from dbml.scheduler.execute.measure import live_tensors
from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.execute.updating import UpdateSettings

from . import memtrack

__all__ = ["Entry", "SPEC", "loss_fn", "eager_entry", "dbml_entry", "peer_entry", "failed", "smallest_budget",
           "weights"]

SPEC = OptimizerSpec("adam", lr=1e-3)
loss_fn = torch.nn.functional.cross_entropy


@dataclass
class Entry:
    method: str                 # the row's method, e.g. "dbml-tensile@50%"
    family: str                 # "eager", "dbml" or "peer"
    runner: object | None       # None: the method could not run (error says why)
    budget: int | None = None
    error: str | None = None
    emulable: bool = True
    seconds: list[float] = field(default_factory=list)   # timed iterations
    first_seconds: float | None = None                  # the first iteration (after prepare)
    setup_seconds: float = 0.0                          # prepare(): planning before the first batch
    tracker: memtrack.MemoryTracker | None = None
    ledger_peak: int | None = None
    losses: list[float] = field(default_factory=list)
    prepared: bool = False                              # prepare() already ran (timed in setup_seconds)
    smallest: int | None = None                         # the workload's smallest feasible budget (bytes)

    @property
    def ok(self) -> bool:
        return self.runner is not None and self.error is None

    def step(self, x, y) -> float:
        """One iteration; its wall seconds."""
        if self.first_seconds is None and isinstance(self.runner, ScheduledStep) and not self.prepared:
            t0 = time.perf_counter()
            self.runner.prepare(x, y)
            self.setup_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        loss = self.runner.step(x, y)
        seconds = time.perf_counter() - t0
        if self.first_seconds is None:
            self.first_seconds = seconds
        self.losses.append(float(loss))
        return seconds

    def measure(self, x, y, record: bool) -> None:
        """One iteration under the memory tracker (not timed: the tracker slows every op)."""
        r = self.runner
        if isinstance(r, ScheduledStep):
            self.tracker = memtrack.measure_step(lambda: self.step(x, y), [x, y], record=record,
                                                 instrument=lambda t: memtrack.tracking_dbml(r, t))
            self.ledger_peak = max(e.iteration_peak for e in r.executors())
        else:
            self.tracker = memtrack.measure_step(lambda: self.step(x, y),
                                                 live_tensors(r.model, r.optimizer, x, y), record=record)

    def stats(self) -> dict:
        r = self.runner
        if isinstance(r, ScheduledStep):
            st = r.stats()
            n = max(st["iterations"], 1)
            return {"swaps": st["swaps"] / n, "recomputes": st["recomputes"] / n,
                    "plan_seconds": st["plan_seconds"], "late": (st["late_swap_ins"] + st["passive_swaps"]) / n,
                    "planned_peak_bytes": st["planned_peak_bytes"]}
        if hasattr(r, "stats"):
            return dict(r.stats())
        return {}

    def close(self) -> None:
        if self.runner is not None and hasattr(self.runner, "close"):
            self.runner.close()


def failed(method: str, family: str, error: str, budget: int | None = None) -> Entry:
    return Entry(method, family, None, budget=budget, error=error)


def eager_entry(model: torch.nn.Module) -> Entry:
    return Entry("eager", "eager", EagerStep(copy.deepcopy(model), loss_fn, SPEC, measured_steps=0), emulable=False)


def dbml_entry(method: str, model: torch.nn.Module, *, policy: str, budget: int | None, share, lm,
               device="cpu", settings=None) -> Entry:
    try:
        runner = ScheduledStep(copy.deepcopy(model), loss_fn, SPEC, policy=policy, budget_bytes=budget,
                               latency_model=lm, share_graphs=share, device=device, planner_settings=settings,
                               update=UpdateSettings(max_plan_share=0.05))
    except Exception as e:  # noqa: BLE001 - the row records why the method could not run
        return failed(method, "dbml", f"{type(e).__name__}: {e}", budget)
    memtrack.instrument(runner)   # before its first step: every host buffer it makes is tagged host
    return Entry(method, "dbml", runner, budget=budget, emulable=policy != "none")


def peer_entry(name: str, model: torch.nn.Module, x, y, **kw) -> Entry:
    try:
        from . import peers
        runner = peers.make_peer(name, copy.deepcopy(model), SPEC, x, y, **kw)
    except Exception as e:  # noqa: BLE001 - PeerUnavailable and anything else: the row says why
        return failed(name, "peer", f"{type(e).__name__}: {e}")
    return Entry(name, "peer", runner, emulable=bool(getattr(runner, "emulable", False)))


def smallest_budget(model: torch.nn.Module, x, y, share, lm, device="cpu", settings=None) -> int:
    """The smallest budget TENSILE's planner can meet for this model and batch (bytes).

    The planner's ``min_budget`` (from a probe at 1 byte) is an estimate: planning at it
    may still fail by a few hundred kB (VGG-16: 652.0 MB asked, 652.1 MB needed), so it
    is confirmed by planning at it, a few times at most."""
    budget = 1
    for _ in range(5):
        probe = ScheduledStep(copy.deepcopy(model), loss_fn, SPEC, budget_bytes=budget, latency_model=lm,
                              share_graphs=share, device=device, planner_settings=settings)
        try:
            probe.prepare(x, y)
            return budget
        except InfeasibleBudget as e:
            budget = max(e.min_budget, int(budget * 1.002) + 1)
        finally:
            probe.close()
    return budget


def weights(entry: Entry) -> list[torch.Tensor]:
    """The trained parameters and buffers of ``entry``'s model (dbml writes them back first)."""
    r = entry.runner
    if isinstance(r, ScheduledStep):
        r.finish()
    model = r.model
    return [t.detach() for t in (*model.parameters(), *model.buffers())]


def bit_identical(a: Entry, b: Entry) -> bool:
    wa, wb = weights(a), weights(b)
    return len(wa) == len(wb) and all(torch.equal(p, q) for p, q in zip(wa, wb)) and a.losses == b.losses

