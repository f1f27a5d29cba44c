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

import sqlglot
from sqlglot import exp
from sqlglot.dialects.bigquery import BigQuery
from sqlglot.errors import ParseError
from sqlglot.tokens import TokenType

from .errors import InvalidArgument
from .sqltext import split_statements

__all__ = ["OPTIONS", "MODEL_TYPES", "translate", "execute", "is_bigquery_ml"]


class MLEvaluate(exp.Expression, exp.Func):
    arg_types = {"this": True, "expression": False, "params_struct": False}


class MLTrainingInfo(exp.Expression, exp.Func):
    arg_types = {"this": True, "expression": False, "params_struct": False}


class _Dialect(BigQuery):
    class Parser(BigQuery.Parser):
        FUNCTION_PARSERS = {**BigQuery.Parser.FUNCTION_PARSERS,
                            "EVALUATE": lambda self: self._parse_model_function(MLEvaluate),
                            "TRAINING_INFO": lambda self: self._parse_model_function(MLTrainingInfo)}

        def _parse_model_function(self, cls):
            """``MODEL name [, (SELECT ...) | TABLE t]``: the input is optional."""
            self._match_text_seq("MODEL")
            this = self._parse_table_parts()
            expression = None
            if self._match(TokenType.COMMA):
                expression = self._parse_table_parts() if self._match_text_seq("TABLE") else self._parse_table()
            return self.expression(cls(this=this, expression=expression))


# model_type -> (dbml arch, task)
MODEL_TYPES = {"dnn_classifier": ("mlp", "classification"), "dnn_regressor": ("mlp", "regression"),
               "logistic_reg": ("linear", "classification"), "linear_reg": ("linear", "regression")}
# BigQuery option -> (dbml argument, what it means there)
OPTIONS = {
    "model_type": ("arch, task", "dnn_classifier, dnn_regressor, logistic_reg, linear_reg (MODEL_TYPES)"),
    "input_label_cols": ("label", "one column"),
    "max_iterations": ("epochs", "passes over the data"),
    "learn_rate": ("lr", "the optimizer's learning rate"),
    "batch_size": ("batch_size", "rows per step"),
    "hidden_units": ("hidden", "widths of the hidden layers"),
    "dropout": ("dropout", "dropout probability"),
    "optimizer": ("optimizer", "adam, sgd or adamw"),
    "l2_reg": ("weight_decay", "L2 penalty"),
    "data_split_method": ("validation", "'auto_split' or 'random' (with data_split_eval_fraction), 'no_split'"),
    "data_split_eval_fraction": ("validation", "fraction held out for validation"),
}
_PLAIN = {"max_iterations": "epochs", "learn_rate": "lr", "batch_size": "batch_size", "hidden_units": "hidden",
          "dropout": "dropout", "l2_reg": "weight_decay"}


def is_bigquery_ml(sql: str) -> bool:
    """Whether ``sql`` looks like BigQuery ML (cheap: before any parsing)."""
    upper = " ".join(sql.upper().split())
    return " MODEL " in f" {upper} " and upper.startswith(("CREATE ", "DROP ")) or "ML." in upper


def translate(con, statement: str) -> list[str] | None:
    """The DuckDB/dbml statements that carry out one BigQuery ML ``statement``, or None
    when it is not BigQuery ML (run it unchanged). ``con`` is read for the model's label
    (``predicted_<label>``)."""
    if not is_bigquery_ml(statement):
        return None
    try:
        tree = sqlglot.parse_one(statement, read=_Dialect)
    except ParseError:
        return None   # not BigQuery ML after all (DuckDB reports what is wrong with it)
    if isinstance(tree, exp.Create) and str(tree.args.get("kind", "")).upper() == "MODEL":
        return _create_model(tree)
    if isinstance(tree, exp.Drop) and str(tree.args.get("kind", "")).upper() == "MODEL":
        return _drop_model(tree)
    if isinstance(tree, exp.Query) and any(tree.find_all(exp.Predict, MLEvaluate, MLTrainingInfo)):
        return [_rewrite_query(con, tree)]
    return None


