"""dbml from Python: the SQL functions as Python functions, and relations that train once.

``dbml.train(con, 'churn', 'customers', label='churned', epochs=5)`` runs the SQL
``train`` with the same arguments and returns its summary (a dict); ``predictions``,
``evaluate``, ``drop_model`` and ``list_jobs`` (the dbml_jobs view) mirror theirs. They are built on the SQL surface
(arguments bound as parameters), so both behave alike.

DuckDB's ``con.sql(...)`` is lazy: the relation runs each time it is displayed, fetched or
converted. For ``SELECT train(...)`` that trained a new version at every look. A dbml
``Connection``'s ``sql`` returns a :class:`OnceRelation` for a query that calls a dbml
function with effects (``train``, ``drop_model``, ``calibrate``, ``cancel_job``,
``export_model``, ``wait_job``): still lazy, but it runs at most once and keeps its rows.
"""

from __future__ import annotations

import functools
import importlib.util
from types import FrameType

import duckdb
from sqlglot import exp

from .errors import InvalidArgument

__all__ = ["train", "tune", "predictions", "evaluate", "drop_model", "list_jobs", "OnceRelation", "has_effects"]

def has_effects(query: str) -> bool:
    """Whether ``query`` calls one of dbml's functions with effects (``dbml.udfs.FUNCTIONS``
    says which, and which macros call them), read with the SQL tokenizer: a name inside a
    string or a comment is no call."""
    from sqlglot.dialects import Dialect
    from sqlglot.errors import TokenError
    from sqlglot.tokens import TokenType

    from .udfs import names_with_effects

    try:
        tokens = Dialect.get_or_raise("duckdb").tokenizer_class().tokenize(query)
    except TokenError:
        return False          # DuckDB reports what is wrong with it
    effects = names_with_effects()
    return any(a.token_type != TokenType.STRING and a.text.lower() in effects and b.token_type == TokenType.L_PAREN
               for a, b in zip(tokens, tokens[1:]))


def require_pandas(what: str) -> None:
    if importlib.util.find_spec("pandas") is None:
        raise InvalidArgument(f"{what} needs pandas, which is not installed; pip install 'dbml[notebook]' "
                              f"(or fetch Arrow instead: .to_arrow_table(), or rows: .fetchall())")


class OnceRelation:
    """A relation over a statement with effects that runs it at most once, at first use,
    and keeps its rows (an Arrow table behind a DuckDB relation). Every relation method
    works; ``df()`` checks for pandas before the statement runs.

    What a person reads shows a result of one STRUCT column (``SELECT train(...)``'s
    summary) as the STRUCT's fields, one column each, as the shell does: its display in a
    notebook or a print, and ``df()``. The rows fetched (``fetchall``, Arrow) stay the
    STRUCT that SQL returns."""

    def __init__(self, con: duckdb.DuckDBPyConnection, query: str, kwargs: dict):
        self._con, self._query, self._kwargs = con, query, kwargs
        self._rel: duckdb.DuckDBPyRelation | None = None
        self._fields: duckdb.DuckDBPyRelation | None = None

    def _relation(self) -> duckdb.DuckDBPyRelation:
        if self._rel is None:
            from .udfs.arguments import arguments_explained
            with arguments_explained(self._query):
                table = self._con.sql(self._query, **self._kwargs).to_arrow_table()   # the one run
            self._rel = self._con.from_arrow(table)
            import pyarrow as pa   # not at import: `import dbml` stays light (the shell's start-up)
            column = table.column(0) if table.num_columns == 1 else None
            if column is not None and pa.types.is_struct(column.type):
                self._fields = self._con.from_arrow(pa.Table.from_arrays(
                    column.combine_chunks().flatten(), names=[f.name for f in column.type]))
        return self._rel

    def _shown(self) -> duckdb.DuckDBPyRelation:
        rel = self._relation()
        return self._fields if self._fields is not None else rel

    def df(self, *args, **kwargs):
        require_pandas("df()")
        return self._shown().df(*args, **kwargs)

    fetchdf = to_df = df

    def __getattr__(self, name: str):
        return getattr(self._relation(), name)

    def __len__(self) -> int:
        return len(self._relation())

    def __repr__(self) -> str:
        return repr(self._shown())

    def __str__(self) -> str:
        return str(self._shown())


def sql(con: duckdb.DuckDBPyConnection, frame: FrameType, query, **kwargs):
    """``con.sql`` for a dbml Connection, called from ``frame``: a :class:`OnceRelation` for a
    SELECT with effects; a dbml function's misspelt argument named (``udfs.arguments``); an
    IMPORT DATABASE that brings a dbml catalog replaces the database's empty one."""
    if isinstance(query, str) and _imports(query):
        from . import import_database
        return import_database(con, query, lambda q: as_caller(frame, con.sql, q, **kwargs))
    if isinstance(query, str) and has_effects(query):
        try:
            statements = duckdb.extract_statements(query)
        except duckdb.Error:
            statements = []
        if len(statements) == 1 and statements[0].type == duckdb.StatementType.SELECT:
            return OnceRelation(con, query, kwargs)
    from .udfs.arguments import arguments_explained
    with arguments_explained(query):
        return as_caller(frame, con.sql, query, **kwargs)


