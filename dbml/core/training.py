"""One training job, from a validated spec to a stored model.

The job has DuckDB encode its source once into a scratch table of (features, label,
is_val) rows stored in a random order, then streams the training rows every epoch from
a random starting row through a shuffle buffer. Every iteration goes through a
``StepRunner`` (``dbml.scheduler.execute.step``), the boundary at which the memory scheduler
takes training over: ``ScheduledStep`` for policies tensile and none, ``EagerStep``
(plain PyTorch) for eager (``dbml.core.runners``). The job reports its progress, and learns it
was cancelled, through a :class:`Progress` (``dbml.core.jobs.Job`` is one); this module never
imports the job manager.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Protocol, runtime_checkable

import duckdb
import numpy as np
import torch
import torch.nn.functional as F
from sqlglot import exp

from . import catalog, checkpoints, heldout, models, placement, preload, runners, threads
from .estimate import Estimate, Measured, estimate, learn, overheads, remeasured, slow_warning, timed, timed_enough
from .runtime import runtime
from .columns import MEMORY_FIELDS
from .data import BatchStream, StreamStats, drop_scratch, scratch_rows
from ..errors import SourceError, TrainingError, scheduler_errors
from .features import Preprocessing, fit as fit_preprocessing
from .runners import JobHandle
from ..scheduler import hostmem, procmem
from ..scheduler.execute import rng
from ..scheduler.execute.runner import bounds_host_memory
from ..scheduler.execute.step import EagerStep, StepRunner
from .settings import resolve_device
from .source import job_source, parsed as _parsed, select_tree, split_column
from .spec import MAX_VALIDATION, MIN_VALIDATION, TrainSpec, default_lr, default_validation, stored_params
from ..zoo import fitter as zoo_fitter

D = "duckdb"

# What is alive once this module is imported (torch, torch.fx, sympy, the scheduler: the
# modules a job needs, alive until exit) is put out of the collector's reach, once per process:
# the full collection after each job (give_back_host_memory) then walks only what jobs made.
# With them it walked ~300,000 objects, 0.2-0.8 s a collection and two a job (a warm train()
# of 400 rows spent half its time there). Objects frozen are still freed by their refcount; a
# cycle among them that becomes garbage later (what the process held before its first job) is not.
gc.freeze()


def _classification_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y)


def _regression_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.squeeze(-1), y)


def loss_function(prep: Preprocessing):
    """One function object per task: jobs with equal models share captured graphs."""
    return loss_function_of(prep.task)


def loss_function_of(task: str):
    """The loss function of ``task`` ('classification' or 'regression')."""
    return _classification_loss if task == "classification" else _regression_loss


@runtime_checkable
class Progress(JobHandle, Protocol):
    """What a training run reports to and is cancelled through (``dbml.core.jobs.Job`` is one).

    From :class:`~dbml.core.runners.JobHandle`: ``name``, ``cancelled()``, ``attach_scheduler()``
    and ``release_scheduler()``, what the shared memory scheduler needs of a job.
    """

    id: int   # the job's id: its scratch table and its summary row
    since: float   # time.perf_counter() when the statement that started the job began (the estimate's start-up)

    def begin(self, epochs: int, steps_per_epoch: int) -> None:
        """Before the first epoch."""

    def step(self, rows: int) -> None:
        """After an iteration of ``rows`` rows; raises JobCancelled at this boundary if cancelled."""

    def check(self) -> None:
        """Raises JobCancelled if cancelled (between the stages of a job, and before storing)."""

    def estimated(self, seconds: float, warning: str | None) -> None:
        """Before the first iteration, when the runner planned one: the job's estimated time
        (``dbml.core.estimate``), and the warning of a slow job (None if it is not)."""

    def end_epoch(self, record: dict, memory: dict) -> None:
        """After an epoch: its history ``record`` and the runner's memory figures so far.
        May raise JobCancelled to stop the job at this boundary (a pruned tune() trial)."""

    # Whether each epoch's record also holds ``val_loss`` and ``val_metric``, measured on the
    # held-out rows with the weights of that moment (tune()'s objectives; a forward pass
    # over the validation rows every epoch, so off for train()).
    validate_epochs: bool

    def checkpoint(self, state) -> None:
        """After an epoch (once ``end_epoch`` let it go on): ``state()`` builds the job's state
        (``dbml.core.checkpoints``) for a retry to resume from; a job on a Ray worker sends it home
        when retries are allowed, a local job never calls it."""

    def place(self, node: str | None, device: str | None, queued_for: str | None) -> None:
        """Where the job runs on a Ray cluster, and what it waits for there (None: nothing)."""


@dataclass
class Trained:
    """A job's trained model, not yet stored: what ``store`` writes and the summary reports."""
    spec: TrainSpec
    prep: Preprocessing
    config: models.ModelConfig
    module: torch.nn.Module
    metrics: dict          # what dbml.models.metrics stores: final loss, history, validation, memory
    memory: dict           # the summary's memory figures
    rows: int              # training rows
    skipped: int           # source rows left out for an unusable label
    started: float         # time.perf_counter() when the job started
    warnings: tuple[str, ...] = ()   # what looks wrong with the data (label_warnings)
    held_out_bucket: int | None = None   # the split's exact hash bucket (Scratch), stored in params
    said: "Said | None" = None   # the estimate said before training, to learn from once the job ends

    def summary(self, job_id: int, version: int | None) -> dict:
        """The train() row of the job, stored as ``version``."""
        return {
            "job_id": job_id, "model": self.spec.model, "version": version, "status": "finished",
            "epochs": len(self.metrics["history"]), "best_epoch": self.metrics.get("best_epoch"),
            "rows": self.rows, "skipped_rows": self.skipped,
            "final_loss": self.metrics["final_loss"], "metric": self.metrics.get("val_metric_name"),
            "val_metric": self.metrics["val_metric"],
            "val_loss": self.metrics.get("val_loss"), "warnings": "; ".join(self.warnings) or None,
            "estimated_seconds": self.metrics.get("estimated_seconds"), "seconds": time.perf_counter() - self.started, **{k: self.memory.get(k) for k in MEMORY_FIELDS},
        }


