"""Fusion: tune() trials that differ only in optimizer settings trained as one stacked model.

Issue 23, part 3 (HFTA's horizontal fusion). A small model spends its step in per-op
overhead, not arithmetic; K trials of one architecture that differ only in ``lr``,
``weight_decay`` or ``momentum`` are trained as one :class:`~dbml.search.stacking.StackedModel`,
whose every op runs once for the K of them. The fused step is one job to the
scheduler: it is captured (vmap and all: ``make_fx`` traces the batched ops), planned and
admitted by the shared MemoryScheduler like any trial's, and each member's own
hyper-parameters are buffers its captured update reads (``OptimizerSpec(stacked=True)``).

Which trials fuse (:func:`fusion_key`). Those whose TrainSpecs are equal but for ``lr``,
``weight_decay`` and ``momentum`` (and then the same ones zero: a member without weight
decay or momentum skips that operation alone), of an architecture made of layers whose
stacked ops are the single model's bit for bit (``FUSED_ARCHS``, without dropout: a mask
drawn under vmap is not the one the trial draws alone), scheduled (policy tensile or none,
no budget of their own, no measured vanilla), trained in this process (``trains_here``: on
a Ray cluster every trial is a job of its own, placed on its workers).

The data. Trials of one seed share one epoch stream: the seed decides the validation
split, the order rows are stored in and each epoch's order (``training._materialise``,
``_run_epochs``), so every member reads the batches it would read alone, and the rows are
read and shuffled once for all. Trials of different seeds do not fuse: they hold out
different rows, so they do not even have the same number of batches per epoch, and
feeding K streams would spend K times the reading that fusing saves.

Leaving. After each epoch every member's record goes to its own hook (the search's
pruner): a pruned member, one whose loss became NaN or infinite (noted at that step, as
the trial alone would fail there), or one whose objective cannot be measured, leaves the
fusion at that boundary; the others go on in a fusion of the ones left, their weights
and optimizer state carried over (``ScheduledStep(optimizer_state=...)``), re-admitted
by the scheduler at their smaller size.

Early stopping (``early_stop``, ``patience``). Each member keeps its own best epoch, by
the rule its trial alone follows (``heldout.EarlyStopping``): the weights of its best
validation loss so far are copied out of the stack, and when its patience runs out it
leaves the fusion at that epoch boundary as finished, with those weights, while the others
go on; a member still live at the last epoch finishes with its best epoch's weights too.
So a fused member stops, and ends, where its trial alone would.

Width. Members are stacked as many as fit the device budget unscheduled together (the
unscheduled peak of one member's stacked step, on the meta device, times the members:
``fusion_width``), at most ``MAX_MEMBERS``; more are trained in waves, one after another,
in the same job and on the same scratch table.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from datetime import datetime
from typing import Callable

import torch
import torch.nn.functional as F

from ..core import heldout, models, runners, training
from . import stacking
from ..core.data import StreamStats
from ..errors import JobCancelled, TrainingError, scheduler_errors
from ..core.jobs import Job
from ..scheduler.execute.planners import release_only
from ..scheduler.graph.access import build_sequence
from ..scheduler.graph.graphs import GraphCache
from ..scheduler.graph.optim import OptimizerSpec
from ..scheduler.graph.stacked import BUFFERS
from ..scheduler.latency.estimate import RooflineModel
from ..core.settings import resolve_device
from ..core.spec import TrainSpec, default_lr

__all__ = ["FUSED_ARCHS", "MAX_MEMBERS", "fusion_key", "group", "Member", "work", "fusion_width"]

# Architectures made only of layers whose stacked ops equal the single model's bit for bit
# (Linear as one baddbmm, ReLU; the loss per member): see dbml.search.stacking.
FUSED_ARCHS = ("linear", "mlp")
# Optimizers whose update scheduler.graph.stacked writes for a stack (adagrad's is not).
FUSED_OPTIMIZERS = ("sgd", "adam", "adamw")
# The most members one fusion stacks: beyond a few, a small model's step is arithmetic, not
# overhead, and a wider fusion only delays the trials the sampler would learn from.
MAX_MEMBERS = 8
# The TrainSpec fields members of a fusion may differ in (each a buffer of the stacked model).
MEMBER_FIELDS = tuple(BUFFERS)


def fusion_key(spec: TrainSpec) -> str | None:
    """What trials must share to be fused (module docstring), as text; None for a trial
    that is never fused."""
    options = spec.options_dict()
    if not trains_here(spec):
        return None
    if (spec.arch not in FUSED_ARCHS or spec.optimizer not in FUSED_OPTIMIZERS or spec.dropout or options.get("dropout") or spec.policy not in ("tensile", "none")
            or spec.memory_budget is not None or spec.measure_vanilla):
        return None
    shared = {k: v for k, v in dataclasses.asdict(spec).items() if k not in MEMBER_FIELDS}
    zero = {"weight_decay": spec.weight_decay == 0, "momentum": spec.optimizer != "sgd" or spec.momentum == 0}
    return json.dumps([shared, zero], sort_keys=True, default=str)


def trains_here(spec: TrainSpec) -> bool:
    """Whether the trial trains in this process (the ``cluster`` setting 'local'). A fused job's
    stacked step runs here (``work``); on a Ray cluster each trial is a job of its own, placed
    on the cluster's device workers, so a search spreads over its nodes (fused, a 6-trial
    search ran 5 of its trials on the driver: tests/multinode.py)."""
    return spec.settings.cluster == "local"


def group(specs: list[TrainSpec], limit: int = MAX_MEMBERS) -> list[list[int]]:
    """``specs``' positions in fusions, in order of each fusion's first member: the ones of
    one :func:`fusion_key`, ``limit`` at most to a fusion; a spec never fused alone."""
    groups: list[list[int]] = []
    open_: dict[str, list[int]] = {}
    for i, spec in enumerate(specs):
        key = fusion_key(spec) if limit > 1 else None
        if key is None or key not in open_ or len(open_[key]) >= limit:
            groups.append([i])
            if key is not None:
                open_[key] = groups[-1]
        else:
            open_[key].append(i)
    return groups


def stacked_loss(loss_fn) -> stacking.StackedLoss:
    """The stacked step's loss for members trained with ``loss_fn`` (``training.loss_function``):
    classification's ``cross_entropy`` as one ``log_softmax`` over the stack, then
    ``nll_loss`` per member (the two ops ``cross_entropy`` is), fewer ops than both per member."""
    if loss_fn is training.loss_function_of("classification"):
        return stacking.StackedLoss(F.nll_loss, log_softmax=True)
    return stacking.StackedLoss(loss_fn)


def stacked_spec(specs: list[TrainSpec]) -> OptimizerSpec:
    """The optimizer spec of the members' stacked step: theirs, with ``lr``,
    ``weight_decay`` and ``momentum`` read from the model's buffers (only whether weight
    decay and momentum apply is the spec's: 1.0, or 0.0 when no member has them), so
    fusions of every drawn value share one captured graph."""
    first = specs[0].optimizer_spec()
    return dataclasses.replace(first, lr=1.0, weight_decay=float(first.weight_decay != 0),
                               momentum=float(first.kind == "sgd" and first.momentum != 0),
                               update_chunk_bytes=None, stacked=True)


class Member:
    """One trial of a fused job. The search holds it where it holds a trial's job, so it
    answers what the search asks of a job (``id``, ``status``, ``wait``, ``cancel`` ...):
    the job's figures, and its own fate once it has left the fusion.

    ``on_epoch(record)``: after each of its epochs (may raise JobCancelled: pruned);
    ``on_trained(trained)``: its trained model, when it finishes."""

    def __init__(self, spec: TrainSpec, on_epoch: Callable[[dict], None],
                 on_trained: Callable[[training.Trained], None]):
        self.spec, self.on_epoch, self.on_trained = spec, on_epoch, on_trained
        self.job: Job | None = None
        self.history: list[dict] = []
        self.early = heldout.EarlyStopping(spec)   # its best epoch's weights: a module of its own
        self._fate: tuple[str, str | None, BaseException | None, datetime] | None = None
        self._left = threading.Event()

    # -- set on the job's thread -------------------------------------------------------------
    def leave(self, status: str, exception: BaseException | None = None) -> None:
        """It leaves the fusion: ``status`` finished, cancelled (pruned) or failed."""
        self._fate = (status, None if exception is None else str(exception), exception, datetime.now())
        self._left.set()

    def finish(self, trained: training.Trained) -> None:
        self.on_trained(trained)
        self.leave("finished")

    # -- what the search reads of a trial's job --------------------------------------------
    def _own(self, i: int, of_job: str):
        return self._fate[i] if self._fate is not None else getattr(self.job, of_job)

    status = property(lambda self: self._own(0, "status"))
    error = property(lambda self: self._own(1, "error"))
    exception = property(lambda self: self._own(2, "exception"))
    finished = property(lambda self: self._own(3, "finished"))
    id = property(lambda self: self.job.id)
    name = property(lambda self: self.job.name)
    started = property(lambda self: self.job.started)
    progress = property(lambda self: self.job.progress)
    measured_peak_bytes = property(lambda self: self.job.measured_peak_bytes)   # the fusion's

    @property
    def epochs(self) -> int:
        return self.spec.epochs

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it has left, or its job has ended (waiting up to ``timeout`` s for the job)."""
        return self._left.is_set() or self.job.wait(timeout) or self._left.is_set()

    def cancel(self, reason: str | None = None) -> None:
        """Cancel the fused job (every member)."""
        self.job.cancel(reason)

    def cancelled(self) -> bool:
        return self.job.cancelled()

    def waiting_for_memory(self) -> bool:
        return self.job.waiting_for_memory()


