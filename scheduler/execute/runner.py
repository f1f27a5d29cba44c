"""The scheduled step runner: a StepRunner that trains under a TENSILE plan.

``ScheduledStep(model, loss_fn, spec, policy=..., budget_bytes=...)`` captures the
training step (one graph per batch shape), builds its access sequence from latency
estimates, asks the planner for a plan within the budget, and runs every iteration
through the :class:`~.executor.Executor`. Results equal eager PyTorch's bit for bit on
CPU, whatever the policy.

Policies:

* ``"tensile"``: plan from the estimates before the first iteration (cold start by the
  latency model), then keep the plan up to date (below);
* ``"capuchin"``: the passive-mode peer (Capuchin, as TENSILE's paper reproduces it):
  the first iteration of each graph runs with no plan, only the budget: an allocation
  that would pass it swaps tensors out on demand, least recently used first, and a
  swapped tensor is swapped in on demand when next read (``passive_swaps``). That
  iteration's measured op latencies are the observation; the next iteration runs a plan
  made from it — by the TENSILE planner, standing in for Capuchin's own (which also
  plans swaps and recomputation from the measured access pattern). Eviction stays armed
  as a fallback;
* ``"none"``: release after last use only, no budget.

Plan updating (TENSILE IV-E, :mod:`.updating`): after every iteration the executor's
measured op latencies are folded into a per-op moving average; when their sum drifts
past ``UpdateSettings.threshold`` from the sum the plan was made with, the sequence is
retimed with the averages and replanned (``stats()["replans"]``). A new plan — from a
replan, :meth:`ScheduledStep.offer_plan`, or a newer version of an external planner —
takes effect at the next iteration boundary, never during an iteration.

``planner=``: a callable ``(AccessSequence) -> Plan`` used instead of
``planner.plan(seq, budget, ...)`` for every plan of this runner (a shared multi-job
scheduler). If it also has ``version() -> int`` and ``latest(seq) -> Plan``, the runner
compares the version at each iteration boundary and takes ``latest(seq)`` when it moved.

Switches: ``DBML_NO_SCHEDULER=1`` forces policy ``"none"`` (release after last use
only, no budget); ``DBML_DEBUG=1`` prints the one-line summary to stderr after each new
plan, e.g. ``peak 912 MB -> 431 MB, 37 swaps, 4 recomputes, plan 0.21 s``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import Callable, Hashable

import torch

from ..graph.access import build_sequence
from ..graph.capture import CapturedStep, initial_states, state_keys, trainable
from ..graph.graphs import GraphCache
from .devices import Device, as_view, make_device
from ..latency.estimate import LatencyModel, RooflineModel
from .executor import ExecState, Executor, Program
from ..multijob.ledger import DeviceLedger, JobAccount
from ..graph.optim import OptimizerSpec
from ..graph.sequence import AccessSequence, EventKind, Plan
from .step import LossFn
from .updating import LatencyTracker, UpdateSettings, retime
from .. import config

__all__ = ["ScheduledStep", "summary_line", "POLICIES"]

POLICIES = ("tensile", "capuchin", "none")
Planner = Callable[[AccessSequence], Plan]


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB" if n >= 10e6 else f"{n / 1e6:.2f} MB"


def summary_line(stats: dict) -> str:
    return (f"peak {_mb(stats['vanilla_peak_bytes'])} -> {_mb(stats['measured_peak_bytes'])}, "
            f"{stats['swaps']} swaps, {stats['recomputes']} recomputes, plan {stats['plan_seconds']:.2f} s")


class _Graph:
    """One captured graph's schedule: its executor, the plan in effect and the sequence
    it was made from, the latency tracker, and a plan waiting for the next boundary."""

    def __init__(self, executor: Executor, plan: Plan, seq: AccessSequence, tracker: LatencyTracker,
                 passive: bool):
        self.executor, self.plan, self.seq, self.tracker = executor, plan, seq, tracker
        self.passive = passive                  # capuchin: no plan yet, evicting on demand
        self.pending: tuple[Plan, AccessSequence] | None = None


class ScheduledStep:
    """A :class:`~.step.StepRunner` executing the captured step under a memory plan.

    ``budget_bytes`` is the device memory the job may use (None: no limit). The planner
    raises ``InfeasibleBudget`` (naming the smallest feasible budget) when it cannot be
    met. ``latency_model`` defaults to the roofline estimator; ``log=True`` keeps the
    executor's event log (``self.executors()[i].event_log``) for invariant checks.
    ``update`` sets plan updating (:class:`~.updating.UpdateSettings`; its defaults:
    ``beta=0.9``, ``threshold=0.3``; ``UpdateSettings(enabled=False)`` turns it off);
    ``planner`` replaces the built-in planning call (see the module docstring).
    ``ledger``: the device's :class:`~.memory.DeviceLedger` (default: the planner's, if
    it has one), told of every change of this job's device memory, for the measured
    global peak of concurrent jobs. ``share_graphs``: a name for the model's
    architecture under which captured graphs are shared with other jobs
    (:class:`~.capture.GraphCache`). ``iteration_plans`` lists the plan each iteration
    ran under, in order.
    """

    def __init__(self, model: torch.nn.Module, loss_fn: LossFn, spec: OptimizerSpec, *,
                 policy: str = "tensile", budget_bytes: int | None = None, device: str = "cpu",
                 job: str = "job", latency_model: LatencyModel | None = None, log: bool = False,
                 planner_settings=None, planner: Planner | None = None,
                 update: UpdateSettings | None = None, ledger: DeviceLedger | None = None,
                 share_graphs: Hashable | None = None):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
        if policy == "capuchin" and budget_bytes is None and planner is None:
            raise ValueError("policy 'capuchin' needs budget_bytes: passive mode evicts against a budget")
        self.policy = "none" if config.scheduler_disabled() else policy
        self.model, self.loss_fn, self.spec, self.job = model, loss_fn, spec, job
        self.budget_bytes, self.log, self.planner_settings = budget_bytes, log, planner_settings
        self.planner, self.update = planner, update or UpdateSettings()
        self.device: Device = make_device(device)
        self.latency_model = latency_model or RooflineModel(device=str(self.device.torch_device))
        self.graphs = GraphCache(model, loss_fn, spec, job=job, share=share_graphs)
        ledger = ledger if ledger is not None else getattr(planner, "ledger", None)
        self.account: JobAccount | None = ledger.account(job) if ledger is not None else None
        self._graphs: dict[Hashable, _Graph] = {}
        self._lock = threading.Lock()           # offer_plan may come from another thread
        self._planner_version = self._external_version()
        self._last: Executor | None = None
        self._reserved: Counter = Counter()   # host buffer sizes reserved ahead so far
        self.iteration_plans: list[Plan] = []
        self.plan_seconds = 0.0
        self.replans = 0            # replans after latencies drifted (plan updating)
        self.replan_seconds = 0.0   # ... and the time they took
        self.deferred_replans = 0   # drifts that waited for UpdateSettings.max_plan_share
        self._started: float | None = None   # perf_counter() at the first step
        self.failed_replans = 0     # ... that found no plan within the budget (old plan kept)
        self.plan_changes = 0       # plans taken at an iteration boundary, from any source
        self.state = self._initial_state()

    # -- state -----------------------------------------------------------------------
    def _initial_state(self) -> ExecState:
        params = [p.detach() for p in self.model.parameters()]
        buffers = [b.detach() for b in self.model.buffers()]
        states = initial_states(self.spec, self.model)
        return ExecState(params + buffers + states)

    def _value(self, i: int, like: torch.Tensor) -> torch.Tensor:
        """State ``i`` as a device tensor (brought back from the host store if there)."""
        v = self.state.values[i]
        if v is None:
            host = self.state.host.pop(i)
            flat = self.device.alloc(host.numel())
            flat.copy_(host)
            self.device.free_host(host)
            v = as_view(flat, like.dtype, tuple(like.shape), tuple(like.stride()), 0)
            self.state.values[i] = v
        return v

    # -- views kept for callers and tests ----------------------------------------------
    @property
    def plans(self) -> dict[Hashable, Plan]:
        """Per graph signature, the plan in effect."""
        return {k: g.plan for k, g in self._graphs.items()}

    @property
    def sequences(self) -> dict[Hashable, AccessSequence]:
        """Per graph signature, the access sequence the plan in effect was made from."""
        return {k: g.seq for k, g in self._graphs.items()}

    # -- planning --------------------------------------------------------------------
    def _make_plan(self, seq: AccessSequence) -> Plan:
        t0 = time.perf_counter()
        try:
            if self.planner is not None:
                return self.planner(seq)
            from ..plan.planner import plan  # the planning passes; imported late (optional at import time)
            if self.policy == "none" or self.budget_bytes is None:
                return plan(seq, sys.maxsize, policy="none" if self.policy == "none" else "tensile",
                            settings=self.planner_settings)
            return plan(seq, self.budget_bytes, policy="tensile", settings=self.planner_settings)
        finally:
            self.plan_seconds += time.perf_counter() - t0

    def _limit(self, plan: Plan, passive: bool) -> int | None:
        """The executor's hard limit. TENSILE: the plan's peak is a promise, so where
        copies run slower than planned compute waits for them rather than exceed it (and
        never exceeds the budget). Capuchin: the budget, which eviction defends."""
        if self.policy == "none":
            return None
        if self.policy == "capuchin" or passive:
            return self.budget_bytes
        if self.budget_bytes is None and self.planner is None:
            return None
        return min(plan.peak_bytes, self.budget_bytes if self.budget_bytes is not None else plan.peak_bytes)

    def _graph(self, x: torch.Tensor, y: torch.Tensor) -> tuple[Hashable, _Graph]:
        captured = self.graphs.get(x, y)
        key = captured.signature
        if key not in self._graphs:
            self._graphs[key] = self._build(captured)
        return key, self._graphs[key]

    def _build(self, captured: CapturedStep) -> _Graph:
        from ..plan.planner import InfeasibleBudget, plan
        seq = build_sequence(captured, self.latency_model, self.job)
        passive = self.policy == "capuchin"
        limit = None
        if passive:   # no plan: release after last use, evict against the budget
            the_plan = plan(seq, sys.maxsize, policy="none", settings=self.planner_settings)
        else:
            try:
                the_plan = self._make_plan(seq)
            except InfeasibleBudget:
                if not self._graphs or self.policy != "tensile":
                    raise
                # A further graph (the last, smaller batch: faster ops hide fewer copies)
                # that no plan fits beside the other jobs: it runs in passive mode within
                # the largest limit the job's planned graphs have, evicting on demand,
                # and is planned again from what it measures (see _after_iteration).
                limit = max(g.executor.budget or g.plan.peak_bytes for g in self._graphs.values())
                the_plan = plan(seq, sys.maxsize, policy="none", settings=self.planner_settings)
                passive = True
        self._reserve(seq, the_plan)
        executor = Executor(Program(captured, seq), the_plan, self.device, log=self.log,
                            budget_bytes=limit if limit is not None else self._limit(the_plan, passive),
                            evict=passive, account=self.account)
        return _Graph(executor, the_plan, seq, LatencyTracker(seq, self.update), passive)

    def _reserve(self, seq: AccessSequence, plan: Plan) -> None:
        """Host copies live until the iteration ends: one pinned buffer per swap-out,
        allocated ahead; a later plan adds only the buffers no earlier plan reserved."""
        want = Counter(seq.tensors[e.tensor].nbytes for e in plan.events if e.kind is EventKind.SWAP_OUT)
        self.device.reserve_host(list((want - self._reserved).elements()))
        self._reserved |= want

    # -- plan updating and hand-over -------------------------------------------------
    def _after_iteration(self, g: _Graph) -> None:
        """Fold the measured latencies in; replan when they drifted (or, in passive mode,
        plan from the observation). The plan waits in ``g.pending`` for the boundary."""
        if self.policy == "none" or (self.budget_bytes is None and self.planner is None):
            return   # no budget: the plan only releases, whatever the latencies
        measured = g.executor.op_latencies()
        if g.passive:
            from ..plan.planner import InfeasibleBudget
            observed = retime(g.seq, measured)
            try:
                self._offer(g, self._make_plan(observed), observed)
            except InfeasibleBudget:
                pass   # no plan fits: stay in passive mode, observe again next iteration
            return
        if g.tracker.observe(measured, g.executor.copy_bandwidth()):
            from ..plan.planner import InfeasibleBudget
            share = self.update.max_plan_share
            if share is not None and self.replan_seconds > share * (time.perf_counter() - self._started):
                self.deferred_replans += 1   # the drift stays: replan once the share allows it
                return
            seq = retime(g.seq, g.tracker.latencies,
                         g.tracker.bandwidth if self.update.copy_bandwidth else None)
            t0 = self.plan_seconds
            try:
                new = self._make_plan(seq)
            except InfeasibleBudget:
                # the current plan still fits (its peak is a ledger bound); only its
                # timing is stale. Measure drift from the new latencies from now on.
                self.failed_replans += 1
                g.tracker.rebase(seq)
                return
            finally:
                self.replan_seconds += self.plan_seconds - t0
            self.replans += 1
            self._offer(g, new, seq)

    def _offer(self, g: _Graph, plan: Plan, seq: AccessSequence) -> None:
        with self._lock:
            g.pending = (plan, seq)

    def offer_plan(self, plan: Plan, seq: AccessSequence | None = None,
                   signature: Hashable | None = None) -> None:
        """Hand the runner a plan from outside; it takes effect at the next iteration
        boundary of its graph. ``seq``: the sequence it was made from (default: the one
        the current plan was made from); ``signature``: the graph (default: the graph of
        the last step). Thread-safe."""
        if signature is None:
            signature = next((k for k, g in list(self._graphs.items()) if g.executor is self._last), None)
        if signature not in self._graphs:
            raise ValueError(f"offer_plan(): job {self.job!r} has no graph {signature!r}; "
                             f"known: {list(self._graphs)}")
        if plan.job != self.job:
            raise ValueError(f"offer_plan(): the plan is for job {plan.job!r}, this runner runs {self.job!r}")
        g = self._graphs[signature]
        self._offer(g, plan, seq if seq is not None else g.seq)

    def _versioned(self) -> bool:
        return callable(getattr(self.planner, "version", None)) and callable(getattr(self.planner, "latest", None))

    def _external_version(self):
        if not self._versioned():
            return None
        try:
            return self.planner.version()
        except LookupError:   # the job is not registered with it yet
            return None

    def _boundary(self, g: _Graph) -> None:
        """An iteration boundary: adopt a pending plan, or a newer external one."""
        if self._versioned():
            version = self._external_version()
            if version != self._planner_version:
                self._planner_version = version
                try:
                    latest = self.planner.latest(g.seq)
                except LookupError:   # it has no plan for this graph (yet)
                    latest = g.plan
                if latest is not g.plan:   # it supersedes a pending replan of our own
                    made_from = getattr(self.planner, "made_from", None)
                    self._offer(g, latest, made_from(g.seq) if made_from is not None else
                                g.pending[1] if g.pending is not None else g.seq)
        with self._lock:
            pending, g.pending = g.pending, None
        if pending is not None:
            self._adopt(g, *pending)
        if callable(getattr(self.planner, "applied", None)):
            self.planner.applied()   # after settling: the room a smaller plan frees is free now

    def _adopt(self, g: _Graph, plan: Plan, seq: AccessSequence) -> None:
        self._reserve(seq, plan)
        g.executor.set_plan(plan, seq, budget_bytes=self._limit(plan, False))
        g.executor.settle(self.state)   # hold no more than the new plan allows before saying so
        g.plan, g.seq, g.passive = plan, seq, False
        g.tracker.rebase(seq)
        self.plan_changes += 1
        if config.debug():
            print(f"dbml.scheduler[{self.job}]: new plan: {self.stats()['summary']}", file=sys.stderr)

    # -- StepRunner ------------------------------------------------------------------
    def prepare(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Everything the first iteration of this batch shape needs before it runs: capture
        the graph, estimate its latencies, make its plan (TENSILE: from the estimates,
        which is the point of the predictor; Capuchin: release only, no plan yet), admit
        it under a shared planner, build its executor. :meth:`step` does this the first
        time it sees a shape; calling it ahead, while the data is still being read, takes
        it off the first iteration. ``x`` and ``y`` only give shapes and dtypes (e.g.
        ``torch.empty``)."""
        self._graph(x, y)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        fresh = len(self._graphs)
        if self._started is None:
            self._started = time.perf_counter()
        _, g = self._graph(x, y)
        executor = g.executor
        if executor is not self._last:   # one graph's reuse pool must not sit beside another's
            if self._last is not None:
                self._last.release_pool()
            self._last = executor
        self._boundary(g)
        self.iteration_plans.append(g.plan)
        loss = executor.run(self.state, x, y)
        self._after_iteration(g)
        if config.debug() and len(self._graphs) != fresh:
            print(f"dbml.scheduler[{self.job}]: {self.stats()['summary']}", file=sys.stderr)
        return loss.detach()

    def finish(self) -> None:
        """Write the trained parameters and buffers back into the model."""
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        with torch.no_grad():
            for i, t in enumerate(tensors):
                v = self._value(i, t)
                if v.data_ptr() != t.data_ptr() or v.shape != t.shape:
                    t.data = v

    def optimizer_state(self) -> list[dict[str, torch.Tensor]]:
        """Per trainable parameter, its optimizer state (as torch.optim would hold it)."""
        params = [p for p, t in zip(self.model.parameters(), trainable(self.model)) if t]
        keys = state_keys(self.spec)
        base = len(list(self.model.parameters())) + len(list(self.model.buffers()))
        out = []
        for j, p in enumerate(params):
            out.append({k: self._value(base + j * len(keys) + m, p if k != "step" else torch.zeros(()))
                        for m, k in enumerate(keys)})
        return out

    def executors(self) -> list[Executor]:
        return [g.executor for g in self._graphs.values()]

    def close(self) -> None:
        """Stop the copy threads; the job's account in the device ledger closes (call it
        once the job's device memory is given back, e.g. after :meth:`finish`)."""
        for g in self._graphs.values():
            g.executor.close()
        if self.account is not None:
            self.account.close()

    def stats(self) -> dict:
        execs = self.executors()
        totals: dict[str, int] = {}
        for e in execs:
            for k, v in e.totals.items():
                totals[k] = totals.get(k, 0) + v
        plans = list(self.plans.values())
        out = {
            "policy": self.policy,
            "budget_bytes": self.budget_bytes,
            "vanilla_peak_bytes": max((p.vanilla_peak_bytes for p in plans), default=0),
            "planned_peak_bytes": max((p.peak_bytes for p in plans), default=0),
            "measured_peak_bytes": max((e.peak_bytes for e in execs), default=0),
            # ledger + the executor's pool of released buffers (like CUDA's reserved)
            "reserved_peak_bytes": max((max(e.peak_bytes, e.reserved_peak) for e in execs), default=0),
            "swaps": totals.get("swap_outs", 0) + totals.get("swap_ins", 0),
            "swap_outs": totals.get("swap_outs", 0),
            "swap_ins": totals.get("swap_ins", 0),
            "recomputes": totals.get("recomputes", 0),
            # passive: copies made on demand, not by a plan (swap-ins of tensors an op
            # needed and found on the host; swap-outs evicting over the budget)
            "passive_swaps": totals.get("passive_swaps", 0) + totals.get("passive_swap_outs", 0),
            "passive_swap_ins": totals.get("passive_swaps", 0),
            "passive_swap_outs": totals.get("passive_swap_outs", 0),
            "late_swap_ins": totals.get("late_swap_ins", 0),
            "passive_recomputes": totals.get("passive_recomputes", 0),
            "setup_swaps": totals.get("setup_swaps", 0),
            "budget_waits": totals.get("budget_waits", 0),
            "iterations": totals.get("iterations", 0),
            "graphs": len(self.graphs),
            "plan_seconds": self.plan_seconds,
            "replans": self.replans,
            "failed_replans": self.failed_replans,
            "deferred_replans": self.deferred_replans,
            "replan_seconds": self.replan_seconds,
            "plan_changes": self.plan_changes,
            "planned_extra_seconds": sum(p.extra_time for p in plans),
        }
        if self.device.type == "cuda":
            out["device_max_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device.torch_device)
        out["summary"] = summary_line(out)
        return out
