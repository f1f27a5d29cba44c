"""The step runner a training job runs its iterations through, and its memory figures.

``make_runner`` picks the runner for the job's policy (the TENSILE scheduler, for a
data-parallel worker with its all-reduce in the graph, or plain PyTorch for 'eager') and,
for a job sharing the device, joins it to the process's shared MemoryScheduler. ``check_model_fits`` refuses, before the model's parameters exist, a
model whose parameters and optimizer state alone exceed the device's memory, and
``check_plan_fits`` a large model no plan fits in its budget. ``memory_summary`` turns
the runner's figures into the train summary's; the vanilla MSR is reported against is the plan's analysed unscheduled peak (release after
last use, on the captured graph: no memory), or, with ``measure_vanilla``, eager
PyTorch's peak measured on a copy of the model (``eager_peak``).
"""

from __future__ import annotations

import copy
import os
import re
import dataclasses
from dataclasses import dataclass
from typing import Hashable, Protocol

import torch

from . import models
from .dataparallel import DataParallelStep
from .latency import latency_model
from ..scheduler.execute.devices import CpuDevice
from ..scheduler.execute.runner import FIRST_MARGIN, ScheduledStep, bounce_reserve
from ..scheduler.execute.spill import SpillFile, sweep_stale, tier_of
from ..scheduler.execute.step import EagerStep, StepRunner
from ..scheduler.execute.updating import UpdateSettings
from .columns import MEMORY_FIELDS
from ..errors import InvalidArgument
from ..scheduler.errors import InfeasibleBudget
from ..scheduler import config as scheduler_config
from ..scheduler.graph.access import build_sequence
from ..scheduler.graph.sequence import AccessSequence
from ..scheduler.graph.capture import state_keys
from ..scheduler.graph.optim import OptimizerSpec
from ..scheduler.graph.graphs import GraphCache
from ..scheduler.latency.estimate import RooflineModel
from ..scheduler.plan.planner import plan, tensor_granularity_floor
from ..scheduler.multijob.registry import device_ledger, shared_scheduler
from ..scheduler.multijob.scheduler import MemoryScheduler
from .settings import default_budget, parse_bytes

# Drift replans take at most this share of a job's time (UpdateSettings.max_plan_share).
MAX_PLAN_SHARE = 0.05
# A model whose parameters and optimizer state take this share of its budget or more is
# planned on the meta device before it is built (``check_plan_fits``): building it first
# would allocate a large part of the budget, and more than the budget once its plan
# fails (the smallest plans found need about 1.3-2x parameters plus state). A smaller
# model is built first: the second capture would cost time for memory that is small.
LARGE_MODEL_SHARE = 0.25


@dataclass(frozen=True)
class RunnerParams:
    """What the runner and the checks before it use of a job (``of``), not its whole TrainSpec."""
    job: str                        # the model's name: its captured graphs' (check_plan_fits)
    policy: str                     # train()'s policy
    workers: int                    # > 1: one worker of a data-parallel job
    optimizer: OptimizerSpec        # what the runner steps with (a stacked model's: dbml.fusion)
    memory_budget: int | None       # the job's own (memory_budget :=); None: the device's
    shared_budget: int | None       # the memory_budget setting (dbml_memory_budget): the device's jobs'; None: unset
    latency_model: str              # the latency_model setting
    torch_threads: int              # the torch_threads setting
    replan_beta: float              # the replan_beta setting
    replan_threshold: float         # the replan_threshold setting
    measure_vanilla: bool           # measure_vanilla :=

    @classmethod
    def of(cls, spec, *, optimizer: OptimizerSpec | None = None) -> RunnerParams:
        """``spec``'s (a TrainSpec whose lr is resolved); ``optimizer``: when not its own."""
        s = spec.settings
        return cls(spec.model, spec.policy, spec.workers, optimizer or spec.optimizer_spec(), spec.memory_budget,
                   s.memory_budget, s.latency_model, s.torch_threads, s.replan_beta, s.replan_threshold,
                   spec.measure_vanilla)


