"""One training job, from a validated spec to a stored model.

The job has DuckDB encode its source once into a scratch table of (features, label,
is_val) rows stored in a random order, then streams the training rows every epoch from
a random starting row through a shuffle buffer. Every iteration goes through a
``StepRunner`` (``dbml.scheduler.execute.step``), the boundary at which the memory scheduler
takes training over: ``ScheduledStep`` for policies tensile and none, ``EagerStep``
(plain PyTorch) for eager.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass

import duckdb
import numpy as np
import torch
import torch.nn.functional as F

from . import catalog, models
from .columns import MEMORY_FIELDS
from .data import BatchStream, StreamStats
from .errors import InvalidArgument, SourceError, TrainingError
from .features import Preprocessing, fit
from .jobs import Job, JobCancelled
from .latency import latency_model
from .scheduler import OPTIMIZERS, OptimizerSpec
from .scheduler.plan.planner import InfeasibleBudget
from .scheduler.execute.runner import ScheduledStep
from .scheduler.multijob.scheduler import NotAdmitted, device_ledger, shared_scheduler
from .scheduler.execute.updating import UpdateSettings
from .scheduler.execute.step import EagerStep, StepRunner
from .settings import default_budget, resolve_device
from .source import as_select, describe, quote
from .spec import POLICIES, TrainSpec  # noqa: F401  (TrainSpec and its validation live in dbml/spec.py)

VALIDATION_BUCKETS = 1_000_000


def _classification_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y)


def _regression_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.squeeze(-1), y)


def loss_function(prep: Preprocessing):
    """One function object per task: jobs with equal models share captured graphs."""
    return _classification_loss if prep.task == "classification" else _regression_loss


# Drift replans take at most this share of a job's time (UpdateSettings.max_plan_share).
MAX_PLAN_SHARE = 0.05


def make_runner(model: torch.nn.Module, loss_fn, spec: TrainSpec, device: str, job: Job,
                config: models.ModelConfig | None = None) -> StepRunner:
    """The step-runner boundary: the TENSILE scheduler, or plain PyTorch for policy 'eager'.

    A tensile job without a ``memory_budget`` of its own plans jointly with every other
    such job on the device through the process's shared MemoryScheduler, within the
    device budget (the ``memory_budget`` setting), waiting for admission when it does not
    fit beside the running ones. A job given its own budget, and the none/capuchin
    policies, plan alone. Jobs with the same model ``config`` share captured graphs.
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
    runner.latency_source = how
    return runner


def eager_peak(model: torch.nn.Module, loss_fn, spec: TrainSpec, x: torch.Tensor, y: torch.Tensor) -> int:
    """The vanilla of MSR: eager PyTorch's peak on a copy of the model, over two iterations
    (the first creates the optimizer state, the second is a steady one)."""
    runner = EagerStep(copy.deepcopy(model), loss_fn, spec.optimizer_spec())
    runner.step(x, y)
    runner.step(x, y)
    return runner.stats()["measured_peak_bytes"]


def train(cur: duckdb.DuckDBPyConnection, spec: TrainSpec, job: Job | None = None) -> dict:
    """Run one training job to completion and store the model; return the summary row.

    ``cur`` is a cursor for this job alone. The job's encoded rows live in a table of the
    in-memory scratch database ``dbml_scratch`` (attached by install, gone with the
    process), which every cursor can read and which is dropped when the job ends.
    ``job`` receives progress and may cancel at an iteration boundary (``dbml.jobs``).
    """
    started = time.perf_counter()
    if torch.get_num_threads() != spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)
    job = job or Job(id=catalog.next_job_id(cur), model=spec.model)
    job_id = job.id
    select_sql = as_select(spec.source, fn="train")
    columns = describe(cur, select_sql, fn="train")
    prep = fit(cur, select_sql, columns, label=spec.label,
               features=None if spec.features is None else list(spec.features), task=spec.task)
    table = f"dbml_scratch.job_{job_id}"
    n_train, n_val = _materialise(cur, table, select_sql, prep, spec)
    try:
        result = _fit_model(cur, table, prep, spec, n_train, n_val, job)
    finally:
        cur.execute(f"DROP TABLE IF EXISTS {table}")
    version = catalog.write(cur, name=spec.model, config=result["config"], prep=prep,
                            params=_params(spec), metrics=result["metrics"], rows=n_train,
                            module=result["module"])
    return {
        "job_id": job_id, "model": spec.model, "version": version, "status": "finished",
        "epochs": spec.epochs, "rows": n_train, "final_loss": result["metrics"]["final_loss"],
        "val_metric": result["metrics"]["val_metric"], "seconds": time.perf_counter() - started,
        **{k: result["memory"].get(k) for k in MEMORY_FIELDS},
    }


