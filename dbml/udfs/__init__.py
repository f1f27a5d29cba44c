"""The SQL surface of dbml: thin UDFs that parse SQL arguments, call dbml, shape results.

``FUNCTIONS`` is the table of them: SQL name, the function in ``functions.py``, parameter
and return types (``types.py``) and how DuckDB calls it. ``register(instance)`` puts them
in one database instance. ``sql/macros.sql`` and the generated ``train`` macro
(``dbml.core.spec.train_macro_sql``) wrap some of them in macros with named parameters.
``SQL_FUNCTIONS`` is the public surface with its help text: the shell's ``.help`` prints
it and a test checks that the README documents every entry.
"""

from __future__ import annotations

import functools
import importlib
import time
from dataclasses import dataclass
from inspect import Parameter, Signature
from typing import TYPE_CHECKING, Callable

import duckdb
from duckdb import sqltypes as t

from ..core import preload
from ..core.jobs import interrupted_since
from ..core.source import refuse_in_sources
from .types import (CALIBRATE_RESULT, DEPLOY_RESULT, PROBABILITIES, EVALUATE_RESULT, EXPLAIN_RESULT, EXPORT_RESULT, PREDICT_INPUT, JOB_ROWS, MEMORY_ROWS, PREDICTOR_ROWS, TRAIN_ARGS,
                    TRAIN_RESULT, TRIAL_ROWS, TUNE_ARGS, sql)

SQL_FUNCTIONS: dict[str, str] = {
    "train": "train(model, source, label := ..., features, arch, epochs, batch_size, lr, optimizer, seed, "
             "validation, folds, split, split_col, hidden, dropout, options, task, weight_decay, l1_reg, momentum, policy, memory_budget, measure_vanilla, "
             "image_size, shape, text, series_scale, early_stop, patience, workers, on_error) -> STRUCT: "
             "train a model on a table or one SELECT under the memory scheduler and store it as the next "
             "version of `model`",
    "tune": "SELECT * FROM tune(model, source, label := ..., space := '<JSON>', trials, parallel, objective, "
            "pruner, sampler, and any train() argument as every trial's fixed value): search hyperparameters "
            "with Optuna, trials packed on the device by the memory scheduler and pruned per epoch; one row per "
            "trial (recorded in dbml_trials); the best is stored as the model's next version",
    "predict": "predict(model, [x1, x2, ...] | image | text) -> DOUBLE: the prediction for raw numeric features "
               "in training order (or an image BLOB, a text, token ids, a series) (regression value, or class "
               "for numeric labels)",
    "predict_label": "predict_label(model, [x1, ...]) -> VARCHAR: the predicted class as text",
    "predict_proba": "predict_proba(model, [x1, ...]) -> MAP(VARCHAR, DOUBLE): each class (as predict_label "
                     "names it) to its probability, in class order; predict_proba(m, x)['yes'] reads one",
    "predictions": "SELECT * FROM predictions(model, source, on_error := 'raise'): every row of a table or "
                   "SELECT plus a `prediction` column; takes the model's features by name (categorical ones "
                   "too); on_error := 'skip': a row whose image or text does not decode gets NULL, named in a warning",
    "explain": "SELECT * FROM explain(model, source): every row of a table or SELECT with `prediction` and "
               "each input column's attribution to it (`attributions`: exact for linear models, TreeSHAP for "
               "trees, integrated gradients for networks), `baseline_value`, `prediction_value`, "
               "`approximation_error`; tabular models",
    "evaluate": "evaluate(model, source, on_error := 'raise') -> STRUCT: accuracy, macro_f1, log_loss "
                "(classification) or rmse, mae, r2 (regression) on a table or SELECT that holds the label; "
                "on_error := 'skip' leaves out rows whose image or text does not decode, naming each; "
                "SELECT * FROM evaluate(model, source) gives one column per metric",
    "deploy": "deploy(model, version := NULL) -> STRUCT(model, version, pinned): pin the version that "
              "predict(model, ...) and every other function serve ('churn' alone; 'churn@2' names version 2 "
              "wherever a model is named); deploy(model) rolls forward to the latest again; dbml_models.deployed "
              "marks the version served",
    "drop_model": "drop_model(model) -> BIGINT: delete every version of a model and its weights; "
                  "returns how many versions were dropped",
    "export_model": "export_model(model, path, version := NULL, overwrite := false) -> STRUCT: write the model "
                    "(its latest version) as an ONNX file with its preprocessing folded in, for onnxruntime or "
                    "DuckDB's ONNX extensions; needs pip install 'dbml[onnx]'",
    "wait_job": "wait_job(job_id) -> STRUCT: block until a training job started with wait := false ends; "
                "its summary (the job's error if it failed or was cancelled)",
    "cancel_job": "cancel_job(job_id) -> VARCHAR: stop a training job at its next iteration boundary; "
                  "nothing of it is stored; returns its status when asked",
    "calibrate": "calibrate(quick := false) -> STRUCT: measure this machine's op latencies and copy bandwidth "
                 "and train the latency predictor the scheduler plans with (as python -m dbml install)",
}

