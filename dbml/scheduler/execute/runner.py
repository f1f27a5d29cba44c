"""The scheduled step runner: a StepRunner that trains under a TENSILE plan.

``ScheduledStep(model, loss_fn, spec, policy=..., budget_bytes=...)`` captures the
training step (one graph per batch shape), builds its access sequence from latency
estimates, asks its planner for a plan within the budget, and runs every iteration
through the :class:`~.executor.Executor`. Results equal eager PyTorch's bit for bit on
CPU, whatever the policy.

Policies (:data:`RUNNER_POLICIES`; one object each, :mod:`.policies`):

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
* ``"none"``: release after last use only, no budget;
* ``"vdnn"``: vDNN-conv, the layer-granularity baseline TENSILE compares with
  (:func:`~..plan.vdnn.vdnn_plan`): convolutions' input feature maps swapped out after
  their forward use and prefetched one layer ahead in backward; a fixed plan, no budget
  (``budget_bytes`` is not a limit: the plan's own peak is, compute waiting for late
  offloads as vDNN's layers do), never replanned;
* ``"pooch"`` and ``"swapadvisor"``: the seeds' other planners, each searching a plan
  by simulation within ``budget_bytes`` once per graph (:func:`~..plan.pooch.pooch_plan`:
  keep, swap or recompute per layer output; :func:`~..plan.swapadvisor.swapadvisor_plan`:
  a genetic algorithm over swap choices), never replanned.

Plan updating (TENSILE IV-E, :mod:`.updating`): after every iteration the executor's
measured op latencies are folded into a per-op moving average; when their sum drifts
past ``UpdateSettings.threshold`` from the sum the plan was made with, the sequence is
retimed with the averages and replanned (``stats()["replans"]``). A new plan — from a
replan, :meth:`ScheduledStep.offer_plan`, or a newer version of the planner's plans —
takes effect at the next iteration boundary, never during an iteration.

``planner=``: an :class:`~.planners.ExternalPlanner` (a shared multi-job scheduler's
``JobPlanner``) used for every plan of this runner; the runner compares its
``version()`` at each iteration boundary and takes ``latest(seq)`` when it moved. A bare
callable ``(AccessSequence) -> Plan`` is used as a planner whose plans never change by
themselves. Without one the job plans alone within ``budget_bytes``
(:class:`~.planners.LocalPlanner`).

Switches: ``DBML_NO_SCHEDULER=1`` forces policy ``"none"`` (release after last use
only, no budget); ``DBML_DEBUG=1`` prints the one-line summary (:func:`summary_line`) to
stderr after each new plan, e.g. ``peak 912 MB -> 431 MB, 37 swaps, 4 recomputes, plan 0.21 s``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import mmap
import sys
import threading
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Mapping

import torch

from .. import config
from .. import procmem
from ..hostmem import bounded, keep_freed_host_memory
from ..errors import BudgetExceeded, InfeasibleBudget
from ..graph.access import build_sequence
from ..graph.capture import CapturedStep
from ..graph.collective import Collective, measure_bandwidth
from ..graph.graphs import GraphCache
from ..graph.optim import OptimizerSpec
from ..graph.sequence import AccessSequence, EventKind, Plan
from ..latency.estimate import LatencyModel, RooflineModel
from ..multijob.ledger import DeviceLedger, JobAccount
from ..multijob.registry import DEVICES
from ..plan.planner import PlanSettings
from ..plan.vdnn import vdnn_plan
from .codegen import fast_path_for
from .devices import Device, as_view, make_device
from .executor import Executor, Program
from .jobstate import each_model_value, initial_state, load_optimizer_states, model_values, optimizer_states
from .planners import SEARCHES, ExternalPlanner, FixedPlanner, LocalPlanner, SearchPlanner, as_planner
from .spill import BLOCK, CHUNK, Parked, SpillFull

# a job alone under a budget measures its first iterations against the allocator (CUDA,
# _remeasure_device) or the process's resident memory (a spilling CPU job, _remeasure_real)
DEVICE_CHECKS = 8
# a CPU job's resident memory creeps up by pages from one iteration to the next (Python's objects,
# malloc's heap); a replan for each would spend planning time on nothing: it grows past this first
REAL_SLACK = 1 << 20
REAL_TRIES = 3   # plans tried for a smaller reserve when none fits the one measured (_remeasure_real)
# a spilling CPU job whose architecture nothing in this process has measured yet: its first
# iteration holds back this share of its budget (_reserve_real), then plans for what it measured
FIRST_MARGIN = 0.25
from .policies import PlanCounts, Planning, make_policy
from .step import LossFn
from .updating import LatencyTracker, UpdateSettings

__all__ = ["ScheduledStep", "RunnerStats", "GraphSchedule", "summary_line", "RUNNER_POLICIES", "bounds_host_memory"]

RUNNER_POLICIES = ("tensile", "capuchin", "none", "vdnn", "pooch", "swapadvisor")


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB" if n >= 10e6 else f"{n / 1e6:.2f} MB"


def summary_line(stats: Mapping) -> str:
    """The one-line summary ``DBML_DEBUG=1`` prints (``stats``: a runner's stats)."""
    return (f"peak {_mb(stats['vanilla_peak_bytes'])} -> {_mb(stats['measured_peak_bytes'])}, "
            f"{stats['swaps']} swaps, {stats['recomputes']} recomputes, plan {stats['plan_seconds']:.2f} s")


def _own(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a storage of its own size: a batch sliced from a larger buffer (a record
    batch's tail) would otherwise bring the whole buffer into the plan's books."""
    if t.untyped_storage().nbytes() != t.numel() * t.element_size() or t.storage_offset() or not t.is_contiguous():
        return t.clone(memory_format=torch.contiguous_format)
    return t


@dataclass(frozen=True)
class RunnerStats:
    """Figures about the steps a :class:`ScheduledStep` ran so far. :meth:`as_dict` is
    ``ScheduledStep.stats()``, which dbml's memory summary and SQL views read."""

    policy: str
    budget_bytes: int | None
    vanilla_peak_bytes: int
    planned_peak_bytes: int
    measured_peak_bytes: int
    reserved_peak_bytes: int   # ledger + the executor's pool of released buffers (like CUDA's reserved)
    swaps: int
    swap_outs: int
    swap_ins: int
    recomputes: int
    # passive: copies made on demand, not by a plan (swap-ins of tensors an op
    # needed and found on the host; swap-outs evicting over the budget)
    passive_swaps: int
    passive_swap_ins: int
    passive_swap_outs: int
    late_swap_ins: int
    passive_recomputes: int
    setup_swaps: int
    budget_waits: int
    iterations: int
    graphs: int
    plan_seconds: float
    replans: int
    failed_replans: int
    deferred_replans: int
    replan_seconds: float
    plan_changes: int
    planned_extra_seconds: float
    device_max_allocated_bytes: int | None = None   # CUDA only: the allocator's peak
    spilled_peak_bytes: int | None = None           # the CPU's spill file at its largest (None: no spill file)

    @classmethod
    def collect(cls, policy: str, budget_bytes: int | None, plans: list[Plan], executors: list[Executor],
                graphs: int, counts: PlanCounts, plan_changes: int,
                device_max_allocated_bytes: int | None = None, spilled_peak_bytes: int | None = None,
                planned: list[Plan] | None = None) -> RunnerStats:
        """``planned``: the plans of the graphs that run one (not passive), when not all of ``plans``."""
        t: Counter = Counter()
        for e in executors:
            t.update(e.totals)
        return cls(
            policy=policy, budget_bytes=budget_bytes,
            vanilla_peak_bytes=max((p.vanilla_peak_bytes for p in plans), default=0),
            planned_peak_bytes=max((p.peak_bytes for p in (planned or plans)), default=0),
            measured_peak_bytes=max((e.peak_bytes for e in executors), default=0),
            reserved_peak_bytes=max((max(e.peak_bytes, e.reserved_peak) for e in executors), default=0),
            swaps=t["swap_outs"] + t["swap_ins"], swap_outs=t["swap_outs"], swap_ins=t["swap_ins"],
            recomputes=t["recomputes"],
            # the executor counts passive swap-ins as "passive_swaps"
            passive_swaps=t["passive_swaps"] + t["passive_swap_outs"], passive_swap_ins=t["passive_swaps"],
            passive_swap_outs=t["passive_swap_outs"], late_swap_ins=t["late_swap_ins"],
            passive_recomputes=t["passive_recomputes"], setup_swaps=t["setup_swaps"],
            budget_waits=t["budget_waits"], iterations=t["iterations"], graphs=graphs,
            plan_seconds=counts.plan_seconds, replans=counts.replans, failed_replans=counts.failed_replans,
            deferred_replans=counts.deferred_replans, replan_seconds=counts.replan_seconds,
            plan_changes=plan_changes, planned_extra_seconds=sum(p.extra_time for p in plans),
            device_max_allocated_bytes=device_max_allocated_bytes, spilled_peak_bytes=spilled_peak_bytes)

    @property
    def summary(self) -> str:
        return summary_line(dataclasses.asdict(self))

    def as_dict(self) -> dict:
        """Every field (``device_max_allocated_bytes`` only on CUDA, ``spilled_peak_bytes``
        only with a spill file), then ``summary``."""
        out = dataclasses.asdict(self)
        for optional in ("device_max_allocated_bytes", "spilled_peak_bytes"):
            if out[optional] is None:
                del out[optional]
        out["summary"] = summary_line(out)
        return out


def bounds_host_memory(policy: str, budget_bytes: int | None, spill) -> bool:
    """Whether a job holds its budget in the process's real memory (``hostmem.bounded``): a
    scheduled job under a budget whose swaps go to a spill file. Its runner is bounded for its
    life; ``training._fit_model`` builds its model under the same rule."""
    return spill is not None and budget_bytes is not None and policy not in ("none", "eager")


def hollow(model: torch.nn.Module) -> None:
    """Point ``model``'s parameters and buffers at placeholders of the same dtype, shape
    and strides whose memory the process never touches (anonymous ``mmap`` pages: no
    resident memory until written), so that the runner's state holds the only reference
    to the real values.

    Why: the state's units are the model's own storages. A plan that swaps a parameter
    out (to disk) drops the executor's reference, but the model's would keep the bytes
    in memory: the ledger would count them freed while the process still holds them.
    :meth:`ScheduledStep.finish` puts the trained values back. Until then nothing reads
    the model's values: capture reads only their metadata, and the runner's ``values()``
    reads the state."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            n = t.untyped_storage().nbytes()
            if n == 0 or t.device.type != "cpu":
                continue
            flat = torch.frombuffer(mmap.mmap(-1, n), dtype=torch.uint8)
            t.data = as_view(flat, t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())


def _model_bytes(model: torch.nn.Module) -> int:
    """The bytes of the model's parameters and buffers (their shapes: a hollow model's too)."""
    return sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers()))


def _resident_bytes(values, device: str) -> int:
    """The bytes of the distinct storages among ``values`` (tensors on ``device``)."""
    seen: dict[int, int] = {}
    for v in values:
        if isinstance(v, torch.Tensor) and v.device.type == device:
            seen[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
    return sum(seen.values())


class GraphSchedule:
    """One captured graph's schedule: its executor, the plan in effect and the sequence
    it was made from, the latency tracker, and a plan waiting for the next boundary."""

    def __init__(self, executor: Executor, plan: Plan, seq: AccessSequence, tracker: LatencyTracker,
                 passive: bool):
        self.executor, self.plan, self.seq, self.tracker = executor, plan, seq, tracker
        self.passive = passive                  # no plan yet, evicting on demand
        self.pending: tuple[Plan, AccessSequence] | None = None


def bounce_reserve(seq: AccessSequence) -> int:
    """What a job alone whose swaps go to disk plans without: the pages of its spill file's
    bounce buffer that its swaps touch (its largest storage, up to the buffer's size)."""
    largest = max((t.nbytes for t in seq.tensors), default=0)
    return min(CHUNK, -(-largest // BLOCK) * BLOCK)


class ScheduledStep:
    """A :class:`~.step.StepRunner` executing the captured step under a memory plan.

    ``budget_bytes`` is the device memory the job may use (None: no limit). The planner
    raises ``InfeasibleBudget`` (naming the smallest feasible budget) when it cannot be
    met. ``latency_model`` defaults to the roofline estimator; ``log=True`` keeps the
    executor's event log (``self.executors()[i].event_log``) for invariant checks.
    ``update`` sets plan updating (:class:`~.updating.UpdateSettings`; its defaults:
    ``beta=0.9``, ``threshold=0.3``; ``UpdateSettings(enabled=False)`` turns it off);
    ``planner`` replaces planning alone within ``budget_bytes`` (see the module
    docstring); ``planner_settings`` tunes the planner's heuristics when it plans alone
    (policies pooch and swapadvisor: their own PoochSettings, SwapAdvisorSettings).
    ``ledger``: the device's :class:`~..multijob.ledger.DeviceLedger` (default: the
    planner's, if it has one), told of every change of this job's device memory, for the
    measured global peak of concurrent jobs. ``share_graphs``: a name for the model's
    architecture under which captured graphs are shared with other jobs
    (:class:`~..graph.graphs.GraphCache`). ``iteration_plans`` lists the plan each
    iteration ran under, in order. ``latency_source``: where the latency model came from,
    for the caller's report (set by the caller; None here).
    ``optimizer_state``: the optimizer state to start from (per trainable
    parameter, as :meth:`optimizer_state` returns it; default: fresh), e.g. a training
    that goes on in another runner. ``collective``: one worker of a data-parallel job
    (:mod:`~..graph.collective`): each step takes the global batch, trains on this
    worker's share and all-reduces the gradients in the graph; ``comm_bandwidth``: the
    process group's bytes per second the planner times the collectives with (default:
    measured here, a collective every worker must join).
    """

    def __init__(self, model: torch.nn.Module, loss_fn: LossFn, spec: OptimizerSpec, *,
                 policy: str = "tensile", budget_bytes: int | None = None, device: str = "cpu",
                 job: str = "job", latency_model: LatencyModel | None = None, log: bool = False,
                 planner_settings: PlanSettings | None = None,
                 planner: ExternalPlanner | Callable[[AccessSequence], Plan] | None = None,
                 update: UpdateSettings | None = None, ledger: DeviceLedger | None = None,
                 share_graphs: Hashable | None = None, optimizer_state: list[dict] | None = None,
                 collective: Collective | None = None, comm_bandwidth: float | None = None,
                 real_base: int | None = None):
        if policy not in RUNNER_POLICIES:
            raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(RUNNER_POLICIES)}")
        if policy == "capuchin" and budget_bytes is None and planner is None:
            raise ValueError("policy 'capuchin' needs budget_bytes: passive mode evicts against a budget")
        if policy in ("vdnn", *SEARCHES) and planner is not None:
            raise ValueError(f"policy {policy!r} plans alone (a plan of its own): pass no planner")
        self.policy = "none" if config.scheduler_disabled() else policy
        keep_freed_host_memory()   # large tensors reused, not page-faulted in every step
        self.model, self.loss_fn, self.spec, self.job = model, loss_fn, spec, job
        self.budget_bytes, self.log, self.update = budget_bytes, log, update or UpdateSettings()
        # alone, the job plans within its own budget; policy none has no budget
        self.planner: ExternalPlanner = (
            as_planner(planner) if planner is not None else
            FixedPlanner(functools.partial(vdnn_plan, settings=planner_settings)) if self.policy == "vdnn" else
            SearchPlanner(self.policy, budget_bytes, planner_settings) if self.policy in SEARCHES else
            LocalPlanner(None if self.policy == "none" else budget_bytes, swap=self.policy != "none",
                         settings=planner_settings))
        self.planning = Planning(self.planner, planner_settings if isinstance(planner_settings, PlanSettings) else None)
        self._policy = make_policy(self.policy, self.planning, budget_bytes, self.update,
                                   bounded=planner is not None or budget_bytes is not None)
        self.device: Device = make_device(device)
        self.latency_model = latency_model or RooflineModel(device=str(self.device.torch_device))
        self.latency_source: str | None = None
        self.collective = collective
        if collective is not None and comm_bandwidth is None:
            comm_bandwidth = measure_bandwidth()   # a collective: every worker builds its runner
        self.comm_bandwidth = comm_bandwidth
        self.graphs = GraphCache(model, loss_fn, spec, job=job, share=share_graphs,
                                 options=None if collective is None else {"collective": collective})
        ledger = ledger if ledger is not None else self.planner.ledger
        self.account: JobAccount | None = ledger.account(job) if ledger is not None else None
        self._graphs: dict[Hashable, GraphSchedule] = {}
        self._lock = threading.Lock()           # offer_plan may come from another thread
        self._planner_version = self._published_version()
        self._last: Executor | None = None
        self._reserved: Counter = Counter()   # host buffer sizes reserved ahead so far
        self.iteration_plans: list[Plan] = []
        self.plan_changes = 0       # plans taken at an iteration boundary, from any source
        self.state = initial_state(model, spec, optimizer_state)
        self._bounded = None
        self.real_reserve: int | None = None   # bytes taken off the planner's budget (_reserve_real)
        # CUDA: what the allocator holds beside the plan's tensors, taken off the budget (_reserve_device)
        self.device_reserve: int | None = None
        self._device_checks = 0   # iterations measured against the allocator so far (DEVICE_CHECKS at most)
        self._real_base: int | None = None   # a spilling CPU job: the process's RSS less its state (_reserve_real)
        self._real_key: Hashable | None = None   # ... and where its measured reserve is kept for the next job
        self._probing = False   # its first iteration runs with FIRST_MARGIN held back (_reserve_real)
        if self.device.spill is not None:
            hollow(model)   # the state holds the only reference: a swapped parameter frees real memory
            if bounds_host_memory(self.policy, budget_bytes, self.device.spill):
                # under a budget, the process's memory follows the tensors held, not malloc's high-water mark
                # a step dropped without close() leaves it too, when collected
                self._bounded = weakref.finalize(self, bounded().__enter__().__exit__, None, None, None)
        if self._plans_real_memory():
            rss = procmem.rss_bytes()
            # the process before the job: where the job's real_peak_bytes counts from, when the caller
            # watched it (real_base), else as near as the runner sees it (its state was made for the job)
            self._real_base = real_base if real_base is not None else \
                None if rss is None else rss - _resident_bytes(self.state.values, "cpu")

    # -- views kept for callers and tests ----------------------------------------------
    def schedules(self) -> dict[Hashable, GraphSchedule]:
        """Per graph signature, its schedule (executor, plan in effect, passive or not)."""
        return dict(self._graphs)

    @property
    def plans(self) -> dict[Hashable, Plan]:
        """Per graph signature, the plan in effect."""
        return {k: g.plan for k, g in self._graphs.items()}

    @property
    def sequences(self) -> dict[Hashable, AccessSequence]:
        """Per graph signature, the access sequence the plan in effect was made from."""
        return {k: g.seq for k, g in self._graphs.items()}

    @property
    def plan_seconds(self) -> float:
        """Time spent in the planner so far."""
        return self.planning.counts.plan_seconds

    def executors(self) -> list[Executor]:
        return [g.executor for g in self._graphs.values()]

    # -- a graph's first plan ------------------------------------------------------------
    def _graph(self, x: torch.Tensor, y: torch.Tensor) -> GraphSchedule:
        captured = self.graphs.get(x, y)
        key = captured.signature
        if key not in self._graphs:
            try:
                self._graphs[key] = self._build(captured)
            except InfeasibleBudget as e:
                reserve = (self.real_reserve or 0) + (self.device_reserve or 0)
                if not reserve:
                    raise
                raise InfeasibleBudget(repr(self.job), self.budget_bytes, e.min_budget + reserve) from None
        return self._graphs[key]

    # -- the budget bounds real memory (a spilling job alone) ---------------------------
    def _plans_real_memory(self) -> bool:
        """A job alone whose swaps go to disk: its budget is the process's real memory, so
        what it holds besides tensors is taken off the budget its plans get."""
        return self.device.spill is not None and self.budget_bytes is not None \
            and isinstance(self.planner, LocalPlanner) and self.policy == "tensile"

    def _first_plan(self, seq: AccessSequence, fallback: int | None):
        """The policy's first plan; where none fits with the reserve held back (a first
        iteration's margin, or what an earlier job of the architecture measured: a guess,
        the budget is the user's), with half of it, a quarter..., then none. (An earlier
        job's reserve went to none at once: a second job under 75 MB then planned 70.8 MB of
        tensors, and the process held 88 MB.)"""
        try:
            return self._policy.first_plan(seq, fallback)
        except InfeasibleBudget:
            if not self.device_reserve or not (self._real_key or self._probing):
                raise
        for _ in range(REAL_TRIES):
            self._set_device_reserve(self.device_reserve // 2)
            try:
                return self._policy.first_plan(seq, fallback)
            except InfeasibleBudget:
                continue
        self._probing = False
        self._set_device_reserve(0)
        return self._policy.first_plan(seq, fallback)

    def _reserve_real(self, seq: AccessSequence, signature: Hashable) -> None:
        """Take off the planner's budget the memory the job holds for its swaps that is no
        tensor of its plan: the pages of the spill file's bounce buffer that swaps touch
        (its largest storage, up to the buffer's size). What else a process holds besides
        tensors — temporaries inside ops, allocator slack, graphs and plans (~10 MB for a
        ResNet), a process's first capture's imports of torch's compiler stack (~46 MB) —
        is not known ahead: the first iterations measure it (:meth:`_remeasure_real`),
        starting from what the last job of the same architecture in this process measured,
        or, where none has, with :data:`FIRST_MARGIN` of the budget held back in the first.
        The summary's ``real_peak_bytes`` and the benchmarks (``benchmarks/budgets_real.py``,
        ``benchmarks/dp_real_memory.py``) report it beside the budget."""
        self.real_reserve = bounce_reserve(seq)
        # the rest is measured in the first iterations (_remeasure_real), where the process says its
        # RSS, from what the last job of this architecture measured
        if self._real_base is not None and self.graphs.share is not None:
            self._real_key = (self.graphs.share, signature)
        known = DEVICES.real_reserves.get(self._real_key) if self._real_key is not None else None
        if self._real_base is None or known is not None:
            self._set_device_reserve(known)
        else:
            # nothing measured yet what this process holds beside such plans (temporaries
            # inside ops: 2-5 MB for an MLP 2048 wide, which a first iteration planned for the
            # whole budget held on top of it): the first iteration holds back a margin, and
            # the plans after it are made for what it measured (_remeasure_real)
            self._probing = True
            self._set_device_reserve(int(FIRST_MARGIN * self.budget_bytes))

    # -- the budget bounds the allocator's memory (a CUDA job alone) -------------------
    def _plans_device_memory(self) -> bool:
        """A job alone on a GPU under a budget: the budget is what the process's allocator
        holds on the device (``torch.cuda.max_memory_allocated``), not only the tensors of
        its plans. cuBLAS's and cuDNN's workspaces and the temporaries inside ops (Adam's
        foreach lists) are no tensors of the graph: on an H200 they were 81-183 MB beside
        plans of 63-340 MB (benchmarks/results/2026-11-28-h200-gpu-check.md)."""
        return self.device.type == "cuda" and self.budget_bytes is not None \
            and isinstance(self.planner, LocalPlanner) and self.policy == "tensile"

    def _set_device_reserve(self, nbytes: int | None) -> None:
        """Plan within the budget less the reserves: ``real_reserve`` (a spill file's bounce
        buffer) and ``nbytes``, what the device's memory was measured to hold beyond the
        plan's tensors (None: not measured)."""
        self.device_reserve = nbytes
        budget = max(1, self.budget_bytes - (self.real_reserve or 0) - (nbytes or 0))
        self.planner.budget_bytes = budget
        if hasattr(self._policy, "budget_bytes"):
            self._policy.budget_bytes = budget

    def _reserve_device(self) -> None:
        """Before the first plan: what the device holds that is not the job's state (other
        tensors of the process, cuBLAS's workspace, made here by one small product if it
        was not yet) is taken off the budget. The first iteration then measures the rest
        (:meth:`_remeasure_device`)."""
        dev = self.device.torch_device
        a = torch.ones(8, 8, device=dev)
        (a @ a).sum().item()   # cuBLAS allocates its workspace on first use and keeps it
        del a
        resident = _resident_bytes(self.state.values, "cuda")
        self._set_device_reserve(max(0, torch.cuda.memory_allocated(dev) - resident))

    def _before_device_check(self) -> int | procmem.watch:
        """Before an iteration measured against the allocator: its peak so far (reset
        first if it is over the budget: only an iteration's own peak says whether it held).
        On the CPU: a watch of the process's resident memory (:meth:`_remeasure_real`)."""
        if self.device.type != "cuda":
            return procmem.watch().__enter__()
        dev = self.device.torch_device
        torch.cuda.synchronize(dev)
        if torch.cuda.max_memory_allocated(dev) > self.budget_bytes:
            torch.cuda.reset_peak_memory_stats(dev)
        return torch.cuda.max_memory_allocated(dev)

    def _remeasure_device(self, g: GraphSchedule, before_max: int) -> None:
        """After each of the first iterations (``DEVICE_CHECKS``): the allocator's peak
        beyond the ledger's, or past the budget, grows the reserve, and the next iteration
        runs a plan made for what is left. Memory freed on the copy stream returns to the
        allocator only when compute has used it, so more swaps hold more of it: a plan
        with more swaps can need a larger reserve, found in the next iteration. Those
        first iterations may pass the budget by what they find (the summary's
        ``device_max_allocated_bytes`` says so)."""
        if self.device.type != "cuda":
            return self._remeasure_real(g, before_max)
        dev = self.device.torch_device
        torch.cuda.synchronize(dev)
        self._device_checks += 1
        peak = torch.cuda.max_memory_allocated(dev)
        if peak <= before_max:
            return   # within the peak before it, itself within the budget: nothing to learn
        self._grow_device_reserve(g, peak)

    def _remeasure_real(self, g: GraphSchedule, watch: procmem.watch) -> None:
        """A spilling CPU job's :meth:`_remeasure_device`: the device is the process's RAM,
        and its peak the process's resident memory above what it held before the job
        (``_real_base``), as the summary's ``real_peak_bytes`` counts it. Beyond the plan's
        tensors the process holds what the ledger cannot see: temporaries inside ops (a
        product's packed operands), the collectives' buffers of a data-parallel worker,
        allocator slack. The first iteration passes the budget by what it finds; the next
        ones run a plan made for what is left. Where the planner finds no plan for what is
        left, the job takes the largest reserve between the one it had and that one that
        it finds a plan for (halving the difference, :data:`REAL_TRIES` times), else keeps
        its plan, and measures no more: a CPU job's real memory is reported beside its
        budget (``real_peak_bytes``), never fatal."""
        self._device_checks += 1
        real = watch.stop()
        if real is None:
            return
        kept = self.device_reserve
        if self._probing:   # the first iteration held back a margin: plan for what it found instead
            self._probing = False
            hidden = max(0, real.peak_rss - self._real_base - (self.real_reserve or 0) - g.executor.iteration_peak)
            # half-way: what a plan holds beside its tensors varies with the plan (a transformer's
            # temporaries measured 13 MB under the margin's plan and 25 MB under the next, larger
            # one); later iterations grow the reserve, none shrinks it
            self._set_device_reserve(max(hidden + REAL_SLACK, (hidden + kept) // 2))
            try:
                self._offer(g, self._policy.first_plan(g.seq, None).plan, g.seq)
            except InfeasibleBudget:
                self._set_device_reserve(self._smaller_reserve(g, kept, self.device_reserve))
            if self._real_key is not None:
                DEVICES.real_reserves[self._real_key] = self.device_reserve
            return
        try:
            self._grow_device_reserve(g, real.peak_rss - self._real_base, slack=REAL_SLACK)
        except InfeasibleBudget:
            self._device_checks = DEVICE_CHECKS
            self._set_device_reserve(self._smaller_reserve(g, kept, self.device_reserve))
        if self._real_key is not None:
            DEVICES.real_reserves[self._real_key] = self.device_reserve

    def _smaller_reserve(self, g: GraphSchedule, kept: int, wanted: int) -> int:
        """No plan fits the budget less ``wanted``: the largest reserve towards it from
        ``kept`` (the one in effect) that the planner finds a plan for, its plan offered."""
        for _ in range(REAL_TRIES):
            wanted = kept + (wanted - kept) // 2
            self._set_device_reserve(wanted)
            try:
                self._offer(g, self._policy.first_plan(g.seq, None).plan, g.seq)
                return wanted
            except InfeasibleBudget:
                continue
        return kept

    def _grow_device_reserve(self, g: GraphSchedule, peak: int, slack: int = 0) -> None:
        """The device held ``peak`` bytes in the last iteration: what it held beyond the
        plan's tensors (or past the budget) grows the reserve, when by more than ``slack``
        (past the budget: always), to what it found and ``slack`` more, and a plan made for
        what is left waits for the next iteration boundary."""
        reserved = self.real_reserve or 0   # the bounce buffer's pages: reserved ahead already
        over = peak - self.budget_bytes
        hidden = max(peak - reserved - g.executor.iteration_peak, self.device_reserve + max(0, over))
        if over <= 0 and hidden <= self.device_reserve + slack:
            return
        # past the budget never within the slack (a job measured 0.6 MB over, its hidden bytes
        # 0.7 MB, and kept its plan); and the slack is the margin taken past what it found (a
        # transformer's temporaries vary by 1-3 MB from plan to plan: it sat at its budget)
        hidden += slack
        self._set_device_reserve(hidden)
        try:
            start = self._policy.first_plan(g.seq, None)
        except InfeasibleBudget as e:
            raise InfeasibleBudget(repr(self.job), self.budget_bytes, e.min_budget + reserved + hidden) from None
        self._offer(g, start.plan, g.seq)

    def _build(self, captured: CapturedStep) -> GraphSchedule:
        seq = build_sequence(captured, self.latency_model, self.job, copy_bandwidth=self.device.copy_bandwidth(),
                             comm_bandwidth=self.comm_bandwidth)
        if self.real_reserve is None and self._plans_real_memory():
            self._reserve_real(seq, captured.signature)
        if self.device_reserve is None and self._plans_device_memory():
            self._reserve_device()
        fallback = max((g.executor.budget or g.plan.peak_bytes for g in self._graphs.values()), default=None)
        start = self._first_plan(seq, fallback)
        self._reserve(seq, start.plan)
        executor = Executor(Program(captured, seq), start.plan, self.device, log=self.log,
                            budget_bytes=start.limit, evict=start.passive, account=self.account)
        executor.fast = fast_path_for(executor)
        return GraphSchedule(executor, start.plan, seq, LatencyTracker(seq, self.update), start.passive)

    def _reserve(self, seq: AccessSequence, plan: Plan) -> None:
        """Host copies live until the iteration ends: one pinned buffer per swap-out,
        allocated ahead; a later plan adds only the buffers no earlier plan reserved."""
        want = Counter(seq.tensors[e.tensor].nbytes for e in plan.events if e.kind is EventKind.SWAP_OUT)
        self.device.reserve_host(list((want - self._reserved).elements()))
        self._reserved |= want

    # -- plan updating and hand-over -------------------------------------------------
    def _offer(self, g: GraphSchedule, plan: Plan, seq: AccessSequence) -> None:
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
        if self.budget_bytes is not None and plan.peak_bytes > self.budget_bytes:
            raise ValueError(f"offer_plan(): the plan peaks at {plan.peak_bytes} bytes, over the runner's budget "
                             f"of {self.budget_bytes}: a budget is a limit")
        g = self._graphs[signature]
        self._offer(g, plan, seq if seq is not None else g.seq)

    def _published_version(self) -> int | None:
        try:
            return self.planner.version()
        except LookupError:   # the job is not registered with it yet
            return None

    def _boundary(self, g: GraphSchedule) -> None:
        """An iteration boundary: adopt a pending plan, or a newer one from the planner."""
        version = self._published_version()
        if version != self._planner_version:
            self._planner_version = version
            try:
                latest = self.planner.latest(g.seq)
            except LookupError:   # it has no plan for this graph (yet)
                latest = g.plan
            if latest is not g.plan:   # it supersedes a pending replan of our own
                self._offer(g, latest, self.planner.made_from(g.seq))
        with self._lock:
            pending, g.pending = g.pending, None
        if pending is not None:
            self._adopt(g, *pending)
        self.planner.applied()   # after settling: the room a smaller plan frees is free now

    def _adopt(self, g: GraphSchedule, plan: Plan, seq: AccessSequence) -> None:
        self._reserve(seq, plan)
        g.executor.set_plan(plan, seq, budget_bytes=self._policy.limit(plan))
        g.executor.settle(self.state)   # hold no more than the new plan allows before saying so
        g.executor.fast = fast_path_for(g.executor, g.executor.fast)   # None: the plan binds something
        g.plan, g.seq, g.passive = plan, seq, False
        g.tracker.rebase(seq)
        self.plan_changes += 1
        self._debug(lambda: f"new plan: {self.runner_stats().summary}")

    def _fold(self, g: GraphSchedule) -> bool:
        """Whether the last iteration's op latencies go to plan updating: not from a fast
        iteration that did not time its ops (codegen.py), nor while the job is planned alone
        (its own budget, or the only job on a shared planner's device) a plan binding
        nothing: the peak after last-use release does not depend on latencies, so every
        drift replan would give the same plan (another job's arrival replans anyway)."""
        fast, ledger = g.executor.fast, self.planner.ledger
        alone = isinstance(self.planner, LocalPlanner) or (ledger is not None and list(ledger.accounts()) == [self.job])
        return fast is None or (fast.measured(g.executor) and not (
            alone and getattr(self.planning.settings, "stop_when_fits", True)))

    def _debug(self, message: Callable[[], str]) -> None:
        if config.debug():
            print(f"dbml.scheduler[{self.job}]: {message()}", file=sys.stderr)

    # -- StepRunner ------------------------------------------------------------------
    def prepare(self, x: torch.Tensor, y: torch.Tensor, plan: bool = True) -> None:
        """Everything the first iteration of this batch shape needs before it runs: capture
        the graph, estimate its latencies, make its plan (TENSILE: from the estimates,
        which is the point of the predictor; Capuchin: release only, no plan yet), admit
        it under a shared planner, build its executor. :meth:`step` does this the first
        time it sees a shape; calling it ahead, while the data is still being read, takes
        it off the first iteration. ``x`` and ``y`` only give shapes and dtypes (e.g.
        ``torch.empty``). ``plan=False``: the capture alone (most of the time: 0.32 s of
        0.37 s for a small MLP's), for a shape that comes later (an epoch's smaller last
        batch): its plan, made now, would go to a shared planner, and the jobs beside this
        one would make room for a graph it does not run yet."""
        if plan:
            self._graph(_own(x), _own(y))
        else:
            self.graphs.get(_own(x), _own(y))

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        fresh = len(self._graphs)
        self.planning.start()
        x, y = _own(x), _own(y)
        g = self._graph(x, y)
        executor = g.executor
        if executor is not self._last:   # one graph's reuse pool must not sit beside another's
            if self._last is not None:
                self._last.release_pool()
            self._last = executor
        self._boundary(g)
        self.iteration_plans.append(g.plan)
        measure = self.device_reserve is not None and self._device_checks < DEVICE_CHECKS
        if measure:
            before_max = self._before_device_check()
        try:
            loss = executor.run(self.state, x, y)
        except BaseException:
            if measure and isinstance(before_max, procmem.watch):
                before_max.stop()   # the sampler reads no more for it
            raise
        if measure:
            self._remeasure_device(g, before_max)
        if executor.budget is not None and executor.iteration_peak > executor.budget:
            raise BudgetExceeded(self.job, executor.iteration_peak, executor.budget, self.budget_bytes)
        offer = self._policy.after_iteration(executor, g.seq, g.tracker, g.passive) if self._fold(g) else None
        if offer is not None:   # it waits in g.pending for the next boundary
            self._offer(g, *offer)
        if len(self._graphs) != fresh:
            self._debug(lambda: self.runner_stats().summary)
        return loss.detach()

    def finish(self) -> None:
        """Write the trained parameters and buffers back into the model (a parameter held
        in pieces joined whole). With a spill file, the model's own tensors are
        placeholders until then (:func:`hollow`)."""
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        values = model_values(self.state, self.device, self.model, self.spec)
        with torch.no_grad():
            for t, v in zip(tensors, values):
                if v.data_ptr() != t.data_ptr() or v.shape != t.shape:
                    t.data = v

    def values(self) -> list[torch.Tensor]:
        """Between iterations: the parameters and buffers as the state holds them now; a value
        on the host is read there (copied to the device for the caller, on CUDA), not moved."""
        return model_values(self.state, self.device, self.model, self.spec, move=False)

    def kept_values(self) -> Iterable[torch.Tensor]:
        """A copy of :meth:`values` kept while training goes on: written to the job's spill
        file one value at a time where it has one (a swapped value is read from there and
        written back, never all of them in memory at once), else copied in memory. On the
        CPU under a budget the spill file is the slow tier: a copy of the weights kept in
        RAM would sit beside the budget (an early-stopping job's best epoch: one model's
        size, benchmarks/realmem_phases.py)."""
        spill = self.device.spill
        values = each_model_value(self.state, self.device, self.model, self.spec, move=False)
        if spill is not None and not self._room_beside_the_job(_model_bytes(self.model)):
            try:
                return Parked(spill, values)
            except SpillFull:
                values = each_model_value(self.state, self.device, self.model, self.spec, move=False)
        return [v.detach().to("cpu", copy=True) for v in values]

    def _room_beside_the_job(self, nbytes: int) -> bool:
        """Whether ``nbytes`` fit in the budget beside the job's whole unscheduled peak (no
        budget: they do). A job its budget does not bind keeps a copy in RAM: writing it to
        disk would cost time for memory nothing needs (a CPU job's default budget is half the
        database's memory_limit)."""
        if self.budget_bytes is None:
            return True
        vanilla = max((g.plan.vanilla_peak_bytes for g in self._graphs.values()), default=0)
        return vanilla + nbytes <= self.budget_bytes - (self.real_reserve or 0) - (self.device_reserve or 0)

    def optimizer_state(self) -> list[dict[str, torch.Tensor]]:
        """Per trainable parameter, its optimizer state (as torch.optim would hold it)."""
        return optimizer_states(self.state, self.device, self.model, self.spec)

    def load_optimizer_state(self, states: list[dict[str, torch.Tensor]]) -> None:
        """Before the first iteration: start from ``states`` (``optimizer_state``'s form), not fresh."""
        load_optimizer_states(self.state, self.device, self.model, self.spec, states)

    def close(self) -> None:
        """Stop the copy threads; the job's account in the device ledger closes (call it
        once the job's device memory is given back, e.g. after :meth:`finish`)."""
        for g in self._graphs.values():
            g.executor.close()
        self.device.close()   # its spill file, if any, is removed
        if self._bounded is not None:
            self._bounded()   # once: a finalize that ran is a no-op
            self._bounded = None
        if self.account is not None:
            self.account.close()

    def runner_stats(self) -> RunnerStats:
        cuda = self.device.type == "cuda"
        # a passive graph (no plan yet: it evicts on demand, as a batch seen once an epoch does) holds the
        # unscheduled placeholder, whose peak is no plan's: a job's planned peak is its plans'
        planned = [p for k, p in self.plans.items() if not (k in self._graphs and self._graphs[k].passive)]
        return RunnerStats.collect(
            self.policy, self.budget_bytes, list(self.plans.values()), self.executors(), len(self.graphs),
            self.planning.counts, self.plan_changes,
            torch.cuda.max_memory_allocated(self.device.torch_device) if cuda else None,
            self.device.spill.peak if self.device.spill is not None else None, planned=planned)

    def stats(self) -> dict:
        return self.runner_stats().as_dict()