def _params(spec: TrainSpec) -> dict:
    d = asdict(spec)
    d.pop("source"), d.pop("model")
    return d


def _materialise(cur, table: str, select_sql: str, prep: Preprocessing, spec: TrainSpec) -> tuple[int, int]:
    """Features and labels computed once by DuckDB, with a deterministic validation split.

    ``h`` hashes each row's content with the seed: it decides the split and the one
    random order the rows are stored in (the only sort of the job), so both are
    reproducible whatever order the source yields rows in. Epochs then stream that order
    from a random starting row through a shuffle buffer (``data.shuffle_windows``).
    """
    val_cut = int(spec.validation * VALIDATION_BUCKETS)
    cur.execute(f"""
        CREATE TABLE {table} AS
        SELECT x, y, h % {VALIDATION_BUCKETS} < {val_cut} AS is_val
        FROM (SELECT x, y, hash(x, y, {int(spec.seed)}) AS h
              FROM (SELECT {prep.features_sql()} AS x, {_label_column(prep)} AS y
                    FROM ({select_sql}) WHERE {quote(prep.label)} IS NOT NULL))
        ORDER BY h""")
    n_train, n_val = cur.execute(f"SELECT count(*) FILTER (NOT is_val), count(*) FILTER (is_val) FROM {table}").fetchall()[0]
    if n_train == 0:
        raise SourceError(f"train(): no rows left for training after holding out validation := {spec.validation}; "
                          f"pass a larger source or validation := 0")
    return n_train, n_val


def _label_column(prep: Preprocessing) -> str:
    """The label as the dtype the loss wants: int64 class indices or float32 scaled targets."""
    return f"({prep.label_sql()})::BIGINT" if prep.task == "classification" else prep.label_sql()


def _fit_model(cur, table: str, prep: Preprocessing, spec: TrainSpec, n_train: int, n_val: int,
               job: Job) -> dict:
    device = resolve_device(spec.device)
    outputs = len(prep.classes) if prep.task == "classification" else 1
    arch = "mlp" if spec.arch == "auto" else spec.arch
    config = models.config(arch, prep.width, outputs, spec.hidden, spec.dropout)
    module = models.build_seeded(config, spec.seed).to(device)
    loss_fn = loss_function(prep)
    runner = make_runner(module, loss_fn, spec, device, job, config)
    vanilla: list[int] = []

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not vanilla:
            # CPU: measured on a copy. On CUDA an eager copy would take device memory the
            # shared budget does not know of (and the allocator's peak is every job's):
            # there the vanilla is the plan's release-only peak (_memory_summary).
            vanilla.append(eager_peak(module, loss_fn, spec, x, y) if torch.device(device).type == "cpu" else None)
        try:
            loss = runner.step(x, y)
        except NotAdmitted:
            raise JobCancelled(f"job {job.id} ({job.model!r}) was cancelled while it waited for memory; "
                               f"nothing was stored") from None
        except InfeasibleBudget as e:
            own = spec.memory_budget is not None
            budget = spec.memory_budget if own else spec.device_budget or default_budget(device)
            fix = (f"pass memory_budget := '{_round_up(e.min_budget)}'" if own else
                   f"SET VARIABLE dbml_memory_budget = '{_round_up(e.min_budget)}'")
            raise InvalidArgument(
                f"train(): memory_budget {_size(budget)} is below the smallest budget this model and batch "
                f"can be trained in, {_size(e.min_budget)}; {fix} or more, or a smaller batch_size") from None
        job.step(len(y))
        return loss

    def prepare() -> None:   # the first batch's graph and plan, while DuckDB reads the rows
        if hasattr(runner, "prepare"):
            rows = min(spec.batch_size, n_train)
            label = torch.int64 if prep.task == "classification" else torch.float32
            try:
                runner.prepare(torch.empty(rows, prep.width, device=device), torch.empty(rows, dtype=label, device=device))
            except (NotAdmitted, InfeasibleBudget):
                pass   # the first step meets it again and reports it

    job.begin(spec.epochs, math.ceil(n_train / spec.batch_size))
    try:
        history, stream_stats = _run_epochs(cur, table, spec, step, device, n_train + n_val, n_train,
                                            lambda record: job.end_epoch(record, runner.stats()), prepare)
        runner.finish()
    finally:
        if hasattr(runner, "close"):
            runner.close()
        job.release_scheduler()
    module.eval()
    memory = _memory_summary({**runner.stats(), "latency_model": getattr(runner, "latency_source", None)},
                             vanilla[0] if vanilla else None)
    metrics = {"final_loss": history[-1]["loss"], "history": history,
               "fetch_wait_seconds": stream_stats.wait_seconds, "memory": memory}
    metrics.update(_validation_metric(cur, table, prep, module, device, n_val))
    return {"config": config, "module": module.cpu(), "metrics": metrics, "memory": memory}