def shares_device(policy: str, memory_budget: int | None) -> bool:
    """Whether a job plans jointly with the device's other jobs, within their shared budget
    (``make_runner``): a tensile job without a ``memory_budget`` of its own."""
    return policy == "tensile" and memory_budget is None


class JobHandle(Protocol):
    """The job a runner plans for, as the shared scheduler sees it (``dbml.core.jobs.Job`` is one)."""

    @property
    def name(self) -> str:
        """The job's name in the memory scheduler."""

    def cancelled(self) -> bool:
        """True once the job was cancelled: a job waiting for admission stops waiting."""

    def attach_scheduler(self, scheduler: MemoryScheduler) -> None:
        """The shared MemoryScheduler planning this job, to leave when the job ends."""

    def release_scheduler(self) -> None:
        """Leave the scheduler attached, if any, and give back the memory taken off the
        database's memory_limit (``hold_memory``): the job's memory is free."""

    def memory_limit(self) -> int | None:
        """DuckDB's memory_limit as the user set it, in bytes, in the database the job runs
        in (``dbml.core.duckmem``); None where it runs outside one (a Ray worker)."""

    def hold_memory(self, budget: int, pool: str | None) -> None:
        """Take ``budget`` off the database's memory_limit while the job runs (``pool``: the
        shared scheduler's device, whose one budget its jobs hold once together), waiting
        while DuckDB cannot give it back; ``release_scheduler`` gives it back."""


def make_runner(model: torch.nn.Module, loss_fn, params: RunnerParams, device: str, job: JobHandle,
                config: Hashable | None = None, *, optimizer_state: list[dict] | None = None,
                spill: SpillFile | None = None, real_base: int | None = None) -> StepRunner:
    """The step-runner boundary: the TENSILE scheduler, or plain PyTorch for policy 'eager'.

    A tensile job without a ``memory_budget`` of its own plans jointly with every other
    such job on the device through the process's shared MemoryScheduler, within the
    device budget (the ``memory_budget`` setting), waiting for admission when it does not
    fit beside the running ones. A job given its own budget, and the none/capuchin/vdnn/
    pooch/swapadvisor policies, plan alone. Jobs with the same model ``config`` (a
    ``ModelConfig``, or any name of the architecture) share captured graphs. ``params``:
    what the runner uses of the job (``RunnerParams.of(spec)``), ``optimizer_state``: the state to start from
    (``ScheduledStep(optimizer_state=...)``; a scheduled runner only). ``spill``: on the
    CPU, the job's spill file (:func:`spill_file`), where swapped tensors go; the runner
    owns it from here and removes it when it closes.

    One worker of a data-parallel job (``params.workers > 1``) runs the same scheduled
    step with its gradient all-reduce captured in the graph (:class:`DataParallelStep`),
    under the same budget; with policy 'eager', plain PyTorch under DDP (the placement
    backend's ``step``).
    """
    optimizer = params.optimizer
    if params.policy == "eager" and spill is not None:
        spill.close()   # plain PyTorch swaps nothing
    if params.workers > 1 and params.policy == "eager":   # plain PyTorch under DDP (dbml.core.placement)
        from .placement import backend
        return backend(params).step(model, loss_fn, params.optimizer, job)
    if params.policy == "eager":
        if optimizer_state is not None:
            raise ValueError("make_runner(): policy 'eager' starts from fresh optimizer state")
        hold_database_memory(job, device, job_budget(params, device, job), shared=False)
        return EagerStep(model, loss_fn, optimizer)
    estimator, how = latency_model(params.latency_model, device, params.torch_threads)
    shared = shares_device(params.policy, params.memory_budget)
    budget = job_budget(params, device, job)
    planner = None
    if shared:
        scheduler = shared_scheduler(device, budget)
        # the device's budget as this connection set it (or any, unset): waits while jobs
        # run under another one, never changes theirs
        budget = scheduler.hold_budget(job.name, params.shared_budget,
                                       lambda: default_budget(device, job.memory_limit()), cancelled=job.cancelled)
        job.attach_scheduler(scheduler)
        planner = scheduler.planner_for(job.name, wait=True, cancelled=job.cancelled)
    hold_database_memory(job, device, budget, shared=shared)
    # one worker of a data-parallel job: the same, with the gradient all-reduce in its graph
    step, worker = (ScheduledStep, ()) if params.workers <= 1 else (DataParallelStep, (job,))
    runner = step(model, loss_fn, optimizer, *worker, policy=params.policy, budget_bytes=budget,
                           device=CpuDevice(device, spill=spill) if spill is not None else device, job=job.name, latency_model=estimator, planner=planner,
                           ledger=device_ledger(device), share_graphs=config, optimizer_state=optimizer_state,
                           update=UpdateSettings(beta=params.replan_beta, threshold=params.replan_threshold,
                                                 max_plan_share=MAX_PLAN_SHARE), real_base=real_base)
    runner.latency_source = how   # the train summary reports it
    return runner


