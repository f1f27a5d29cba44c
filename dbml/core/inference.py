"""Using trained models: batched prediction, the table form, and evaluation.

Models are loaded from the catalog once per stored model (``ModelCache``, keyed by the
catalog's uid); a retrained or dropped model is noticed at the next call, since every call
looks up the uid of the latest version first.
"""

from __future__ import annotations

import threading
import warnings
from typing import Callable

import duckdb
import numpy as np
import sqlglot
from sqlglot import exp
import pyarrow as pa
import pyarrow.compute as pc
import torch

from . import catalog, metrics
from .data import BatchStream, shared_tensor
from ..errors import InvalidArgument, RowSkipped
from .features import Preprocessing
from .forward_memory import rows_within
from .source import column, describe, parsed, resolve_column, select_tree, unused_name, value_sql


class ModelCache:
    """Loaded models by their catalog ``uid``, each loaded at most once; safe across
    DuckDB's threads.

    A uid names one stored model and no other, ever: a model dropped and trained again
    under the same name and version is another uid, so a cache keyed by it can never hand
    out the old weights. Each call looks up the uid of the version asked for (one indexed
    query, on a cursor of the calling thread's own: lookups never wait for each other);
    only loading takes the lock. ``cursor`` gives a connection to the database when the
    cache needs one (again).
    """

    def __init__(self, cursor: Callable[[], duckdb.DuckDBPyConnection]):
        self._new_cursor = cursor
        self._local = threading.local()
        self._lock = threading.Lock()
        self._models: dict[str, catalog.StoredModel] = {}

    def get(self, name: str, version: int | None = None, *, fn: str, uid: str | None = None) -> catalog.StoredModel:
        """Version ``version`` of ``name`` (None: the latest); with ``uid``, that stored model
        (ModelNotFound if it was dropped or replaced since)."""
        try:
            return self._get(name, version, uid, fn)
        except duckdb.ConnectionException:  # the connection it used was closed
            self._local.cur = None
            return self._get(name, version, uid, fn)

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        cur = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._local.cur = self._new_cursor()
        return cur

    def _get(self, name: str, version: int | None, uid: str | None, fn: str) -> catalog.StoredModel:
        cached = self._models.get(uid) if uid is not None else None
        if cached is not None and cached.name == name:
            return cached
        cur = self._cursor()
        if uid is None:
            name, version, uid = catalog.resolve(cur, name, version, fn=fn)
            cached = self._models.get(uid)
            if cached is not None:
                return cached
        with self._lock:
            if uid not in self._models:
                model = catalog.load(cur, name, version, uid) if version is not None else \
                    catalog.load_uid(cur, name, uid, fn=fn)
                # a version dropped and trained again is another uid: forget the old one (other
                # versions stay: a statement may compare 'churn@1' with 'churn@2')
                self._models = {k: v for k, v in self._models.items()
                                if (v.name, v.version) != (model.name, model.version)}
                self._models[uid] = model
            return self._models[uid]


def forward(model: catalog.StoredModel, x: np.ndarray | torch.Tensor, *, fn: str = "predict") -> torch.Tensor:
    """Raw model outputs for encoded features (or an input encoder's tensor), without
    autograd, in chunks of as many rows as the memory budget holds (``forward_memory``)."""
    if isinstance(x, np.ndarray):   # a read-only view of Arrow's rows, shared
        x = shared_tensor(np.asarray(x, dtype=np.float32))
    elif not (isinstance(x, torch.Tensor) and x.dtype == torch.int64):   # token ids stay integers
        x = torch.as_tensor(x, dtype=torch.float32)
    # the whole input and the outputs of every row are held beside a chunk's pass
    held = x.numel() * x.element_size() + len(x) * model.config.outputs * 4
    rows = rows_within(model.config, inference_budget(), held=held, fn=fn)
    with torch.no_grad():
        if len(x) <= rows:
            return model.module(x)
        return torch.cat([model.module(x[i:i + rows]) for i in range(0, len(x), rows)])