def work(members: list[Member], validate: bool, shared: training.SharedRows | None = None):
    """What a fused job runs (``JobManager.submit(run=...)``): its members trained, nothing
    stored; ``validate``: each epoch's records hold val_loss and val_metric; ``shared``: the
    search's rows, read once for its jobs."""
    def run(cur, spec: TrainSpec, job: Job) -> dict:
        job.validate_epochs = validate
        for member in members:   # before any epoch reports (the search sets it too, once submit returns)
            member.job = job
        started = time.perf_counter()
        with training.scratch(cur, spec, job, shared=shared) as data:
            spec = data.spec   # validation := NULL resolved for the rows (the members share it: fusion_key)
            for member in members:
                member.spec = dataclasses.replace(member.spec, validation=spec.validation)
            trained = _fit(cur, data, spec, job, members, started)
        return {"job_id": job.id, "model": spec.model, "version": None, "status": "finished", "epochs": spec.epochs,
                "rows": data.n_train, "skipped_rows": data.skipped, "seconds": time.perf_counter() - started,
                "fused": len(members), "trained": trained}
    return run


def _fit(cur, data: training.Scratch, spec: TrainSpec, job: Job, members: list[Member], started: float) -> int:
    """Train ``members`` in waves of fusions; how many finished."""
    device = resolve_device(spec.settings.device)
    outputs = len(data.prep.classes) if data.prep.task == "classification" else 1
    config = models.config(spec.arch, data.prep.model_inputs(), outputs, spec.options_dict(), hidden=spec.hidden,
                           dropout=spec.dropout or None, rows=data.n_train)
    for member in members:   # lr := NULL: the arch family's, as training._fit_model resolves it
        if member.spec.lr is None:
            member.spec = dataclasses.replace(member.spec, lr=default_lr(config.arch, member.spec.optimizer))
    spec = members[0].spec
    loss_fn = training.loss_function(data.prep)
    label = torch.int64 if data.prep.task == "classification" else torch.float32
    rows = min(spec.batch_size, data.n_train)
    params = runners.RunnerParams.of(spec)
    with scheduler_errors(spec.model, job_id=job.id, memory_budget=params.memory_budget,
                          shared_budget=lambda: runners.job_budget(params, device, job)):
        width = fusion_width(config, loss_fn, [m.spec for m in members], device, rows, label, job)
        waves = [members[i:i + width] for i in range(0, len(members), width)]
        job.begin(spec.epochs * len(waves), math.ceil(data.n_train / spec.batch_size))
        base = models.build_seeded(config, spec.seed).to(device)
        if not stacking.stackable(base):   # fusion_key lets in only FUSED_ARCHS without dropout
            raise TrainingError(f"tune(): arch {spec.arch!r} with options {config.options_dict()} cannot be fused")
        for i, wave in enumerate(waves):
            Fusion(cur, data, spec, job, config, base, loss_fn, device, wave, started, i * spec.epochs).train()
    return sum(m.status == "finished" for m in members)