def execute(con, text: str):
    """Run a script of statements, BigQuery ML ones rewritten into dbml calls and any other
    SQL unchanged; the last statement's result (a DuckDB result whose rows can be fetched)."""
    result = None
    for statement in split_statements(text):
        for sql in translate(con, statement) or [statement]:
            result = con.execute(sql)
    return result


# -- CREATE MODEL and DROP MODEL ---------------------------------------------------------

def _model_name(table: exp.Expression) -> str:
    return table.name if isinstance(table, exp.Table) else table.sql(dialect="duckdb")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _exists(name: str) -> str:
    return f"SELECT 1 FROM dbml_models WHERE name = {_quote(name)}"


def _create_model(tree: exp.Create) -> list[str]:
    name = _model_name(tree.this)
    query = tree.expression
    if query is None:
        raise InvalidArgument(f"CREATE MODEL {name}: needs AS SELECT ... (the training data); dbml trains "
                              f"only from a query")
    args = _train_arguments(name, tree.args.get("properties"))
    source = query.sql(dialect="duckdb")
    train = f"SELECT train({_quote(name)}, {_quote(source)}{''.join(f', {k} := {v}' for k, v in args.items())})"
    if tree.args.get("exists"):          # IF NOT EXISTS: an existing model is left as it is
        return [f"{train} WHERE NOT EXISTS ({_exists(name)})"]
    if tree.args.get("replace"):
        return [train]
    return [f"SELECT error({_quote(f'Already exists: model {name}; use CREATE OR REPLACE MODEL to train a new version')}) "
            f"FROM ({_exists(name)}) LIMIT 1", train]


def _drop_model(tree: exp.Drop) -> list[str]:
    names = [_model_name(t) for t in tree.args.get("tables") or [tree.this]]
    out = []
    for name in names:
        if not tree.args.get("exists"):
            out.append(f"SELECT error({_quote(f'Not found: model {name}')}) WHERE NOT EXISTS ({_exists(name)})")
        out.append(f"SELECT drop_model({_quote(name)}) AS versions_dropped WHERE EXISTS ({_exists(name)})")
    return out


def _literal(value: exp.Expression, option: str):
    if isinstance(value, exp.Array):
        return [_literal(v, option) for v in value.expressions]
    if isinstance(value, exp.Boolean):
        return bool(value.this)
    if isinstance(value, exp.Neg):
        return -_literal(value.this, option)
    if isinstance(value, exp.Literal):
        if value.is_string:
            return value.this
        number = float(value.this)
        return int(number) if number.is_integer() and "." not in value.this else number
    raise InvalidArgument(f"CREATE MODEL: option {option} must be a constant, got {value.sql(dialect='bigquery')}")


