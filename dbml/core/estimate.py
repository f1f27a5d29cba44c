"""How long a training job will take, said before it trains (issue 24, part 2; issue 32).

The planner already predicts every op of one iteration (the access sequence it plans on,
from the latency predictor or the roofline model: ``dbml.scheduler.latency``), so the
job's time is that iteration times the iterations it will run, plus the forward passes
over the held-out rows that early stopping reads each epoch, plus the job's fixed costs:

    start-up (measured: from the statement's start to the estimate)
    + epochs x (iterations per epoch x (iteration x scale + batch wait) + epoch's stream
                + validation rows / batch x forward)
    + one last forward pass over the validation rows (the summary's val_metric)
    + the finish (storing the model, the collection after the job)
    + a fresh process's first job's one-off costs (first calls of the ops, lazy imports)

* The start-up is what the statement has spent before the estimate is said, measured, not
  predicted: in a fresh process the imports (torch, the scheduler), loading the latency
  predictor, the first capture; in any process reading and encoding the rows and the
  first batch's capture and plan and the last, smaller batch's capture (``TrainLoop.prepare``).
  Issue 32 found it left out: 13 s of a fresh process's 14 s first train().
* The rest is what no op latency holds (``Overheads``): the executor's dispatch and the
  step's bookkeeping (``scale``, measured step seconds per predicted op second), waiting
  for each batch and starting each epoch's stream from DuckDB (``batch``, ``epoch``),
  storing and collecting after the last epoch (``finish``), a fresh process's first job's
  one-off costs (``cold``). Issue 32 measured them at 2-5x the predicted ops of small MLPs
  and linear models. They are learned from the jobs this machine ran (:func:`learn`, after
  each train(): measured against predicted), per device, input kind and arch, and kept
  beside the latency predictor (``overheads.json`` in the cache directory), so a fresh
  process's first job starts from the last ones'. A kind never trained on this machine
  takes the streaming and finishing costs the device's other kinds taught, with its ops at
  their predicted scale (:func:`overheads`); on a machine that trained nothing, none.

The last batch's capture is measured, not predicted: a smaller last batch is a new graph,
captured before the estimate (until the tenth round it was captured and planned in the first
epoch and guessed as long as the first batch's; but the first batch's graph is often read
from the disk cache and the last one's not, and the first epoch of a 5,000-row job then
took 0.4 s more than said). Its plan, 0.05 s, is still made in the first epoch.

``epochs`` is the upper bound: early stopping may end sooner. The sequence is planned
for the first batch at its full size (sequences at their longest), so a job of
variable-length texts usually runs faster than said.

A job whose estimate passes the ``slow_train_seconds`` setting says so, with cheaper
choices, in its ``warnings``; ``dbml_jobs`` shows the estimate while it runs.
"""

from __future__ import annotations

import json
import math
import statistics
import os
import dataclasses
import threading
from dataclasses import asdict, dataclass

from .runtime import runtime

__all__ = ["Estimate", "Measured", "Overheads", "estimate", "learn", "overheads", "remeasured", "timed", "timed_enough", "slow_warning",
           "cheaper_choices"]


@dataclass(frozen=True)
class Overheads:
    """What the jobs of one kind spent beyond their predicted ops, in seconds (learned)."""

    scale: float = 1.0       # an iteration's measured seconds in its step per predicted second of its ops
                             # (the executor's dispatch, bookkeeping; below 1 where the predictor says more)
    epoch: float = 0.0       # per epoch, outside the steps: starting and ending the epoch's stream
    batch: float = 0.0       # per iteration, outside its step: waiting for its batch (fetching, tokenising)
    finish: float = 0.0      # after the last epoch: storing the model, the collection
    cold: float = 0.0        # a process's first job, beyond the others': first calls, lazy imports, warm caches
    # the last jobs' (iterations per epoch, seconds per epoch outside the steps): ``epoch`` and
    # ``batch`` are the line through them (a job size alone: all of it per epoch)
    rests: tuple[tuple[int, float], ...] = ()
    # the last jobs' (predicted seconds of their steps' ops, measured seconds in their steps),
    # and their iterations per epoch (``weights``, a field of its own: versions before it read
    # the pairs): ``scale`` is the median of their ratios, weighed by iterations per epoch (one
    # job on a loaded machine, or one that waited on its copies more than its plan said, moves
    # it no more than its weight; _scale)
    excess: tuple[tuple[float, float], ...] = ()
    weights: tuple[float, ...] = ()


