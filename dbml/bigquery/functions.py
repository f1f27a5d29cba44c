"""BigQuery ML's model functions, computed in Python from dbml's models and registered with the
connection as Arrow tables; the query then reads that table where the function stood.

``ML.PREDICT``, ``ML.EVALUATE``, ``ML.TRAINING_INFO``, ``ML.CONFUSION_MATRIX``, ``ML.ROC_CURVE``,
``ML.FEATURE_INFO``, ``ML.WEIGHTS``, ``ML.EXPLAIN_PREDICT``, ``ML.GLOBAL_EXPLAIN``,
``ML.FEATURE_IMPORTANCE``, ``ML.TRIAL_INFO``, ``ML.CENTROIDS``, with BigQuery's documented
output columns. The input rows (a ``(SELECT ...)``, which may use the outer query's CTEs, or
``TABLE t``) are read once, with the model's stored TRANSFORM applied.
"""

from __future__ import annotations

import json
import re

import duckdb
import numpy as np
import pyarrow as pa
import torch
from sqlglot import exp

from ..core import catalog, home
from .. import explain as attributions
from ..errors import InvalidArgument
from ..core.runtime import runtime
from ..core.inference import forward
from ..core.heldout import held_out_sql, holds_out
from ..core.source import column, parsed, unused_name
from . import evaluation, names, store
from .create import apply_transform, model_name, temporal_as_numbers
from .parse import MLFunction, count, function_name, settings

KEEP_REGISTERED = 16
MAX_THRESHOLDS = 10_000     # ML.ROC_CURVE: one pass over the rows per threshold
EXPLAIN_ROWS = 512          # ML.EXPLAIN_PREDICT attributes rows in chunks of this many (its memory per row is large)


# BigQuery's documented column types, where a column may be NULL in every row (a model without
# categorical inputs, without evaluation rows): typed as BigQuery types it, never Arrow's null
FEATURE_INFO_SCHEMA = pa.schema([("input", pa.string()), *((c, pa.float64()) for c in ("min", "max", "mean", "median",
                                                                                        "stddev")),
                                 ("category_count", pa.int64()), ("null_count", pa.int64()), ("dimension", pa.int64())])
TRAINING_INFO_SCHEMA = pa.schema([("training_run", pa.int64()), ("iteration", pa.int64()), ("loss", pa.float64()),
                                  ("eval_loss", pa.float64()), ("learning_rate", pa.float64()),
                                  ("duration_ms", pa.int64())])


class Model:
    """A model as the functions see it: the loaded catalog model, its BigQuery record."""

    def __init__(self, con, node, fn: str, trial: int | None = None, *, name: str | None = None,
                 version: int | None = None):
        """The model of ``node`` (``ML.<fn>(MODEL m, ...)``) as ``predict()`` resolves it
        (``catalog.resolve``): ``MODEL `m@2``` that version, else the version ``deploy()`` pinned,
        else the latest, or a tuned model's optimal trial; ``trial``: that trial of the tuning run
        of the version chosen. Or ``name`` at ``version`` (a trial CREATE MODEL ranks)."""
        self.name = name if name is not None else model_name(node.this)
        chosen_by_user = version is not None
        if version is None:
            self.name, asked = catalog.model_ref(self.name, None, fn=fn)
            chosen_by_user = (asked is not None and asked != catalog.LATEST) or \
                (asked is None and catalog.pinned_version(con, self.name) is not None)
            version = store.resolve(con, self.name, asked, fn)
        run = (store.info(con, self.name, version).get("trial") or {}).get("run")
        # the trials of the version's tuning run (an earlier CREATE OR REPLACE had its own)
        trials = [(v, t) for v, t in store.trials(con, self.name) if t.get("run") == run] if run is not None else []
        if trials and (trial is not None or not chosen_by_user):
            chosen = [v for v, t in trials if (t["trial_id"] == trial if trial is not None else t["is_optimal"])]
            if not chosen:
                raise InvalidArgument(f"BigQuery ML: {fn}: model {self.name} has no trial {trial}")
            version = chosen[0]
        self.version, self.trials = version, trials
        self.stored = catalog.load(con, self.name, version)
        params = exp.select("params").from_(exp.to_table(catalog.MODELS)).where(exp.column("uid").eq(exp.Placeholder()))
        self.params = json.loads(con.execute(home.sql(con, params), [self.stored.uid]).fetchall()[0][0])
        self.prep = self.stored.preprocessing
        if self.prep.input is not None:
            raise InvalidArgument(f"BigQuery ML: {fn}: model {self.name} takes {self.prep.input.kind} input; "
                                  f"BigQuery ML's functions take tabular models (use predictions() or evaluate())")
        self.info = store.info(con, self.name, version)
        self.is_kmeans = self.stored.config.arch == "kmeans"
        self.classes = list(self.prep.classes) if self.prep.task == "classification" else []


