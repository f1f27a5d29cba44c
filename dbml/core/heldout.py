"""The held-out rows of a job: which rows they are, their validation figures, and early
stopping by them.

``split_hash`` and ``is_held_out`` are the split's one rule: a hash of each source row
(every column, as the source gives it: not the encoded features, so models of one source
with other features hold out the same rows) with the seed, in ``VALIDATION_BUCKETS``;
``by_column`` is the rule of ``split := 'custom'`` and ``'seq'`` (BigQuery ML's
``data_split_method``), by ``split_col``. ``training._materialise`` applies them once per job
and ``held_out_sql`` is the same rule for a reader of the source (BigQuery ML's
``ML.EVALUATE(MODEL m)``). ``validate`` measures a model (or its weights of the moment) on the scratch table's
held-out rows (``is_val``, ``training._materialise``'s split): the mean loss, and accuracy
or R^2. ``EarlyStopping`` is ``early_stop``'s one rule, followed by a job's ``TrainLoop``
and by each member of a fused one (``dbml.search.fusion``), so a member stops where its trial
alone stops.
"""

from __future__ import annotations

import math

import torch
from sqlglot import exp

from . import metrics
from .data import BatchStream, scratch_rows
from .features import Preprocessing
from .source import value_sql
from .spec import TrainSpec
from ..scheduler.execute.spill import Parked

__all__ = ["EarlyStopping", "by_column", "held_out_sql", "holds_out", "is_held_out", "split_hash", "validate", "validation_outputs", "scores"]


VALIDATION_BUCKETS = 1_000_000


def split_hash(seed: int) -> exp.Expression:
    """The hash of a source row (every column of the query it is selected from) with the seed,
    a tree: it decides the validation split and the order the scratch table stores the rows
    in (``held_out_sql`` is the same rule for a reader of the source)."""
    every_column = exp.Columns(this=exp.Star(), unpack=True)
    return exp.Anonymous(this="hash", expressions=[every_column, value_sql(int(seed))])


def is_held_out(h: str | exp.Expression, validation: float | None = None, *, bucket: int | None = None,
                low: int = 0) -> exp.Expression:
    """The split's rule on a row's hash ``h`` (a column's name, or the hash itself), a tree: its
    bucket is below ``bucket`` (a job's exact one, ``training._held_out_share``), or below
    ``validation``'s share of the buckets (a model stored before the bucket was); and from
    ``low`` on (a fold of ``train(..., folds := k)``: the buckets of its rows, ``training._fold_buckets``)."""
    cut = bucket if bucket is not None else int(validation * VALIDATION_BUCKETS)
    h_bucket = exp.Mod(this=exp.column(h) if isinstance(h, str) else h,
                       expression=exp.Literal.number(VALIDATION_BUCKETS))
    below = exp.LT(this=h_bucket, expression=exp.Literal.number(cut))
    if not low:
        return below
    return exp.and_(exp.GTE(this=h_bucket.copy(), expression=exp.Literal.number(low)), below)


def by_column(split: str | None, split_col: str | None, validation: float | None) -> exp.Expression | None:
    """The rule of ``split := 'custom'`` and ``'seq'`` on a source row, a tree (None for the hash
    split): 'custom' holds out the rows whose BOOLEAN ``split_col`` is TRUE (FALSE and NULL
    train); 'seq' the last ``validation`` share of the rows ordered by ``split_col`` (NULLs
    first: they train; ties stay together), a window over the rows with a usable label."""
    if split not in ("custom", "seq"):
        return None
    col = exp.column(split_col, quoted=True)
    if split == "custom":
        return exp.Is(this=col, expression=exp.Boolean(this=True))
    if not validation:
        return exp.Boolean(this=False)
    rank = exp.Window(this=exp.func("percent_rank"), over="OVER",
                      order=exp.Order(expressions=[exp.Ordered(this=col, nulls_first=True)]))
    return exp.GTE(this=rank, expression=exp.Literal.number(repr(1.0 - float(validation))))


def holds_out(params: dict) -> bool:
    """Whether the job of a model's stored ``params`` held rows out (``held_out_sql`` reads them)."""
    return params.get("split") in ("custom", "seq") or bool(params.get("validation"))


