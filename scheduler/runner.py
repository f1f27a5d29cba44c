"""The scheduled step runner: a StepRunner that trains under a TENSILE plan.

``ScheduledStep(model, loss_fn, spec, policy=..., budget_bytes=...)`` captures the
training step (one graph per batch shape), builds its access sequence from latency
estimates, asks the planner for a plan within the budget, and runs every iteration
through the :class:`~.executor.Executor`. Results equal eager PyTorch's bit for bit on
CPU, whatever the policy.

Switches: ``DBML_NO_SCHEDULER=1`` forces policy ``"none"`` (release after last use
only, no budget); ``DBML_DEBUG=1`` prints the one-line summary to stderr after each new
plan, e.g. ``peak 912 MB -> 431 MB, 37 swaps, 4 recomputes, plan 0.21 s``.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from .access import build_sequence
from .capture import CapturedStep, GraphCache, initial_states, state_keys, trainable
from .devices import Device, as_view, make_device
from .estimate import LatencyModel, RooflineModel
from .executor import ExecState, Executor, Program
from .optim import OptimizerSpec
from .sequence import AccessSequence, EventKind, Plan
from .step import LossFn

__all__ = ["ScheduledStep", "scheduler_disabled", "summary_line"]

POLICIES = ("tensile", "none")


def scheduler_disabled() -> bool:
    return os.environ.get("DBML_NO_SCHEDULER", "").strip() not in ("", "0", "false", "no")


def _debug() -> bool:
    return os.environ.get("DBML_DEBUG", "").strip() not in ("", "0", "false", "no")


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB" if n >= 10e6 else f"{n / 1e6:.2f} MB"


def summary_line(stats: dict) -> str:
    return (f"peak {_mb(stats['vanilla_peak_bytes'])} -> {_mb(stats['measured_peak_bytes'])}, "
            f"{stats['swaps']} swaps, {stats['recomputes']} recomputes, plan {stats['plan_seconds']:.2f} s")


class ScheduledStep:
    """A :class:`~.step.StepRunner` executing the captured step under a memory plan.

    ``budget_bytes`` is the device memory the job may use (None: no limit). The planner
    raises ``InfeasibleBudget`` (naming the smallest feasible budget) when it cannot be
    met. ``latency_model`` defaults to the roofline estimator; ``log=True`` keeps the
    executor's event log (``self.executors()[i].event_log``) for invariant checks.
    """

    def __init__(self, model: torch.nn.Module, loss_fn: LossFn, spec: OptimizerSpec, *,
                 policy: str = "tensile", budget_bytes: int | None = None, device: str = "cpu",
                 job: str = "job", latency_model: LatencyModel | None = None, log: bool = False,
                 planner_settings=None):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
        self.policy = "none" if scheduler_disabled() else policy
        self.model, self.loss_fn, self.spec, self.job = model, loss_fn, spec, job
        self.budget_bytes, self.log, self.planner_settings = budget_bytes, log, planner_settings
        self.device: Device = make_device(device)
        self.latency_model = latency_model or RooflineModel(device=str(self.device.torch_device))
        self.graphs = GraphCache(model, loss_fn, spec, job=job)
        self._executors: dict[tuple, Executor] = {}
        self.plans: dict[tuple, Plan] = {}
        self.sequences: dict[tuple, AccessSequence] = {}
        self._last: Executor | None = None
        self.plan_seconds = 0.0
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

    # -- planning --------------------------------------------------------------------
    def _executor(self, x: torch.Tensor, y: torch.Tensor) -> Executor:
        captured = self.graphs.get(x, y)
        key = captured.signature
        if key not in self._executors:
            self._executors[key] = self._build(captured)
        return self._executors[key]

    def _build(self, captured: CapturedStep) -> Executor:
        from .planner import plan  # the planning passes; imported late (optional at import time)
        seq = build_sequence(captured, self.latency_model, self.job)
        budget = self.budget_bytes if self.policy == "tensile" and self.budget_bytes is not None else sys.maxsize
        t0 = time.perf_counter()
        the_plan = plan(seq, budget, policy=self.policy, settings=self.planner_settings)
        self.plan_seconds += time.perf_counter() - t0
        self.plans[captured.signature] = the_plan
        self.sequences[captured.signature] = seq
        # host copies live until the iteration ends: one pinned buffer per swap-out, ahead
        self.device.reserve_host([seq.tensors[e.tensor].nbytes for e in the_plan.events
                                  if e.kind is EventKind.SWAP_OUT])
        # The plan's peak is a promise: where copies run slower than planned, compute
        # waits for them rather than exceed it (and never exceeds the budget).
        limit = min(budget, the_plan.peak_bytes) if self.policy == "tensile" and budget != sys.maxsize else None
        return Executor(Program(captured, seq), the_plan, self.device, log=self.log, budget_bytes=limit)

    # -- StepRunner ------------------------------------------------------------------
    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        fresh = len(self._executors)
        executor = self._executor(x, y)
        if executor is not self._last:   # one graph's reuse pool must not sit beside another's
            if self._last is not None:
                self._last.release_pool()
            self._last = executor
        loss = executor.run(self.state, x, y)
        if _debug() and len(self._executors) != fresh:
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
        return list(self._executors.values())

    def close(self) -> None:
        for e in self._executors.values():
            e.close()

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
            "passive_swaps": totals.get("passive_swaps", 0),
            "late_swap_ins": totals.get("late_swap_ins", 0),
            "passive_recomputes": totals.get("passive_recomputes", 0),
            "setup_swaps": totals.get("setup_swaps", 0),
            "budget_waits": totals.get("budget_waits", 0),
            "iterations": totals.get("iterations", 0),
            "graphs": len(self.graphs),
            "plan_seconds": self.plan_seconds,
            "planned_extra_seconds": sum(p.extra_time for p in plans),
        }
        if self.device.type == "cuda":
            out["device_max_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device.torch_device)
        out["summary"] = summary_line(out)
        return out