def input_query(con, arg, outer: exp.Expression) -> exp.Select:
    if arg is None:
        raise InvalidArgument("BigQuery ML: this function needs its input rows: (SELECT ...) or TABLE t")
    if isinstance(arg, exp.Subquery):
        query = arg.this.copy()
    else:
        query = exp.select(exp.Star()).from_(arg.copy())
    with_ = outer.args.get("with_") or outer.args.get("with")
    if with_ is not None and isinstance(query, exp.Select):
        for cte in with_.expressions:
            if not any(c.alias == cte.alias for c in (query.args.get("with_") or exp.With()).expressions):
                query = query.with_(cte.alias, cte.this.copy())
    return names.to_duckdb(con, query)


def rows(con, model: Model, query: exp.Select, labelled: bool,
         held_out: bool = False) -> tuple[pa.Table, np.ndarray, np.ndarray | None]:
    """(the input rows, their encoded features, the label as class index or value) in one read;
    ``held_out``: only the rows ``train`` held out for validation (the training query's)."""
    # the input's own columns, the TRANSFORM's and the model's names stay the user's: the row's
    # struct (the subquery's alias read as a value) and its column are named apart from them
    transform = model.info.get("transform")
    taken = [*getattr(con, "duckdb", con).sql(query.sql("duckdb")).columns, *model.prep.feature_names,
             model.prep.label, *(parsed(e).alias_or_name for e in transform or ())]
    alias, row_col = unused_name("__dbml_in", taken), unused_name("__dbml_row", taken)
    inner = exp.select(exp.alias_(exp.column(alias, quoted=True), row_col, quoted=True), exp.Star()).from_(
        exp.Subquery(this=query, alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True))))
    src = inner
    if transform:
        # the column split := 'custom' or 'seq' held rows out by, beside TRANSFORM's (as train() read it)
        split_col = model.params.get("split_col") if held_out else None
        kept = [column(split_col)] if split_col and split_col not in {parsed(e).alias_or_name for e in transform} else []
        src = apply_transform(inner, [*transform, *kept, column(row_col)])
    if model.info:   # CREATE MODEL's: dates are features, in seconds (train() takes none: its source as it was)
        src = temporal_as_numbers(con, src)
    cols = [exp.alias_(column(row_col), "__dbml_row"), exp.alias_(model.prep.features_sql(), "__dbml_x")]
    outer = exp.select(*cols).from_(exp.Subquery(this=src, alias=exp.TableAlias(this=exp.to_identifier("__dbml_s"))))
    if labelled:
        y = (exp.maybe_parse(model.prep.label_sql(), dialect="duckdb") if model.prep.task == "classification" else
             exp.cast(exp.column(model.prep.label, quoted=True), "DOUBLE"))
        outer = outer.select(exp.alias_(y, "__dbml_y")).where(model.prep.label_filter())
    if held_out:
        # src is train's source (the query, TRANSFORM, dates as numbers) with __dbml_row beside it
        held = held_out_sql(model.params, exclude=(row_col,))
        outer = outer.qualify(held) if held.find(exp.Window) else outer.where(held)
    try:
        table = _arrow(con, outer)
    except duckdb.BinderException:
        _missing_columns(con, model, query, labelled)
        raise
    width = model.prep.width
    x = table.column("__dbml_x").combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    row = table.column("__dbml_row").combine_chunks()
    inputs = pa.Table.from_arrays(row.flatten(), names=[row.type.field(i).name for i in range(row.type.num_fields)])
    y = table.column("__dbml_y").to_numpy() if labelled else None
    return inputs, x.reshape(table.num_rows, width), y