@dataclass(frozen=True)
class Estimate:
    """A job's predicted time, from its first batch's access sequence."""

    iteration: float       # seconds of one training iteration (forward, backward, optimizer)
    forward: float         # seconds of its forward phase: one validation batch
    iterations: int        # training iterations per epoch
    val_batches: float     # validation batches per pass (rows / batch size)
    epochs: int            # the most epochs the job runs
    validate_epochs: bool  # whether every epoch ends with a pass over the validation rows
    startup: float = 0.0   # seconds spent before the estimate, measured: the statement's start to the first plan
    overheads: Overheads = Overheads()   # learned fixed costs of jobs like this one (learn)
    cold: bool = False     # the process's first job: its one-off costs (overheads.cold) are counted
    timed: bool = False    # ``iteration`` is the job's own steps' median (timed), not the latency model's

    @property
    def epoch_seconds(self) -> float:
        per_iteration = self.iteration * self.overheads.scale + self.overheads.batch
        return (self.iterations * per_iteration + self.overheads.epoch
                + (self.val_batches * self.forward if self.validate_epochs else 0.0))

    @property
    def seconds(self) -> float:
        return self.startup + self.left_after(0)

    def left_after(self, done: int) -> float:
        """Seconds left once ``done`` of its iterations have run: the rest of them, the streams
        of the epochs not begun, the validation passes of those not ended and the last one,
        the finish, and (cold) the one-off costs."""
        per_iteration = self.iteration * self.overheads.scale + self.overheads.batch
        streams = max(0, self.epochs - math.ceil(done / self.iterations))   # epochs not begun
        ends = max(0, self.epochs - done // self.iterations)                # epochs not ended
        validation = self.val_batches * self.forward
        return (max(0, self.epochs * self.iterations - done) * per_iteration + streams * self.overheads.epoch
                + ends * (validation if self.validate_epochs else 0.0) + validation + self.overheads.finish
                + (self.overheads.cold if self.cold else 0.0))


def estimate(seq, *, n_train: int, n_val: int, batch_size: int, epochs: int, validate_epochs: bool,
             startup: float = 0.0, learned: Overheads = Overheads(),
             cold: bool = False, plan_extra: float = 0.0) -> Estimate:
    """The job's estimate from ``seq``, the ``AccessSequence`` of its first batch (of
    ``min(batch_size, n_train)`` rows): op ``end`` times are the predicted latencies, summed,
    and ``plan_extra``, what its plan adds to an iteration (copies compute waits for,
    recomputations: ``Plan.extra_time``; a job under a budget).
    ``startup``: what the statement spent before now (measured: the batch shapes' captures
    included); ``learned``: jobs like this one's fixed costs
    (:func:`overheads`); ``cold``: the process's first job."""
    rows = max(1, min(batch_size, n_train))
    forward = sum(op.end - op.start for op in seq.ops if op.phase == "forward")
    return Estimate(iteration=seq.duration + max(0.0, plan_extra), forward=forward, iterations=math.ceil(n_train / rows),
                    val_batches=n_val / rows, epochs=epochs, validate_epochs=validate_epochs and n_val > 0,
                    startup=startup, overheads=learned,
                    cold=cold)


# How many of its iterations' steps a job times before it says its estimate again from them
# (the job's first left out: its first calls): 20, or fewer (3 at least) once they took a
# second. The first ten or so steps of an epoch run beside DuckDB starting the next epoch's
# stream on the other core: measured at 0.9-1.0 ms against 0.6 ms later in a 282-step epoch,
# so five steps said a 20,000-row MLP 1.3-1.7x its time; twenty, 1.1x.
TIMED_ITERATIONS, TIMED_SECONDS, TIMED_AT_LEAST = 20, 1.0, 3


def timed_enough(steps: list[float]) -> bool:
    """Whether a job's timed steps are enough to say its estimate again from."""
    return len(steps) >= TIMED_ITERATIONS or (len(steps) >= TIMED_AT_LEAST and sum(steps) >= TIMED_SECONDS)


def remeasured(est: Estimate, elapsed: float, done: int, steps: list[float]) -> float:
    """The job's estimate again once it has run ``done`` iterations in ``elapsed`` seconds
    (from the statement's start): what is left of its iterations at the median of ``steps``,
    the measured seconds of its first iterations' steps, plus what ``est`` says of the rest
    (waiting for each batch, each epoch's stream and validation, the finish).

    The prediction scales the latency model's sum of an iteration's ops by what the jobs
    like this one measured; a kind whose jobs never ran here starts at the ops' own scale,
    and there the model's error is the estimate's: measured on this machine, a small
    transformer's step ran 2.6-3.3x its predicted ops at batch 64 (calibration times it at
    batch 4), a bag of words' 1.6x. So the estimate is said twice: predicted before the first
    iteration, then from the job's own steps (and the slow-job warning with it: :func:`timed`). (Not from the whole
    iterations' wall time: the first batches wait for a stream that has just started, and
    timed so, a 20,000-row MLP's estimate came out 1.5-1.8x its time.)"""
    return elapsed + timed(est, steps).left_after(done)


# -- the fixed costs, learned from the jobs that ran ------------------------------------------------

# How much a new measurement moves the learned figure: half, so one job on a loaded machine
# does not set it alone, and a change (a quieter machine) is followed within a few jobs.
LEARNING_RATE = 0.5
# key (device, kind, arch) -> overheads, loaded once from the file: the runtime's ``overheads``,
# under its ``overheads_lock``
_FILE = "overheads.json"


def _key(device: str, kind: str, arch: str | None) -> str:
    return "/".join((device, kind, arch or "*"))


def overheads(device: str, kind: str, arch: str) -> Overheads:
    """The learned fixed costs of a job of ``arch`` on ``kind`` inputs on ``device``; those of
    the kind's other archs where this arch never ran, and the streaming costs (per epoch, per
    batch) of all the kind's jobs. Where no job of the kind ran warm here
    (a fresh cache's first image job after its tabular ones), the per-epoch, per-batch and
    finishing costs of the device's other kinds, at the predicted ops' own scale: streaming
    and storing cost much the same whatever the model, the scale is the arch's (measured
    0.5-0.7 for an MLP, 3 for a small transformer). None (zeros) where nothing ran."""
    with runtime().overheads_lock:
        table = _table()
        kinds = table.get(_key(device, kind, None))
        own = table.get(_key(device, kind, arch)) or kinds
        anywhere = table.get(_key(device, ANY, None))
        if (own is None or not own.excess) and anywhere is not None and anywhere.excess:
            return Overheads(epoch=anywhere.epoch, batch=anywhere.batch, finish=anywhere.finish,
                             cold=(own or anywhere).cold)
        if own is None or kinds is None or own is kinds:
            return own or Overheads()
        # streaming is the data's: the line through all the kind's jobs (of more sizes than one
        # arch's: a linear model's 400-row jobs alone said nothing of a 5,000-row epoch's batches)
        return dataclasses.replace(own, epoch=kinds.epoch, batch=kinds.batch)


# The key of what every kind's jobs on a device taught (overheads' fallback).
ANY = "*"


def learn(device: str, kind: str, arch: str, est: Estimate, measured: Measured) -> Overheads:
    """After a job: what it spent beyond its estimate's predicted parts, folded into what
    jobs like it (its arch, its kind, and any job on the device) are estimated with; the new
    figures (:func:`_learned`: a process's first job teaches no scale). A first measurement is
    taken whole, later ones move the figures ``LEARNING_RATE`` of the way."""
    epochs = len(measured.epochs)
    if epochs == 0 or est.iterations == 0:
        return overheads(device, kind, arch)
    with runtime().overheads_lock:
        table = _table()
        for key in (_key(device, kind, arch), _key(device, kind, None), _key(device, ANY, None)):
            table[key] = _learned(table.get(key), est, measured)
        _save(table)
        return table[_key(device, kind, arch)]


def _learned(known: Overheads | None, est: Estimate, measured: Measured) -> Overheads:
    """``known`` moved towards what one job measured (``LEARNING_RATE`` of the way; all of
    it where nothing was known). A process's first job teaches its one-off costs and what
    streaming and storing cost (they are not one-off: the first job's finish measured
    0.25-0.29 s, later ones' 0.18-0.22 s), not the scale its first calls inflate."""
    rate = LEARNING_RATE if known is not None else 1.0
    known = known or Overheads()
    epochs = len(measured.epochs)
    validation = est.val_batches * est.forward
    rest = max(0.0, (sum(measured.epochs) - sum(measured.steps)) / epochs
               - (validation if est.validate_epochs else 0.0))
    rests = (*known.rests, (est.iterations, rest))[-RESTS:]
    epoch, batch = _line(rests)
    finish = _towards(known.finish, max(0.0, measured.finish - validation), rate if known.rests else 1.0)
    taught = dataclasses.replace(known, epoch=epoch, batch=batch, finish=finish, rests=rests)
    if est.cold:
        warm = dataclasses.replace(est, overheads=taught, cold=False, epochs=epochs, startup=0.0)
        spent = sum(measured.epochs) + measured.finish
        return dataclasses.replace(taught, cold=_towards(known.cold, max(0.0, spent - warm.seconds), rate))
    weights = (*_weights(known), est.iterations)[-RESTS:]
    excess = (*known.excess, (epochs * est.iterations * est.iteration, sum(measured.steps)))[-RESTS:]
    return dataclasses.replace(taught, scale=_scale(excess, weights, known.scale), excess=excess, weights=weights)


def _weights(known: Overheads) -> tuple[float, ...]:
    """``known.weights``, one per ``known.excess`` (1 for those an older version wrote)."""
    return (1.0,) * (len(known.excess) - len(known.weights)) + known.weights[-len(known.excess):] \
        if known.excess else ()


def _scale(excess, weights, known: float) -> float:
    """The median of the last jobs' ratios (measured step seconds / predicted), each job weighed
    by its iterations per epoch: a job of 5 iterations an epoch switches between its two batch
    shapes' graphs every 5 steps (their memory pools, caches gone cold) and measured 2x the
    per-step time of one of 71, which its epochs' few steps make no large part of its time.
    ``excess``: (predicted, measured) per job, ``weights`` their iterations per epoch; ``known``
    where none."""
    ratios = sorted((y / x, w) for (x, y), w in zip(excess, weights, strict=True) if x > 0)
    if not ratios:
        return known
    half, seen = sum(w for _, w in ratios) / 2, 0.0
    for ratio, weight in ratios:
        seen += weight
        if seen >= half:
            return ratio
    return ratios[-1][0]


# How many jobs the per-epoch, per-batch and per-iteration costs are fitted to.
RESTS = 8


def _towards(old: float, new: float, rate: float = LEARNING_RATE) -> float:
    return old + rate * (new - old)


def _line(points) -> tuple[float, float]:
    """(intercept, slope), both >= 0, of the least-squares line through (x, y) ``points``; all of
    it the intercept where the points have one x or the slope comes out negative."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    if slope <= 0:
        return max(0.0, my), 0.0
    intercept = my - slope * mx
    if intercept < 0:   # through the origin instead
        return 0.0, sum(x * y for x, y in points) / sum(x * x for x in xs)
    return intercept, slope


@dataclass(frozen=True)
class Measured:
    """What a job measured of the parts its estimate predicted, for :func:`learn`."""
    epochs: list[float]   # each epoch's seconds
    steps: list[float]    # each epoch's seconds inside its steps (the rest: fetching batches, the stream)
    finish: float         # from the end of the last epoch to the job's end


def _path():
    from ..scheduler.config import cache_dir

    return cache_dir() / _FILE


def _table() -> dict[str, Overheads]:
    """The learned figures, read from the cache directory once per process (under the lock).
    An entry this version cannot read (another version's, a hand edit) is left out: it is
    learned afresh, never a failed train()."""
    learned = runtime().overheads
    if not learned:
        try:
            entries = json.loads(_path().read_text())
        except (OSError, ValueError):   # none yet, or unreadable: learned afresh
            entries = {}
        for key, value in (entries.items() if isinstance(entries, dict) else ()):
            entry = _entry(value)
            if entry is not None:
                learned[key] = entry
    return learned


def _entry(value) -> Overheads | None:
    """One key's figures from the file, or None where they are not what this version writes."""
    try:
        fields = {f.name for f in dataclasses.fields(Overheads)}
        got = {k: v for k, v in value.items() if k in fields}
        for f in ("rests", "excess"):
            got[f] = tuple(tuple(float(x) for x in p) for p in got.get(f, ()))
        got["weights"] = tuple(float(w) for w in got.get("weights", ()))
        entry = Overheads(**got)
        numbers = (entry.scale, entry.epoch, entry.batch, entry.finish, entry.cold)
        if not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in numbers) \
                or any(len(p) != 2 for p in (*entry.rests, *entry.excess)) or len(entry.weights) > len(entry.excess):
            return None
        return entry
    except (AttributeError, TypeError, ValueError):
        return None


def _save(table: dict[str, Overheads]) -> None:
    """Write the figures (replacing the file whole: another process reads it whole or not at all)."""
    path = _path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps({k: asdict(v) for k, v in table.items()}, indent=1))
        os.replace(tmp, path)
    except OSError:   # a read-only cache: the figures stay this process's
        pass