def inference_budget() -> int:
    """The memory a forward pass may use: the CPU's shared training budget in force (the
    ``memory_budget`` a running job holds), else the CPU's default."""
    from ..scheduler.multijob.registry import existing_scheduler
    from .settings import default_budget
    scheduler = existing_scheduler("cpu")
    return scheduler.budget_bytes if scheduler is not None else default_budget("cpu")


# The table form's forward pass per input: the SQL type its column is passed as to dbml_infer*.
INFER_FUNCTIONS = {None: "dbml_infer", "blob": "dbml_infer_blob", "text": "dbml_infer_text",
                   "tokens": "dbml_infer_ids", "numbers": "dbml_infer_numbers"}


def infer_function(prep: Preprocessing) -> str:
    enc = prep.input
    if enc is None:
        return INFER_FUNCTIONS[None]
    if enc.kind == "image":
        return INFER_FUNCTIONS["blob" if enc.blob else "numbers"]
    return INFER_FUNCTIONS[{"text": "text", "tokens": "tokens", "series": "numbers"}[enc.kind]]


def outputs_to_values(prep: Preprocessing, out: torch.Tensor) -> np.ndarray:
    """Regression: the unscaled target; classification: the class index."""
    if prep.task == "classification":
        return out.argmax(1).numpy()
    return prep.unscale(out.squeeze(-1).numpy())


def encode_raw(model: catalog.StoredModel, features: pa.Array, *, fn: str) -> tuple[np.ndarray, np.ndarray]:
    """A LIST/ARRAY of raw numeric features per row (or an image BLOB, or a text) -> (encoded
    rows, mask of non-NULL rows)."""
    prep = model.preprocessing
    features = member(flat(features), model, fn)
    if prep.input is not None:
        return _encode_input(model, features, fn)
    if not prep.all_numeric:
        cats = [f.name for f in prep.features if f.kind != "numeric"]
        raise InvalidArgument(f"{fn}(): model {model.name!r} has categorical features ({', '.join(cats)}), "
                              f"which a list of numbers cannot carry; use the table form: "
                              f"SELECT * FROM predictions({model.name!r}, '<table or SELECT>')")
    valid = ~np.asarray(features.is_null().to_numpy(zero_copy_only=False))
    present = features.filter(pa.array(valid))
    lengths = present.value_lengths().to_numpy(zero_copy_only=False) if len(present) else np.array([], int)
    names = prep.input_names            # a column per feature, or one per element of an array column
    k = len(names)
    if len(lengths) and (lengths != k).any():
        bad = int(lengths[lengths != k][0])
        raise InvalidArgument(f"{fn}(): model {model.name!r} takes {k} features "
                              f"({', '.join(names)}), got a list of {bad}; "
                              f"pass [{', '.join(names)}] in that order")
    raw = present.flatten().to_numpy(zero_copy_only=False).astype(np.float64).reshape(len(present), k)
    with torch.no_grad():
        return model.standardiser(torch.from_numpy(raw)), valid


# What predict() takes for each input: the member of its UNION argument (udfs.types.PREDICT_INPUT)
WHAT_PREDICT_TAKES = {"numbers": "a list of numbers", "image": "an image BLOB", "text": "a text"}


def _wanted(prep: Preprocessing) -> str:
    enc = prep.input
    if enc is not None and enc.kind == "text":
        return "text"
    return "image" if enc is not None and enc.blob else "numbers"


