"""The step runner a training job runs its iterations through, and its memory figures.

``make_runner`` picks the runner for the job's policy (the TENSILE scheduler, or plain
PyTorch for 'eager') and, for a job sharing the device, joins it to the process's shared
MemoryScheduler. ``eager_peak`` measures the vanilla that MSR is reported against, and
``memory_summary`` turns the runner's figures into the train summary's.
"""

from __future__ import annotations

import copy
from typing import Protocol

import torch

from . import models
from .latency import latency_model
from .scheduler.errors import InfeasibleBudget, NotAdmitted
from .scheduler.execute.runner import ScheduledStep
from .scheduler.execute.step import EagerStep, StepRunner
from .scheduler.execute.updating import UpdateSettings
from .columns import MEMORY_FIELDS
from .scheduler.multijob.registry import device_ledger, shared_scheduler
from .scheduler.multijob.scheduler import MemoryScheduler
from .settings import default_budget

# Drift replans take at most this share of a job's time (UpdateSettings.max_plan_share).
MAX_PLAN_SHARE = 0.05

class JobHandle(Protocol):
    """The job a runner plans for, as the shared scheduler sees it (``dbml.jobs.Job`` is one)."""

    @property
    def name(self) -> str:
        """The job's name in the memory scheduler."""

    def cancelled(self) -> bool:
        """True once the job was cancelled: a job waiting for admission stops waiting."""

    def attach_scheduler(self, scheduler: MemoryScheduler) -> None:
        """The shared MemoryScheduler planning this job, to leave when the job ends."""

    def release_scheduler(self) -> None:
        """Leave the scheduler attached, if any: the job's memory is free."""


def make_runner(model: torch.nn.Module, loss_fn, spec, device: str, job: JobHandle,
                config: models.ModelConfig | None = None) -> StepRunner:
    """The step-runner boundary: the TENSILE scheduler, or plain PyTorch for policy 'eager'.

    A tensile job without a ``memory_budget`` of its own plans jointly with every other
    such job on the device through the process's shared MemoryScheduler, within the
    device budget (the ``memory_budget`` setting), waiting for admission when it does not
    fit beside the running ones. A job given its own budget, and the none/capuchin
    policies, plan alone. Jobs with the same model ``config`` share captured graphs.
    ``spec`` is the job's TrainSpec.
    """
    if spec.policy == "eager":
        return EagerStep(model, loss_fn, spec.optimizer_spec())
    estimator, how = latency_model(spec.latency_model, device, spec.torch_threads)
    shared = spec.policy == "tensile" and spec.memory_budget is None
    budget = spec.memory_budget or spec.device_budget or default_budget(device)
    planner = None
    if shared:
        scheduler = shared_scheduler(device, budget)
        planner = scheduler.planner_for(job.name, wait=True, cancelled=job.cancelled)
        job.attach_scheduler(scheduler)
    runner = ScheduledStep(model, loss_fn, spec.optimizer_spec(), policy=spec.policy, budget_bytes=budget,
                           device=device, job=job.name, latency_model=estimator, planner=planner,
                           ledger=device_ledger(device), share_graphs=config,
                           update=UpdateSettings(beta=spec.replan_beta, threshold=spec.replan_threshold,
                                                 max_plan_share=MAX_PLAN_SHARE))
    runner.latency_source = how   # the train summary reports it
    return runner


def prepare(runner: StepRunner, rows: int, width: int, label: torch.dtype, device: str) -> None:
    """Capture and plan the first batch's graph (``rows`` x ``width``) ahead of it, while
    DuckDB reads the rows (a no-op for eager)."""
    try:
        runner.prepare(torch.empty(rows, width, device=device), torch.empty(rows, dtype=label, device=device))
    except (NotAdmitted, InfeasibleBudget):
        pass   # the first step meets it again and reports it


# -- the vanilla and the summary ---------------------------------------------------------

def eager_peak(model: torch.nn.Module, loss_fn, spec, x: torch.Tensor, y: torch.Tensor) -> int:
    """The vanilla of MSR: eager PyTorch's peak on a copy of the model, over two iterations
    (the first creates the optimizer state, the second is a steady one)."""
    runner = EagerStep(copy.deepcopy(model), loss_fn, spec.optimizer_spec())
    runner.step(x, y)
    runner.step(x, y)
    return runner.stats()["measured_peak_bytes"]


def vanilla_peak(model: torch.nn.Module, loss_fn, spec, x: torch.Tensor, y: torch.Tensor) -> int | None:
    """The vanilla for the job's first batch: ``eager_peak`` on the CPU. On CUDA an eager
    copy would take device memory the shared budget does not know of (and the allocator's
    peak is every job's): there it is None, and the vanilla is the plan's release-only
    peak (``memory_summary``)."""
    return eager_peak(model, loss_fn, spec, x, y) if torch.device(x.device).type == "cpu" else None


def memory_summary(stats: dict, vanilla: int | None) -> dict:
    """The train summary's memory figures; MSR against eager PyTorch's measured peak."""
    out = {k: stats.get(k) for k in MEMORY_FIELDS}
    out["vanilla_peak_bytes"] = vanilla = vanilla or stats.get("vanilla_peak_bytes")
    measured = out["measured_peak_bytes"]
    out["msr"] = (vanilla - measured) / vanilla if vanilla and measured is not None else None
    out["planned_vanilla_peak_bytes"] = stats.get("vanilla_peak_bytes")
    out["policy"] = stats.get("policy", "eager")
    out["latency_model"] = stats.get("latency_model")
    out["budget_bytes"] = stats.get("budget_bytes")
    return out