def _sql_value(v) -> str:
    if isinstance(v, str):
        return _quote(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(_sql_value(x) for x in v) + "]"
    return repr(v)


def _train_arguments(name: str, properties) -> dict[str, str]:
    given = {p.name.lower(): _literal(p.args["value"], p.name)
             for p in (properties.expressions if properties is not None else [])}
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise InvalidArgument(f"CREATE MODEL {name}: option {unknown[0]} is not supported by dbml; supported "
                              f"options are {', '.join(OPTIONS)} (the README's BigQuery ML table maps each)")
    labels = given.get("input_label_cols")
    if not isinstance(labels, list) or len(labels) != 1 or not isinstance(labels[0], str):
        raise InvalidArgument(f"CREATE MODEL {name}: needs input_label_cols = ['<label column>'] (one column), "
                              f"got {labels!r}")
    args = {"label": labels[0]}
    if "model_type" in given:
        kind = str(given["model_type"]).lower()
        if kind not in MODEL_TYPES:
            raise InvalidArgument(f"CREATE MODEL {name}: model_type {given['model_type']!r} is not supported; "
                                  f"use one of {', '.join(MODEL_TYPES)}")
        args["arch"], args["task"] = MODEL_TYPES[kind]
    args.update({_PLAIN[k]: v for k, v in given.items() if k in _PLAIN})
    if "hidden" in args and not isinstance(args["hidden"], list):
        args["hidden"] = [args["hidden"]]
    if "optimizer" in given:
        args["optimizer"] = str(given["optimizer"]).lower()
    args.update(_validation(name, given))
    return {k: _sql_value(v) for k, v in args.items()}


def _validation(name: str, given: dict) -> dict:
    method = str(given.get("data_split_method", "auto_split")).lower()
    if method == "no_split":
        return {"validation": 0.0}
    if method not in ("auto_split", "random"):
        raise InvalidArgument(f"CREATE MODEL {name}: data_split_method {given['data_split_method']!r} is not "
                              f"supported; use 'auto_split', 'random' or 'no_split'")
    fraction = given.get("data_split_eval_fraction")
    return {} if fraction is None else {"validation": fraction}


# -- ML.PREDICT, ML.EVALUATE, ML.TRAINING_INFO --------------------------------------------

def _source(arg) -> str:
    """The input of an ML function as dbml's source argument: a table name or a SELECT."""
    if arg is None:
        return ""
    if isinstance(arg, exp.Subquery):
        return arg.this.sql(dialect="duckdb")
    return arg.sql(dialect="duckdb")


def _label(con, name: str) -> str:
    rows = con.execute("SELECT label FROM dbml_models WHERE name = ? ORDER BY version DESC LIMIT 1",
                       [name]).fetchall()
    if not rows:
        raise InvalidArgument(f"ML.PREDICT: no model named {name!r}; SELECT name FROM dbml_models lists them")
    return rows[0][0]


def _replacement(con, fn: exp.Expression) -> str:
    name = _model_name(fn.this)
    source = _source(fn.args.get("expression"))
    if isinstance(fn, exp.Predict):
        if not source:
            raise InvalidArgument(f"ML.PREDICT(MODEL {name}, ...): needs the rows to predict, "
                                  f"a (SELECT ...) or TABLE t")
        column = exp.to_identifier(f"predicted_{_label(con, name)}", quoted=True).sql("duckdb")   # never code
        return (f"SELECT * EXCLUDE (prediction), prediction AS {column} "
                f"FROM predictions({_quote(name)}, {_quote(source)})")
    if isinstance(fn, MLEvaluate):
        if source:
            return f"SELECT e.* FROM (SELECT evaluate({_quote(name)}, {_quote(source)}) AS e)"
        return (f"SELECT metrics->>'val_metric_name' AS metric, (metrics->>'val_metric')::DOUBLE AS value "
                f"FROM dbml_models WHERE name = {_quote(name)} ORDER BY version DESC LIMIT 1")
    return (f"SELECT epoch AS iteration, loss, seconds * 1000 AS duration_ms, data_wait_seconds "
            f"FROM dbml_epochs WHERE model = {_quote(name)} AND version = "
            f"(SELECT max(version) FROM dbml_models WHERE name = {_quote(name)}) ORDER BY epoch")


def _rewrite_query(con, tree: exp.Query) -> str:
    """The query with each ML function's table replaced by the dbml query behind it."""
    for fn in list(tree.find_all(exp.Predict, MLEvaluate, MLTrainingInfo)):
        table = fn.parent if isinstance(fn.parent, exp.Table) else fn
        alias = table.alias if isinstance(table, exp.Table) and table.alias else "ml"
        sub = sqlglot.parse_one(_replacement(con, fn), read="duckdb")
        table.replace(exp.Subquery(this=sub, alias=exp.TableAlias(this=exp.to_identifier(alias))))
    return tree.sql(dialect="duckdb")
