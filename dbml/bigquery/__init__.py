"""BigQuery ML syntax, rewritten into dbml calls (``dbml.execute(con, text)`` and the shell).

Parsed with sqlglot's BigQuery dialect, extended where it stops (``ML.EVALUATE`` and
``ML.TRAINING_INFO``, which sqlglot does not parse):

* ``CREATE [OR REPLACE] MODEL [IF NOT EXISTS] m OPTIONS(...) AS SELECT ...`` → ``train``
  on that SELECT (BigQuery's options mapped by :data:`OPTIONS`; an unsupported one is an
  error naming it). dbml keeps versions: ``OR REPLACE`` trains the next version; without it
  an existing model is an error, as in BigQuery; ``IF NOT EXISTS`` leaves it alone.
* ``ML.PREDICT(MODEL m, (SELECT ...) | TABLE t)`` → ``predictions(m, source)``: the input
  columns and ``predicted_<label>``.
* ``ML.EVALUATE(MODEL m[, (SELECT ...) | TABLE t])`` → ``evaluate``'s metrics as columns;
  without input, the validation metric stored at training.
* ``ML.TRAINING_INFO(MODEL m)`` → per-epoch rows of the latest version (``iteration``,
  ``loss``, ``duration_ms``).
* ``DROP MODEL [IF EXISTS] m`` → ``drop_model``.

A model named ``dataset.model`` is the dbml model ``model`` (dbml has no datasets). Any
other SQL runs unchanged.
"""

from __future__ import annotations

import pyarrow as pa
from sqlglot import exp

from ..errors import InvalidArgument
from ..sqltext import split_statements
from . import create, functions, names, store
from .create import MODEL_TYPES, OPTIONS, model_name
from .parse import MLFunction, parse

__all__ = ["OPTIONS", "MODEL_TYPES", "run", "execute", "looks_like_bigquery"]


def looks_like_bigquery(sql: str) -> bool:
    """Whether ``sql`` is written for BigQuery: a backquoted name, a ``#`` comment, an ``ML.``
    function, or CREATE/DROP MODEL. Anything else is DuckDB's and runs unchanged."""
    from sqlglot.tokens import TokenType
    from sqlglot.dialects.bigquery import BigQuery
    if "`" in sql or any(line.lstrip().startswith("#") for line in sql.splitlines()):
        return True
    try:
        tokens = BigQuery().tokenize(sql)
    except Exception:   # noqa: BLE001 - not BigQuery's either: DuckDB reports it
        return False
    words = [t.text.upper() for t in tokens if t.token_type != TokenType.STRING]
    pairs = list(zip(words, words[1:]))
    return ("ML", ".") in pairs or any(w == "MODEL" for w in words[:4])


def run(con, statement: str):
    """Run one statement: BigQuery (ML) rewritten into dbml and DuckDB, anything else unchanged.
    Returns DuckDB's result (or a relation over the rows CREATE MODEL's training returned)."""
    if not looks_like_bigquery(statement):
        return con.execute(statement)
    tree = parse(statement)
    if isinstance(tree, exp.Create) and str(tree.args.get("kind", "")).upper() == "MODEL":
        return _create_model(con, tree)
    if isinstance(tree, exp.Drop) and str(tree.args.get("kind", "")).upper() == "MODEL":
        return _drop_model(con, tree)
    if any(tree.find_all(MLFunction, exp.Predict)):
        tree = tree.transform(_predict_node)
        tree = functions.rewrite(con, names.to_duckdb(con, tree))
    else:
        tree = names.to_duckdb(con, tree)
    return con.execute(tree.sql("duckdb"))


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


def _exists(con, name: str) -> bool:
    return con.execute("SELECT count(*) FROM dbml_models WHERE name = ?", [name]).fetchall()[0][0] > 0


def _create_model(con, tree: exp.Create):
    plan = create.plan(con, tree)   # every option checked: nothing trains before this passes
    name = plan["name"]
    if _exists(con, name):
        if tree.args.get("exists"):
            return con.execute("SELECT NULL AS model WHERE false")
        if not tree.args.get("replace"):
            raise InvalidArgument(f"Already exists: model {name}; use CREATE OR REPLACE MODEL to train a new version")
    if plan["trials"]:
        return _trials(con, plan)
    summary = con.execute(create.train_statement(name, plan["source"], plan["args"]).sql("duckdb")).to_arrow_table()
    version = summary.column(0)[0].as_py()["version"]
    store.record(con, name, version, plan["kind"], plan["query"], plan["held_out"], plan["transform"], None)
    return con.from_arrow(summary)


# hyperparameter tuning: trial i takes l2_reg (and, for boosted trees, learn_rate) from these
L2_CANDIDATES = (0.0, 0.01, 0.1, 1.0, 10.0)
LR_CANDIDATES = (0.3, 0.1, 0.03)


def _trials(con, plan: dict):
    """num_trials versions, each with other hyperparameters; the one with the best validation
    metric is the optimal trial (what ML.PREDICT and ML.EVALUATE use)."""
    import json
    name, results = plan["name"], []
    for trial in range(1, plan["trials"] + 1):
        args = dict(plan["args"])
        l2 = L2_CANDIDATES[(trial - 1) % len(L2_CANDIDATES)]
        if args.get("arch") in ("linear", "dnn"):
            args["weight_decay"] = l2
            hp = {"l2_reg": l2}
        else:
            opts = {**json.loads(args.get("options") or "{}"), "l2_reg": l2}
            args["options"] = json.dumps(opts)
            hp = {"l2_reg": l2}
        summary = con.execute(create.train_statement(name, plan["source"], args).sql("duckdb")).fetchall()[0][0]
        results.append((summary, hp, trial))
    best = max(results, key=lambda r: -float("inf") if r[0]["val_metric"] is None else r[0]["val_metric"])
    for summary, hp, trial in results:
        record = {"trial_id": trial, "hyperparameters": hp,
                  "hparam_tuning_evaluation_metrics": {summary.get("val_metric_name", "metric") if False else "val_metric": summary["val_metric"]},
                  "training_loss": summary["final_loss"], "eval_loss": None, "status": "SUCCEEDED",
                  "error_message": None, "is_optimal": trial == best[2]}
        store.record(con, name, summary["version"], plan["kind"], plan["query"], plan["held_out"], plan["transform"], record)
    return con.from_arrow(pa.Table.from_pylist([{"trials": len(results), "optimal_trial_id": best[2]}]))


def _drop_model(con, tree: exp.Drop):
    result = None
    for table in tree.args.get("tables") or [tree.this]:
        name = model_name(table)
        if not _exists(con, name):
            if not tree.args.get("exists"):
                raise InvalidArgument(f"Not found: model {name}")
            result = con.execute("SELECT 0 AS versions_dropped")
            continue
        result = con.execute(exp.select(exp.alias_(exp.func("drop_model", exp.Literal.string(name)),
                                                    "versions_dropped")).sql("duckdb"))
    return result
