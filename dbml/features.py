"""Preprocessing: how a source's columns become one ``FLOAT[n]`` feature vector and a label.

Everything is fitted by SQL aggregates over the training source and applied by a SQL
expression DuckDB evaluates, so training, ``evaluate`` and table-form ``predict`` read
exactly the same features. The rules (documented in the README):

* numeric columns are standardised, ``(x - mean) / std`` (``std`` 0 counts as 1);
  a NULL becomes the mean, i.e. 0 after standardisation;
* VARCHAR, BOOLEAN and ENUM columns are one-hot encoded over their
  ``MAX_CATEGORIES`` most frequent non-NULL training values; NULL and unseen values
  encode as all zeros;
* rows whose label is NULL are left out of training and evaluation;
* the task is classification for a VARCHAR/BOOLEAN/ENUM label or an integer label
  with at most ``MAX_INTEGER_CLASSES`` distinct values, regression otherwise;
  regression targets are standardised for training and unscaled on prediction.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import duckdb
import numpy as np

from .errors import InvalidArgument, SourceError
from .source import Column, literal, number, quote, resolve_column

MAX_CATEGORIES = 64
MAX_INTEGER_CLASSES = 20
MAX_CLASSES = 1000
TASKS = ("classification", "regression")


@dataclass(frozen=True)
class Feature:
    name: str
    kind: str                           # "numeric" | "categorical"
    mean: float = 0.0
    std: float = 1.0
    categories: tuple[str, ...] = ()

    @property
    def width(self) -> int:
        return 1 if self.kind == "numeric" else len(self.categories)

    def sql(self) -> list[str]:
        col = quote(self.name)
        if self.kind == "numeric":
            return [f"coalesce(({col}::DOUBLE - {number(self.mean)}) / {number(self.std)}, 0)"]
        return [f"CASE WHEN {col}::VARCHAR = {literal(c)} THEN 1 ELSE 0 END" for c in self.categories]


@dataclass(frozen=True)
class Preprocessing:
    features: tuple[Feature, ...]
    label: str
    task: str
    classes: tuple = ()                 # classification: the label values, in class-index order
    target_mean: float = 0.0            # regression
    target_std: float = 1.0

    @property
    def width(self) -> int:
        return sum(f.width for f in self.features)

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]

    @property
    def all_numeric(self) -> bool:
        return all(f.kind == "numeric" for f in self.features)

    def features_sql(self) -> str:
        """A SQL expression of type ``FLOAT[width]`` over the source's columns."""
        parts = [p for f in self.features for p in f.sql()]
        return f"[{', '.join(parts)}]::FLOAT[{self.width}]"

    def label_sql(self) -> str:
        """Classification: the class index (INTEGER, -1 for an unseen class); regression: the scaled target."""
        col = quote(self.label)
        if self.task == "classification":
            values = ", ".join(literal(c) for c in self.classes)
            return f"coalesce(list_position([{values}], {col}) - 1, -1)::INTEGER"
        return f"(({col}::DOUBLE - {number(self.target_mean)}) / {number(self.target_std)})::FLOAT"

    def standardise(self, raw: np.ndarray) -> np.ndarray:
        """Raw numeric features (rows x features, NaN for NULL) -> model input, as features_sql does."""
        mean = np.array([f.mean for f in self.features])
        std = np.array([f.std for f in self.features])
        x = (raw.astype(np.float64) - mean) / std
        return np.nan_to_num(x, nan=0.0).astype(np.float32)

    def unscale(self, y: np.ndarray) -> np.ndarray:
        return y.astype(np.float64) * self.target_std + self.target_mean

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Preprocessing":
        d = json.loads(text)
        feats = tuple(Feature(**{**f, "categories": tuple(f["categories"])}) for f in d.pop("features"))
        return cls(features=feats, **{**d, "classes": tuple(d["classes"])})


