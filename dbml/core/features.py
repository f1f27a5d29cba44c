"""Preprocessing: how a source's columns become one ``FLOAT[n]`` feature vector and a label.

Everything is fitted by SQL aggregates over the training source and applied by a SQL
expression DuckDB evaluates, so training, ``evaluate`` and table-form ``predict`` read
exactly the same features. The rules (documented in the README):

* numeric columns are standardised, ``(x - mean) / std`` (``std`` 0 counts as 1);
  a NULL, NaN or ±Inf becomes the mean, i.e. 0 after standardisation; statistics are
  computed over the finite values only; encoded values are clipped to FLOAT's range;
* fixed-size numeric arrays (``FLOAT[n]``, ``DOUBLE[n]``, ``INTEGER[n]``, ...) give one
  feature per element, each standardised as a numeric column with its own statistics;
* VARCHAR, BOOLEAN and ENUM columns are one-hot encoded over their
  ``MAX_CATEGORIES`` most frequent non-NULL training values; NULL and unseen values
  encode as all zeros;
* rows whose label is NULL are left out of training and evaluation, and so are rows
  whose numeric label is NaN or ±Inf or (regression) beyond FLOAT's range;
* the task is classification for a VARCHAR/BOOLEAN/ENUM label or an integer label
  with at most ``MAX_INTEGER_CLASSES`` distinct values, regression otherwise;
  regression targets are standardised for training and unscaled on prediction.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

import duckdb
import numpy as np
import torch
from sqlglot import exp

from . import inputs
from ..errors import InvalidArgument, SourceError
from .inputs import InputEncoder
from .source import Column, column, label_and_text, number, parsed, quote, resolve_column, unused_name, value_sql
from ..zoo import Inputs

MAX_CATEGORIES = 64
MAX_INTEGER_CLASSES = 20
MAX_CLASSES = 1000
D = "duckdb"
TASKS = ("classification", "regression")
FLOAT_MAX = 3.4028234663852886e38    # the largest FLOAT: encoded values are clipped to it


def finite_or_zero(value: exp.Expression) -> exp.Expression:
    """A DOUBLE expression as a FLOAT-safe value: NULL, NaN and ±Inf become 0, the rest is clipped.
    (Built from the node classes: the builders' parsing and copies cost seconds on a
    784-element array.)"""
    least = exp.Least(this=value.copy(), expressions=[value_sql(FLOAT_MAX)], ignore_nulls=True)
    clipped = exp.Greatest(this=least, expressions=[value_sql(-FLOAT_MAX)], ignore_nulls=True)
    finite = exp.Anonymous(this="isfinite", expressions=[value])
    return exp.Case(ifs=[exp.If(this=finite, true=clipped)], default=exp.Literal.number(0))


def scaled(value: exp.Expression, mean: exp.Expression, std: exp.Expression) -> exp.Expression:
    """``(value::DOUBLE - mean) / std``: the standardisation, in DOUBLE arithmetic."""
    return exp.Div(this=exp.Paren(this=exp.Sub(this=exp.cast(value, "DOUBLE"), expression=mean)), expression=std)


def _element(array: exp.Expression, index: exp.Expression) -> exp.Bracket:
    """``array[index]``, 1-based as DuckDB counts (the index is written as it is)."""
    return exp.Bracket(this=array, expressions=[index], offset=1)


def _lambda(name: str, body: exp.Expression) -> exp.Lambda:
    return exp.Lambda(this=body, expressions=[exp.to_identifier(name, quoted=True)])


@dataclass(frozen=True)
class Feature:
    name: str
    kind: str                           # "numeric" | "categorical" | "array"
    mean: float = 0.0
    std: float = 1.0
    categories: tuple[str, ...] = ()
    means: tuple[float, ...] = ()       # array: one mean and std per element (absent in older models)
    stds: tuple[float, ...] = ()

    @property
    def width(self) -> int:
        return {"numeric": 1, "array": len(self.means)}.get(self.kind, len(self.categories))

    @property
    def element_names(self) -> list[str]:
        """The name of each input this feature takes: the column, or one per array element."""
        return [f"{self.name}[{i + 1}]" for i in range(self.width)] if self.kind == "array" else [self.name]

    def expressions(self, means: tuple[float, ...], stds: tuple[float, ...]) -> list[exp.Expression]:
        """This feature's inputs as sqlglot trees, scaled by ``means`` and ``stds`` (its share of
        ``Preprocessing.scaling``)."""
        col = column(self.name)
        if self.kind == "numeric":
            return [finite_or_zero(scaled(col, value_sql(means[0]), value_sql(stds[0])))]
        if self.kind == "array":
            elements = [finite_or_zero(scaled(_element(col.copy(), exp.Literal.number(i + 1)), value_sql(m),
                                              value_sql(s))) for i, (m, s) in enumerate(zip(means, stds))]
            # a column of another length would read NULLs past its end (or ignore its tail): an
            # error in the row, not an answer
            n = exp.Literal.number(len(means))
            message = (f"column {self.name} holds an array whose length is not {len(means)}, the length the model "
                       f"was trained on; pass arrays of {len(means)} numbers (cast the column to FLOAT[{len(means)}])")
            fits = exp.or_(exp.Is(this=col.copy(), expression=exp.Null()),
                           exp.EQ(this=exp.Anonymous(this="array_length", expressions=[col.copy()]), expression=n))
            elements[0] = exp.Case().when(fits, elements[0]).else_(exp.func("error", exp.Literal.string(message)))
            return elements
        return [exp.Case().when(exp.EQ(this=exp.cast(col.copy(), "VARCHAR"), expression=value_sql(c)),
                                exp.Literal.number(1)).else_(exp.Literal.number(0)) for c in self.categories]

    def sql(self, means: tuple[float, ...], stds: tuple[float, ...]) -> list[str]:
        """:meth:`expressions` rendered for DuckDB (``Preprocessing.features_sql`` joins them)."""
        return [e.sql("duckdb") for e in self.expressions(means, stds)]

    def list_sql(self, means: tuple[float, ...], stds: tuple[float, ...]) -> exp.Expression:
        """An array feature's inputs as one list expression (a tree), each element scaled as
        :meth:`expressions` scales it (the same DOUBLE arithmetic, so the same bits): one lambda
        over the positions, where :meth:`expressions` gives an expression per element, each with
        vectors of its own in DuckDB (a 784-element array: ~70 MB while a job's scratch
        table was written, issue 29)."""
        # the lambdas' parameters would hide a column of their name: named apart from the feature's
        i, z = unused_name("__dbml_i", [self.name]), unused_name("__dbml_z", [self.name])
        at = column(i)
        each = scaled(_element(column(self.name), at), _element(_doubles(means), at.copy()),
                      _element(_doubles(stds), at.copy()))
        positions = exp.func("range", exp.Literal.number(1), exp.Literal.number(len(means) + 1))
        elements = exp.func("list_transform", positions, _lambda(i, each))
        return exp.func("list_transform", elements, _lambda(z, finite_or_zero(column(z))))


def _doubles(values: tuple[float, ...]) -> exp.Array:
    """A DOUBLE[] literal whose elements convert as the literals of ``Feature.expressions`` do."""
    return exp.Array(expressions=[exp.cast(value_sql(v), "DOUBLE") for v in values])


class Standardise(torch.nn.Module):
    """``(x - mean) / std`` per input, in float64 as DuckDB computes the SQL form; NaN, ±Inf
    (and NULL, passed as NaN) become 0, the rest is clipped to FLOAT's range; float32 out."""

    def __init__(self, means, stds):
        super().__init__()
        self.register_buffer("mean", torch.tensor(means, dtype=torch.float64))
        self.register_buffer("std", torch.tensor(stds, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (x.double() - self.mean) / self.std
        z = torch.where(torch.isfinite(z), z.clamp(-FLOAT_MAX, FLOAT_MAX), torch.zeros_like(z))
        return z.float()


@dataclass(frozen=True)
class Preprocessing:
    features: tuple[Feature, ...]
    label: str
    task: str
    classes: tuple = ()                 # classification: the label values, in class-index order
    target_mean: float = 0.0            # regression
    target_std: float = 1.0
    input: InputEncoder | None = None   # an image, text or sequence column: the model's whole input

    @property
    def width(self) -> int:
        return sum(f.width for f in self.features)

    @property
    def feature_names(self) -> list[str]:
        return [self.input.column] if self.input is not None else [f.name for f in self.features]

    def model_inputs(self) -> Inputs:
        """What the model takes (``zoo.Inputs``)."""
        return self.input.inputs() if self.input is not None else Inputs("tabular", features=self.width)

    @property
    def input_names(self) -> list[str]:
        """The raw numbers ``predict`` takes, in order: a column, or each element of an array column."""
        return [n for f in self.features for n in f.element_names]

    @property
    def all_numeric(self) -> bool:
        return all(f.kind in ("numeric", "array") for f in self.features)

    def label_filter(self) -> exp.Expression:
        """The rows training and evaluation use, as a sqlglot condition: a non-NULL label,
        finite when numeric, within FLOAT's range for regression (``label_usable``)."""
        numeric = self.task == "regression" or all(
            isinstance(c, (int, float)) and not isinstance(c, bool) for c in self.classes)
        usable = label_usable(quote(self.label), numeric=numeric, regression=self.task == "regression")
        return exp.maybe_parse(usable, dialect="duckdb")

    def features_sql(self) -> exp.Expression:
        """A sqlglot expression of type ``FLOAT[width]`` over the source's columns (or, for an
        image, text or sequence input, the column as its encoder reads it)."""
        if self.input is not None:
            return exp.maybe_parse(self.input.raw_sql(), dialect="duckdb")
        means, stds, parts, at = *self.scaling(), [], 0
        for f in self.features:
            parts += [exp.maybe_parse(part, dialect="duckdb")
                      for part in f.sql(means[at:at + f.width], stds[at:at + f.width])]
            at += f.width
        vector = exp.DataType(this=exp.DataType.Type.ARRAY, expressions=[exp.DataType.build("FLOAT")],
                              values=[exp.Literal.number(self.width)], nested=True)
        return exp.cast(exp.Array(expressions=parts), vector)

    def scratch_sql(self) -> str:
        """:meth:`scratch_expression` rendered for DuckDB."""
        return self.scratch_expression().sql("duckdb")

    def scratch_expression(self) -> exp.Expression:
        """``features_sql`` as a job's scratch table stores it, a tree (images decoded once:
        ``InputEncoder.scratch_expression``; an array feature as one list expression,
        ``Feature.list_sql``: the same values, tested equal)."""
        if self.input is not None:
            return self.input.scratch_expression()
        means, stds = self.scaling()
        segments, scalars, at = [], [], 0
        for f in self.features:
            m, s = means[at:at + f.width], stds[at:at + f.width]
            at += f.width
            if f.kind != "array":
                scalars += f.expressions(m, s)
                continue
            if scalars:
                segments.append(exp.Array(expressions=scalars))
                scalars = []
            segments.append(f.list_sql(m, s))
        if scalars:
            segments.append(exp.Array(expressions=scalars))
        joined = segments[0]
        for segment in segments[1:]:
            joined = exp.DPipe(this=joined, expression=segment)
        return exp.cast(exp.Paren(this=joined), exp.DataType.build(f"FLOAT[{self.width}]", dialect="duckdb"))

    def label_sql(self) -> str:
        """:meth:`label_expression` rendered for DuckDB."""
        return self.label_expression().sql("duckdb")

    def label_expression(self) -> exp.Expression:
        """Classification: the class index (INTEGER, -1 for an unseen class); regression: the
        scaled target. A tree."""
        col = column(self.label)
        if self.task == "classification":
            position = exp.func("list_position", value_sql(list(self.classes)), col)
            index = exp.func("coalesce", exp.Sub(this=position, expression=exp.Literal.number(1)), value_sql(-1))
            return exp.cast(index, "INTEGER")
        return exp.cast(exp.Paren(this=scaled(col, value_sql(self.target_mean), value_sql(self.target_std))), "FLOAT")

    def scaling(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(means, stds) of each input the model takes, in order: a numeric column's, or each
        element's of an array column; a categorical feature's one-hot inputs pass as they are
        (0, 1). The one flattening of the statistics: the SQL form (``features_sql``), predict's
        and the ONNX export's module (``standardiser``) are all made from it."""
        means, stds = [], []
        for f in self.features:
            if f.kind == "numeric":
                means.append(f.mean), stds.append(f.std)
            elif f.kind == "array":
                means.extend(f.means), stds.extend(f.stds)
            else:
                means.extend([0.0] * f.width), stds.extend([1.0] * f.width)
        return tuple(means), tuple(stds)

    def standardiser(self) -> "Standardise":
        """Raw numeric inputs (rows x inputs, NaN for NULL) -> the model's input, as
        ``features_sql`` computes it (tested equal): predict() and the ONNX export run it."""
        return Standardise(*self.scaling())

    def unscale(self, y: np.ndarray) -> np.ndarray:
        return y.astype(np.float64) * self.target_std + self.target_mean

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Preprocessing":
        d = json.loads(text)
        feats = tuple(Feature(**{**f, **{k: tuple(f[k]) for k in ("categories", "means", "stds") if k in f}})
                      for f in d.pop("features"))
        encoder = d.pop("input", None)
        return cls(features=feats, input=None if encoder is None else InputEncoder.from_dict(encoder),
                   **{**d, "classes": tuple(d["classes"])})


def fit(cur: duckdb.DuckDBPyConnection, select_sql: str, columns: list[Column], *,
        label: str | None, features: list[str] | None, task: str | None, text=None, shape=None,
        image_size=None, series_scale: str = "global", fn: str = "train") -> Preprocessing:
    """Choose features, infer the task and compute every statistic with SQL over the source.
    An image, text or sequence column (``dbml.core.inputs``) is fitted by its encoder instead."""
    label_col, text_cols = label_and_text(columns, label, text, fn=fn)
    src = _labelled_rows(cur, select_sql, label_col, fn)
    kinds: dict[str, str | None] = {}

    def kind(c: Column) -> str | None:   # asked only of the feature columns, once each
        if c.name not in kinds:
            # text := [...] names the text columns; without it, VARCHARs of many words are detected
            kinds[c.name] = inputs.kind_of(cur, src, c, text=True if c.name in text_cols else
                                           None if text is None else False, shape=shape)
        return kinds[c.name]

    feature_cols = _feature_columns(columns, label_col, features, fn, usable=kind)
    task = _task(cur, src, label_col, task, fn)
    if task == "regression":   # also drop labels beyond FLOAT's range, which a FLOAT target cannot hold
        src = _labelled_rows(cur, select_sql, label_col, fn, regression=True)
    special = [c for c in feature_cols if kind(c)]
    if special:
        encoder = _one_input(cur, src, feature_cols, special[0], kind(special[0]), shape, image_size, fn,
                             series_scale=series_scale)
        return _with_label(cur, src, label_col, task, (), fn, input=encoder)
    _series_scale_applies(series_scale, None, fn)
    numeric = _numeric_stats(cur, src, [c for c in feature_cols if c.is_numeric])
    feats = tuple(numeric[c.name] if c.is_numeric else
                  _array_stats(cur, src, c, array_size(c)) if array_size(c) else
                  Feature(c.name, "categorical", categories=_categories(cur, src, c))
                  for c in feature_cols)
    if sum(f.width for f in feats) == 0:
        raise SourceError(f"{fn}(): the features have no values to learn from (categorical columns "
                          f"all NULL); pass features := [...] with informative columns")
    return _with_label(cur, src, label_col, task, feats, fn)


def _with_label(cur, src: exp.Subquery, label_col: Column, task: str, feats: tuple, fn: str, input=None) -> Preprocessing:
    """The preprocessing of ``feats`` (or ``input``) with the label's classes or scaling."""
    if task == "classification":
        classes = _classes(cur, src, label_col, fn)
        return Preprocessing(feats, label_col.name, task, classes=classes, input=input)
    y = exp.cast(column(label_col.name), "DOUBLE")
    mean, std = cur.execute(exp.select(exp.func("avg", y), exp.func("stddev_pop", y)).from_(src).sql(D)).fetchall()[0]
    return Preprocessing(feats, label_col.name, task, target_mean=_finite(mean), target_std=_nonzero(std), input=input)


def _series_scale_applies(series_scale: str, kind: str | None, fn: str) -> None:
    """series_scale := 'row' is for a series input only; elsewhere it would change nothing, silently."""
    if series_scale != "global" and kind != "series":
        raise InvalidArgument(f"{fn}(): series_scale := {series_scale!r} applies to a series (a FLOAT[] or DOUBLE[] "
                              f"column), and this model's input is {kind or 'tabular'}; leave series_scale out")


def _one_input(cur, src: exp.Subquery, feature_cols: list[Column], col: Column, kind: str, shape, image_size,
               fn: str, series_scale: str = "global") -> InputEncoder:
    """The encoder of the one image, text or sequence column; the zoo's architectures take
    one kind of input, so other feature columns beside it are an error."""
    if len(feature_cols) > 1:
        others = [c.name for c in feature_cols if c.name != col.name]
        raise InvalidArgument(f"{fn}(): column {col.name!r} is {'an' if kind == 'image' else 'a'} {kind} input and "
                              f"{others[0]!r} is another feature; dbml's architectures take one kind of input: "
                              f"pass features := [{col.name!r}] (or leave {col.name!r} out)")
    _series_scale_applies(series_scale, kind, fn)
    return inputs.fit(cur, src, col, kind, image_size=image_size, shape=shape, series_scale=series_scale, fn=fn)


def label_usable(col_sql: str, *, numeric: bool, regression: bool) -> str:
    """The SQL predicate of a usable label: not NULL; if numeric, finite; for regression, within FLOAT's range."""
    if not numeric:
        return f"{col_sql} IS NOT NULL"
    cond = f"isfinite({col_sql}::DOUBLE)"
    return f"coalesce({cond} AND abs({col_sql}::DOUBLE) <= {number(FLOAT_MAX)}, false)" if regression else \
        f"coalesce({cond}, false)"


def _labelled_rows(cur, select_sql: str, label: Column, fn: str, regression: bool = False) -> exp.Subquery:
    """The source's rows with a usable label, as a subquery; an error naming the label if there are none."""
    usable = parsed(label_usable(quote(label.name), numeric=label.is_numeric, regression=regression))
    source = parsed(select_sql).subquery()
    counts = exp.select(exp.Filter(this=exp.Count(this=exp.Star()), expression=exp.Where(this=usable)),
                        exp.Count(this=column(label.name))).from_(source)
    n_usable, n_labelled = cur.execute(counts.sql(D)).fetchall()[0]
    if n_labelled == 0:
        raise SourceError(f"{fn}(): source has no rows with a non-NULL label {label.name!r}; "
                          f"pass a source that selects some rows")
    if n_usable == 0:
        beyond = " or beyond FLOAT's range" if regression else ""
        raise SourceError(f"{fn}(): label {label.name!r} has no usable value: every non-NULL one is NaN, "
                          f"±Inf{beyond}; pass a source with finite labels (rows with such labels are skipped)")
    return exp.select("*").from_(source.copy()).where(usable.copy()).subquery()


def array_size(col: Column) -> int | None:
    """n for a fixed-size array of numbers (``FLOAT[n]``, ``DOUBLE[n]``, ``INTEGER[n]``, ...), else None."""
    m = re.fullmatch(r"(.+)\[(\d+)\]", col.type.strip())
    return int(m[2]) if m and Column(col.name, m[1]).is_numeric else None


def _feature_columns(columns: list[Column], label: Column, names: list[str] | None, fn: str,
                     usable=lambda c: False) -> list[Column]:
    if names is None:
        chosen = [c for c in columns if c.name != label.name]
    else:
        chosen = [resolve_column(columns, n, fn=fn, arg="features") for n in names]
        if any(c.name == label.name for c in chosen):
            raise InvalidArgument(f"{fn}(): features include the label {label.name!r}; "
                                  f"leave it out of features := [...]")
    if not chosen:
        raise InvalidArgument(f"{fn}(): no feature columns; the source must have columns besides the label, "
                              f"or pass features := ['<column>', ...]")
    for c in chosen:
        if not (c.is_numeric or c.is_categorical or array_size(c) or usable(c)):
            raise InvalidArgument(f"{fn}(): feature column {c.name!r} has type {c.type}, which dbml cannot use; "
                                  f"{_type_fix(c)}cast it in the SELECT or leave it out with features := [...]")
    return chosen


def _type_fix(col: Column) -> str:
    """What to do with a column of a nested or binary type, before the general advice."""
    t = col.type.strip().upper()
    if t.startswith("STRUCT"):
        return f"select its fields as columns ({col.name}.field AS name), "
    if t.startswith("MAP"):
        return f"select its values as columns ({col.name}['key'] AS name), "
    if t.startswith(("BLOB", "BYTEA", "BIT")):
        return "decode it into numbers or text, "
    if t.endswith("[]"):
        return (f"unnest it, cast it to a fixed-size array when every row has n numbers "
                f"({col.name}::FLOAT[n]), ")
    if t.endswith("]"):
        return "only fixed-size arrays of numbers are features; "
    return ""


def _task(cur, src: exp.Subquery, label: Column, task: str | None, fn: str) -> str:
    if task is not None:
        if task not in TASKS:
            raise InvalidArgument(f"{fn}(): unknown task {task!r}; pass task := 'classification' or 'regression'")
        if task == "regression" and not label.is_numeric:
            raise InvalidArgument(f"{fn}(): label {label.name!r} has type {label.type}, which cannot be regressed; "
                                  f"pass task := 'classification' or a numeric label")
        return task
    if label.is_categorical:
        return "classification"
    if not label.is_numeric:
        raise InvalidArgument(f"{fn}(): label {label.name!r} has type {label.type}, which dbml cannot predict; "
                              f"cast it to a number or VARCHAR in the SELECT")
    if label.is_integer:
        distinct = exp.Count(this=exp.Distinct(expressions=[column(label.name)]))
        n = cur.execute(exp.select(distinct).from_(src).sql(D)).fetchall()[0][0]
        if n <= MAX_INTEGER_CLASSES:
            return "classification"
    return "regression"


def _finite_stats(value: exp.Expression) -> list[exp.Expression]:
    """Mean and population std of a DOUBLE expression over its finite values (NULL, NaN, ±Inf left out)."""
    return [exp.Filter(this=exp.func(agg, value.copy()), expression=exp.Where(this=exp.func("isfinite", value.copy())))
            for agg in ("avg", "stddev_pop")]


def _numeric_stats(cur, src: exp.Subquery, cols: list[Column]) -> dict[str, Feature]:
    if not cols:
        return {}
    aggs = [agg for c in cols for agg in _finite_stats(exp.cast(column(c.name), "DOUBLE"))]
    row = cur.execute(exp.select(*aggs).from_(src).sql(D)).fetchall()[0]
    return {c.name: Feature(c.name, "numeric", mean=_finite(row[2 * i]), std=_nonzero(row[2 * i + 1]))
            for i, c in enumerate(cols)}


def _array_stats(cur, src: exp.Subquery, col: Column, size: int) -> Feature:
    """Per-element mean and std of a fixed-size array column, by one grouped aggregate over its elements."""
    elements = (exp.select(exp.alias_(exp.func("unnest", exp.func("range", 1, size + 1)), "i"),
                           exp.alias_(exp.func("unnest", exp.cast(column(col.name), "DOUBLE[]", dialect=D)), "v"))
                .from_(src).where(column(col.name).is_(exp.null()).not_()))
    stats_sql = exp.select("i", *_finite_stats(exp.column("v"))).from_(elements.subquery()).group_by("i")
    rows = cur.execute(stats_sql.sql(D)).fetchall()
    stats = {i: (m, s) for i, m, s in rows}
    means = tuple(_finite(stats.get(i, (None, None))[0]) for i in range(1, size + 1))
    stds = tuple(_nonzero(stats.get(i, (None, None))[1]) for i in range(1, size + 1))
    return Feature(col.name, "array", means=means, stds=stds)


def _finite(mean) -> float:
    """A mean as stored: 0 where there was no finite value or the sum overflowed."""
    return float(mean) if mean is not None and np.isfinite(mean) else 0.0


def _nonzero(std) -> float:
    return float(std) if std and np.isfinite(std) and std > 0 else 1.0


def _categories(cur, src: exp.Subquery, col: Column) -> tuple[str, ...]:
    query = (exp.select(exp.alias_(exp.cast(column(col.name), "VARCHAR"), "v")).from_(src)
             .where("v IS NOT NULL", dialect=D).group_by("v").order_by("count(*) DESC", "v", dialect=D)
             .limit(MAX_CATEGORIES))
    rows = cur.sql(query.sql(D)).fetchall()
    return tuple(sorted(r[0] for r in rows))


def _plain(value):
    """A label value as a JSON-able Python scalar (DECIMAL -> float)."""
    return value if isinstance(value, (str, bool, int, float)) else float(value)


def _classes(cur, src: exp.Subquery, label: Column, fn: str) -> tuple:
    query = exp.select(column(label.name)).distinct().from_(src).order_by("1", dialect=D).limit(MAX_CLASSES + 1)
    rows = cur.sql(query.sql(D)).fetchall()
    classes = tuple(_plain(r[0]) for r in rows)
    if len(classes) < 2:
        only = classes[0] if classes else None
        raise InvalidArgument(f"{fn}(): label {label.name!r} has only one class ({only!r}) in the source; "
                              f"pass a source with at least two label values, or task := 'regression'")
    if len(classes) > MAX_CLASSES:
        raise InvalidArgument(f"{fn}(): label {label.name!r} has more than {MAX_CLASSES} classes; "
                              f"pass task := 'regression' or a coarser label")
    if isinstance(classes[0], float) and all(float(c).is_integer() for c in classes):
        classes = tuple(int(c) for c in classes)
    return classes