def spill_file(cur, job: str, device: str, temp: tuple[str, str] | None = None) -> SpillFile | None:
    """On the CPU, the job's spill file in the database's ``temp_directory`` (where DuckDB
    spills too), within ``max_temp_directory_size`` less what DuckDB holds there now; None
    on CUDA (host RAM is a GPU's slow tier) and where DuckDB's temp directory is off
    (``SET temp_directory = ''``: swapped tensors then stay in RAM, and save nothing).
    Spill files of crashed processes found there are removed first. ``temp``: the two
    settings as :func:`measure_spill_tier` read them (else read here)."""
    if not device.startswith("cpu"):
        return None
    directory, limit = temp or temp_settings(cur)
    if not directory:
        return None
    (held,), = cur.execute("SELECT coalesce(sum(size), 0) FROM duckdb_temporary_files()").fetchall()
    sweep_stale(directory)
    spill = SpillFile(directory, job)
    spill.limit = max(0, _temp_limit(limit, directory) - int(held))
    return spill


def measure_spill_tier(cur, device: str) -> tuple[str, str] | None:
    """Before a job's real memory is measured (``procmem.watch``): the speed of the file
    system its spill file will be on, which the planner plans swaps with
    (``spill.tier_of``), measured here once per process and file system where ``python -m
    dbml install`` did not calibrate it. The probe's buffers are then the process's, once,
    as its imports are: inside the job they were 64 MB of a first job's real memory (a
    worker set's first job held 94 MB for a 67 MB budget). Returns the temp settings it
    read (:func:`temp_settings`; None off the CPU), for :func:`spill_file`. Errors are left
    to :func:`spill_file`, which reports them as the job's."""
    if not device.startswith("cpu"):
        return None
    temp = temp_settings(cur)
    if temp[0]:
        try:
            tier_of(temp[0])
        except OSError:
            pass
    return temp


def temp_settings(cur) -> tuple[str, str]:
    """The database's ``temp_directory`` ('' when off) and ``max_temp_directory_size``."""
    # fetchall, not fetchone: a result left unfinished keeps the cursor busy (DuckDB 2)
    (directory, limit), = cur.execute(
        "SELECT current_setting('temp_directory'), current_setting('max_temp_directory_size')").fetchall()
    return directory, limit