def fusion_width(config: models.ModelConfig, loss_fn, specs: list[TrainSpec], device: str, rows: int,
                 label: torch.dtype, job=None) -> int:
    """How many of ``specs``' members one fusion stacks: as many as fit the device budget
    unscheduled (one member's stacked step, captured on the meta device, times the
    members: the batch is counted once for each, so it errs on the side of fitting), at
    most ``MAX_MEMBERS``. ``job``: the job, whose database's memory_limit a default budget
    is a share of (``runners.job_budget``)."""
    spec = specs[0]
    if len(specs) == 1:
        return 1
    with torch.device("meta"):
        base = models.build(config)
        model = stacking.StackedModel(base, stacking.stack(base, 1), {k: [getattr(spec, k)] for k in BUFFERS})
        batch = (models.sample_input(config, rows), torch.empty(rows, dtype=label))
    captured = GraphCache(model, stacked_loss(loss_fn), stacked_spec(specs), job=spec.model,
                          share=("stacked", 1, config)).get(*batch)
    one = release_only(build_sequence(captured, RooflineModel(device=str(torch.device(device))), spec.model)).peak_bytes
    budget = runners.job_budget(runners.RunnerParams.of(spec), device, job)
    return max(1, min(len(specs), MAX_MEMBERS, budget // max(one, 1)))


class Fusion:
    """One wave of a fused job: its members' stacked training over every epoch, members
    leaving at epoch boundaries (module docstring), the finished ones' models made."""

    def __init__(self, cur, data: training.Scratch, spec: TrainSpec, job: Job, config: models.ModelConfig,
                 base: torch.nn.Module, loss_fn, device: str, members: list[Member], started: float,
                 epochs_before: int = 0):
        self.cur, self.data, self.spec, self.job, self.config = cur, data, spec, job, config
        self.epochs_before = epochs_before   # the job's epochs in the waves before this one
        self.base, self.loss_fn, self.device, self.started = base, loss_fn, device, started
        self.live = list(members)
        self.totals = torch.zeros(len(members), dtype=torch.float64)   # each member's epoch loss so far
        self.failed: dict[int, TrainingError] = {}                     # live position -> its divergence
        self.epoch = 0
        self.peak_stats: dict = {}
        self.runner = None
        self.latency_source: str | None = None
        self._start(stacking.stack(base, len(members)), None)

    def _start(self, params: dict[str, torch.Tensor], optimizer_state: list[dict] | None) -> None:
        """A runner for the live members, from ``params`` (stacked) and ``optimizer_state``."""
        hyper = {k: [getattr(m.spec, k) for m in self.live] for k in BUFFERS}
        self.model = stacking.StackedModel(self.base, params, hyper).to(self.device)
        stacking.probe_linears(self.base, len(self.live), self._batch_rows(), self.device)
        self.names = [n for n, _ in self.model.named_parameters()] + [n for n, _ in self.model.named_buffers()]
        self.loss_at = self.names.index(stacking.LOSS_BUFFER)
        params = runners.RunnerParams.of(self.spec, optimizer=stacked_spec([m.spec for m in self.live]))
        self.runner = runners.make_runner(self.model, stacked_loss(self.loss_fn), params, self.device,
                                          self.job, ("stacked", len(self.live), self.config),
                                          optimizer_state=optimizer_state)

    def _batch_rows(self) -> set[int]:
        """The row counts of the batches it trains and validates on (a last one may be short)."""
        size, d = self.spec.batch_size, self.data
        return {r for n in (d.n_train, d.n_val) for r in (min(size, n), n % size) if r}

    def train(self) -> None:
        d = self.data
        try:
            _, stream_stats = training._run_epochs(
                self.cur, d.table, self.spec, self.step, self.device, d.n_train + d.n_val, d.n_train,
                self.end_epoch, self.prepare, convert=training._converter(d.prep, "train"))
            values, source = self.runner.values(), self.runner.latency_source
        except _AllLeft:
            return
        finally:
            self._close()
        self._finish(dict(zip(self.names, values)), source, stream_stats)

    def prepare(self) -> None:
        rows = min(self.spec.batch_size, self.data.n_train)
        label = torch.int64 if self.data.prep.task == "classification" else torch.float32
        runners.prepare(self.runner, models.sample_input(self.config, rows, self.device), label, self.device)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One stacked iteration; each member's loss kept (and its divergence noted)."""
        self.runner.step(x, y)
        losses = self.runner.values()[self.loss_at].double().cpu()
        self.totals += losses * len(y)
        if not bool(torch.isfinite(losses).all()):
            for k, value in enumerate(losses.tolist()):
                if not math.isfinite(value) and k not in self.failed:
                    self.failed[k] = training.diverged(value, self.epoch + 1, self.live[k].spec)
        self.job.step(len(y))
        return torch.zeros(())   # each member's loss is its own; _run_epochs sees a finite one

    def end_epoch(self, record: dict) -> None:
        """After an epoch: each member's record to its hook; the ones leaving leave."""
        self.epoch = record["epoch"]
        records = [{**record, "loss": t / self.data.n_train} for t in self.totals.tolist()]
        self.totals.zero_()
        if (self.job.validate_epochs or self.spec.early_stop) and self.data.n_val:
            for rec, scores in zip(records, self._validate()):
                rec.update(scores)
        stats = self.runner.stats()
        self._keep_peak(stats)
        finite = [r["loss"] for k, r in enumerate(records) if k not in self.failed]
        self.job.end_epoch({**record, "epoch": self.epochs_before + record["epoch"],
                            "loss": sum(finite) / len(finite) if finite else math.nan},
                           {**stats, "schedule": training.schedule_of(self.runner)})
        leaving: dict[int, tuple[str, BaseException]] = {k: ("failed", e) for k, e in self.failed.items()}
        for k, member in enumerate(self.live):
            if k in leaving:
                continue
            member.history.append(records[k])
            try:
                member.on_epoch(records[k])
            except JobCancelled as e:       # pruned
                leaving[k] = ("cancelled", e)
            except TrainingError as e:      # its objective cannot be measured
                leaving[k] = ("failed", e)
            else:   # early stopping: its own best epoch and patience, as its trial alone
                if member.early.update(records[k], lambda: stacking.member(self.base, self._values(), k)):
                    leaving[k] = ("finished", None)
        if leaving:
            self._leave(leaving)

    def _values(self) -> dict[str, torch.Tensor]:
        """The stacked parameters the runner holds now, by name (``members.`` dropped)."""
        return {n.removeprefix("members."): v for n, v in zip(self.names, self.runner.values())}

    def _validate(self) -> list[dict]:
        """Each live member's val_loss and val_metric, the weights of the moment, one pass."""
        values = self._values()

        def forward(x: torch.Tensor) -> torch.Tensor:   # rows first
            return stacking.stacked_forward(self.model.members, values, x).movedim(0, 1)
        out, y = heldout.validation_outputs(self.cur, self.data.table, forward, self.device, self.spec.batch_size,
                                            training._converter(self.data.prep, "train"))
        return [heldout.scores(self.data.prep, self.loss_fn, out[:, k].contiguous(), y) for k in range(len(self.live))]

    def _leave(self, leaving: dict[int, tuple[str, BaseException]]) -> None:
        """Members ``leaving`` (live position -> status, why) leave; the others go on stacked anew."""
        keep = [k for k in range(len(self.live)) if k not in leaving]
        self.latency_source = self.runner.latency_source
        for k, (status, why) in leaving.items():
            if status == "finished":   # stopped early: its best epoch's model
                self._finish_member(self.live[k], self.live[k].early.best, _stream_stats(self.live[k].history))
            else:
                self.live[k].leave(status, why)
        if not keep:
            raise _AllLeft
        index = torch.tensor(keep)
        values = dict(zip(self.names, self.runner.values()))
        params = {n.removeprefix("members."): values[n].index_select(0, index.to(values[n].device))
                  for n, _ in self.model.named_parameters()}
        state = [{key: v if key == "step" else v.index_select(0, index.to(v.device)) for key, v in s.items()}
                 for s in self.runner.optimizer_state()]
        self._close()
        self.live = [self.live[k] for k in keep]
        self.totals = self.totals[index]
        self.failed = {}
        self._start(params, state)

    def _keep_peak(self, stats: dict) -> None:
        if (stats.get("measured_peak_bytes") or 0) >= (self.peak_stats.get("measured_peak_bytes") or 0):
            self.peak_stats = stats

    def _close(self) -> None:
        if self.runner is not None:
            self._keep_peak(self.runner.stats())
            self.runner.close()
            self.job.release_scheduler()
            self.runner = None

    def _finish(self, values: dict[str, torch.Tensor], latency_source: str | None, stream_stats) -> None:
        """The members still live finished: each one's model (its best epoch's, where early
        stopping kept one, as training.TrainLoop.restore_best), checked and validated as alone."""
        self.latency_source = latency_source
        values = {n.removeprefix("members."): v for n, v in values.items()}
        for k, member in enumerate(self.live):
            module = member.early.best if member.early.best is not None else stacking.member(self.base, values, k)
            self._finish_member(member, module, stream_stats)

    def _finish_member(self, member: Member, module: torch.nn.Module, stream_stats) -> None:
        """``member`` finished with ``module``: its Trained made as its trial's alone, or it failed
        (its last update made a weight NaN or infinite)."""
        memory = runners.memory_summary({**self.peak_stats, "latency_model": self.latency_source}, None)
        d = self.data
        try:
            result = training.trained_result(self.cur, d.table, d.prep, member.spec, self.config, module,
                                             self.loss_fn, self.device, d.n_val, member.history, stream_stats,
                                             memory, member.early.best_epoch)
        except TrainingError as e:
            member.leave("failed", e)
            return
        member.finish(training.Trained(member.spec, d.prep, self.config, result["module"], result["metrics"],
                                       result["memory"], d.n_train, d.skipped, self.started,
                                       training.label_warnings(d.prep, d.n_train + d.n_val)))


def _stream_stats(history: list[dict]) -> StreamStats:
    """The reading figures of a member's epochs (its records' waits), for one that left early."""
    return StreamStats(wait_seconds=sum(r.get("wait_seconds", 0.0) for r in history))


class _AllLeft(Exception):
    """Every member of a wave left before its last epoch."""