def _missing_columns(con, model: Model, query: exp.Select, labelled: bool) -> None:
    """Name the input columns the model needs that ``query``'s rows lack (DuckDB's binder
    error names one column of dbml's inner query, "not found in FROM clause"); returns where
    none is missing."""
    transform = model.info.get("transform")
    if transform:   # TRANSFORM computes the features from the query's own columns
        needed = [c.name for e in transform for c in
                  (e if isinstance(e, exp.Expression) else exp.maybe_parse(e, dialect="duckdb")).find_all(exp.Column)]
    else:
        needed = [f.name for f in model.prep.features]
    if labelled:
        needed.append(model.prep.label)
    needed = list(dict.fromkeys(needed))
    given = {c.lower() for c in con.sql(query.sql("duckdb")).columns}
    missing = [c for c in needed if c.lower() not in given]
    if missing:
        label = f" (the label: {model.prep.label})" if labelled and model.prep.label in missing else ""
        raise InvalidArgument(f"BigQuery ML: model {model.name} needs the input column{'s' * (len(missing) > 1)} "
                              f"{', '.join(missing)}{label}, which the rows passed lack; it reads {', '.join(needed)}: "
                              f"select them in the input query") from None


def _outputs(model: Model, x: np.ndarray) -> np.ndarray:
    if model.is_kmeans:
        with torch.no_grad():
            return model.stored.module.distances(torch.as_tensor(x)).double().numpy()
    return forward(model.stored, x).double().numpy()


def probabilities(out: np.ndarray) -> np.ndarray:
    return torch.softmax(torch.as_tensor(out), 1).numpy()


def predicted(model: Model, out: np.ndarray, threshold: float | None) -> np.ndarray:
    """Class indices (classification; binary with ``threshold`` on the second class's probability)
    or values."""
    if model.prep.task != "classification":
        return model.prep.unscale(out[:, 0])
    if len(model.classes) == 2:
        return (probabilities(out)[:, 1] >= (0.5 if threshold is None else threshold)).astype(np.int64)
    return out.argmax(1)


def _label_array(model: Model, idx: np.ndarray) -> pa.Array:
    return pa.array([model.classes[i] for i in idx])


def _predict(con, node, outer, model: Model) -> pa.Table:
    args = node.expressions
    opts = settings(args[1] if len(args) > 1 else None, "ML.PREDICT")
    inputs, x, _ = rows(con, model, input_query(con, args[0] if args else None, outer), labelled=False)
    out = _outputs(model, x)
    if model.is_kmeans:
        order = np.argsort(out, axis=1)
        nearest = [[{"CENTROID_ID": int(c) + 1, "DISTANCE": float(out[r, c])} for c in order[r]] for r in range(len(out))]
        cols = {"CENTROID_ID": pa.array(order[:, 0] + 1 if len(out) else [], pa.int64()),
                "NEAREST_CENTROIDS_DISTANCE": pa.array(nearest, pa.list_(pa.struct([("CENTROID_ID", pa.int64()), ("DISTANCE", pa.float64())])))}
    else:
        label = model.prep.label
        value = predicted(model, out, opts.get("threshold"))
        cols = {f"predicted_{label}": _label_array(model, value) if model.classes else pa.array(value, pa.float64())}
        if model.classes:
            p = probabilities(out)
            cols[f"predicted_{label}_probs"] = pa.array(
                [[{"label": c, "prob": float(p[r, i])} for i, c in sorted(enumerate(model.classes), key=lambda t: -p[r, t[0]])]
                 for r in range(len(p))])
    return _with_inputs(cols, inputs)


