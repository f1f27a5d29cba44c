"""dbml — in-database machine learning for DuckDB.

    con = dbml.connect("shop.duckdb")
    con.sql("SELECT train('churn', 'customers', label := 'churned')")

``connect`` opens a DuckDB connection with dbml installed; ``install`` adds dbml to a
connection you already have. Both are idempotent and return a ``Connection``: the DuckDB
connection with every method it has, whose ``cursor()`` (DuckDB's way to use a connection
from another thread) has dbml too.
"""

from __future__ import annotations

import sys
import threading
from importlib import resources

import duckdb
from sqlglot import exp

from .core import home, settings as _settings
from .errors import (CatalogError, DbmlError, Interrupted, InvalidArgument, ModelNotFound, SourceError,
                     TrainingError)
from .api import drop_model, evaluate, list_jobs, predictions, train, tune

__version__ = "0.1.0"
__all__ = ["connect", "install", "execute", "export_model", "train", "tune", "predictions", "evaluate", "drop_model",
           "list_jobs", "Connection", "DbmlError", "InvalidArgument", "SourceError", "ModelNotFound",
           "TrainingError", "CatalogError", "Interrupted", "register_model", "unregister_model"]

# SQL files that write the database: skipped on a read-only one (sql/scratch.sql attaches an
# in-memory database, which DuckDB refuses in read-only mode; only training uses it).
# sql/catalog.sql is run by dbml.core.home, in the catalog's home.
_WRITING_SQL = ("scratch.sql",)


class Connection:
    """A DuckDB connection with dbml installed: every ``duckdb.DuckDBPyConnection`` method
    passes through, and ``cursor()`` returns a ``Connection`` with dbml's macros, views and
    settings (copied from this one) installed. DuckDB's connection type cannot be subclassed
    (it has no constructor), hence the wrapper; ``con.duckdb`` is the DuckDB connection
    itself, for APIs that need one (``duckdb.sql(..., connection=con.duckdb)``)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, instance, settings: dict | None = None):
        self.duckdb = con
        self._instance = instance
        self._read_only = instance.read_only
        self._id = con.execute("SELECT current_connection_id()").fetchall()[0][0]
        self._lock = threading.Lock()        # cursor() from several threads at once
        self._settings = settings if settings is not None else self._read_settings()

    def __getattr__(self, name: str):
        return getattr(self.duckdb, name)

    def sql(self, query, **kwargs):
        """DuckDB's ``sql`` (lazy: a relation runs when displayed or fetched), except that a
        SELECT calling a dbml function with effects (``train``, ``drop_model``, ...) runs at
        most once and keeps its rows (``dbml.api.OnceRelation``): looking at the result of
        ``con.sql("SELECT train(...)")`` again never trains again."""
        from .api import sql
        return sql(self.duckdb, sys._getframe(1), query, **kwargs)

    def execute(self, query, *args, **kwargs):
        """DuckDB's ``execute``; a dbml function called with an argument it does not take
        raises DuckDB's binder error naming that argument and the nearest valid one."""
        from .api import execute
        return execute(self.duckdb, sys._getframe(1), query, *args, **kwargs)

    def cursor(self) -> "Connection":
        """A new connection to the same database (for another thread), with this one's dbml
        settings. Safe to call from several threads at once, and while this connection runs
        a statement in another thread: the settings are then those it had when last idle."""
        cur = self.duckdb.cursor()
        # No wrapper of execute() marks this connection busy: DuckDB finds a query's Python
        # variables (replacement scans) in the frame that calls execute, which must stay the
        # user's (execute and sql run the statement from a frame with the user's variables).
        with self._lock:
            try:
                read = self._read_settings()
                _settings.apply(cur, **read)   # checked: a read racing another call may be garbage
                self._settings = read
            except (duckdb.Error, DbmlError, IndexError):   # busy elsewhere: DuckDB refuses to wait
                pass
            settings = dict(self._settings)
        _settings.apply(cur, **settings)
        _install_sql(cur, self._instance)
        return Connection(cur, self._instance, settings)

    def _read_settings(self) -> dict:
        names = [s.name for s in _settings.SETTINGS]   # one query for all, typed as set
        query = exp.select(*(exp.func("getvariable", exp.Literal.string(_settings.variable(n))) for n in names))
        values = self.duckdb.execute(query.sql("duckdb")).fetchall()[0]
        return {n: v for n, v in zip(names, values) if v is not None}

    def interrupt(self) -> None:
        """Interrupt the statement running on this connection (from another thread), as
        DuckDB's ``interrupt()`` does; a ``train`` it runs cancels its jobs at their next
        iteration boundary, stores nothing and raises ``Interrupted`` within seconds. Jobs
        started with ``wait := false`` by earlier statements run on."""
        self._instance.jobs.interrupt(self._id)
        self.duckdb.interrupt()

    def close(self) -> None:
        """Close the connection; the last one of a database dbml runs jobs on cancels them
        at their next iteration boundary, waits for them and releases the file."""
        from .core.instance import release_user
        release_user(self.duckdb)
        self.duckdb.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<dbml.Connection {self.duckdb!r}>"