def _temp_limit(setting: str, directory: str) -> int:
    """DuckDB's ``max_temp_directory_size`` in bytes: a size ('953.6 MiB'), or its default,
    '90% of available disk space' (of the temp directory's file system)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)% of available disk space\s*", setting or "")
    if m:
        st = os.statvfs(directory)
        return int(float(m.group(1)) / 100 * st.f_bavail * st.f_frsize)
    return parse_bytes(setting, name="max_temp_directory_size")


def job_budget(params: RunnerParams, device: str, job: JobHandle | None = None) -> int:
    """The budget a job plans within, before it joins the device: its own ``memory_budget``,
    else the device budget of its connection (the setting, or the device's default: on the
    CPU a share of ``job``'s database's memory_limit). A job sharing the device then runs
    under the budget it holds there (``hold_budget``)."""
    if params.memory_budget or params.shared_budget:
        return params.memory_budget or params.shared_budget
    return default_budget(device, job.memory_limit() if job is not None else None)


def hold_database_memory(job: JobHandle, device: str, budget: int, *, shared: bool) -> None:
    """On the CPU, take the job's ``budget`` off its database's memory_limit before its runner
    allocates anything (``dbml.core.duckmem``: the jobs of the shared scheduler hold its budget
    once). The model's parameters, built just before, are the one allocation of the job
    that comes first (a large model is planned on the meta device before: ``check_plan_fits``).
    An eager job is not held to a budget, but DuckDB leaves it the same room. On CUDA the
    budget is device memory, not DuckDB's: nothing is held."""
    if torch.device(device).type == "cpu":
        job.hold_memory(budget, device if shared else None)


def prepare(runner: StepRunner, x: torch.Tensor, label: torch.dtype, device: str, plan: bool = True) -> None:
    """Capture and plan the first batch's graph (an input like ``x``) ahead of it, while
    DuckDB reads the rows (a no-op for eager). Capture runs on fake tensors, so a budget
    no plan can meet raises ``InfeasibleBudget`` here, before any activation is allocated
    (and a job cancelled while it waits for admission, ``NotAdmitted``). ``plan=False``:
    capture only (a later batch shape: ``StepRunner.prepare``)."""
    runner.prepare(x, torch.empty(len(x), dtype=label, device=device), plan=plan)


# -- before the model is built ---------------------------------------------------------

def device_memory(device: str) -> int:
    """The device's memory: the GPU's total on CUDA, the machine's RAM on the CPU."""
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[1])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def state_bytes(cfg: models.ModelConfig, optimizer: OptimizerSpec) -> tuple[int, int]:
    """(parameters plus optimizer state, parameters) in bytes, counted on the meta device."""
    params = models.parameter_bytes(cfg)
    states = sum(k != "step" for k in state_keys(optimizer))   # step: a scalar
    return params * (1 + states), params


def check_model_fits(cfg: models.ModelConfig, optimizer: OptimizerSpec, device: str) -> None:
    """Refuse a model whose parameters and optimizer state alone exceed the device's memory
    (the machine's RAM on the CPU, the GPU's total on CUDA): counted on the meta device,
    before any parameter is allocated. Raises InvalidArgument naming the arguments that
    shrink the model (hidden, arch). Against the budget, ``check_plan_fits``."""
    need, params = state_bytes(cfg, optimizer)
    memory = device_memory(device)
    if need <= memory:
        return
    if cfg.arch == "mlp":
        shape = f"hidden := {list(cfg.options_dict()['hidden'])} on {cfg.inputs.features} features"
        fix = "pass smaller hidden := layer sizes or arch := 'linear'"
    else:
        shape, fix = f"{cfg.describe()} on {cfg.inputs.kind} inputs", "pass smaller widths in options := or a smaller arch"
    raise InvalidArgument(
        f"train(): the model's parameters and {optimizer.kind} state alone need {_gb(need)} "
        f"({_gb(params)} of parameters: {shape}), more than the device's "
        f"memory ({_gb(memory)}, {device}); nothing was stored; {fix}")


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _meta_sequence(cfg: models.ModelConfig, loss_fn, params: RunnerParams, device: str, rows: int,
                   label: torch.dtype, model: torch.nn.Module | None = None):
    """The job's first batch's step captured on a model of the meta device (nothing allocated;
    ``model``: one built there already), as an access sequence timed by the job's latency model."""
    with torch.device("meta"):
        model = model if model is not None else models.build(cfg)
        batch = (models.sample_input(cfg, rows), torch.empty(rows, dtype=label))
    estimator, _ = latency_model(params.latency_model, device, params.torch_threads)
    estimator = estimator or RooflineModel(device=str(torch.device(device)))
    captured = GraphCache(model, loss_fn, params.optimizer, job=params.job).get(*batch)
    return build_sequence(captured, estimator, params.job)