def _with_inputs(cols: dict, inputs: pa.Table) -> pa.Table:
    names_ = list(cols) + [n for n in inputs.column_names if n not in cols]
    arrays = list(cols.values()) + [inputs.column(n) for n in inputs.column_names if n not in cols]
    return pa.Table.from_arrays(arrays, names=names_)


def stored_query(model: Model, key: str, fn: str) -> exp.Select:
    """A query the store kept for the model (before TRANSFORM), parsed and checked read-only
    (the catalog is data: an edited row must not become a write)."""
    import sqlglot
    from ..core.source import as_select
    text = model.info.get(key) if model.info else model.params.get(key)   # train()'s: the catalog's params
    if text is None:
        raise InvalidArgument(f"BigQuery ML: {fn} reads the training query, which the catalog keeps from this "
                              f"version on; {model.name} version {model.version} was stored before: pass the "
                              f"rows, e.g. {fn}(MODEL {model.name}, (SELECT ...))")
    return sqlglot.parse_one(as_select(text, fn=fn), read="duckdb")


def _evaluated(con, node, outer, model: Model, fn: str) -> tuple[exp.Select, list, bool]:
    """(the rows to evaluate on, the arguments after them, whether only the held-out rows count).
    Without input: the evaluation rows of the model's data split, as BigQuery ML: the rows
    ``train`` held out (``heldout.held_out_sql``: by hash, or SEQ's and CUSTOM's ``split_col``; a
    SEQ or CUSTOM model stored before: its held-out query), else (NO_SPLIT, k-means) the training rows."""
    args = node.expressions
    if args and not isinstance(args[0], exp.Struct):
        return input_query(con, args[0], outer), args[1:], False
    if model.info.get("eval_source") is not None:
        return stored_query(model, "eval_source", fn), args, False
    return stored_query(model, "source", fn), args, holds_out(model.params)


def _arrow(con, tree: exp.Expression) -> pa.Table:
    return getattr(con, "duckdb", con).sql(tree.sql("duckdb")).to_arrow_table()


def result(con, table: pa.Table) -> str:
    """The query that reads ``table`` (registered on ``con``) as the result of a statement."""
    view = f"__dbml_ml_{next(runtime().view_names)}"
    con.register(view, table)
    _forget_old(con, view)
    return exp.select(exp.Star()).from_(exp.to_identifier(view)).sql("duckdb")


def _evaluate(con, node, outer, model: Model) -> pa.Table:
    query, rest, held_out = _evaluated(con, node, outer, model, "ML.EVALUATE")
    opts = settings(rest[0] if rest else None, "ML.EVALUATE")
    if model.is_kmeans:
        _, x, _ = rows(con, model, query, labelled=False)
        return pa.Table.from_pylist([evaluation.clustering(_outputs(model, x),
                                                        model.stored.module.between_centroids().double().numpy())])
    figures = _figures(con, model, query, held_out, opts.get("threshold"))
    return pa.Table.from_pylist([{**_trial_id(model), **figures}])


def _figures(con, model: Model, query: exp.Select, held_out: bool, threshold: float | None = None) -> dict:
    """ML.EVALUATE's figures of a supervised model on ``query``'s rows (``held_out``: those ``train``
    held out)."""
    _, x, y = rows(con, model, query, labelled=True, held_out=held_out)
    out = _outputs(model, x)
    if model.classes:
        return evaluation.classification(y, probabilities(out), predicted(model, out, threshold))
    return evaluation.regression(y, model.prep.unscale(out[:, 0]))


def trial_figures(con, name: str, version: int, eval_source: str | None) -> dict:
    """ML.EVALUATE's figures of a trial CREATE MODEL just trained (``HPARAM_TUNING_OBJECTIVES``
    ranks the trials by one): on its evaluation rows, as ``ML.EVALUATE(MODEL m)`` reads them
    (``eval_source``, SEQ's and CUSTOM's, else the rows ``train`` held out of its source)."""
    import sqlglot
    from ..core.source import as_select
    model = Model(con, None, "CREATE MODEL", name=name, version=version)
    if eval_source is not None:
        return _figures(con, model, sqlglot.parse_one(as_select(eval_source, fn="CREATE MODEL"), read="duckdb"),
                        held_out=False)
    return _figures(con, model, stored_query(model, "source", "CREATE MODEL"),
                    held_out=holds_out(model.params))