def execute(con: duckdb.DuckDBPyConnection, frame: FrameType, query, *args, **kwargs):
    """``con.execute`` for a dbml Connection, called from ``frame``; a dbml function's misspelt
    argument named (``udfs.arguments``); an IMPORT DATABASE as in ``sql``."""
    if isinstance(query, str) and _imports(query):
        from . import import_database
        return import_database(con, query, lambda q: as_caller(frame, con.execute, q, *args, **kwargs))
    from .udfs.arguments import arguments_explained
    with arguments_explained(query):
        return as_caller(frame, con.execute, query, *args, **kwargs)


def _imports(query: str) -> bool:
    """Whether ``query`` is an IMPORT DATABASE (``home.import_path``)."""
    from .core.home import import_path
    return import_path(query) is not None


def as_caller(frame: FrameType, call, *args, **kwargs):
    """``call(*args, **kwargs)`` run from a frame with the variables of ``frame`` (the user's):
    DuckDB's replacement scans find a table's name among the variables of the Python frame
    that runs the statement (``python_scan_all_frames`` is off), which a wrapper's would hide.
    ``functools.partial`` adds no Python frame of its own."""
    scope = {**frame.f_locals, "__dbml_call__": functools.partial(call, *args, **kwargs)}
    return eval("__dbml_call__()", frame.f_globals, scope)   # noqa: S307 - a fixed expression


# -- the SQL functions from Python ------------------------------------------------------

def _train_params() -> list[str]:
    from .core.spec import TRAIN_PARAMS
    return [p.name for p in TRAIN_PARAMS]


def _nearest(name: str, known: list[str]) -> str:
    """`` (did you mean 'label'?)`` where a known name is close (as the SQL functions' errors say it)."""
    from .udfs.arguments import nearest
    guess = nearest(name, known)
    return f" (did you mean {guess!r}?)" if guess else ""


def _call(fn: str, arguments: dict) -> exp.Anonymous:
    """``fn(?, ?, name := ?, ...)``: the model, the source and ``arguments`` by name, bound."""
    named = (exp.PropertyEQ(this=exp.to_identifier(k), expression=exp.Placeholder()) for k in arguments)
    return exp.Anonymous(this=fn, expressions=[exp.Placeholder(), exp.Placeholder(), *named])


def train(con, model: str, source: str, **arguments) -> dict:
    """``SELECT train(model, source, name := value, ...)``: trains (waiting for the job) and
    returns its summary. Arguments are train()'s, by name (``label='y'``, ``epochs=5``)."""
    names = _train_params()
    unknown = sorted(set(arguments) - set(names[2:]))
    if unknown:
        raise InvalidArgument(f"dbml.train(): unknown argument {unknown[0]!r}{_nearest(unknown[0], names[2:])}; "
                              f"train() takes {', '.join(names[2:])}")
    row = con.execute(exp.select(_call("train", arguments)).sql("duckdb"),
                      [model, source, *arguments.values()]).fetchall()
    return row[0][0]


def tune(con, model: str, source: str, **arguments) -> list[dict]:
    """``SELECT * FROM tune(model, source, name := value, ...)``: runs the search and returns
    one dict per trial it ran. Arguments are tune()'s by name (``space`` may be a dict:
    ``space={"lr": {"log_uniform": [1e-4, 0.1]}}``, ``trials=20``, ``label='y'``, ...)."""
    import json

    from .search.tunespec import TUNE_PARAMS
    names = [p.name for p in TUNE_PARAMS][2:]
    unknown = sorted(set(arguments) - set(names))
    if unknown:
        raise InvalidArgument(f"dbml.tune(): unknown argument {unknown[0]!r}{_nearest(unknown[0], names)}; "
                              f"tune() takes {', '.join(names)}")
    if isinstance(arguments.get("space"), dict):
        arguments["space"] = json.dumps(arguments["space"])
    cur = con.execute(exp.select("*").from_(exp.Table(this=_call("tune", arguments))).sql("duckdb"),
                      [model, source, *arguments.values()])
    columns = [d[0] for d in cur.description]
    return [dict(zip(columns, row)) for row in cur.fetchall()]


def predictions(con, model: str, source: str, on_error: str = "raise"):
    """Every row of ``source`` (a table or a SELECT) with the model's ``prediction``, as an
    Arrow table (``.to_pandas()`` with pandas); ``on_error='skip'``: a row whose image or
    text does not decode gets NULL, named in a ``dbml.errors.RowSkipped`` warning."""
    return con.sql("SELECT * FROM predictions(?, ?, on_error := ?)", params=[model, source, on_error]).to_arrow_table()


def evaluate(con, model: str, source: str, on_error: str = "raise") -> dict:
    """The model's metrics on ``source`` (a table or a SELECT holding the label);
    ``on_error='skip'``: rows whose image or text does not decode are left out, each named in a warning."""
    return con.execute("SELECT evaluate(?, ?, on_error := ?)", [model, source, on_error]).fetchall()[0][0]


def drop_model(con, model: str) -> int:
    """Drop every version of ``model``; how many there were."""
    return con.execute("SELECT drop_model(?)", [model]).fetchall()[0][0]


def list_jobs(con) -> list[dict]:
    """The training jobs of this process (the ``dbml_jobs`` view), one dict per job."""
    cur = con.execute("SELECT * FROM dbml_jobs ORDER BY job_id")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]
