"""BigQuery ML statements, rewritten into dbml calls and DuckDB SQL: ``translate`` is the one
entry point of ``dbml.execute`` (``run``) and the shell (which runs and draws the SQL it returns).

A statement written for BigQuery (``looks_like_bigquery``) is parsed with sqlglot's BigQuery
dialect, extended for the model functions sqlglot lacks (``parse``), and every piece is
built as a sqlglot tree:

* ``CREATE [OR REPLACE] MODEL [IF NOT EXISTS] m [TRANSFORM(...)] OPTIONS(...) AS <query>``:
  ``create.plan`` checks every option and model type first, then ``train`` runs (once per
  trial with ``num_trials``: ``tuning``); ``store`` keeps what the model functions need
  beside the catalog. dbml keeps versions: ``OR REPLACE`` trains the next one.
* ``ML.<function>(MODEL m, ...)``: ``functions`` computes the result from the loaded model
  and registers it as an Arrow table, which the query reads in the function's place.
  CREATE and DROP MODEL run when translated; the SQL returned reads their result the same way.
* ``DROP MODEL [IF EXISTS] m``: ``drop_model``.
* BigQuery's names and functions in any other statement (``names``): ``project.dataset.t``
  is ``dataset.t``, wildcard tables, ``ST_DISTANCE``, ``GENERATE_ARRAY``, ``FROM UNNEST`` of
  STRUCTs, ML's preprocessing functions (``preprocess``).

A model named ``dataset.model`` is the dbml model ``model`` (dbml has no datasets). Any
other SQL runs unchanged. Whatever is not supported is an error that names it and says
"not supported in dbml", before anything trains.
"""

from __future__ import annotations

import pyarrow as pa
from sqlglot import exp

from ..errors import InvalidArgument
from ..core.sqltext import bigquery_markers, split_statements
from ..core import home
from ..core import catalog
from ..core.catalog import MODELS
from ..core.source import refuse_effects
from . import create, functions, names, store, tuning
from .create import MODEL_TYPES, OPTIONS, model_name
from .parse import MLFunction, parse

__all__ = ["OPTIONS", "MODEL_TYPES", "run", "execute", "translate", "looks_like_bigquery"]


def looks_like_bigquery(sql: str) -> bool:
    """Whether ``sql`` is written for BigQuery (``sqltext.bigquery_markers``: a backquoted
    name, a ``#`` comment, an ``ML.`` function call, CREATE/DROP MODEL, as DuckDB reads the
    text). Anything else is DuckDB's and runs unchanged."""
    return bigquery_markers(sql)


def run(con, statement: str):
    """Run one statement: BigQuery (ML) rewritten into dbml and DuckDB, anything else unchanged.
    Returns DuckDB's result (``con.execute``'s): rows to fetch, a description of its columns.
    An IMPORT DATABASE that brings a dbml catalog replaces the database's empty one."""
    if home.import_path(statement) is not None:
        from .. import import_database
        return import_database(con, statement, getattr(con, "duckdb", con).execute)   # DuckDB's own: no second pass here
    return con.execute(translate(con, statement))


def translate(con, statement: str) -> str:
    """One statement as the DuckDB SQL that gives its result: anything not written for BigQuery
    unchanged; CREATE and DROP MODEL run here (train, drop_model) and the SQL reads what they
    returned; model functions are computed here and read as registered Arrow tables."""
    if not looks_like_bigquery(statement):
        return statement
    tree = parse(statement)
    if isinstance(tree, exp.Create) and str(tree.args.get("kind", "")).upper() == "MODEL":
        return _create_model(con, tree)
    if isinstance(tree, exp.Drop) and str(tree.args.get("kind", "")).upper() == "MODEL":
        return _drop_model(con, tree)
    if any(tree.find_all(MLFunction, exp.Predict)):
        _check_inputs(tree)
        tree = tree.transform(_predict_node)
        tree = functions.rewrite(con, names.to_duckdb(con, tree))
    else:
        tree = names.to_duckdb(con, tree)
    return names.unnest_structs(con, tree).sql("duckdb")


def _predict_node(node):
    """sqlglot's own ML.PREDICT node as the MLFunction every other model function is."""
    if isinstance(node, exp.Predict):
        args = [a for a in (node.args.get("expression"), node.args.get("params_struct")) if a is not None]
        return MLFunction(this=node.this, name=exp.Literal.string("PREDICT"), expressions=args)
    return node


def execute(con, text: str):
    """Run a script of statements, BigQuery ML ones rewritten into dbml calls and any other
    SQL unchanged; the last statement's result (a DuckDB result whose rows can be fetched)."""
    result = None
    for statement in split_statements(text):
        result = run(con, statement)
    return result


def _check_inputs(tree: exp.Expression) -> None:
    """Before any model function runs: the rows each one reads only read (as ``predictions()``'s
    source). A model function in another's input runs first (``functions.rewrite``)."""
    for node in tree.find_all(MLFunction, exp.Predict):
        fn = _ml_name(node)
        for child in node.iter_expressions():
            if child is not node.this:   # the model's name
                refuse_effects(child, where=f"BigQuery ML: {fn}", arg="its input")


def _ml_name(node: exp.Expression) -> str:
    name = node.args.get("name")
    name = name.name if isinstance(name, exp.Expression) else name
    return f"ML.{str(name or 'PREDICT').upper()}"


def _exists(con, name: str) -> bool:
    query = exp.select(exp.func("count", exp.Star())).from_(exp.to_table(MODELS)).where(
        exp.column("name").eq(exp.Placeholder()))
    return con.execute(home.sql(con, query), [name]).fetchall()[0][0] > 0