def _trial_id(model: Model) -> dict:
    """``{"trial_id": n}`` of a tuned model's trial (BigQuery ML's first column for one), else {}."""
    chosen = [t["trial_id"] for v, t in model.trials if v == model.version]
    return {"trial_id": chosen[0]} if chosen else {}


def _confusion(con, node, outer, model: Model) -> pa.Table:
    query, rest, held_out = _evaluated(con, node, outer, model, "ML.CONFUSION_MATRIX")
    opts = settings(rest[0] if rest else None, "ML.CONFUSION_MATRIX")
    _, x, y = rows(con, model, query, labelled=True, held_out=held_out)
    pred = predicted(model, _outputs(model, x), opts.get("threshold"))
    table = {"expected_label": [str(c) for c in model.classes]}
    for j, c in enumerate(model.classes):
        col = str(c) if re.fullmatch(r"[A-Za-z_]\w*", str(c)) else "_" + re.sub(r"\W", "_", str(c))
        table[col] = [int(np.sum((y == i) & (pred == j))) for i in range(len(model.classes))]
    return pa.table(table)


def _roc(con, node, outer, model: Model) -> pa.Table:
    query, rest, held_out = _evaluated(con, node, outer, model, "ML.ROC_CURVE")
    if len(model.classes) != 2:
        raise InvalidArgument(f"BigQuery ML: ML.ROC_CURVE is for binary classification models; {model.name} has "
                              f"{len(model.classes) or 'no'} classes")
    thresholds = None
    if rest:
        # BigQuery's 0.5 is a FLOAT64 (DuckDB's a DECIMAL, which rounds a long literal)
        given = exp.cast(names.to_duckdb(con, rest[0].copy()), "DOUBLE[]", dialect="duckdb")
        n = con.execute(exp.select(exp.func("len", given)).sql("duckdb")).fetchall()[0][0]
        count(n, "the number of ML.ROC_CURVE's thresholds", 1, MAX_THRESHOLDS)
        thresholds = con.execute(exp.select(given.copy()).sql("duckdb")).fetchall()[0][0]
    _, x, y = rows(con, model, query, labelled=True, held_out=held_out)
    return pa.Table.from_pylist(evaluation.roc_curve(y, probabilities(_outputs(model, x))[:, 1], thresholds))


def _training_info(con, node, outer, model: Model) -> pa.Table:
    import json
    params, metrics = con.execute("SELECT params, metrics FROM dbml_models WHERE name = ? AND version = ?",
                                  [model.name, model.version]).fetchall()[0]
    lr = json.loads(params).get("lr")
    out = []
    for e in json.loads(metrics).get("history", []):
        out.append({"training_run": 0, "iteration": int(e["epoch"]) - 1, "loss": e.get("loss"),
                    "eval_loss": e.get("eval_loss", e.get("val_loss")),
                    "learning_rate": e["learning_rate"] if "learning_rate" in e else lr,
                    "duration_ms": int(round(1000 * e.get("seconds", 0.0)))})
    return pa.Table.from_pylist(out, schema=TRAINING_INFO_SCHEMA)


def _training_rows(con, model: Model, fn: str, limit: int = 2000):
    """Up to ``limit`` rows of the training query (what GLOBAL_EXPLAIN averages over)."""
    return rows(con, model, stored_query(model, "source", fn).limit(limit), labelled=False)