def train(cur: duckdb.DuckDBPyConnection, spec: TrainSpec, progress: Progress) -> dict:
    """Run one training job to completion and store the model; return the summary row.

    ``cur`` is a cursor for this job alone. ``progress`` receives progress and may cancel
    at an iteration boundary (``dbml.core.jobs``). See ``fit`` for the training; with
    ``folds := k``, ``cross_validate`` runs first and the model's metrics keep its scores.
    """
    folds = cross_validate(cur, spec, progress) if spec.folds else None
    trained = fit(cur, spec, progress)
    if folds is not None:
        trained.metrics["cross_validation"] = folds
    progress.check()
    summary = trained.summary(progress.id, store(cur, trained))
    said = trained.said
    del trained        # the module and the blob it was stored as: what malloc keeps goes back too
    give_back_host_memory()
    if said is not None:   # what the job spent beyond its estimate, learned for the next ones
        learn(*said.key, said.estimate, Measured(said.epochs, said.steps, time.perf_counter() - said.trained))
    return summary


def store(cur: duckdb.DuckDBPyConnection, trained: Trained) -> int:
    """Write a trained model as the next version of its name (one transaction); its version."""
    return catalog.write(cur, name=trained.spec.model, config=trained.config, prep=trained.prep,
                         params=_params(trained.spec, trained.held_out_bucket), metrics=trained.metrics, rows=trained.rows,
                         module=trained.module)


def cross_validate(cur: duckdb.DuckDBPyConnection, spec: TrainSpec, progress: Progress) -> dict:
    """k-fold cross-validation (``folds := k``, scikit-learn's ``KFold`` with shuffling): the rows
    with a usable label in k folds of whole rows by the split's hash (``heldout``: the same
    rows whatever order the source gives them), and one fit per fold on the other folds,
    scored on its own (the validation metric and loss, as the job's). Nothing is stored: the
    model ``train`` then stores is trained as without folds. What the model's ``metrics``
    keep under ``cross_validation``: each fold's scores, their mean and standard deviation."""
    scores, metric = [], None
    for i in range(spec.folds):
        one = fit(cur, spec, progress, fold=(i, spec.folds))
        scores.append({"fold": i + 1, "rows": one.rows, "val_metric": one.metrics.get("val_metric"),
                       "val_loss": one.metrics.get("val_loss"), "epochs": len(one.metrics["history"])})
        metric = one.metrics.get("val_metric_name", metric)
        del one
    values = np.array([s["val_metric"] for s in scores if s["val_metric"] is not None], dtype=np.float64)
    return {"folds": spec.folds, "metric": metric, "scores": scores,
            "mean": float(values.mean()) if len(values) else None,
            "std": float(values.std(ddof=1)) if len(values) > 1 else None}


def fit(cur: duckdb.DuckDBPyConnection, spec: TrainSpec, progress: Progress,
        fold: tuple[int, int] | None = None, shared: "SharedRows | None" = None) -> Trained:
    """Train one job's model, storing nothing (``train`` stores it; tune() keeps only its best trial);
    ``fold`` (i, k): holding out the i-th of k folds instead of the job's validation rows;
    ``shared``: the statement's rows, read once for its jobs (a tune()'s trials: ``SharedRows``).

    The job's encoded rows live in a table of the in-memory scratch database
    ``dbml_scratch`` (attached by install, gone with the process), which every cursor can
    read and which is dropped when the job ends.
    """
    started = time.perf_counter()
    try:
        with scratch(cur, spec, progress, fold, shared) as data:
            placement.check_access(data.spec, cur)   # also checked before the statement starts its jobs
            if placement.is_local(data.spec):
                result = _fit_model(cur, data.table, data.prep, data.spec, data.n_train, data.n_val, progress)
            else:   # on a cluster, its workers run _fit_model on a copy of the table (dbml.core.placement)
                result = placement.backend(data.spec).fit_model(cur, data.table, data.prep, data.spec, data.n_train,
                                                                data.n_val, progress, _fit_model)
    finally:
        give_back_host_memory()
    over = runners.real_memory_warning(result["memory"])
    warnings = label_warnings(data.prep, data.n_train + data.n_val) + tuple(result["metrics"].get("warnings", ())) \
        + ((over,) if over else ())
    return Trained(result["spec"], data.prep, result["config"], result["module"], result["metrics"], result["memory"],
                   data.n_train, data.skipped, started, warnings, data.held_out_bucket, result.get("said"))