def member(x: pa.Array, model: catalog.StoredModel, fn: str) -> pa.Array:
    """predict()'s UNION argument as the one member the model takes; a row holding another
    member is an error naming what the model takes. A plain array passes through."""
    if not pa.types.is_union(x.type):
        return x
    wanted = _wanted(model.preprocessing)
    names = [x.type.field(i).name for i in range(x.type.num_fields)]
    child = x.field(names.index(wanted))
    codes = np.asarray(x.type_codes)
    for i, name in enumerate(names):
        if name != wanted and ((codes == x.type.type_codes[i]) & ~np.asarray(
                x.field(i).is_null().to_numpy(zero_copy_only=False))).any():
            raise InvalidArgument(f"{fn}(): model {model.name!r} takes {WHAT_PREDICT_TAKES[wanted]}, got "
                                  f"{WHAT_PREDICT_TAKES[name]}; pass {WHAT_PREDICT_TAKES[wanted]} (or use "
                                  f"SELECT * FROM predictions({model.name!r}, '<table or SELECT>'))")
    return child


def _encode_input(model: catalog.StoredModel, values: pa.Array, fn: str):
    """``predict(model, x)`` for an image (BLOB or numbers), a text, token ids or a series."""
    enc = model.preprocessing.input
    valid = ~np.asarray(values.is_null().to_numpy(zero_copy_only=False))
    present = values.filter(pa.array(valid))
    if not valid.any():
        return None, valid
    if enc.kind == "text" or enc.blob:
        return enc.to_tensor(present, fn=fn), valid
    lists = present
    if enc.kind == "tokens":
        flat_ids = lists.flatten()
        if pc.any(pc.not_equal(flat_ids, pc.round(flat_ids))).as_py():
            raise InvalidArgument(f"{fn}(): model {model.name!r} takes token ids; pass a list of integers")
        _check_token_range(model, flat_ids, fn)
        lists = lists.cast(pa.list_(pa.int64()))
    return enc.to_tensor(lists, fn=fn), valid


EXACT_IDS = 2 ** 53   # predict() receives ids as DOUBLE: integers past this are not the ids written


def _check_token_range(model: catalog.StoredModel, ids: pa.Array, fn: str) -> None:
    """Token ids >= 0 (as ``train`` takes them) that a DOUBLE holds exactly; another is an
    error naming the input and the range (before, 2**63 - 1 failed Arrow's cast to int64)."""
    bounds = pc.min_max(ids).as_py()
    if bounds["min"] is None or (bounds["min"] >= 0 and bounds["max"] <= EXACT_IDS):
        return
    enc = model.preprocessing.input
    bad = bounds["min"] if bounds["min"] < 0 else bounds["max"]
    known = (f"its vocabulary is {len(enc.ids)} training ids up to {max(enc.ids)}, any other id counts as unknown"
             if enc.ids else f"its vocabulary is the ids 0..{enc.vocab_size - 2}")
    raise InvalidArgument(f"{fn}(): model {model.name!r} takes token ids in 0..{EXACT_IDS} (predict() passes them "
                          f"as DOUBLE; {known}); the input x holds {bad:.0f} (as DOUBLE); pass ids in that range")