def _create_model(con, tree: exp.Create):
    name = model_name(tree.this)
    if _exists(con, name):   # before anything of the statement runs (TRANSFORM's statistics read the query)
        if tree.args.get("exists"):
            return functions.result(con, pa.table({"model": pa.array([], pa.string())}))
        if not tree.args.get("replace"):
            raise InvalidArgument(f"Already exists: model {name}; use CREATE OR REPLACE MODEL {name} to train its "
                                  f"next version, CREATE MODEL IF NOT EXISTS to keep it, or DROP MODEL {name} first "
                                  f"(BigQuery's examples create their models in a new dataset)")
    plan = create.plan(con, tree)   # every option checked: nothing trains before this passes
    if plan["trials"]:
        return _trials(con, plan)
    result = _train(con, plan, plan["runs"][0][0])
    version = result.column("version")[0].as_py()
    _record(con, plan, version, None)
    _serve(con, plan["name"], None)
    return functions.result(con, result)


def _serve(con, name: str, version: int | None) -> None:
    """What CREATE MODEL made is what every function serves, as in BigQuery, where a model
    replaced is the new one and a tuned model is its optimal trial: ``predict()``, the
    ML functions and ``dbml_models.deployed`` alike. A tuning run pins its optimal trial's
    version (``deploy``); a plain CREATE unpins (a pin of the model replaced would keep
    serving an older version)."""
    catalog.deploy(con, name, version, fn="CREATE MODEL")


def _train(con, plan: dict, args: dict) -> pa.Table:
    """One ``train`` call of the plan: its result as one row of train()'s columns, typed as
    train() types them (``SELECT result.* FROM (SELECT train(...) AS result)``)."""
    call = create.train_statement(plan["name"], plan["source"], args)
    call.set("expressions", [exp.alias_(call.expressions[0], "result")])
    query = exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier("result"))).from_(
        exp.Subquery(this=call, alias=exp.TableAlias(this=exp.to_identifier("r"))))
    return con.sql(query.sql("duckdb")).to_arrow_table()


def _record(con, plan: dict, version: int, trial: dict | None) -> None:
    store.record(con, plan["name"], version, plan["kind"], plan["query"], plan["held_out"], plan["transform"], trial)


def _trials(con, plan: dict):
    """``num_trials`` versions, each with other hyperparameters (``tuning.Search``: a Bayesian
    search learns from each trial's figure before it picks the next); the one with the best
    objective (``HPARAM_TUNING_OBJECTIVES``'s figure on its evaluation rows, else ``train``'s
    validation metric) is the optimal trial (what ML.PREDICT and ML.EVALUATE use)."""
    search, objective = plan["search"], plan["objective"]
    summaries, scores, points = [], [], []
    while (point := search.ask()) is not None:
        summary = _train(con, plan, plan["arguments"](point)).to_pylist()[0]
        if objective is not None:
            key = objective.lower()
            score = {key: functions.trial_figures(con, plan["name"], summary["version"], plan["held_out"]).get(key)}
        else:
            score = {_metric_name(con, plan["name"], summary["version"]): summary["val_metric"]}
        search.tell(next(iter(score.values())))
        summaries.append(summary)
        scores.append(score)
        points.append(point)
    maximize = tuning.OBJECTIVES[plan["args"]["task"]][objective] if objective is not None else True
    best = tuning.optimal([(i, next(iter(sc.values()))) for i, sc in enumerate(scores, 1)], maximize)
    rows = []
    for trial, (summary, score, hyperparameters) in enumerate(zip(summaries, scores, points), 1):
        record = {"trial_id": trial, "hyperparameters": hyperparameters,
                  "hparam_tuning_evaluation_metrics": score,
                  "training_loss": summary["final_loss"], "eval_loss": None, "status": "SUCCEEDED",
                  "error_message": None, "is_optimal": trial == best,
                  "run": summaries[0]["version"]}   # which tuning run: its first version
        _record(con, plan, summary["version"], record)
        rows.append({"trial_id": trial, "version": summary["version"], "val_metric": summary["val_metric"],
                     "is_optimal": trial == best})
    _serve(con, plan["name"], summaries[best - 1]["version"])
    schema = pa.schema([("trial_id", pa.int64()), ("version", pa.int32()), ("val_metric", pa.float64()),
                        ("is_optimal", pa.bool_())])   # typed even when every val_metric is NULL
    return functions.result(con, pa.Table.from_pylist(rows, schema=schema))


def _metric_name(con, name: str, version: int) -> str:
    import json
    query = exp.select("metrics").from_(exp.to_table(MODELS)).where(
        exp.and_(exp.column("name").eq(exp.Placeholder()), exp.column("version").eq(exp.Placeholder())))
    metrics = con.execute(home.sql(con, query), [name, version]).fetchall()
    return {"r2": "r2_score"}.get(json.loads(metrics[0][0]).get("val_metric_name"), "accuracy")


def _drop_model(con, tree: exp.Drop):
    dropped = 0
    for table in tree.args.get("tables") or [tree.this]:
        name = model_name(table)
        if not _exists(con, name):
            if not tree.args.get("exists"):
                raise InvalidArgument(f"Not found: model {name}")
            continue
        dropped += con.execute(exp.select(exp.func("drop_model", exp.Literal.string(name))).sql("duckdb")).fetchall()[0][0]
    return functions.result(con, pa.table({"versions_dropped": pa.array([dropped], pa.int64())}))