if TYPE_CHECKING:
    from ..core.instance import Instance


class _Deferred:
    """A function of ``functions.py`` named before it is imported: the module is imported
    when DuckDB first calls a UDF (or by ``register`` with ``preload``)."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args):
        return getattr(importlib.import_module(".functions", __package__), self.name)(*args)


class _Functions:
    def __getattr__(self, name: str) -> _Deferred:
        return _Deferred(name)


f = _Functions()

# Internal functions the macros call; not part of the documented surface.
INTERNAL_FUNCTIONS = ("dbml_instance_id", "dbml_export_model", "dbml_train", "dbml_tune", "dbml_wait_job", "dbml_evaluate", "dbml_temp_names",
                      "dbml_predictions_sql", "dbml_explain_sql", "dbml_explain", "dbml_infer", "dbml_infer_blob", "dbml_decode_image", "dbml_infer_text", "dbml_infer_ids", "dbml_infer_numbers", "dbml_job_rows",
                      "dbml_calibrate", "dbml_predictor_rows", "dbml_memory_rows", "dbml_deploy")


@dataclass(frozen=True)
class Function:
    """One UDF. ``arrow``: called once per vector with Arrow arrays, else once per row.

    The one owner of which of dbml's functions have effects, and of what follows:
    ``effects``: it changes something (the database, files, jobs, the calibration) or waits
    for a job; ``runs_sql``: it runs SQL text given as an argument, which a source's checks
    cannot see. A source may call neither (``source.refuse_in_sources``, with the macros that
    call them: ``refused_names``), and a ``con.sql`` relation over a call with effects runs it
    once (``api.has_effects``: ``names_with_effects``). ``volatile``: its result may change
    between calls with the same arguments (DuckDB must not fold or cache it). Both effects and
    volatility make DuckDB treat the call as having side effects; those functions, and
    ``nulls``, see NULL arguments (``null_handling='special'``: a NULL cast to a UNION is a
    non-NULL union)."""
    name: str
    function: Callable
    params: tuple
    returns: duckdb.sqltypes.DuckDBPyType
    effects: bool
    arrow: bool = False
    runs_sql: bool = False
    volatile: bool = False
    nulls: bool = False

    def options(self) -> dict:
        side = self.effects or self.volatile or self.runs_sql
        options = dict(null_handling="special", side_effects=True) if side else \
            dict(null_handling="special") if self.nulls else {}
        return dict(type="arrow", **options) if self.arrow else options


FUNCTIONS = (
    Function("dbml_instance_id", f.instance_id, (), t.VARCHAR, effects=False),
    Function("dbml_train", f.train, TRAIN_ARGS, TRAIN_RESULT, effects=True, arrow=True),
    Function("dbml_tune", f.tune, TUNE_ARGS, TRIAL_ROWS, effects=True),
    Function("dbml_wait_job", f.wait_job, (t.BIGINT, t.BIGINT), TRAIN_RESULT, effects=True),
    Function("cancel_job", f.cancel_job, (t.BIGINT,), t.VARCHAR, effects=True),
    Function("dbml_job_rows", f.job_rows, (), JOB_ROWS, effects=False, volatile=True),
    Function("dbml_memory_rows", f.memory_rows, (t.VARCHAR,), MEMORY_ROWS, effects=False, volatile=True),
    Function("dbml_calibrate", f.calibrate, (t.BOOLEAN, t.VARCHAR, t.INTEGER), CALIBRATE_RESULT, effects=True),
    Function("dbml_predictor_rows", f.predictor_rows, (t.VARCHAR, t.INTEGER), PREDICTOR_ROWS, effects=False,
             volatile=True),
    Function("predict", f.predict, (t.VARCHAR, PREDICT_INPUT), t.DOUBLE, effects=False, arrow=True, nulls=True),
    Function("predict_label", f.predict_label, (t.VARCHAR, PREDICT_INPUT), t.VARCHAR, effects=False, arrow=True,
             nulls=True),
    Function("predict_proba", f.predict_proba, (t.VARCHAR, PREDICT_INPUT), PROBABILITIES, effects=False, arrow=True,
             nulls=True),
    Function("dbml_infer", f.infer, (t.VARCHAR, t.VARCHAR, sql("FLOAT[]"), t.VARCHAR, t.VARCHAR), t.DOUBLE, effects=False, arrow=True, nulls=True),
    # the same for an image, text or sequence model's raw column (dbml.core.inference.INFER_FUNCTIONS); they
    # return NULL for a row skipped under on_error := 'skip' (and for a NULL input), so see NULLs
    Function("dbml_decode_image", f.decode_image, (t.BLOB, t.VARCHAR, t.VARCHAR), t.BLOB, effects=False, arrow=True),
    Function("dbml_infer_blob", f.infer, (t.VARCHAR, t.VARCHAR, t.BLOB, t.VARCHAR, t.VARCHAR), t.DOUBLE, effects=False, arrow=True, nulls=True),
    Function("dbml_infer_text", f.infer, (t.VARCHAR, t.VARCHAR, t.VARCHAR, t.VARCHAR, t.VARCHAR), t.DOUBLE, effects=False, arrow=True, nulls=True),
    Function("dbml_infer_ids", f.infer, (t.VARCHAR, t.VARCHAR, sql("BIGINT[]"), t.VARCHAR, t.VARCHAR), t.DOUBLE, effects=False, arrow=True, nulls=True),
    # DOUBLE[]: a series is read as DOUBLE[] (raw_sql), which DuckDB does not cast to FLOAT[] implicitly
    Function("dbml_infer_numbers", f.infer, (t.VARCHAR, t.VARCHAR, sql("DOUBLE[]"), t.VARCHAR, t.VARCHAR), t.DOUBLE, effects=False,
             arrow=True, nulls=True),
    Function("dbml_evaluate", f.evaluate, (t.VARCHAR, t.VARCHAR, t.VARCHAR, sql("VARCHAR[]"), t.VARCHAR), EVALUATE_RESULT,
             effects=False, runs_sql=True),
    Function("dbml_predictions_sql", f.predictions_sql, (t.VARCHAR, t.VARCHAR, t.VARCHAR, t.VARCHAR), t.VARCHAR,
             effects=False, runs_sql=True),
    Function("dbml_explain", f.explain, (t.VARCHAR, t.VARCHAR, sql("FLOAT[]")), EXPLAIN_RESULT, effects=False,
             arrow=True),
    Function("dbml_explain_sql", f.explain_sql, (t.VARCHAR, t.VARCHAR, t.VARCHAR), t.VARCHAR,
             effects=False, runs_sql=True),
    Function("drop_model", f.drop_model, (t.VARCHAR,), t.BIGINT, effects=True),
    Function("dbml_deploy", f.deploy, (t.VARCHAR, t.INTEGER), DEPLOY_RESULT, effects=True),
    Function("dbml_export_model", f.export_model, (t.VARCHAR, t.VARCHAR, t.INTEGER, t.BOOLEAN), EXPORT_RESULT,
             effects=True),
)


@functools.cache
def macro_definitions() -> dict:
    """What dbml's macros (``sql/macros.sql`` and the generated ``train`` and ``tune``) say:
    ``{"generated": {"train": SQL, "tune": SQL}, "facts": {macro: {"calls", "positional",
    "named", "table"}}}``, read from the tokens of their definitions. It depends only on those
    definitions (and on this module's reading of them, and sqlglot): kept across processes by
    ``dbml.core.startcache`` under their hash, which spares each start the rendering and reading."""
    from importlib import resources
    from pathlib import Path

    import sqlglot

    from ..core import startcache
    from ..core.spec import train_macro_sql
    from ..search.tunespec import tune_macro_sql

    written = resources.files("dbml.sql").joinpath("macros.sql").read_text()
    trees = {"train": train_macro_sql(), "tune": tune_macro_sql()}
    inputs = [written, *map(repr, trees.values()), Path(__file__).read_text(), sqlglot.__version__]
    return startcache.cached("macros", inputs, lambda: _read_definitions(written, trees))


def _read_definitions(written: str, trees: dict) -> dict:
    from sqlglot.dialects import Dialect

    from ..core.sqltext import split_statements

    generated = {name: tree.sql("duckdb") for name, tree in trees.items()}
    definitions: dict[str, list] = {}
    for statement in split_statements(";\n".join([written, *generated.values()])):
        tokens = Dialect.get_or_raise("duckdb").tokenizer_class().tokenize(statement)
        words = [tok.text.lower() for tok in tokens]
        if "macro" in words:
            at = words.index("macro") + 1
            # a name may be both a scalar and a table macro (evaluate): each definition kept
            definitions.setdefault(words[at], []).append(tokens[at + 1:])
    facts = {}
    for name, each in definitions.items():
        positional, named = _parameters(each[0])   # a scalar and a table macro of one name take the same
        facts[name] = {"calls": sorted(_calls(each)), "positional": positional, "named": named,
                       "table": any(map(_is_table, each))}
    return {"generated": generated, "facts": facts}


def _calls(definitions: list) -> set[str]:
    """The names a macro's definitions call (a name followed by a parenthesis)."""
    from sqlglot.tokens import TokenType
    return {tokens[i].text.lower() for tokens in definitions for i in range(len(tokens) - 1)
            if tokens[i + 1].token_type == TokenType.L_PAREN}


def _parameters(tokens) -> tuple[list[str], list[str]]:
    """A definition's parameters: (without a default, in order; ``name := default``)."""
    from sqlglot.tokens import TokenType
    positional, named, depth = [], [], 0
    for i, tok in enumerate(tokens):
        if tok.token_type == TokenType.L_PAREN:
            depth += 1
        elif tok.token_type == TokenType.R_PAREN:
            depth -= 1
            if depth == 0:
                break
        if depth == 1 and i > 0 and tokens[i - 1].token_type in (TokenType.L_PAREN, TokenType.COMMA):
            following = tokens[i + 1].token_type if i + 1 < len(tokens) else None
            (named if following == TokenType.COLON_EQ else positional).append(tok.text.lower())
    return positional, named


def _is_table(tokens) -> bool:
    """``... AS TABLE``: the definition is a table macro."""
    depth = 0
    for i, tok in enumerate(tokens[:-1]):
        depth += 1 if tok.text == "(" else -1 if tok.text == ")" else 0
        if depth == 0 and tok.text.lower() == "as":
            return tokens[i + 1].text.lower() == "table"
    return False


def _macros() -> dict[str, set[str]]:
    """Each of dbml's macros -> the names it calls (in any of its definitions)."""
    return {name: set(fact["calls"]) for name, fact in macro_definitions()["facts"].items()}


def table_macros() -> frozenset[str]:
    """dbml's macros with a table form (``CREATE MACRO name(...) AS TABLE``): those read
    ``SELECT * FROM name(...)``."""
    return frozenset(name for name, fact in macro_definitions()["facts"].items() if fact["table"])


@dataclass(frozen=True)
class MacroSignature:
    """A macro's parameters as its CREATE statement declares them: ``positional`` (no
    default, given in order) and ``named`` (``name := default``, given by name)."""
    positional: tuple[str, ...]
    named: tuple[str, ...]


@functools.cache
def macro_signatures() -> dict[str, MacroSignature]:
    """Each of dbml's macros -> its parameters, read from its definition (the one home of
    what a macro takes: ``sql/macros.sql``, ``spec.train_macro_sql``, ``tunespec.tune_macro_sql``;
    a scalar and a table macro of one name take the same)."""
    return {name: MacroSignature(tuple(fact["positional"]), tuple(fact["named"]))
            for name, fact in macro_definitions()["facts"].items()}


def names_with_effects() -> frozenset[str]:
    """dbml's functions with effects and the macros that call one (``Function.effects``)."""
    direct = {fn.name for fn in FUNCTIONS if fn.effects}
    return frozenset(direct | {m for m, calls in _macros().items() if calls & direct})


def refused_names() -> frozenset[str]:
    """What a source may not call: functions with effects or that run SQL text, and the
    macros that call one."""
    direct = {fn.name for fn in FUNCTIONS if fn.effects or fn.runs_sql}
    return frozenset(direct | {m for m, calls in _macros().items() if calls & direct})


refuse_in_sources(refused_names())


def register(instance: Instance, preload: bool = True) -> None:
    """Register every dbml UDF in a database instance (a ``dbml.core.instance.Instance``).

    UDFs are instance-wide in DuckDB; they are registered through the instance's owner
    connection and take their cursors from it. Their implementation (``functions.py``) is
    imported now with ``preload``, else at the first call of one of them; torch comes later,
    with the first UDF that uses a model or a job that trains one.
    """
    if preload:
        importlib.import_module(".functions", __package__)
    contexts = []

    def context():
        """The instance's ``functions.Context``, made at the first call of any of its UDFs."""
        if not contexts:
            from .functions import Context
            contexts.append(Context(instance))
        return contexts[0]

    for fn in FUNCTIONS:
        instance.owner.create_function(fn.name, _bound(fn, context), list(fn.params), fn.returns, **fn.options())
        instance.functions.append(fn.name)


def _bound(fn: Function, context: Callable) -> Callable:
    """``fn.function`` called with the instance's context first, with one positional parameter
    per SQL argument in its signature: DuckDB counts them there (``functions.train`` takes
    ``*columns``)."""
    function = fn.function

    def bound(*args):
        called = time.perf_counter()
        preload.wait()   # a shell's preload still importing torch: nothing imports beside it
        interrupted_since(called, fn.name)
        return function(context(), *args)
    bound.__signature__ = Signature([Parameter(f"arg{i}", Parameter.POSITIONAL_ONLY) for i in range(len(fn.params))])
    return bound
