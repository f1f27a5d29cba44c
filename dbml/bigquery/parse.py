"""BigQuery ML's statements as sqlglot trees: the BigQuery dialect, extended where it stops.

sqlglot parses ``CREATE MODEL ... TRANSFORM(...) OPTIONS(...) AS ...`` and ``ML.PREDICT``;
every other model function (``ML.EVALUATE``, ``ML.EXPLAIN_PREDICT``, ``ML.ROC_CURVE``, ...)
is parsed here into one node, :class:`MLFunction`: the model, then its arguments (a
``(SELECT ...)``, ``TABLE t``, a ``STRUCT(...)`` of settings, an array of thresholds).
"""

from __future__ import annotations

import math

import sqlglot
from sqlglot import exp
from sqlglot.dialects.bigquery import BigQuery
from sqlglot.errors import ParseError
from sqlglot.tokens import TokenType

from ..errors import InvalidArgument

# the model functions dbml runs (dbml/bigquery/functions.py); others are named in the error
MODEL_FUNCTIONS = ("PREDICT", "EVALUATE", "TRAINING_INFO", "CONFUSION_MATRIX", "ROC_CURVE", "FEATURE_INFO",
                   "WEIGHTS", "EXPLAIN_PREDICT", "GLOBAL_EXPLAIN", "FEATURE_IMPORTANCE", "TRIAL_INFO",
                   "CENTROIDS")
NOT_SUPPORTED = ("FORECAST", "EXPLAIN_FORECAST", "ARIMA_EVALUATE", "ARIMA_COEFFICIENTS", "DETECT_ANOMALIES",
                 "RECOMMEND", "GENERATE_TEXT", "GENERATE_EMBEDDING", "PRINCIPAL_COMPONENTS",
                 "PRINCIPAL_COMPONENT_INFO", "RECONSTRUCTION_LOSS", "ADVANCED_WEIGHTS", "ARIMA_EVALUATE",
                 "HOLIDAY_INFO", "UNDERSTAND_TEXT", "TRANSLATE", "PROCESS_DOCUMENT", "TRANSCRIBE",
                 "ANNOTATE_IMAGE", "GET_INSIGHTS", "VALIDATE_DATA_DRIFT", "VALIDATE_DATA_SKEW", "TFDV_DESCRIBE",
                 "TFDV_VALIDATE", "DESCRIBE_DATA", "EXPLAIN_PREDICT_TEXT", "GENERATE_TABLE")


class MLFunction(exp.Expression, exp.Func):
    """``ML.<name>(MODEL m[, arg, ...])``: ``this`` the model's name (a Table), ``expressions``
    the arguments after it."""
    arg_types = {"this": True, "name": True, "expressions": False}


class _Dialect(BigQuery):
    class Parser(BigQuery.Parser):
        FUNCTION_PARSERS = {**BigQuery.Parser.FUNCTION_PARSERS,
                            **{name: (lambda n: lambda self: self._parse_model_function(n))(name)
                               for name in MODEL_FUNCTIONS + NOT_SUPPORTED}}

        def _parse_model_function(self, name: str):
            if not self._match_text_seq("MODEL"):
                self.raise_error(f"ML.{name} takes MODEL <name> first")
            model = self._parse_table_parts()
            args = []
            while self._match(TokenType.COMMA):
                if self._match_text_seq("TABLE"):
                    args.append(self._parse_table_parts())
                elif self._curr.token_type == TokenType.L_PAREN and self._next and \
                        self._next.token_type in (TokenType.SELECT, TokenType.WITH, TokenType.L_PAREN):
                    args.append(self._parse_table())
                else:
                    args.append(self._parse_assignment())
            return self.expression(MLFunction(this=model, name=exp.Literal.string(name), expressions=args))


def parse(statement: str) -> exp.Expression:
    """One BigQuery statement as a tree; a statement sqlglot cannot read is an error naming
    BigQuery ML and sqlglot's reason."""
    try:
        return sqlglot.parse_one(statement, read=_Dialect)
    except ParseError as e:
        first = str(e).splitlines()[0]
        raise InvalidArgument(f"BigQuery ML: cannot read this statement ({first}); dbml reads the GoogleSQL "
                              f"of BigQuery ML's CREATE MODEL, DROP MODEL and ML.* functions") from None


def function_name(node: MLFunction) -> str:
    return node.args["name"].this


# the model functions' settings dbml reads: name -> (what it must be, the check, an example)
SETTINGS = {
    "threshold": ("a number in [0, 1]", lambda v: _number(v) and 0 <= v <= 1, "0.5 AS threshold"),
    "top_k_features": ("a whole number of at least 1", lambda v: _whole(v) and v >= 1, "5 AS top_k_features"),
    "class_level_explain": ("TRUE or FALSE", lambda v: isinstance(v, bool), "TRUE AS class_level_explain"),
    "standardize": ("TRUE or FALSE", lambda v: isinstance(v, bool), "TRUE AS standardize"),
}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def count(value, what: str, low: int, high: int) -> int:
    """A whole-number argument that sizes work (buckets, thresholds, trials), within
    [low, high] before any work starts; InvalidArgument naming it otherwise."""
    if not _whole(value) or not low <= value <= high:
        raise InvalidArgument(f"BigQuery ML: {what} must be a whole number from {low} to {high}, got {value!r}")
    return value


def settings(node: exp.Expression | None, fn: str) -> dict:
    """``STRUCT(0.55 AS threshold, ...)`` as {name: value}; constants only, each setting dbml
    reads checked (``SETTINGS``)."""
    if node is None:
        return {}
    if not isinstance(node, exp.Struct):
        raise InvalidArgument(f"BigQuery ML: {fn} takes its settings as STRUCT(<value> AS <name>, ...), "
                              f"got {node.sql('bigquery')[:80]}")
    out = {}
    for item in node.expressions:
        if not isinstance(item, exp.PropertyEQ):
            raise InvalidArgument(f"BigQuery ML: {fn}: each setting is <value> AS <name>, got {item.sql('bigquery')[:80]}")
        out[item.name.lower()] = constant(item.expression, f"{fn} setting {item.name}")
    for name, value in out.items():
        rule = SETTINGS.get(name)
        if rule is not None and value is not None and not rule[1](value):
            raise InvalidArgument(f"BigQuery ML: {fn}: setting {name} must be {rule[0]}, got {value!r}; "
                                  f"pass e.g. STRUCT({rule[2]})")
    return out


def constant(value: exp.Expression, what: str):
    """A literal (number, string, boolean, NULL, an array or an unnamed STRUCT of them) as a Python
    value (a STRUCT as a tuple)."""
    if isinstance(value, exp.Array):
        return [constant(v, what) for v in value.expressions]
    if isinstance(value, exp.Struct) and not any(isinstance(e, exp.PropertyEQ) for e in value.expressions):
        return tuple(constant(v, what) for v in value.expressions)   # STRUCT('a', 0.2): its fields in order
    if isinstance(value, exp.Boolean):
        return bool(value.this)
    if isinstance(value, exp.Null):
        return None
    if isinstance(value, exp.Neg):
        return -constant(value.this, what)
    if isinstance(value, exp.Paren):
        return constant(value.this, what)
    if isinstance(value, exp.Literal):
        if value.is_string:
            return value.this
        number = float(value.this)
        if not math.isfinite(number):
            raise InvalidArgument(f"BigQuery ML: {what} must be a finite number, got {value.this[:40]}")
        return int(number) if number.is_integer() and "." not in value.this and "e" not in value.this.lower() else number
    raise InvalidArgument(f"BigQuery ML: {what} must be a constant, got {value.sql(dialect='bigquery')[:80]}")