def forget() -> None:
    """Drop what this process learned (tests: a fresh cache directory, read again)."""
    with runtime().overheads_lock:
        runtime().overheads.clear()


def slow_warning(est: Estimate, config, spec, seconds: float | None = None) -> str | None:
    """The warning of a job whose estimate (``seconds``, or ``est``'s own) passes
    ``spec.settings.slow_train_seconds``, naming the estimate and cheaper choices; None under it."""
    seconds = est.seconds if seconds is None else seconds
    if seconds <= spec.settings.slow_train_seconds:
        return None
    choices = cheaper_choices(est, config, spec)
    how = "timed over its first steps" if est.timed else "predicted by the latency model"
    return (f"estimated {_duration(seconds)} to train ({est.epochs} epochs of {est.iterations} iterations, "
            f"{_duration(est.iteration * est.overheads.scale)} each, {how}) before early stopping"
            + (f"; cheaper: {' or '.join(choices)}" if choices else ""))


def timed(est: Estimate, steps: list[float]) -> Estimate:
    """``est`` with its iteration the median of the job's first ``steps`` (their measured
    seconds: the latency model's scale no longer applies), for :func:`slow_warning`'s figures
    once the estimate is said again (:func:`remeasured`). Its one-off costs, a process's
    first job's, are behind it by then (``cold`` off)."""
    return dataclasses.replace(est, iteration=statistics.median(steps), cold=False,
                               overheads=dataclasses.replace(est.overheads, scale=1.0), timed=True)


