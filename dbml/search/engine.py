"""The search engine behind tune(): its trials as jobs packed on one device by the shared scheduler.

A :class:`Search` runs one tune() call. Its engine is Optuna's ask/tell interface: the
study is made in memory from the model's stored trials (``dbml.trials``), so a search
survives the process and tune() on the same model goes on with it; each trial drawn
(``study.ask``) becomes a training job (``JobManager.submit``, training without storing:
``training.fit``) and its result is told back (``study.tell``).

Packing. Trials are jobs like train()'s: a tensile trial without a ``memory_budget`` of
its own joins the device's shared MemoryScheduler, which plans the running trials
jointly and queues one that does not fit (admission). Up to ``parallel`` run at once;
without it, the search starts another trial while none waits for memory, fewer than
``SETUP_AHEAD`` are still being set up, and one more fits beside the running ones without
a plan that swaps or recomputes (``PACK_WITHOUT_SWAPS``; admission would let in more, at a
cost the bench measured above the gain). Trials
that do not share the scheduler (another policy, or their own budget) run one at a time
unless ``parallel`` says otherwise. After each epoch the job's hook (``Job.on_epoch``)
reports the epoch's objective to the trial and asks the pruner; a pruned trial stops at
that boundary, its memory given back at once, and the next trial is admitted.

Fusion (``FUSE_TRIALS``). Trials are asked in rounds (``_round_size``), and the ones of a
round that differ only in optimizer settings are trained as one job, a stacked model
(``dbml.search.fusion``); each such trial holds a ``fusion.Member`` where a trial holds its job,
with its own fate (a pruned member leaves the fusion at that epoch boundary). Packing
and ``parallel`` count trials as before, a fused job as its members.

The first trial of a search with no feasible trial yet runs alone, with the parameters
that change memory at their smallest (``Space.corner``): if even it does not fit the
budget, the search stops with that error and stores nothing.

Each trial is recorded when it starts and when it ends (status finished, pruned, failed
or infeasible: its plan fit no budget); the trained weights of the best trial so far are
kept in memory, and at the end the best trial is stored as the model's next version, if
it was trained by this call. An interrupt (Ctrl-C, ``Connection.interrupt()``) cancels the
running trials, keeps the ended ones, stores the best and raises ``Interrupted``.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

from sqlglot import exp

from . import fusion
from ..core import runners
from . import trials as store
from ..core import catalog, training
from ..errors import BudgetTooSmall, Interrupted, InvalidArgument, JobCancelled, TrainingError, VersionStored
from ..core.jobs import Job, JobManager, Wait
from ..core.runtime import runtime
from ..scheduler.multijob.registry import existing_scheduler
from ..core.settings import resolve_device
from ..core.source import value_sql
from .studies import best_trial, decode, dists_json, distribution, encode, make_study
from .tunespec import DEFAULT_TRIALS, TuneRequest

POLL_S = 0.05      # how often the search looks at its running trials
STOP_S = 60.0      # how long an interrupted search waits for its trials to stop
# Without ``parallel``, trials being set up (source materialised, graph captured, first plan
# made) before they reach admission: a few at once keep the device fed while one waits
# for memory stops new ones; all at once would do every setup before learning what fits.
SETUP_AHEAD = 2
# Without ``parallel``, start another trial only while it fits beside the running ones at
# their unscheduled peaks. Admission alone packs every trial some plan fits, swapping and
# recomputing to make room: with many small trials that cost more than it gave (the bench's
# 32-trial MLP search on 2 cores: 66.7 s packed by admission alone, 35.2 s one at a time).
# False: admission alone decides (as for train()'s jobs).
PACK_WITHOUT_SWAPS = True
# Train trials that differ only in optimizer settings as one stacked job (dbml.search.fusion): a
# small model's step is per-op overhead, paid once for the fusion instead of once per trial.
# False: every trial its own job. Never with parallel := 1 (one trial at a time).
FUSE_TRIALS = True
# Trials asked of a TPE sampler at once, to find fusable ones among them. TPE learns from
# ended trials, and no trial of a round has ended when the round is asked (as with trials
# packed side by side); a grid's or random sampler's draws learn nothing, so a round is
# as many as ASK_AHEAD.
FUSE_ROUND = 8
# The most trials asked of the sampler ahead of their start (a grid's points are enqueued as
# they are asked, too): a search asks as it goes, so its memory does not grow with ``trials``
# and an interrupt is seen between rounds (asking every trial of a random search at once took
# 17 MB/s, and an interrupt waited for it to end). Room for MAX_MEMBERS fusions of MAX_MEMBERS.
ASK_AHEAD = fusion.MAX_MEMBERS ** 2
# tune()'s objective -> the key of each epoch's record that holds it
RECORD_KEYS = {"val_loss": "val_loss", "val_metric": "val_metric", "loss": "loss"}



@dataclass
class Trial:
    """One trial of this call: what it drew, its job and its fate."""
    number: int
    params: dict                   # the train() arguments drawn, as JSON values
    ask: object                    # Optuna's trial (report, should_prune, tell)
    search: dict                   # the sampler's view: Optuna's params and distributions
    started: datetime = field(default_factory=datetime.now)
    job: Job | fusion.Member | None = None   # a fused trial's: its Member of the fused job
    status: str = "running"
    objectives: list[float] = field(default_factory=list)
    pruned: bool = False
    trained: training.Trained | None = None
    error: str | None = None

    @property
    def objective(self) -> float | None:
        return self.objectives[-1] if self.status == "finished" and self.objectives else None

    def ended(self) -> bool:
        return self.job is None or self.job.wait(0)

    def admitted(self) -> bool:
        """Past admission: it has run an iteration (or it has ended)."""
        return self.job is None or self.job.progress > 0 or self.job.wait(0)


class Search:
    """One tune() call: its study, its trials as jobs of ``manager``, their records.

    ``cursor()`` gives a cursor of the database (the catalog); ``connection``: the DuckDB
    connection id of the calling statement, whose interrupt reaches the search.
    """

    def __init__(self, manager: JobManager, cursor: Callable, request: TuneRequest, connection: int | None = None,
                 since: float | None = None):
        self.manager, self.request, self.connection = manager, request, connection
        self.since = since                  # when the statement began (time.perf_counter())
        self.cur = cursor()
        self.model = request.model
        self.trials: list[Trial] = []       # of this call, in order
        self.best: Trial | None = None      # this call's best finished trial, its weights kept
        self.corner: int | None = None      # the trial that tells whether any fits the budget
        self.largest = 0                    # the largest unscheduled peak of a trial seen so far
        self.queue: list[list[tuple[Trial, object]]] = []   # asked, not started: fusions of (trial, spec)
        self.asked = 0
        self.points = iter(())              # a grid's points not yet enqueued, in the order tried
        self._lock = threading.Lock()       # Optuna's study, from the job threads and this one
        self.rows = training.SharedRows()   # the source read once for every trial (issue 32)

    # -- the call ------------------------------------------------------------------------
    def run(self) -> list[dict]:
        """Run the search; one dbml_trials row per trial it ran."""
        with _tuning(self.model):
            try:
                self._start()
                with self.manager.statement(self.connection, fn="tune", since=self.since) as wait:
                    self._run(wait)
                self._say_stored(self._store_best())
                return store.rows(self.cur, self.model, [t.number for t in self.trials])
            finally:
                try:
                    self.rows.close(self.cur)   # every trial has ended (or the search waited STOP_S for them)
                finally:
                    self.cur.close()

    def _run(self, wait: Wait) -> None:
        try:
            self._loop(wait)
        except KeyboardInterrupt:   # Ctrl-C on this thread (a script, the shell, Jupyter)
            wait.interrupt()
        if wait.interrupted.is_set():
            self._stop()
            version = self._store_best()
            raise Interrupted(self._interrupted(version))
        if self.trials and all(t.status == "infeasible" for t in self.trials):
            self._abort_infeasible(min(self.trials, key=lambda t: t.job.exception.min_budget))

    def _start(self) -> None:
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        store.settle(self.cur, self.model)   # one tune() per model at a time (_tuning): a 'running' one is stale
        stored = store.load(self.cur, self.model)
        _same_objective(stored, self.request)
        self.study = make_study(self.request, stored)
        self.dists = {d.name: distribution(d) for d in self.request.space.dims}
        # the next trial's number, less the trials the study holds (those the space could draw)
        self.offset = (max((r["trial"] for r in stored), default=-1) + 1) - len(self.study.trials)
        self.left = self._plan(stored)

    def _plan(self, stored: list[dict]) -> int:
        """Enqueue what the sampler must try first; how many trials this call runs."""
        space, feasible = self.request.space, any(r["status"] in ("finished", "pruned") for r in stored)
        # the first trial then tells whether any fits (self.corner); an arch drawn from the space
        # has no smallest, and only a search whose every trial is infeasible tells
        self.probe = not feasible and "arch" not in space.names()
        if self.request.sampler == "grid":
            tried = [r["params"] for r in stored if r["status"] != store.INTERRUPTED]   # its point was not tried
            points = [p for p in space.grid(self.request.base.seed) if p not in tried]
            if not points:
                raise InvalidArgument(f"tune(): every point of space's grid has been tried for model {self.model!r} "
                                      f"({len(tried)} trials, see dbml_trials); widen space, or pass sampler := 'tpe'")
            self.points = iter(points)     # enqueued one by one as trials are asked (_ask)
            return min(self.request.trials or len(points), len(points))
        corner = space.corner()
        if corner and not feasible:
            self.study.enqueue_trial(encode(space.dims, corner))
        return self.request.trials or DEFAULT_TRIALS

    # -- the loop --------------------------------------------------------------------------
    def _loop(self, wait: Wait) -> None:
        while self.left > 0 or self.queue or self._live():
            if wait.interrupted.is_set():
                return
            self._collect()
            while True:
                if not self.queue and self.left > 0 and self._room(1):
                    self._ask_round(wait)
                if not self.queue or not self._room(len(self.queue[0])):
                    break
                self._submit(self.queue.pop(0), wait)
            live = self._live()
            if live:
                live[0].job.wait(POLL_S)

    def _live(self) -> list[Trial]:
        return [t for t in self.trials if t.status == "running"]

    def _room(self, trials: int) -> bool:
        """Whether to start ``trials`` more trials (one job) now (see the module docstring):
        never beside the first, smallest trial before it is admitted; then up to
        ``parallel`` trials, or while no job waits for memory, fewer than SETUP_AHEAD are
        being set up and (PACK_WITHOUT_SWAPS) one more fits beside the running ones unscheduled."""
        live = self._live()
        if any(t.number == self.corner and not t.admitted() for t in live):
            return False
        parallel = self._parallel()
        if parallel is not None:
            return len(live) + trials <= parallel
        jobs = list({t.job.name: t for t in live}.values())   # a fused job's members once
        return (not any(t.job.waiting_for_memory() for t in jobs)
                and sum(not t.admitted() for t in jobs) < SETUP_AHEAD
                and (not PACK_WITHOUT_SWAPS or self._fits_unscheduled(live, trials)))

    def _parallel(self) -> int | None:
        """The most trials at once: ``parallel``, or one when trials do not share the device."""
        parallel = self.request.parallel
        return 1 if parallel is None and not self._shared() else parallel

    def _fits_unscheduled(self, live: list[Trial], trials: int = 1) -> bool:
        """Whether ``trials`` more trials (one job), each as large as the largest trial seen,
        fit the budget beside the running jobs at their unscheduled peaks (release after
        last use: no plan needs a swap or a recompute); a job still being set up counts as
        its trials at the largest too. A fused job's trial counts as its share of the job."""
        scheduler = existing_scheduler(resolve_device(self.request.base.settings.device))
        if scheduler is None or not live:   # one trial runs whatever its size (admission plans it)
            return True
        snap = scheduler.snapshot()
        members = Counter(t.job.name for t in live)
        peaks = {name: snap["jobs"][name]["vanilla_peak_bytes"] for name in members if name in snap["jobs"]}
        self.largest = max([self.largest, *(peak / members[name] for name, peak in peaks.items())])
        unknown = sum(n for name, n in members.items() if name not in peaks) + trials
        return sum(peaks.values()) + unknown * self.largest <= snap["budget_bytes"]

    def _shared(self) -> bool:
        """Whether trials join the device's shared scheduler (its admission packs them)."""
        base = self.request.base
        return runners.shares_device(base.policy, base.memory_budget)

    def _ask_round(self, wait: Wait) -> None:
        """Ask the sampler for the next round of trials and queue them, in fusions; an
        interrupt stops the asking (trials asked and not started are not kept)."""
        asked = []
        for _ in range(self._round_size()):
            if wait.interrupted.is_set():
                break
            drawn = self._ask()
            if drawn is not None:
                asked.append(drawn)
        parallel = self._parallel()
        limit = min(fusion.MAX_MEMBERS, parallel or fusion.MAX_MEMBERS) if FUSE_TRIALS else 1
        self.queue += [[asked[i] for i in positions] for positions in fusion.group([s for _, s in asked], limit)]

    def _round_size(self) -> int:
        """How many trials to ask at once (FUSE_ROUND): one to probe the space's corner first."""
        if not FUSE_TRIALS or self._parallel() == 1 or (self.probe and self.asked == 0):
            return 1
        return min(self.left, FUSE_ROUND if self.request.sampler == "tpe" else ASK_AHEAD)

    def _ask(self) -> tuple[Trial, object] | None:
        """The sampler's next trial and its TrainSpec; None if train() refuses what it drew."""
        with self._lock:
            point = next(self.points, None)
            if point is not None:
                self.study.enqueue_trial(encode(self.request.space.dims, point))
            ask = self.study.ask(self.dists)
        trial = Trial(ask.number + self.offset, decode(self.request.space.dims, ask.params), ask,
                      {"params": dict(ask.params), "distributions": dists_json(ask.distributions)})
        if self.probe and self.asked == 0:
            self.corner = trial.number
        self.asked += 1
        self.left -= 1
        try:
            return trial, self.request.space.apply(self.request.base, trial.params)
        except InvalidArgument as e:   # a combination train() refuses (e.g. width and heads)
            self.trials.append(trial)
            self._failed(trial, str(e))
            return None

    def _submit(self, group: list[tuple[Trial, object]], wait: Wait) -> None:
        """Start one job: a trial, or a fusion of trials (``fusion.Member``s in the trials' place)."""
        if len(group) == 1:
            trial, spec = group[0]
            job = trial.job = self.manager.submit(spec, self.connection, run=self._work(trial))
        else:
            members = [self._member(trial, spec) for trial, spec in group]
            job = self.manager.submit(group[0][1], self.connection,
                                      run=fusion.work(members, self.request.objective != "loss", self.rows))
            for (trial, _), member in zip(group, members):
                trial.job, member.job = member, job
        wait.add(job)
        for trial, _ in group:
            trial.started = datetime.now()
            self.trials.append(trial)
        store.save(self.cur, *(self._record(trial) for trial, _ in group))   # one write for the job's trials

    def _member(self, trial: Trial, spec) -> fusion.Member:
        """``trial`` as a member of a fused job: its epochs reported, its model kept."""
        member = fusion.Member(spec, on_epoch=lambda record: self._epoch(trial, member, record),
                               on_trained=lambda trained: setattr(trial, "trained", trained))
        return member

    def _work(self, trial: Trial):
        """What the trial's job runs, on its thread: training, its epochs reported, nothing stored."""
        def run(cur, spec, job: Job) -> dict:
            job.validate_epochs = self.request.objective != "loss"
            job.on_epoch = lambda record: self._epoch(trial, job, record)
            trial.trained = training.fit(cur, spec, job, shared=self.rows)
            return trial.trained.summary(job.id, None)
        return run

    def _epoch(self, trial: Trial, job: Job, record: dict) -> None:
        """After each epoch, on the job's thread: report the objective; stop if pruned."""
        value, epoch = record.get(RECORD_KEYS[self.request.objective]), record["epoch"]
        if value is None:
            raise TrainingError(f"tune(): objective {self.request.objective!r} is measured on held-out rows and the "
                                f"source left none; pass a larger validation := or objective := 'loss'")
        trial.objectives.append(value)
        with self._lock:
            trial.ask.report(value, epoch)
            prune = epoch < job.epochs and trial.ask.should_prune()
        if prune:
            trial.pruned = True
            raise JobCancelled(f"job {job.id} ({self.model!r}) trial {trial.number} was pruned after epoch {epoch} "
                               f"({self.request.objective} {value:.4g}); nothing was stored")

    # -- ended trials ------------------------------------------------------------------------
    def _collect(self) -> None:
        """The trials that ended since the last look: told, kept if best, recorded in one write."""
        ended = [trial for trial in self._live() if trial.ended()]
        store.save(self.cur, *filter(None, map(self._ended, ended)))
        for trial in ended:
            if trial.number == self.corner and trial.status == "infeasible":
                self._abort_infeasible(trial)

    def _ended(self, trial: Trial) -> dict | None:
        """Tell the sampler a trial's fate and keep it if best; its record to write (None: not kept)."""
        import optuna
        job = trial.job
        state = optuna.trial.TrialState.FAIL
        if job.status == "finished":
            trial.status, state = "finished", optuna.trial.TrialState.COMPLETE
        elif job.status == "cancelled" and trial.pruned:
            trial.status, state = "pruned", optuna.trial.TrialState.PRUNED
        elif job.status == "cancelled":
            trial.status = "cancelled"          # interrupted: not kept
        else:
            trial.status = "infeasible" if isinstance(job.exception, BudgetTooSmall) else "failed"
            trial.error = job.error
        with self._lock:
            self.study.tell(trial.ask, trial.objective if trial.status == "finished" else None, state=state)
        self._keep_if_best(trial)
        return self._record(trial) if trial.status != "cancelled" else None

    def _failed(self, trial: Trial, error: str) -> None:
        import optuna
        trial.status, trial.error = "failed", error
        with self._lock:
            self.study.tell(trial.ask, None, state=optuna.trial.TrialState.FAIL)
        store.save(self.cur, self._record(trial))

    def _keep_if_best(self, trial: Trial) -> None:
        """Keep the weights of this call's best finished trial (the earliest on a tie), drop the others'."""
        if trial.status == "finished" and (self.best is None or _better(trial, self.best, self.request.direction)):
            if self.best is not None:
                self.best.trained = None
            self.best = trial
        elif trial is not self.best:
            trial.trained = None

    def _abort_infeasible(self, trial: Trial) -> None:
        """The smallest trial did not fit: nothing of this call is kept; the budget error, raised."""
        for t in self._live():
            t.job.cancel("the search stopped")
        for t in self._live():
            t.job.wait(STOP_S)
        store.delete(self.cur, self.model, [t.number for t in self.trials])
        corner = ", ".join(f"{k} {json.dumps(v)}" for k, v in self.request.space.corner().items())
        which = ("no trial fits a plan" if trial.number != self.corner else
                 f"even the space's smallest trial ({corner}) fits no plan" if corner else "the trials fit no plan")
        raise BudgetTooSmall(f"tune(): {which} in the memory budget; nothing was stored: {trial.job.error}",
                             trial.job.exception.min_budget)

    def _stop(self) -> None:
        """After an interrupt: wait for the running trials to stop (a second Ctrl-C stops waiting)."""
        deadline = time.monotonic() + STOP_S
        try:
            for trial in self._live():
                trial.job.wait(max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:
            pass
        store.save(self.cur, *filter(None, (self._ended(t) for t in self._live() if t.ended())))
        store.delete(self.cur, self.model, [t.number for t in self.trials if t.status in ("running", "cancelled")])

    def _interrupted(self, version: int | None) -> str:
        kept = [t for t in self.trials if t.status not in ("running", "cancelled")]
        stopped = [t for t in self.trials if t.status in ("running", "cancelled")]
        stored = (f"; its best trial {self.best.number} is stored as version {version} of {self.model!r}"
                  if version is not None else "")
        return (f"tune() was interrupted: {len(kept)} ended trial(s) of {self.model!r} are kept in dbml_trials"
                f"{stored}; {len(stopped)} running trial(s) were cancelled and not kept")

    # -- the result --------------------------------------------------------------------------
    def _store_best(self) -> int | None:
        """Store this call's best trial as the model's next version if it is the model's best."""
        best = self.best
        if best is None or best.trained is None or store.best(self.cur, self.model) != best.number:
            return None
        best.trained.metrics["tuning"] = {"trial": best.number, "objective": self.request.objective,
                                          "value": best.objective, "params": best.params}
        version = training.store(self.cur, best.trained)
        best.trained = None
        store.save(self.cur, {**self._record(best), "version": version})
        return version

    def _say_stored(self, version: int | None) -> None:
        """Say which version the best trial became and what the model's name serves now
        (its row in the result holds the version too)."""
        if version is None:
            return
        best = self.best
        served = catalog.identify(self.cur, self.model, None, fn="tune")[0]
        name = exp.Literal.string(self.model).sql("duckdb")   # quoted as SQL: the calls below can be pasted
        if served != version:
            now = f"predict({name}, ...) still serves version {served}, pinned by deploy(); deploy({name}) serves this one"
        elif version > 1:
            now = f"predict({name}, ...) serves it now; deploy({name}, version := {version - 1}) serves the one before"
        else:
            now = f"predict({name}, ...) serves it"
        warnings.warn(f"tune(): trial {best.number}, the best ({self.request.objective} {best.objective:.4g}), is "
                      f"stored as version {version} of {name}; {now}", VersionStored, stacklevel=2)

    def _record(self, trial: Trial) -> dict:
        """The trial's row of dbml.trials (trials.COLUMNS)."""
        job = trial.job
        seconds = (job.finished - job.started).total_seconds() if job is not None and job.finished and job.started \
            else None
        return {"model": self.model, "trial": trial.number, "status": trial.status,
                "objective_name": self.request.objective, "direction": self.request.direction,
                "objective": trial.objective, "objectives": list(trial.objectives), "params": trial.params,
                "search": trial.search, "epochs": len(trial.objectives), "error": trial.error, "seconds": seconds,
                "peak_bytes": job.measured_peak_bytes if job is not None else None,
                "job_id": job.id if job is not None else None, "version": None, "started_at": trial.started}


def _better(a: Trial, b: Trial, direction: str) -> bool:
    """Whether finished trial ``a`` beats ``b`` (``studies.best_trial``: ties go to the earlier)."""
    return best_trial([(a.number, a.objective), (b.number, b.objective)], direction) == a.number


class _tuning:
    """One statement at a time tunes a model in this process (their trial numbers would clash)."""

    def __init__(self, model: str):
        self.model = model

    def __enter__(self):
        rt = runtime()   # the models a statement of this process is tuning
        with rt.tuning_lock:
            if self.model in rt.tuning:
                raise InvalidArgument(f"tune(): model {self.model!r} is being tuned by another statement; "
                                      f"wait for it to end, or tune another name")
            rt.tuning.add(self.model)

    def __exit__(self, *exc):
        rt = runtime()
        with rt.tuning_lock:
            rt.tuning.discard(self.model)


def _same_objective(stored: list[dict], request: TuneRequest) -> None:
    other = {r["objective_name"] for r in stored} - {request.objective}
    if other:
        name = request.model
        # the statements suggested are trees, the name a string literal in them: a name holding
        # quotes (a\'b"c; DROP TABLE t; --) stays a name when the user runs what the message says
        delete = exp.delete(store.TRIALS, where=exp.column("model").eq(value_sql(name)), dialect="duckdb")
        drop = exp.select(exp.func("drop_model", value_sql(name)))
        raise InvalidArgument(f"tune(): model {name!r} has {len(stored)} trials tuned for {sorted(other)[0]!r}; pass "
                              f"objective := {sorted(other)[0]!r} to go on with them, or start afresh after "
                              f"{delete.sql('duckdb')} ({drop.sql('duckdb')} drops them too)")


def run(instance, request: TuneRequest, connection: int | None = None, since: float | None = None) -> list[dict]:
    """Run ``request`` on a dbml database ``instance`` (its jobs and catalog): the rows of its
    trials. ``since``: when the statement began (``time.perf_counter()``)."""
    return Search(instance.jobs, instance.cursor, request, connection, since).run()