def fit_pieces(cfg: models.ModelConfig, loss_fn, params: RunnerParams, device: str, rows: int,
               label: torch.dtype, job: JobHandle | None = None) -> tuple[RunnerParams, AccessSequence | None]:
    """``params`` with its optimizer's pieces cut to its budget (``OptimizerSpec.within``)
    where the budget needs it: where the step captured whole (on the meta device) has a
    tensor-granularity floor above what its first plan may use (on the CPU, the budget less
    ``FIRST_MARGIN`` of it and the spill's bounce buffer). Pieces cost time where no budget
    needs them (the cat that rebuilds a weight each step: 3 epochs of an MLP of hidden
    [2048, 2048] took 3.7-4.1 s in 8 MiB pieces against 3.5-3.6 s whole at a 100 MB budget
    that bound nothing), so a job that plans within its budget whole stays whole. For a
    scheduled policy only; before the job's watch: the meta capture is not its memory.
    Also the meta sequence of the params it returns, where it captured one (None: it cut
    the pieces, or captured nothing), for :func:`check_plan_fits`."""
    if params.policy in ("eager", "none") or scheduler_config.scheduler_disabled():
        return params, None
    budget = job_budget(params, device, job)
    finer = params.optimizer.within(budget)
    if finer == params.optimizer:
        return params, None
    try:
        with torch.device("meta"):
            model = models.build(cfg)
        largest = max((p.numel() * p.element_size() for p in model.parameters() if p.requires_grad), default=0)
        if largest <= finer.update_chunk_bytes:   # no parameter would be cut
            return params, None
        seq = _meta_sequence(cfg, loss_fn, params, device, rows, label, model)
    except Exception:  # noqa: BLE001 - a registered model that cannot be built on the meta device trains whole
        return params, None
    room = budget
    if torch.device(device).type == "cpu":
        room -= int(FIRST_MARGIN * budget) + bounce_reserve(seq)
    if tensor_granularity_floor(seq) <= room:
        return params, seq
    return dataclasses.replace(params, optimizer=finer), None


def check_plan_fits(cfg: models.ModelConfig, loss_fn, params: RunnerParams, device: str, rows: int,
                    label: torch.dtype, job: JobHandle | None = None, *, spill: bool = False,
                    seq: AccessSequence | None = None) -> None:
    """For a tensile job whose parameters and optimizer state are a large part of its
    budget (``LARGE_MODEL_SHARE`` or more), plan its first batch on a model of the meta
    device before the real one is built: capture runs on fake tensors, so a budget no plan
    meets raises ``InfeasibleBudget`` (with the smallest feasible budget) having allocated
    nothing. Smaller models are built first; their own ahead-of-time plan (``prepare``)
    checks, still before any activation. A job with no budget plans within its device's
    default (``job_budget``: on the CPU a share of its database's memory_limit). ``spill``:
    the job's swaps go to disk; alone on its budget, its runner plans without the bounce
    buffer's pages (``runner.bounce_reserve``), so the smallest budget it is told counts them
    (a budget suggested without them was refused by the runner: 1.30 MB for 1.33 MB).
    ``seq``: the meta sequence :func:`fit_pieces` captured for these params, if any."""
    if params.policy != "tensile" or params.workers > 1 or scheduler_config.scheduler_disabled():
        return
    budget = job_budget(params, device, job)
    if state_bytes(cfg, params.optimizer)[0] < LARGE_MODEL_SHARE * budget:
        return
    seq = seq if seq is not None else _meta_sequence(cfg, loss_fn, params, device, rows, label)
    try:
        plan(seq, budget)
    except InfeasibleBudget as e:
        if not spill or shares_device(params.policy, params.memory_budget):
            raise
        raise InfeasibleBudget(repr(params.job), budget, e.min_budget + bounce_reserve(seq)) from None