# Cheaper architectures for a kind of input: the one ``auto`` picks below its size thresholds
# (zoo.registry.auto): a small CNN for images, a bag of words for text, a linear model for columns.
CHEAPER_ARCH = {"image": "cnn", "tokens": "bow", "tabular": "linear"}
# Images whose shorter side is above this are worth halving (a stride-1 stem's cost grows with the area).
HALVE_IMAGES_ABOVE = 32


def cheaper_choices(est: Estimate, config, spec) -> list[str]:
    """What would take less time, as train() arguments: fewer epochs (those that fit the
    threshold), the kind's cheap arch, and smaller images."""
    out = []
    fits = int(max(0.0, spec.settings.slow_train_seconds - est.val_batches * est.forward) // max(est.epoch_seconds, 1e-12))
    if 1 <= fits < est.epochs:
        out.append(f"epochs := {fits}")
    inputs = config.inputs
    cheap = CHEAPER_ARCH.get(inputs.kind)
    if cheap is not None and cheap != config.arch:
        out.append(f"arch := '{cheap}'")
    if inputs.kind == "image" and spec.shape is None and min(inputs.shape[1:]) > HALVE_IMAGES_ABOVE:
        out.append(f"image_size := [{inputs.shape[1] // 2}, {inputs.shape[2] // 2}]")
    return out


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    if seconds >= 1:
        return f"{seconds:.0f} s"
    return f"{seconds * 1000:.1f} ms"
