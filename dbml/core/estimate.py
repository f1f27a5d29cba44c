"""How long a training job will take, said before it trains (issue 24, part 2).

The planner already predicts every op of one iteration (the access sequence it plans on,
from the latency predictor or the roofline model: ``dbml.scheduler.latency``), so the
job's time is that iteration times the iterations it will run, plus the forward passes
over the held-out rows that early stopping reads each epoch:

    epochs x (iterations per epoch x iteration + validation rows / batch x forward)
    + one last forward pass over the validation rows (the summary's val_metric)
    + one more capture and plan when the last batch of an epoch is smaller than the others

The last term is measured, not predicted: a new batch shape is a new graph, captured and
planned once (as long as the first batch's took, timed just before); on small models it
is most of the job's time (0.6 s of a 0.8 s loop of 560 iterations of a linear model).

``epochs`` is the upper bound: early stopping may end sooner. The sequence is planned
for the first batch at its full size (sequences at their longest), so a job of
variable-length texts usually runs faster than said. Fetching rows from DuckDB and the
per-iteration bookkeeping outside the captured step are not in it.

A job whose estimate passes the ``slow_train_seconds`` setting says so, with cheaper
choices, in its ``warnings``; ``dbml_jobs`` shows the estimate while it runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Estimate", "estimate", "slow_warning", "cheaper_choices"]


@dataclass(frozen=True)
class Estimate:
    """A job's predicted time, from its first batch's access sequence."""

    iteration: float       # seconds of one training iteration (forward, backward, optimizer)
    forward: float         # seconds of its forward phase: one validation batch
    iterations: int        # training iterations per epoch
    val_batches: float     # validation batches per pass (rows / batch size)
    epochs: int            # the most epochs the job runs
    validate_epochs: bool  # whether every epoch ends with a pass over the validation rows
    capture: float = 0.0   # seconds to capture and plan one more batch shape (the last, smaller batch)

    @property
    def epoch_seconds(self) -> float:
        return self.iterations * self.iteration + (self.val_batches * self.forward if self.validate_epochs else 0.0)

    @property
    def seconds(self) -> float:
        return self.epochs * self.epoch_seconds + self.val_batches * self.forward + self.capture


def estimate(seq, *, n_train: int, n_val: int, batch_size: int, epochs: int, validate_epochs: bool,
             prepare_seconds: float = 0.0) -> Estimate:
    """The job's estimate from ``seq``, the ``AccessSequence`` of its first batch (of
    ``min(batch_size, n_train)`` rows): op ``end`` times are the predicted latencies, summed.
    ``prepare_seconds``: what capturing and planning that batch took."""
    rows = max(1, min(batch_size, n_train))
    forward = sum(op.end - op.start for op in seq.ops if op.phase == "forward")
    return Estimate(iteration=seq.duration, forward=forward, iterations=math.ceil(n_train / rows),
                    val_batches=n_val / rows, epochs=epochs, validate_epochs=validate_epochs and n_val > 0,
                    capture=prepare_seconds if n_train % rows else 0.0)


def slow_warning(est: Estimate, config, spec) -> str | None:
    """The warning of a job whose estimate passes ``spec.settings.slow_train_seconds``, naming the
    estimate and cheaper choices; None under it."""
    if est.seconds <= spec.settings.slow_train_seconds:
        return None
    choices = cheaper_choices(est, config, spec)
    return (f"estimated {_duration(est.seconds)} to train ({est.epochs} epochs of {est.iterations} iterations, "
            f"{_duration(est.iteration)} each, predicted by the latency model) before early stopping"
            + (f"; cheaper: {' or '.join(choices)}" if choices else ""))


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