def held_out_sql(params: dict, exclude: tuple[str, ...] = ()) -> exp.Expression:
    """Whether a row of the source ``train`` read (every column of it, less ``exclude``: columns
    a reader added) is one it held out for validation, given the model's stored ``params`` (its
    seed, validation, split and exact bucket), as a sqlglot condition: ``training._materialise``'s
    rule (``by_column``, else ``split_hash`` and ``is_held_out``), so ``ML.EVALUATE(MODEL m)``
    reads exactly those rows. For 'seq' a window: a reader filters by it after the label's filter
    (QUALIFY), as the job did."""
    rule = by_column(params.get("split"), params.get("split_col"), params["validation"])
    if rule is not None:
        return rule
    every = exp.Star(except_=[exp.column(c, quoted=True) for c in exclude] or None)
    h = exp.Anonymous(this="hash", expressions=[exp.Columns(this=every, unpack=True),
                                                exp.Literal.number(int(params["seed"]))])
    return is_held_out(h, params["validation"], bucket=params.get("held_out_bucket"))


class EarlyStopping:
    """``early_stop``'s rule, for a job and for each member of a fused one (``dbml.search.fusion``):
    after each epoch with a finite validation loss, a better one keeps that epoch's weights
    (``best``, from ``weights()``), and ``patience`` epochs without one stop training."""

    def __init__(self, spec: TrainSpec):
        self.spec = spec
        self.best_loss: float | None = None
        self.best_epoch: int | None = None
        self.best = None

    def update(self, record: dict, weights) -> bool:
        """After an epoch (``record``, its validation in it): True to stop training here."""
        loss = record.get("val_loss")
        if not self.spec.early_stop or loss is None or not math.isfinite(loss):
            return False
        if self.best_loss is None or loss < self.best_loss:
            # the weights of the best epoch, copied (training goes on from them); the copy it
            # replaces first gives its room back (a spill file's extents: the new one reuses them)
            if isinstance(self.best, Parked):
                self.best.free()
            self.best_loss, self.best_epoch, self.best = loss, record["epoch"], weights()
            return False
        return record["epoch"] - self.best_epoch >= self.spec.patience

    def state(self) -> dict:
        """What a checkpoint keeps of it (``dbml.core.checkpoints``), so a job resumed on another
        Ray worker stops where, and keeps what, the uninterrupted job does."""
        best = None if self.best is None else list(self.best)   # tensors, also of a copy kept on disk
        return {"best_loss": self.best_loss, "best_epoch": self.best_epoch, "best": best}

    def load(self, state: dict) -> None:
        self.best_loss, self.best_epoch, self.best = state["best_loss"], state["best_epoch"], state["best"]

    def restore(self, tensors: list[torch.Tensor]) -> None:
        """The best epoch's weights into ``tensors`` (the model's parameters, then its buffers);
        a copy kept in the job's spill file is read straight into them, no tensor between."""
        if isinstance(self.best, Parked):
            self.best.read_into(tensors)
            return
        with torch.no_grad():
            for t, v in zip(tensors, self.best, strict=True):
                t.copy_(v)


def validate(cur, table: str, prep: Preprocessing, forward, loss_fn, device, n_val: int, rows: int, convert) -> dict:
    """Accuracy (classification) or R^2 (regression), and the mean loss, on the held-out rows,
    through ``forward`` (the module, or its weights of the moment) in batches of ``rows``
    (``convert``: how the scratch table's x column becomes the model's input)."""
    if n_val == 0:
        return {"val_metric": None, "val_metric_name": _metric_name(prep), "val_loss": None}
    return scores(prep, loss_fn, *validation_outputs(cur, table, forward, device, rows, convert))


def validation_outputs(cur, table: str, forward, device, rows: int, convert) -> tuple[torch.Tensor, torch.Tensor]:
    """``forward``'s outputs on the held-out rows, in batches of ``rows``, joined along
    dimension 0, and the rows' labels."""
    outs, ys = [], []
    with torch.no_grad():
        for x, y in BatchStream(cur, scratch_rows(table, "is_val"), rows,
                                convert=convert):
            outs.append(forward(x.to(device)).cpu())
            ys.append(y)
    return torch.cat(outs), torch.cat(ys)


def _metric_name(prep: Preprocessing) -> str:
    return "accuracy" if prep.task == "classification" else "r2"


def scores(prep: Preprocessing, loss_fn, out: torch.Tensor, y: torch.Tensor) -> dict:
    """The validation figures of outputs ``out`` on labels ``y``: the mean loss, and
    accuracy (classification) or R^2 (regression)."""
    name = _metric_name(prep)
    val_loss = float(loss_fn(out, y))
    if prep.task == "classification":
        value = metrics.accuracy(out.argmax(1).numpy(), y.numpy())
    else:
        value = metrics.r2(y.double().numpy(), out.squeeze(-1).double().numpy())
    return {"val_metric": value, "val_metric_name": name, "val_loss": val_loss}