def fit(cur: duckdb.DuckDBPyConnection, select_sql: str, columns: list[Column], *,
        label: str | None, features: list[str] | None, task: str | None, fn: str = "train") -> Preprocessing:
    """Choose features, infer the task and compute every statistic with SQL over the source."""
    if label is None:
        raise InvalidArgument(f"{fn}(): label is missing; pass label := '<column>' naming the column to predict")
    label_col = resolve_column(columns, label, fn=fn, arg="label")
    feature_cols = _feature_columns(columns, label_col, features, fn)
    src = f"(SELECT * FROM ({select_sql}) WHERE {quote(label_col.name)} IS NOT NULL)"
    n_rows = cur.execute(f"SELECT count(*) FROM {src}").fetchall()[0][0]
    if n_rows == 0:
        raise SourceError(f"{fn}(): source has no rows with a non-NULL label {label_col.name!r}; "
                          f"pass a source that selects some rows")
    task = _task(cur, src, label_col, task, fn)
    numeric = _numeric_stats(cur, src, [c for c in feature_cols if c.is_numeric])
    feats = tuple(numeric[c.name] if c.is_numeric else
                  Feature(c.name, "categorical", categories=_categories(cur, src, c))
                  for c in feature_cols)
    if sum(f.width for f in feats) == 0:
        raise SourceError(f"{fn}(): the features have no values to learn from (categorical columns "
                          f"all NULL); pass features := [...] with informative columns")
    if task == "classification":
        classes = _classes(cur, src, label_col, fn)
        return Preprocessing(feats, label_col.name, task, classes=classes)
    mean, std = cur.execute(f"SELECT avg({quote(label_col.name)}::DOUBLE), "
                        f"stddev_pop({quote(label_col.name)}::DOUBLE) FROM {src}").fetchall()[0]
    return Preprocessing(feats, label_col.name, task, target_mean=float(mean), target_std=_nonzero(std))


def _feature_columns(columns: list[Column], label: Column, names: list[str] | None, fn: str) -> list[Column]:
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
        if not (c.is_numeric or c.is_categorical):
            raise InvalidArgument(f"{fn}(): feature column {c.name!r} has type {c.type}, which dbml cannot use; "
                                  f"cast it in the SELECT or leave it out with features := [...]")
    return chosen


def _task(cur, src: str, label: Column, task: str | None, fn: str) -> str:
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
        n = cur.execute(f"SELECT count(DISTINCT {quote(label.name)}) FROM {src}").fetchall()[0][0]
        if n <= MAX_INTEGER_CLASSES:
            return "classification"
    return "regression"


def _numeric_stats(cur, src: str, cols: list[Column]) -> dict[str, Feature]:
    if not cols:
        return {}
    aggs = ", ".join(f"avg({quote(c.name)}::DOUBLE), stddev_pop({quote(c.name)}::DOUBLE)" for c in cols)
    row = cur.execute(f"SELECT {aggs} FROM {src}").fetchall()[0]
    return {c.name: Feature(c.name, "numeric", mean=float(row[2 * i] or 0.0), std=_nonzero(row[2 * i + 1]))
            for i, c in enumerate(cols)}


def _nonzero(std) -> float:
    return float(std) if std and np.isfinite(std) and std > 0 else 1.0


def _categories(cur, src: str, col: Column) -> tuple[str, ...]:
    rows = cur.sql(f"SELECT {quote(col.name)}::VARCHAR AS v FROM {src} WHERE v IS NOT NULL "
                   f"GROUP BY v ORDER BY count(*) DESC, v LIMIT {MAX_CATEGORIES}").fetchall()
    return tuple(sorted(r[0] for r in rows))


def _plain(value):
    """A label value as a JSON-able Python scalar (DECIMAL -> float)."""
    return value if isinstance(value, (str, bool, int, float)) else float(value)


def _classes(cur, src: str, label: Column, fn: str) -> tuple:
    rows = cur.sql(f"SELECT DISTINCT {quote(label.name)} FROM {src} ORDER BY 1 LIMIT {MAX_CLASSES + 1}").fetchall()
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