def _round_up(n: int) -> str:
    """A size at least ``n`` bytes, in KB or MB with two significant digits: 109404 -> '110KB'."""
    unit, scale = ("MB", 1e6) if n >= 1e6 else ("KB", 1e3)
    value = n / scale
    step = 10 ** (math.floor(math.log10(value)) - 1)
    return f"{math.ceil(value / step) * step:g}{unit}"


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB ({n} bytes)"


def _memory_summary(stats: dict, vanilla: int | None) -> dict:
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


def _run_epochs(cur, table: str, spec: TrainSpec, step, device: str, n_rows: int, n_train: int, on_epoch,
                before=None):
    """Every epoch: stream the training rows, shuffled, through ``step``; return the history.
    ``before()`` runs once the first epoch's stream has started, before its first batch."""
    def epoch_stream(epoch: int) -> BatchStream:
        rng = np.random.default_rng([spec.seed, epoch])
        start = int(rng.integers(n_rows))
        sql = [f"SELECT x, y FROM {table} WHERE NOT is_val AND rowid >= {start}",
               f"SELECT x, y FROM {table} WHERE NOT is_val AND rowid < {start}"]
        return BatchStream(cur, sql, spec.batch_size, spec.prefetch_batches,
                           shuffle=int(rng.integers(2**63)), window_rows=spec.shuffle_window).start()

    stream_stats, history = StreamStats(), []
    stream, upcoming = None, epoch_stream(0)
    try:
        if before is not None:
            before()
        for epoch in range(spec.epochs):
            epoch_started = time.perf_counter()
            stream, upcoming = upcoming, epoch_stream(epoch + 1) if epoch + 1 < spec.epochs else None
            total = torch.zeros((), dtype=torch.float64)
            for x, y in stream:
                loss = step(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
                if not torch.isfinite(loss):
                    raise TrainingError(f"train(): loss became {loss.item()} in epoch {epoch + 1}; "
                                        f"nothing was stored; pass a smaller lr := (now {spec.lr})")
                total += loss.double().cpu() * len(y)
            stream_stats.add(stream.stats)
            history.append({"epoch": epoch + 1, "loss": total.item() / n_train,
                            "seconds": time.perf_counter() - epoch_started,
                            "wait_seconds": stream.stats.wait_seconds})
            on_epoch(history[-1])
    finally:
        for s in (stream, upcoming):
            if s is not None:
                s.close()
    return history, stream_stats


def _validation_metric(cur, table: str, prep: Preprocessing, module, device, n_val: int) -> dict:
    """Accuracy (classification) or R^2 (regression) on the held-out rows."""
    name = "accuracy" if prep.task == "classification" else "r2"
    if n_val == 0:
        return {"val_metric": None, "val_metric_name": name}
    outs, ys = [], []
    with torch.no_grad():
        for x, y in BatchStream(cur, f"SELECT x, y FROM {table} WHERE is_val", 8192):
            outs.append(module(x.to(device)).cpu())
            ys.append(y)
    out, y = torch.cat(outs), torch.cat(ys)
    if prep.task == "classification":
        value = (out.argmax(1) == y).double().mean().item()
    else:
        value = r2_score(y.double().numpy(), out.squeeze(-1).double().numpy())
    return {"val_metric": value, "val_metric_name": name}


def r2_score(y: np.ndarray, pred: np.ndarray) -> float | None:
    ss_tot = float(((y - y.mean()) ** 2).sum())
    if ss_tot == 0:
        return None
    return 1.0 - float(((y - pred) ** 2).sum()) / ss_tot