# -- the vanilla and the summary ---------------------------------------------------------

def eager_peak(model: torch.nn.Module, loss_fn, params: RunnerParams, x: torch.Tensor, y: torch.Tensor) -> int:
    """Eager PyTorch's peak on a copy of the model, over two iterations (the first creates
    the optimizer state, the second is a steady one): unbudgeted memory, so only with
    ``measure_vanilla`` and only after the job's plan fit its budget."""
    runner = EagerStep(copy.deepcopy(model), loss_fn, params.optimizer)
    runner.step(x, y)
    runner.step(x, y)
    return runner.stats()["measured_peak_bytes"]


def vanilla_peak(model: torch.nn.Module, loss_fn, params: RunnerParams, x: torch.Tensor,
                 y: torch.Tensor) -> int | None:
    """The measured vanilla for the job's first batch: ``eager_peak`` on the CPU when
    ``params.measure_vanilla`` and the job is scheduled (an eager job measures itself).
    Otherwise None, and the vanilla is the plan's analysed peak (``memory_summary``); on
    CUDA always None: an eager copy would take device memory the shared budget does not
    know of (and the allocator's peak is every job's)."""
    if not params.measure_vanilla or params.policy == "eager" or torch.device(x.device).type != "cpu":
        return None
    return eager_peak(model, loss_fn, params, x, y)


def real_memory_warning(memory: dict) -> str | None:
    """The train summary's warning of a job whose real memory passed its budget
    (``memory``: :func:`memory_summary`'s figures), or None. The budget bounds what its plans
    hold, and the runner takes what the process was measured to hold beside them off the
    planner's budget (``ScheduledStep._remeasure_real``); where the smallest plan and that
    together pass the budget, the job still runs, and says so here, with the budget that
    would have held it (a data-parallel worker's first job at 67.3 MB held 67.4)."""
    real, budget = memory.get("real_peak_bytes"), memory.get("budget_bytes")
    if real is None or budget is None or real <= budget:
        return None
    planned = memory.get("planned_peak_bytes")
    tensors = f"; its tensors took {_gb(planned)} (planned_peak_bytes)" if planned is not None else ""
    return (f"real memory: the process grew by {_gb(real)} while the job ran, {_gb(real - budget)} more than its "
            f"budget of {_gb(budget)}{tensors}, the rest was held beside them (temporaries inside ops, buffers, "
            f"and in a process's first job its one-off imports and caches); pass a larger memory_budget, or a "
            f"smaller batch_size, to keep the process within it")


def memory_summary(stats: dict, vanilla: int | None, real=None) -> dict:
    """The train summary's memory figures. The vanilla MSR is against, and its
    ``vanilla_source``: 'measured' (``vanilla``, eager PyTorch on a copy; or an eager job's
    own peak, eager being the vanilla) or 'analysed' (the plan's unscheduled peak,
    release after last use on the captured graph). ``real``: the job's
    ``procmem.RealMemory`` (what it added to the process's resident memory at its peak),
    reported as ``real_peak_bytes`` beside the tracker's ``measured_peak_bytes``."""
    out = {k: stats.get(k) for k in MEMORY_FIELDS}
    out["real_peak_bytes"] = real.added if real is not None else None
    eager = "policy" not in stats
    if vanilla is None and eager:
        vanilla = stats.get("measured_peak_bytes")
    out["vanilla_source"] = "measured" if vanilla is not None else "analysed"
    out["vanilla_peak_bytes"] = vanilla = vanilla or stats.get("vanilla_peak_bytes")
    measured = out["measured_peak_bytes"]
    out["msr"] = (vanilla - measured) / vanilla if vanilla and measured is not None else None
    out["planned_vanilla_peak_bytes"] = stats.get("vanilla_peak_bytes")
    out["policy"] = stats.get("policy", "eager")
    out["latency_model"] = stats.get("latency_model")
    out["budget_bytes"] = stats.get("budget_bytes")
    return out