def _explain_predict(con, node, outer, model: Model) -> pa.Table:
    args = node.expressions
    opts = settings(args[1] if len(args) > 1 else None, "ML.EXPLAIN_PREDICT")
    top_k = opts.get("top_k_features", 5)
    inputs, x, _ = rows(con, model, input_query(con, args[0] if args else None, outer), labelled=False)
    e = _explained(model.stored, x)
    out = _outputs(model, x)
    label = model.prep.label
    cols = {}
    if model.classes:
        idx = predicted(model, out, opts.get("threshold"))
        cols[f"predicted_{label}"] = _label_array(model, idx)
        cols["probability"] = pa.array(probabilities(out)[np.arange(len(out)), idx])
    else:
        cols[f"predicted_{label}"] = pa.array(model.prep.unscale(out[:, 0]))
    top = []
    for r in range(len(x)):
        order = np.argsort(-np.abs(e["attributions"][r]), kind="stable")[:top_k]
        top.append([{"feature": e["features"][i], "attribution": float(e["attributions"][r, i])} for i in order])
    cols["top_feature_attributions"] = pa.array(top, pa.list_(pa.struct([("feature", pa.string()), ("attribution", pa.float64())])))
    cols["baseline_prediction_value"] = pa.array(e["baseline"])
    cols["prediction_value"] = pa.array(e["prediction"])
    cols["approximation_error"] = pa.array(e["approximation_error"])
    return _with_inputs(cols, inputs)


def _explained(stored, x: np.ndarray) -> dict:
    """``explain_rows`` over ``x`` in chunks of ``EXPLAIN_ROWS`` (integrated gradients hold
    every step's inputs per row: 200,000 rows at once asked for 3.3 GB)."""
    parts = [attributions.explain_rows(stored, x[i:i + EXPLAIN_ROWS]) for i in range(0, max(len(x), 1), EXPLAIN_ROWS)]
    joined = {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in ("attributions", "baseline", "prediction",
                                                                             "approximation_error")}
    return {**parts[0], **joined}


def _global_explain(con, node, outer, model: Model) -> pa.Table:
    opts = settings(node.expressions[0] if node.expressions else None, "ML.GLOBAL_EXPLAIN")
    _, x, _ = _training_rows(con, model, "ML.GLOBAL_EXPLAIN")
    e = attributions.explain_rows(model.stored, x)
    mean = np.abs(e["attributions"]).mean(0)
    out = [{"feature": f, "attribution": float(mean[i])} for i, f in enumerate(e["features"])]
    if opts.get("class_level_explain") and model.classes:
        out = [{"class_label": str(model.classes[c]), "feature": f,
                "attribution": float(np.abs(e["attributions"][e["target"] == c, i]).mean()) if (e["target"] == c).any() else 0.0}
               for c in range(len(model.classes)) for i, f in enumerate(e["features"])]
    return pa.Table.from_pylist(sorted(out, key=lambda d: -d["attribution"]))


def _feature_importance(con, node, outer, model: Model) -> pa.Table:
    module = model.stored.module
    if not hasattr(module, "model"):
        raise InvalidArgument(f"BigQuery ML: ML.FEATURE_IMPORTANCE is for boosted tree and random forest models; "
                              f"{model.name} is {model.stored.config.arch} (use ML.GLOBAL_EXPLAIN)")
    booster = module.model()
    split, gain = booster.feature_importance("split"), booster.feature_importance("gain")
    out, start = [], 0
    for f in model.prep.features:
        sl = slice(start, start + f.width)
        out.append({"feature": f.name, "importance_weight": int(split[sl].sum()), "importance_gain": float(gain[sl].sum()),
                    "importance_cover": None})
        start += f.width
    return pa.Table.from_pylist(out, schema=pa.schema([("feature", pa.string()), ("importance_weight", pa.int64()),
                                                       ("importance_gain", pa.float64()), ("importance_cover", pa.float64())]))


def _weights(con, node, outer, model: Model) -> pa.Table:
    opts = settings(node.expressions[0] if node.expressions else None, "ML.WEIGHTS")
    return pa.Table.from_pylist([{**_trial_id(model), **row}
                                 for row in evaluation.weights(model, bool(opts.get("standardize", False)))])