@dataclass(frozen=True)
class Said:
    """A job's estimate and what it measured, for ``estimate.learn`` once the job ends."""
    key: tuple[str, str, str]   # (device, input kind, arch): whose fixed costs it teaches
    estimate: Estimate
    epochs: list[float]         # each epoch's measured seconds
    steps: list[float]          # ... of which inside its steps
    trained: float              # time.perf_counter() when the last epoch ended


def give_back_host_memory() -> None:
    """The job's steps are over: the freed memory malloc kept for its next step goes back
    to the OS (``hostmem``), before the model is stored (its copies would otherwise add
    to the memory the activations left) and before the next job."""
    if hostmem.keep_freed_host_memory():
        gc.collect()   # the runner's closures and executor reference each other
        hostmem.give_back_freed_host_memory()


@dataclass(frozen=True)
class Scratch:
    """A job's rows, encoded once: the scratch table and what fitting the preprocessing found."""
    spec: TrainSpec   # the job's, its validation := NULL resolved for the rows (default_validation)
    table: str
    prep: Preprocessing
    n_train: int
    n_val: int
    skipped: int   # source rows left out for an unusable label (features.label_usable)
    held_out_bucket: int = 0   # rows whose hash bucket is below it are held out (_held_out_share)


@contextmanager
def scratch(cur: duckdb.DuckDBPyConnection, spec: TrainSpec, progress: Progress,
            fold: tuple[int, int] | None = None, shared: "SharedRows | None" = None) -> Iterator[Scratch]:
    """The job's source checked, its preprocessing fitted and its rows materialised
    (``_materialise``) into the job's scratch table, dropped when the block ends; ``fold``
    (i, k): the i-th of k folds held out (``_fold_buckets``) instead of the job's validation rows.
    ``shared``: the rows of the statement's jobs, read once (``SharedRows``), dropped with it."""
    if shared is not None and fold is None:
        threads.use(spec.settings.torch_threads)
        yield shared.rows(cur, spec, progress)
        return
    threads.use(spec.settings.torch_threads)
    select_sql, columns = job_source(cur, spec)
    data = _read(cur, spec, progress, select_sql, columns, f"dbml_scratch.job_{progress.id}", fold)
    try:
        yield data
    finally:
        _drop_scratch(cur, data.table)


def _read(cur: duckdb.DuckDBPyConnection, spec: TrainSpec, progress: Progress, select_sql: exp.Query, columns,
          table: str, fold: tuple[int, int] | None) -> Scratch:
    """``scratch``'s work: the preprocessing fitted, the split chosen and the rows materialised
    into ``table`` (dropped again if that fails; the caller drops it once done)."""
    by = split_column(columns, spec)   # split := 'custom' / 'seq': it splits, never a feature
    columns = [c for c in columns if by is None or c.name != by.name]
    prep = fit_preprocessing(cur, select_sql, columns, label=spec.label,
                             features=None if spec.features is None else list(spec.features), task=spec.task,
                             text=spec.text, shape=spec.shape, image_size=spec.image_size,
                             series_scale=spec.series_scale)
    # one scan counts the rows, and those with a usable label (the split's)
    counts = exp.select("count(*)", exp.Filter(this=exp.func("count", exp.Star()), expression=exp.Where(
        this=_parsed(prep.label_filter())))).from_(_parsed(select_sql).subquery())
    total, usable = cur.execute(counts.sql(D)).fetchall()[0]
    rule, low = None, 0
    if fold is not None:
        share, (low, bucket) = 1 / fold[1], _fold_buckets(cur, select_sql, prep, spec, usable, fold)
    elif by is not None:
        # 'custom': the column decides (validation stays NULL); 'seq': validation's share, NULL the default one
        share = spec.validation if spec.validation is not None or spec.split == "custom" else default_validation(total)
        rule, bucket = heldout.by_column(spec.split, by.name, share), 0
    else:
        share, bucket = _held_out_share(cur, select_sql, prep, spec, total, usable)
    spec = dataclasses.replace(spec, validation=share)
    try:
        progress.check()
        n_train, n_val = _materialise(cur, table, select_sql, prep, spec, bucket, low, rule)
        progress.check()
    except BaseException:
        _drop_scratch(cur, table)
        raise
    return Scratch(spec, table, prep, n_train, n_val, total - n_train - n_val, bucket)


# What a job's rows depend on (its scratch table, its preprocessing): jobs of one statement that
# agree on these read the same rows in the same order, so they can share one reading
# (``SharedRows``). Everything else a trial varies (lr, hidden, batch_size...) is the model's.
ROWS_FIELDS = ("source", "label", "features", "task", "text", "shape", "image_size", "series_scale", "seed",
               "validation", "split", "split_col")