def install(con: duckdb.DuckDBPyConnection | Connection, *, preload: bool = True, **settings) -> Connection:
    """Install dbml into ``con``: settings, catalog tables, UDFs and macros (``sql/``, and
    ``train`` generated from ``dbml.core.spec``). Returns ``con`` as a ``Connection``.

    On a database opened read-only the catalog must already exist; ``predict``,
    ``predictions``, ``evaluate`` and the views work, and ``train``, ``drop_model`` and
    ``calibrate`` are refused. ``preload=False`` leaves the UDFs' module (``udfs/functions.py``)
    to be imported at their first call (the shell); by default it is imported here. Neither
    imports torch: it comes with the first statement that needs a model or trains one, so the
    views, job control and train()'s argument checks answer without it."""
    from .core.instance import attach
    from .udfs import register

    con = con.duckdb if isinstance(con, Connection) else con
    _settings.apply(con, **settings)
    if settings.get("cluster", "local") != "local":   # an unreachable cluster fails here, in one line
        from .cluster.placement import connect as connect_cluster
        connect_cluster(settings["cluster"], fn="dbml.connect")

    def first_install(instance) -> None:   # before any other connection finds the instance
        register(instance, preload)
        instance.home = home.settle(con, instance.read_only)
        if not instance.read_only:   # no statement of this process runs a trial yet: any 'running' is a dead one's
            from .search.trials import settle
            settle(con, where=instance.home)
    instance, _ = attach(con, first_install)
    _install_sql(con, instance)
    return Connection(con, instance)


def _install_sql(con: duckdb.DuckDBPyConnection, instance) -> None:
    """Run the catalog's views (``catalog_views.views``, in the catalog's home), ``sql/``, the
    generated ``train`` and ``tune`` macros and the ``dbml_trials`` view
    (``dbml.search.trials.view_sql``) on one connection or cursor: TEMP macros and views are
    per connection, UDFs and the catalog (``home.settle``, at the instance's first install)
    per database."""
    from .core.catalog_views import views
    from .search.trials import view_sql
    from .udfs import macro_definitions

    for view in views(con, instance.home):   # before sql/: dbml_epochs reads dbml_models
        con.execute(view.sql("duckdb"))
    for sql in sorted(resources.files("dbml.sql").iterdir(), key=lambda p: p.name):
        if sql.name.endswith(".sql") and sql.name != "catalog.sql" and not (instance.read_only and sql.name in _WRITING_SQL):
            con.execute(sql.read_text())
    for generated in macro_definitions()["generated"].values():   # train and tune, rendered once (startcache)
        con.execute(generated)
    con.execute(view_sql(con, instance.home).sql("duckdb"))


def import_database(con, sql: str, run):
    """Run ``sql``, an ``IMPORT DATABASE`` statement (``home.import_path``), by ``run(sql)``:
    the export's dbml catalog becomes the database's (``home.import_database``), and ``con``'s
    views read it. dbml's statement paths (the shell, ``Connection.sql``, ``dbml.execute``)
    send IMPORT DATABASE here; DuckDB's own ``execute`` does not."""
    result, instance = home.import_database(con, sql, run)
    _install_sql(con, instance)
    return result


def __getattr__(name: str):
    if name == "plot":   # dbml.plot.history(...) without importing dbml.plot first (matplotlib is an extra)
        import importlib
        return importlib.import_module(".plot", __name__)
    if name in ("register_model", "unregister_model"):   # the zoo imports torch: on first use
        from . import zoo
        return getattr(zoo, name)
    raise AttributeError(f"module 'dbml' has no attribute {name!r}")


def execute(con, text: str):
    """Run a script of SQL statements on ``con``: BigQuery ML statements (``CREATE MODEL``,
    ``ML.PREDICT``, ``ML.EVALUATE``, ``ML.TRAINING_INFO``, ``DROP MODEL``) rewritten into
    dbml calls, any other SQL unchanged. Returns the last statement's result (fetch its
    rows with ``.fetchall()``; None for an empty script)."""
    from .bigquery import execute as run
    return run(con, text)


def export_model(con, model: str, path: str, version: int | None = None, overwrite: bool = False) -> dict:
    """Write ``model`` (its latest version, or ``version``) as an ONNX file at ``path``, with
    its preprocessing folded in (``dbml/export.py`` says what the file takes and returns);
    as SQL's ``export_model``. Needs ``pip install 'dbml[onnx]'``."""
    from .export import export_model as export
    cur = (con.duckdb if isinstance(con, Connection) else con).cursor()
    try:
        return export(cur, model, path, version, overwrite)
    finally:
        cur.close()


def no_duckdb_progress_bar(con: duckdb.DuckDBPyConnection) -> None:
    """DuckDB's own progress bar off on a dbml connection (dbml.connect, the shell): a train()
    is one row to DuckDB, whose bar would stand at 0 % beside dbml's line."""
    try:
        con.execute("SET enable_progress_bar = false")
    except duckdb.InvalidInputException:
        pass   # in Jupyter without ipywidgets DuckDB refuses the setting, and draws no bar there


def connect(database: str = ":memory:", read_only: bool = False, **settings) -> Connection:
    """A DuckDB connection to ``database`` with dbml installed; ``settings`` as in dbml.core.settings.
    If installing fails, the connection is closed (the file released) before the error is raised.
    DuckDB's own progress bar is off (``SET enable_progress_bar = true`` brings it back): a
    ``train()`` is one row to DuckDB, whose bar stood at 0 % beside dbml's progress line and
    then printed 100 % to standard output even with ``progress='off'``, as the shell's does."""
    con = duckdb.connect(database, read_only=read_only)
    try:
        no_duckdb_progress_bar(con)
        return install(con, **settings)
    except BaseException:
        from .core.instance import release_user
        release_user(con)
        con.close()
        raise