def _feature_info(con, node, outer, model: Model) -> pa.Table:
    query = stored_query(model, "source", "ML.FEATURE_INFO")
    transform = model.info.get("transform")
    if transform:
        query = apply_transform(query, transform)
    return pa.Table.from_pylist(evaluation.feature_info(con, model, temporal_as_numbers(con, query)),
                                schema=FEATURE_INFO_SCHEMA)


def _centroids(con, node, outer, model: Model) -> pa.Table:
    if not model.is_kmeans:
        raise InvalidArgument(f"BigQuery ML: ML.CENTROIDS is for k-means models; {model.name} is not one")
    c = model.stored.module.centroids.numpy() / model.stored.module.scale.numpy()
    out, start = [], 0
    for f in model.prep.features:
        for k in range(len(c)):
            value = f.mean + f.std * float(c[k, start]) if f.kind == "numeric" else None
            out.append({"centroid_id": k + 1, "feature": f.name, "numerical_value": value,
                        "categorical_value": [] if f.kind == "numeric" else
                        [{"category": cat, "value": float(c[k, start + j])} for j, cat in enumerate(f.categories)]})
        start += f.width
    return pa.Table.from_pylist(out)


def _trial_info(con, node, outer, model: Model) -> pa.Table:
    if not model.trials:
        raise InvalidArgument(f"BigQuery ML: ML.TRIAL_INFO is for models created with num_trials; {model.name} has none")
    return pa.Table.from_pylist([{k: v for k, v in t.items() if k != "run"} for _, t in model.trials])


HANDLERS = {"PREDICT": _predict, "EVALUATE": _evaluate, "TRAINING_INFO": _training_info,
            "CONFUSION_MATRIX": _confusion, "ROC_CURVE": _roc, "FEATURE_INFO": _feature_info, "WEIGHTS": _weights,
            "EXPLAIN_PREDICT": _explain_predict, "GLOBAL_EXPLAIN": _global_explain,
            "FEATURE_IMPORTANCE": _feature_importance, "TRIAL_INFO": _trial_info, "CENTROIDS": _centroids}


def rewrite(con, tree: exp.Expression) -> exp.Expression:
    """The query with every model function replaced by a registered Arrow table of its result."""
    for node in _innermost_first(tree):
        name = function_name(node)
        if name not in HANDLERS:
            raise InvalidArgument(f"BigQuery ML: ML.{name} is not supported in dbml; supported: "
                                  f"{', '.join('ML.' + n for n in HANDLERS)}")
        structs = [a for a in node.expressions if isinstance(a, exp.Struct)]
        trial = settings(structs[-1], f"ML.{name}").get("trial_id") if structs else None
        model = Model(con, node, f"ML.{name}", trial)
        table_ = HANDLERS[name](con, node, tree, model)
        view = f"__dbml_ml_{next(runtime().view_names)}"
        con.register(view, table_)
        _forget_old(con, view)
        table = node.parent if isinstance(node.parent, exp.Table) else node
        alias = table.alias if isinstance(table, exp.Table) and table.alias else None
        table.replace(exp.Table(this=exp.to_identifier(view), alias=exp.TableAlias(this=exp.to_identifier(alias)) if alias else None))
    return tree


def _innermost_first(tree: exp.Expression) -> list[MLFunction]:
    """The model functions of ``tree``, each after every one in its input: ``ML.PREDICT`` over
    another ``ML.PREDICT`` reads the inner one's rows, computed (and registered) first."""
    nodes = list(tree.find_all(MLFunction))
    return sorted(nodes, key=lambda n: -_depth(n))   # an inner one is deeper than the one it feeds


def _depth(node: exp.Expression) -> int:
    depth = 0
    while node.parent is not None:
        node, depth = node.parent, depth + 1
    return depth


def _forget_old(con, view: str) -> None:
    views = runtime().views.setdefault(id(con), [])   # the process's, per connection
    views.append(view)
    while len(views) > KEEP_REGISTERED:
        try:
            con.unregister(views.pop(0))
        except Exception:   # the connection may be gone
            pass