class SharedRows:
    """The scratch tables of one statement's jobs (a tune()'s trials), each set of rows read,
    encoded and materialised once, by the first job that needs it, and dropped by ``close``.
    Issue 32: reading the table again per trial was a fixed cost of every trial; a trial
    that reads the shared rows trains on exactly the rows a lone train() reads (the one
    order ``_materialise`` stores them in), so its result is the same."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rows: dict[tuple, Scratch] = {}
        self._reading: dict[tuple, threading.Lock] = {}

    @staticmethod
    def key(spec: TrainSpec) -> tuple:
        return (*(repr(getattr(spec, f)) for f in ROWS_FIELDS), spec.settings.sources)

    def rows(self, cur: duckdb.DuckDBPyConnection, spec: TrainSpec, progress: Progress) -> Scratch:
        """``spec``'s rows (as ``scratch`` makes them), read by this job if no job has yet."""
        key = self.key(spec)
        with self._lock:
            reading = self._reading.setdefault(key, threading.Lock())
        with reading:   # one job reads; the others of the same rows wait for it
            with self._lock:
                data = self._rows.get(key)
            if data is None:
                select_sql, columns = job_source(cur, spec)
                data = _read(cur, spec, progress, select_sql, columns, f"dbml_scratch.rows_{progress.id}", None)
                with self._lock:
                    self._rows[key] = data
        return dataclasses.replace(data, spec=dataclasses.replace(spec, validation=data.spec.validation))

    def close(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Drop the tables (once no job reads them)."""
        with self._lock:
            tables, self._rows = [d.table for d in self._rows.values()], {}
        for table in tables:
            _drop_scratch(cur, table)


def label_warnings(prep: Preprocessing, rows: int) -> tuple[str, ...]:
    """What looks wrong with the label, said in the summary (``warnings``): a class per row or
    nearly (an identifier?), or a regression target that barely varies."""
    out = []
    if prep.task == "classification" and rows >= 20 and len(prep.classes) >= 0.5 * rows:
        out.append(f"label {prep.label!r} has {len(prep.classes)} classes in {rows} rows: nearly every row is "
                   f"its own class (an identifier?); pass another label, or task := 'regression'")
    if prep.task == "regression" and prep.target_std <= 1e-9 * max(1.0, abs(prep.target_mean)):
        out.append(f"label {prep.label!r} is (nearly) constant ({prep.target_mean:g}): there is little to learn")
    return tuple(out)


def _drop_scratch(cur, table: str) -> None:
    """Drop the job's scratch table, even just after a cancel interrupted the cursor."""
    try:
        cur.execute(drop_scratch(table).sql(D))
    except duckdb.InterruptException:
        cur.execute(drop_scratch(table).sql(D))


def _params(spec: TrainSpec, held_out_bucket: int | None = None) -> dict:
    """What the catalog stores of the job: its parameters, the source it read (one SELECT: what
    BigQuery ML's ``ML.EVALUATE(MODEL m)``, ``ML.FEATURE_INFO`` and ``ML.GLOBAL_EXPLAIN`` read
    without input rows) and the split's exact hash bucket (``held_out_sql`` reads it:
    ML.EVALUATE's rows are the ones held out)."""
    params = stored_params(spec)
    params["source"] = select_tree(spec.source, fn="train").sql(D)
    if held_out_bucket is not None:
        params["held_out_bucket"] = held_out_bucket
    return params


def _materialise(cur, table: str, select_sql: exp.Query, prep: Preprocessing, spec: TrainSpec,
                 bucket: int, low: int = 0, rule: exp.Expression | None = None) -> tuple[int, int]:
    """Features and labels computed once by DuckDB, with a deterministic validation split.

    ``h`` hashes each source row (every column it has, as the source gives it: not the
    encoded features, so models of one source with other features or encodings hold out
    the same rows) with the seed: it decides the split and the one random order the rows
    are stored in (the only sort of the job), so both are reproducible whatever order the
    source yields rows in. Epochs then stream that order from a random starting row
    through a shuffle buffer (``data.shuffle_windows``). ``rule``: split := 'custom' or 'seq'
    holds rows out by its column instead (``heldout.by_column``, a window over the rows with a
    usable label), the hash still ordering the rows.
    """
    held = heldout.is_held_out("h", bucket=bucket, low=low) if rule is None else exp.column("v")
    rows = (exp.select(exp.alias_(prep.scratch_expression(), "x"), exp.alias_(_label_column(prep), "y"),
                       exp.alias_(heldout.split_hash(spec.seed), "h"),
                       *([] if rule is None else [exp.alias_(rule, "v")]))
            .from_(_parsed(select_sql).subquery()).where(_parsed(prep.label_filter())))
    split = (exp.select("x", "y", exp.alias_(held, "is_val"))
             .from_(rows.subquery()).order_by("h", dialect=D))
    cur.execute(exp.Create(this=exp.to_table(table, dialect=D), kind="TABLE", expression=split).sql(D))
    counts = exp.select("count(*) FILTER (NOT is_val)", "count(*) FILTER (is_val)", dialect=D).from_(
        exp.to_table(table, dialect=D))
    n_train, n_val = cur.execute(counts.sql(D)).fetchall()[0]
    if n_train == 0:
        raise SourceError(f"train(): no rows left for training after holding out validation := {spec.validation}; "
                          f"pass a larger source or validation := 0")
    return n_train, n_val


def _held_out_share(cur, select_sql: exp.Query, prep: Preprocessing, spec: TrainSpec,
                    total: int, n: int) -> tuple[float, int]:
    """(the validation share, the hash bucket below which the rows held out fall): the share
    of the rows with a usable label, rounded to whole rows (``validation := NULL``: between
    10 % and 25 % of them, as documented), made exact by choosing the bucket below which
    exactly those rows fall. A fixed bucket per share held out 29 % of iris's 112 rows for a
    share of 25 %. The model stores the bucket (``held_out_bucket``), so ``ML.EVALUATE``
    (``held_out_sql``) reads the same rows. ``n``: the rows with a usable label (counted with
    ``total`` in one scan)."""
    share = spec.validation if spec.validation is not None else default_validation(total)
    if share == 0:
        return 0.0, 0
    k = round(share * n)
    if spec.validation is None:   # the documented bounds, in whole rows
        k = min(max(k, math.ceil(MIN_VALIDATION * n)), math.floor(MAX_VALIDATION * n))
    return share, _bucket_below(cur, select_sql, prep, spec, k, n)


def _bucket_below(cur, select_sql: exp.Query, prep: Preprocessing, spec: TrainSpec, k: int, n: int) -> int:
    """The hash bucket below which exactly ``k`` of the ``n`` rows with a usable label fall."""
    if k <= 0 or n == 0:
        return 0
    bucket = exp.alias_(exp.Mod(this=heldout.split_hash(spec.seed), expression=exp.Literal.number(
        heldout.VALIDATION_BUCKETS)), "r")
    usable = exp.select(bucket).from_(_parsed(select_sql).subquery()).where(_parsed(prep.label_filter()))
    nth = exp.select("r").from_(usable.subquery()).order_by("r").limit(1).offset(k)
    cut = cur.execute(nth.sql(D)).fetchall()
    return int(cut[0][0]) if cut else heldout.VALIDATION_BUCKETS


def _fold_buckets(cur, select_sql: exp.Query, prep: Preprocessing, spec: TrainSpec, n: int,
                  fold: tuple[int, int]) -> tuple[int, int]:
    """(low, high): the hash buckets of fold ``i`` of ``k`` (``fold``), rows ``round(i n / k)`` up to
    ``round((i + 1) n / k)`` of the ``n`` with a usable label in the split's order: k folds of
    whole rows, each row in exactly one."""
    i, k = fold
    low = _bucket_below(cur, select_sql, prep, spec, round(i * n / k), n)
    high = heldout.VALIDATION_BUCKETS if i == k - 1 else _bucket_below(cur, select_sql, prep, spec,
                                                                       round((i + 1) * n / k), n)
    return low, high


def _label_column(prep: Preprocessing) -> exp.Expression:
    """The label as the dtype the loss wants: int64 class indices or float32 scaled targets."""
    label = prep.label_expression()
    return exp.cast(label, "BIGINT", dialect=D) if prep.task == "classification" else label


class TrainLoop:
    """One job's iterations through its step runner: the first batch's plan made ahead
    (a budget no plan meets fails there, before any activation is allocated), every step
    reported to ``progress``, and with ``measure_vanilla`` the vanilla
    (``runners.vanilla_peak``) measured on the first batch, once its plan fit."""

    def __init__(self, runner: StepRunner, module: torch.nn.Module, loss_fn, spec: TrainSpec,
                 prep: Preprocessing, progress: Progress, n_train: int, device: str, config: models.ModelConfig,
                 validate=None, n_val: int = 0):
        self.runner, self.module, self.loss_fn, self.config = runner, module, loss_fn, config
        self.validate = validate   # forward -> {"val_loss", "val_metric"}: each epoch, if the job wants it
        self.spec, self.prep, self.progress = spec, prep, progress
        self.n_train, self.n_val, self.device = n_train, n_val, device
        self.estimate: Estimate | None = None   # the job's predicted time, once its first batch is planned
        self.slow: str | None = None             # ... and the warning it gave, if it passed slow_train_seconds
        self.vanilla: int | None = None
        self.history: list[dict] = []    # the epochs' records so far (a checkpoint's)
        self.checkpoints = False          # after each epoch, hand progress a checkpoint (retries allowed)
        self._measured = False
        self.early = heldout.EarlyStopping(spec)   # the best epoch so far, its weights: copies of the runner's values
        # dropout draws from the job's own generator, as eager PyTorch does after
        # torch.manual_seed(seed), whatever runs beside it (scheduler/execute/rng.py); a
        # plain PyTorch step draws inside its modules, so it runs whole under that generator
        self.random = rng.JobRandom(spec.seed, device)
        self._whole_step = isinstance(runner, EagerStep) and any(
            isinstance(m, torch.nn.modules.dropout._DropoutNd) for m in module.modules())
        self.learns = (device, config.inputs.kind, config.arch)   # whose fixed costs it is estimated with
        self.step_seconds: list[float] = []   # each epoch's seconds inside step() (estimate.Measured)
        self._stepping = 0.0
        # the estimate said again from the job's first iterations' steps (estimate.remeasured)
        self.remeasured: float | None = None
        self._done, self._steps = 0, []

    def measured(self, history: list[dict]) -> "Said | None":
        """The estimate and this run's epochs, once they have ended (None: nothing was estimated)."""
        return None if self.estimate is None else Said(self.learns, self.estimate, [r["seconds"] for r in history],
                                                       self.step_seconds, time.perf_counter())

    def prepare(self) -> None:
        """The first batch's graph and plan, while DuckDB reads the rows, and, where the rows
        do not divide into batches, the last, smaller one's graph (a new shape is a new
        capture, 0.3 s for a small MLP: made here, it is part of the start-up the estimate
        measures rather than a cost inside the first epoch it would have to guess; its plan,
        0.05 s, is made when it comes, as a plan made now would ask a shared planner for room
        the job does not use yet)."""
        rows = min(self.spec.batch_size, self.n_train)
        label = torch.int64 if self.prep.task == "classification" else torch.float32
        runners.prepare(self.runner, models.sample_input(self.config, rows, self.device), label, self.device)
        schedule = schedule_of(self.runner)   # the first batch's: what an iteration is estimated from
        if self.n_train % rows:
            runners.prepare(self.runner, models.sample_input(self.config, self.n_train % rows, self.device), label,
                            self.device, plan=False)
        now = time.perf_counter()
        if schedule is not None:   # eager (and Capuchin before its first iteration) plan nothing ahead
            self.estimate = estimate(schedule[1], n_train=self.n_train, n_val=self.n_val,
                                     batch_size=self.spec.batch_size, epochs=self.spec.epochs,
                                     validate_epochs=self.validate is not None,
                                     startup=now - self.progress.since, learned=overheads(*self.learns),
                                     cold=first_job(), plan_extra=schedule[0].extra_time)
            self.slow = slow_warning(self.estimate, self.config, self.spec)
            self.progress.estimated(self.estimate.seconds, self.slow)

    def said(self) -> dict:
        """What the job stores of its estimate: ``estimated_seconds`` (the last said: from its
        first iterations' steps where it ran that many), ``predicted_seconds`` (said before
        them), and the warning of a slow one."""
        predicted = None if self.estimate is None else self.estimate.seconds
        return {"estimated_seconds": predicted if self.remeasured is None else self.remeasured,
                "predicted_seconds": predicted,   # said before the first iteration (the model's metrics keep it)
                "warnings": [self.slow] if self.slow else []}

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not self._measured:
            self.vanilla = runners.vanilla_peak(self.module, self.loss_fn, runners.RunnerParams.of(self.spec), x, y)
            self._measured = True
        started = time.perf_counter()
        loss = self.random.call(self.runner.step, x, y) if self._whole_step else self.runner.step(x, y)
        self.progress.step(len(y))
        now = time.perf_counter()
        self._stepping += now - started
        self._time_iterations(now - started)
        return loss

    def _time_iterations(self, seconds: float) -> None:
        """After an iteration's step: its seconds (the job's first left out: its first calls);
        once they are enough (``estimate.timed_enough``), the estimate said again from them, and
        the slow-job warning with it."""
        self._done += 1
        if self._done >= 2 and self.estimate is not None and self.remeasured is None:   # nothing kept for eager
            self._steps.append(seconds)
            if timed_enough(self._steps):
                self.remeasured = remeasured(self.estimate, time.perf_counter() - self.progress.since, self._done,
                                             self._steps)
                # the warning follows the estimate: said, or withdrawn, with it
                self.slow = slow_warning(timed(self.estimate, self._steps), self.config, self.spec, self.remeasured)
                self.progress.estimated(self.remeasured, self.slow)

    def end_epoch(self, record: dict) -> bool:
        """Report the epoch (with its validation, when measured); True to stop training here:
        ``early_stop`` and no better validation loss for ``patience`` epochs."""
        self.step_seconds.append(self._stepping)
        self._stepping = 0.0
        if self.validate is not None:
            record.update(self.validate(self.forward_now()))
        self.history.append(record)
        self.progress.end_epoch(record, {**self.runner.stats(), "schedule": schedule_of(self.runner)})
        stop = self.early.update(record, self.runner.kept_values)
        if self.checkpoints and not stop:
            self.progress.checkpoint(lambda: checkpoints.capture(self.runner, self.random, self.history, self.vanilla,
                                                                 self.early.state()))
        return stop

    def restore_best(self) -> None:
        """After ``runner.finish()``: the model holds the best epoch's weights (early_stop), not
        the last one's."""
        if self.early.best is None:
            return
        self.early.restore(list(self.module.parameters()) + list(self.module.buffers()))

    def resume(self, state: dict) -> None:
        """Go on from a checkpoint (its weights are in the module already): optimizer state,
        generators, history, the vanilla, early stopping's best epoch."""
        checkpoints.restore_run(self.runner, self.random, state)
        self.history, self.vanilla, self._measured = list(state["history"]), state["vanilla"], True
        self.early.load(state)
        self._done = len(self.history) * math.ceil(self.n_train / self.spec.batch_size)   # the epochs behind it

    def forward_now(self):
        """The model's forward pass with the weights the runner holds now, in eval mode; it
        moves nothing the runner holds (``StepRunner.values``)."""
        names = [n for n, _ in self.module.named_parameters()] + [n for n, _ in self.module.named_buffers()]
        values = dict(zip(names, self.runner.values(), strict=True))

        def forward(x: torch.Tensor) -> torch.Tensor:
            self.module.eval()
            try:
                return torch.func.functional_call(self.module, values, (x,))
            finally:
                self.module.train()
        return forward

    def memory(self) -> dict:
        """The summary's memory figures, once the loop has ended."""
        stats = {**self.runner.stats(), "latency_model": self.runner.latency_source}
        return runners.memory_summary(stats, self.vanilla, getattr(self, "real", None))


def first_job() -> bool:
    """Whether the caller is the process's first job to be estimated: the one that pays the
    process's one-off costs after its estimate (first calls of the ops, lazy imports)."""
    return runtime().first_job_taken.acquire(blocking=False)


def schedule_of(runner) -> tuple | None:
    """The plan the job runs and the access sequence it was made for (what
    ``dbml.plot.memory`` draws); None for an eager job."""
    plans, sequences = getattr(runner, "plans", None), getattr(runner, "sequences", None)
    if not isinstance(plans, dict) or not isinstance(sequences, dict):
        return None
    key = next((k for k in plans if k in sequences), None)
    return None if key is None else (plans[key], sequences[key])


def _fit_model(cur, table: str, prep: Preprocessing, spec: TrainSpec, n_train: int, n_val: int,
               progress: Progress, resume: dict | None = None) -> dict:
    """Train the model on the job's scratch ``table``. ``resume``: a checkpoint to go on from
    (a job retried on a Ray worker: ``dbml.core.checkpoints``)."""
    fitted = zoo_fitter(spec.arch)   # trees, k-means (dbml.core.kinds): fitted on the scratch table, not stepped
    if fitted is not None:   # lr and early stopping are a stepped model's: its spec as given
        return {**fitted(cur, table, prep, spec, n_train, n_val, progress), "spec": spec}
    device = resolve_device(spec.settings.device)
    outputs = len(prep.classes) if prep.task == "classification" else 1
    config = models.config(spec.arch, prep.model_inputs(), outputs, spec.options_dict(), hidden=spec.hidden,
                           dropout=spec.dropout or None, rows=n_train)
    if spec.lr is None:
        spec = dataclasses.replace(spec, lr=default_lr(config.arch, spec.optimizer))
    params = runners.RunnerParams.of(spec)
    runners.check_model_fits(config, params.optimizer, device)
    loss_fn = loss_function(prep)
    label = torch.int64 if prep.task == "classification" else torch.float32
    # the process's one-off imports and first trace are not the job's memory: where a budget bounds it
    preload.ready(warm=params.memory_budget is not None or params.shared_budget is not None)
    params, meta = runners.fit_pieces(config, loss_fn, params, device, min(spec.batch_size, n_train), label, progress)
    temp = runners.measure_spill_tier(cur, device)
    # what the job adds to the process's real memory, from here to its end
    with procmem.watch() as real, scheduler_errors(
            spec.model, job_id=progress.id, memory_budget=params.memory_budget,
            shared_budget=lambda: runners.job_budget(params, device, progress)):
        spill = runners.spill_file(cur, progress.name, device, temp)
        try:
            runners.check_plan_fits(config, loss_fn, params, device, min(spec.batch_size, n_train), label, progress,
                                    spill=spill is not None, seq=meta)
            # a job that holds its budget in real memory (hostmem.bounded, which its runner enters):
            # its weights are made under it too, not in the heap, whose holes outlive them
            bounded = bounds_host_memory(params.policy, runners.job_budget(params, device, progress), spill) \
                and hostmem.keep_freed_host_memory()
            with hostmem.bounded() if bounded else contextlib.nullcontext():
                module = models.build_seeded(config, spec.seed).to(device)
                if resume is not None:
                    checkpoints.restore_model(module, resume)
                runner = runners.make_runner(module, loss_fn, params, device, progress, config, spill=spill,
                                             real_base=real.start)
        except BaseException:
            if spill is not None:
                spill.close()
            raise
        # each epoch's validation runs in batches of the job's own size: its activations (no
        # gradients) stay below an iteration's
        validate = (lambda forward: heldout.validate(cur, table, prep, forward, loss_fn, device, n_val, spec.batch_size,
                                                    _converter(prep, "train"))) \
            if (progress.validate_epochs or spec.early_stop) and n_val else None
        loop = TrainLoop(runner, module, loss_fn, spec, prep, progress, n_train, device, config, validate, n_val)
        loop.checkpoints = spec.settings.cluster != "local" and bool(spec.settings.max_retries)
        if resume is not None:
            loop.resume(resume)
        progress.begin(spec.epochs, math.ceil(n_train / spec.batch_size))
        try:
            with rng.using(loop.random):
                history, stream_stats = _run_epochs(cur, table, spec, loop.step, device, n_train + n_val, n_train,
                                                    loop.end_epoch, loop.prepare, convert=_converter(prep, "train"),
                                                    history=loop.history)
            runner.finish()
            loop.restore_best()   # before close: the best epoch's weights may be in the job's spill file
            said = loop.measured(history) if resume is None else None   # a resumed run's epochs are not all its own
        finally:
            runner.close()
            real.stop()
            progress.release_scheduler()
    loop.real = real.result
    return {**trained_result(cur, table, prep, spec, config, module, loss_fn, device, n_val, history,
                             stream_stats, loop.memory(), loop.early.best_epoch, loop.said()), "said": said}


def trained_result(cur, table: str, prep: Preprocessing, spec: TrainSpec, config: models.ModelConfig,
                   module: torch.nn.Module, loss_fn, device: str, n_val: int, history: list[dict],
                   stream_stats: StreamStats, memory: dict, best_epoch: int | None, said: dict | None = None) -> dict:
    """A trained module (with its best epoch's weights, where early stopping kept one),
    checked finite, as what ``Trained`` keeps: its metrics (final loss, history, the best
    epoch, whether it stopped early, validation on the held-out rows, ``said``: the estimate
    and its warning, ``TrainLoop.said``) and memory figures."""
    _check_finite(module, spec)
    module.eval()
    stored = {"final_loss": history[-1]["loss"], "history": history, "best_epoch": best_epoch,
              "stopped_early": len(history) < spec.epochs, **(said or {}),
              "fetch_wait_seconds": stream_stats.wait_seconds, "memory": memory}
    stored.update(heldout.validate(cur, table, prep, module, loss_fn, device, n_val, 8192 if prep.input is None else 256,
                                  _converter(prep, "train")))
    return {"config": config, "module": module.cpu(), "metrics": stored, "memory": memory, "spec": spec}


def _check_finite(module: torch.nn.Module, spec: TrainSpec) -> None:
    """The weights after the last update: the loss is checked each step, but it is computed
    before that step's update, which can still make every weight NaN or infinite."""
    bad = next((name for name, t in module.state_dict().items()
                if t.is_floating_point() and not bool(torch.isfinite(t).all())), None)
    if bad is not None:
        raise TrainingError(f"train(): the weights became NaN or infinite in the last update ({bad}); "
                            f"nothing was stored; pass a smaller lr := (now {spec.lr}) or weight_decay := "
                            f"(now {spec.weight_decay})")


def _converter(prep: Preprocessing, fn: str):
    """How a batch's x column of the scratch table becomes the model's input: None (a
    FLOAT[n] view) for tabular features, the input encoder (tokenising, padding, scaling
    pixels decoded at materialising) otherwise."""
    return None if prep.input is None else (lambda col: prep.input.to_tensor(col, fn=fn, decoded=True))


def _run_epochs(cur, table: str, spec: TrainSpec, step, device: str, n_rows: int, n_train: int, on_epoch,
                before=None, convert=None, history: list[dict] | None = None):
    """Every epoch: stream the training rows, shuffled, through ``step``; return the history.
    ``before()`` runs once the first epoch's stream has started, before its first batch.
    ``history``: the epochs already trained (a resumed job starts after them)."""
    def epoch_stream(epoch: int) -> BatchStream:
        rng = np.random.default_rng([spec.seed % 2**64, epoch])   # any BIGINT seed, negative too
        start = int(rng.integers(n_rows))
        rowid, at = exp.column("rowid"), exp.Literal.number(start)
        sql = [scratch_rows(table, exp.and_("NOT is_val", rowid >= at, dialect=D)),
               scratch_rows(table, exp.and_("NOT is_val", rowid < at, dialect=D))]
        return BatchStream(cur, sql, spec.batch_size, spec.settings.prefetch_batches, shuffle=int(rng.integers(2**63)),
                           window_rows=spec.settings.shuffle_window, convert=convert).start()

    stream_stats, history = StreamStats(), list(history or [])
    start = len(history)
    stream, upcoming = None, epoch_stream(start) if start < spec.epochs else None
    try:
        if before is not None:
            before()
        for epoch in range(start, spec.epochs):
            epoch_started = time.perf_counter()
            stream, upcoming = upcoming, epoch_stream(epoch + 1) if epoch + 1 < spec.epochs else None
            total = torch.zeros((), dtype=torch.float64)
            for x, y in stream:
                loss = step(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
                if not torch.isfinite(loss):
                    raise diverged(loss.item(), epoch + 1, spec)
                total += loss.double().cpu() * len(y)
            stream_stats.add(stream.stats)
            history.append({"epoch": epoch + 1, "loss": total.item() / n_train,
                            "seconds": time.perf_counter() - epoch_started,
                            "wait_seconds": stream.stats.wait_seconds})
            if on_epoch(history[-1]):   # early stopping
                break
    finally:
        for s in (stream, upcoming):
            if s is not None:
                s.close()
    return history, stream_stats


def diverged(loss: float, epoch: int, spec: TrainSpec) -> TrainingError:
    """The error of a job whose loss became NaN or infinite in ``epoch`` (from 1)."""
    return TrainingError(f"train(): loss became {loss} in epoch {epoch}; nothing was stored; pass a smaller "
                         f"lr := (now {spec.lr}), or look for extreme values in the features")