def flat(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Arrow UDFs receive chunked arrays; the code here wants one contiguous array."""
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def predict_values(model: catalog.StoredModel, features: pa.Array, *, fn: str, kind: str) -> pa.Array:
    """``kind``: "value" (DOUBLE), "label" (VARCHAR) or "proba" (PROBABILITIES: each class, named as
    predict_label names it, to its probability, in class order), NULL where the input is NULL."""
    prep = model.preprocessing
    if kind != "value" and prep.task != "classification":
        raise InvalidArgument(f"{fn}(): model {model.name!r} is a regression model; use predict({model.name!r}, ...)")
    if kind == "value" and prep.task == "classification" and not _numeric_classes(prep):
        raise InvalidArgument(f"{fn}(): model {model.name!r} predicts text labels; "
                              f"use predict_label({model.name!r}, ...) for the label as VARCHAR")
    out, valid = _forward_chunks(model, flat(features), fn)
    if out is None:                      # every input NULL: every prediction NULL
        return pa.nulls(len(valid), PROBABILITIES if kind == "proba" else
                        pa.string() if kind == "label" else pa.float64())
    if kind == "proba":
        names = [str(c) for c in prep.classes]
        values = [list(zip(names, p)) for p in torch.softmax(out, 1).double().numpy().tolist()]
        typ = PROBABILITIES
    elif kind == "label":
        values = [str(prep.classes[i]) for i in out.argmax(1).numpy()]
        typ = pa.string()
    else:
        v = outputs_to_values(prep, out)
        values = [float(prep.classes[i]) for i in v] if prep.task == "classification" else v
        typ = pa.float64()
    return _scatter(values, valid, typ)


def _forward_chunks(model: catalog.StoredModel, features: pa.Array, fn: str) -> tuple[torch.Tensor | None, np.ndarray]:
    """The outputs of a vector of rows DuckDB hands a UDF (2,048), encoded and run in
    chunks of as many rows as the memory budget holds beside every row's outputs (each
    chunk's encoded input is part of its forward pass's cost); the mask of non-NULL rows."""
    rows = rows_within(model.config, inference_budget(), held=len(features) * model.config.outputs * 4, fn=fn)
    outs, valids = [], []
    for i in range(0, max(len(features), 1), rows):
        x, valid = encode_raw(model, features.slice(i, rows), fn=fn)
        valids.append(valid)
        if valid.any():
            outs.append(forward(model, x, fn=fn))
    return (torch.cat(outs) if outs else None), np.concatenate(valids)


def _numeric_classes(prep: Preprocessing) -> bool:
    return all(isinstance(c, (int, float, bool)) for c in prep.classes)


# predict_proba's Arrow type: MAP(VARCHAR, DOUBLE), class label -> probability
PROBABILITIES = pa.map_(pa.string(), pa.float64())


def _scatter(values, valid: np.ndarray, typ: pa.DataType) -> pa.Array:
    if valid.all():
        return pa.array(values, type=typ)
    it = iter(values)
    return pa.array([next(it) if v else None for v in valid], type=typ)


# on_error of predictions() and evaluate(), as train()'s: 'raise' (the default): the first row
# an image, text or sequence model cannot encode (an unreadable or undecodable image, an empty
# text) fails the statement, its error naming the row; 'skip': every such row is skipped, its
# prediction NULL (predictions) or left out of the metrics (evaluate), each named in a
# RowSkipped warning.
ON_ERROR = ("raise", "skip")


def check_on_error(on_error, fn: str) -> None:
    if on_error not in ON_ERROR:
        raise InvalidArgument(f"{fn}(): unknown on_error {on_error!r}; "
                              f"pass on_error := one of {', '.join(map(repr, ON_ERROR))}")


def row_names(columns) -> exp.Expression:
    """How errors and warnings name a source row (``inputs.row_name``): by its ``filename``
    column (``read_blob``, ``read_text``) when the source has one, else by its number."""
    filename = next((c.name for c in columns if c.name.lower() == "filename"), None)
    if filename is None:
        return sqlglot.parse_one("format('row {}', row_number() OVER ())", read="duckdb")
    return exp.func("format", exp.Literal.string("file '{}'"),
                    exp.func("coalesce", exp.cast(exp.column(filename), "VARCHAR"), exp.Literal.string("NULL")))


def _skipped(errors: list[str], what: str) -> None:
    for e in errors:
        warnings.warn(f"{e} (skipped under on_error := 'skip': {what})", RowSkipped, stacklevel=3)


def encode_skipping(model: catalog.StoredModel, x: pa.Array, names: list[str] | None, *, fn: str,
                    on_error: str, what: str) -> tuple[torch.Tensor | None, np.ndarray]:
    """An image, text or sequence model's column as its input tensor, under ``on_error``:
    (tensor of the rows that encode, their mask); each skipped row named in a warning."""
    tensor, ok, errors = model.preprocessing.input.encode(x, fn=fn, names=names, on_error=on_error)
    _skipped(errors, what)
    return tensor, ok


def infer_encoded(model: catalog.StoredModel, x: pa.Array, *, on_error: str = "raise",
                  names: pa.Array | None = None) -> pa.Array:
    """Model output for rows already encoded by ``features_sql`` (the table form), or for
    the raw column of an image, text or sequence model, encoded here (rows named by
    ``names`` in errors; under ``on_error := 'skip'`` a row that does not encode is NULL)."""
    x = flat(x)
    prep = model.preprocessing
    if prep.input is not None:   # a NULL input is a NULL prediction, as a function of NULL is
        present = np.flatnonzero(~np.asarray(x.is_null().to_numpy(zero_copy_only=False)))
        names = None if names is None else flat(names).take(pa.array(present)).to_pylist()
        values, done = np.zeros(len(x)), np.zeros(len(x), bool)
        for i in range(0, len(present), 256):
            part = present[i:i + 256]
            tensor, ok = encode_skipping(model, x.take(pa.array(part)), None if names is None else names[i:i + 256],
                                         fn="predictions", on_error=on_error, what="its prediction is NULL")
            if tensor is not None:
                rows = part[ok]
                values[rows], done[rows] = outputs_to_values(prep, forward(model, tensor)), True
        return pa.array(values, type=pa.float64(), mask=~done)
    width = model.preprocessing.width
    rows = x.flatten().to_numpy(zero_copy_only=False).reshape(len(x), width)
    return pa.array(outputs_to_values(model.preprocessing, forward(model, rows)), type=pa.float64())


def model_and_source(cur, cache: ModelCache, name: str, source: str, fn: str):
    """The latest version of model ``name``, the source as one SELECT and its columns,
    which must hold every feature of the model."""
    model = cache.get(name, fn=fn)
    select_sql = select_tree(source, fn=fn)
    columns = describe(cur, select_sql, fn=fn)
    for f in model.preprocessing.feature_names:
        resolve_column(columns, f, fn=fn, arg="source")
    return model, select_sql, columns


def prediction_expression(model: catalog.StoredModel, on_error: str = "raise",
                          names: exp.Expression | None = None) -> exp.Expression:
    """The ``prediction`` column of ``predictions`` (and ``explain``) over a source row;
    ``names``: how an error names the row (``row_names``; tabular rows need none)."""
    prep = model.preprocessing
    call: exp.Expression = exp.Anonymous(this=infer_function(prep), expressions=[
        value_sql(model.name), value_sql(model.uid), parsed(prep.features_sql()),
        exp.Literal.string(on_error), names if names is not None else exp.Literal.string("")])
    if prep.task == "classification":   # the class index -> the class, from the catalog's classes
        index = exp.Add(this=exp.cast(call, "INTEGER"), expression=exp.Literal.number(1))
        call = exp.Bracket(this=value_sql(list(prep.classes)), expressions=[index], offset=1)   # 1-based, as written
    return call


def over_source(columns: list[exp.Expression], select_sql: exp.Query) -> str:
    """``SELECT src.*, <columns> FROM (<source>) AS src``, as the text a SQL macro runs."""
    source = exp.Subquery(this=parsed(select_sql).copy(), alias=exp.TableAlias(this="src"))
    return exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier("src")), *columns).from_(source).sql("duckdb")


def predictions_sql(cur: duckdb.DuckDBPyConnection, cache: ModelCache, name: str, source: str,
                    on_error: str = "raise") -> str:
    """The query behind ``predictions(model, source)``: every source row plus a ``prediction`` column."""
    check_on_error(on_error, "predictions")
    model, select_sql, columns = model_and_source(cur, cache, name, source, "predictions")
    names = row_names(columns) if model.preprocessing.input is not None else None
    return over_source([exp.alias_(prediction_expression(model, on_error, names), "prediction")], select_sql)


def evaluate(cur: duckdb.DuckDBPyConnection, cache: ModelCache, name: str, source: str,
             on_error: str = "raise") -> dict:
    """Metrics of the latest version of ``name`` on the rows of ``source`` (its label must be there)."""
    fn = "evaluate"
    check_on_error(on_error, fn)
    model, select_sql, columns = model_and_source(cur, cache, name, source, fn)
    prep = model.preprocessing
    if not any(c.name.lower() == prep.label.lower() for c in columns):
        raise InvalidArgument(f"{fn}(): source has no column {prep.label!r}, the label of model {name!r}; "
                              f"include it in the SELECT")
    y = (exp.cast(prep.label_expression(), "BIGINT") if prep.task == "classification"
         else exp.cast(column(prep.label), "DOUBLE"))
    xy = [exp.alias_(parsed(prep.features_sql()), "x"), exp.alias_(y, "y")]
    outs, ys = [], []
    if prep.input is None:
        query = exp.select(*xy).from_(parsed(select_sql).subquery()).where(parsed(prep.label_filter()))
        batches = BatchStream(cur, query, 8192)
    else:   # the rows numbered (or named by file) before the label's filter
        row_name = unused_name("__dbml_row_name", [c.name for c in columns])   # a source column keeps its name
        named = exp.select(exp.Star(), exp.alias_(row_names(columns), row_name, quoted=True)).from_(
            exp.Subquery(this=parsed(select_sql).copy(), alias=exp.TableAlias(this="src")))
        query = (exp.select(*xy, column(row_name)).from_(named.subquery())
                 .where(parsed(prep.label_filter())))
        batches = _input_batches(cur, model, query, on_error, fn)
    for x, y in batches:
        outs.append(forward(model, x))
        ys.append(y)
    if not ys:
        raise InvalidArgument(f"{fn}(): source has no rows with a non-NULL label {prep.label!r}; "
                              f"pass a source that selects some labelled rows")
    out, y = torch.cat(outs), torch.cat(ys).numpy()
    if prep.task == "classification":
        return {"rows": len(y), **metrics.classification(out, y, len(prep.classes))}
    return {"rows": len(y), **metrics.regression(y, prep.unscale(out.squeeze(-1).numpy()))}


def _input_batches(cur, model: catalog.StoredModel, query: exp.Select, on_error: str, fn: str):
    """(input tensor, labels) of an image, text or sequence model's rows, 256 at a time;
    under on_error := 'skip' without the rows that do not encode."""
    reader = cur.sql(query.sql("duckdb")).to_arrow_reader(256)
    try:
        for batch in reader:
            x, y, names = batch.column(0), batch.column(1), batch.column(2).to_pylist()
            tensor, ok = encode_skipping(model, x, names, fn=fn, on_error=on_error,
                                         what="left out of the metrics")
            if tensor is not None:
                yield tensor, shared_tensor(y.filter(pa.array(ok)).to_numpy(zero_copy_only=False))
    finally:
        reader.close()


def per_model(models: pa.Array, run) -> pa.Array:
    """Apply ``run(model_name, row_indices)`` to each model named in a vector, reassembled in row order.

    Rows whose model name is NULL get NULL.
    """
    models = flat(models)
    names = models.to_numpy(zero_copy_only=False)
    distinct = [n for n in pc.unique(models).to_pylist() if n is not None]
    if len(distinct) == 1 and models.null_count == 0:
        return run(distinct[0], pa.array(np.arange(len(models))))
    parts = [(np.flatnonzero(names == n), run(n, pa.array(np.flatnonzero(names == n)))) for n in distinct]
    null_rows = np.flatnonzero(pc.is_null(models).to_numpy(zero_copy_only=False))
    typ = parts[0][1].type if parts else pa.float64()
    values = pa.concat_arrays([p for _, p in parts] + [pa.nulls(len(null_rows), typ)])
    order = np.concatenate([r for r, _ in parts] + [null_rows])
    return values.take(pa.array(np.argsort(order, kind="stable")))
