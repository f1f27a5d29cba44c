"""The shell's one seam to duckdb-python: run a statement, keep its rows, draw DuckDB's box.

DuckDB's CLI runs a statement once, keeps a query's rows as the last result (``FROM _``),
draws them with DuckDB's box renderer and reads them again for ``.last``. duckdb-python
exposes each step, though below its relation API: ``DuckDBPyRelation.show()`` and
``str(relation)`` are ``RelationResult.to_box`` over a statement's result, a result whose
rows a connection keeps is ``_register_collection``, and a relation reads them.
Going through the relation itself would run a SELECT twice (it is lazy) and caps what
it draws at 10,000 rows ("? rows" in the footer), so the shell takes the same calls the
relation makes, here and nowhere else; a duckdb-python without them fails at start-up
with a message that says so (``check``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import duckdb
from sqlglot import exp

__all__ = ["INTERRUPTED", "Kept", "Outcome", "check", "error_text", "keep", "run", "UNLIMITED"]

UNLIMITED = 2 ** 63 - 1
INTERRUPTED = "Error: interrupted (Ctrl-C); the statement was stopped, nothing of it was stored"


def check(con) -> None:
    """Fail early, with the reason, on a duckdb-python without the calls the shell uses."""
    missing = [name for name in ("_submit", "_register_collection") if not hasattr(con, name)]
    if missing:
        raise RuntimeError(f"the dbml shell needs duckdb-python's relation results ({', '.join(missing)}); "
                           f"duckdb {duckdb.__version__} lacks them: pip install 'duckdb>=2'")


@dataclass
class Outcome:
    """What one statement returned: DuckDB's return type and, for a query, its result."""
    kind: str                 # "query_result" | "changed_rows" | "nothing"
    result: object            # duckdb's RelationResult
    names: list[str]
    types: list

    @property
    def changes(self) -> int | None:
        """The number of changed rows an INSERT, UPDATE or DELETE reports."""
        if self.kind != "changed_rows":
            return None
        rows = self.result.fetchall()
        return int(rows[0][0]) if rows and rows[0] and rows[0][0] is not None else None


_LAST = re.compile(r"(?<![\w$\"])_(?![\w$\"])")


def run(con, sql: str, last: Kept | None = None) -> Outcome:
    """Run one statement; ``last`` is the previous query's rows, which it reads as ``_``. A dbml
    function called with an argument it does not take fails naming it (``dbml.udfs.arguments``);
    an IMPORT DATABASE that brings a dbml catalog replaces the database's empty one."""
    from ..core.home import import_path
    from ..udfs.arguments import arguments_explained
    with arguments_explained(sql):
        if last is not None and _LAST.search(sql):
            result = _with_last(con, sql, last.relation())
        elif import_path(sql) is not None:
            from .. import import_database
            result = import_database(con, sql, con._submit)
        else:
            result = con._submit(sql)
    description = result.description or []
    return Outcome(result.return_type, result, [d[0] for d in description], [d[1] for d in description])


def _with_last(__con, __sql: str, _):
    # DuckDB's replacement scan finds a table named _ among the caller's variables: the
    # last result, as the CLI's own replacement scan for _ reads it
    return __con._submit(__sql)


@dataclass
class Kept:
    """A query's rows, kept on the connection as long as this object lives (``_``, ``.last``)."""
    con: object
    handle: object
    names: list[str]
    types: list

    def select(self, columns: list[exp.Expression] | None = None):
        """A result over the kept rows: ``columns`` are expressions over ``c0``, ``c1``, ...
        (the columns by position), each shown under the statement's own name."""
        return self.con._submit(self.named(columns).sql("duckdb"))

    def named(self, columns: list[exp.Expression] | None = None) -> exp.Select:
        """The query :meth:`select` runs."""
        exprs = columns if columns is not None else [exp.column(f"c{i}") for i in range(len(self.names))]
        outer = [exp.alias_(e, exp.to_identifier(n, quoted=True)) for e, n in zip(exprs, self.names)]
        return exp.select(*outer).from_(self.by_position().subquery())

    def by_position(self) -> exp.Select:
        """The kept rows with their columns named ``c0``, ``c1``, ... (by position)."""
        columns = [exp.alias_(exp.column(n, quoted=True), f"c{i}") for i, n in enumerate(self._own_names())]
        return exp.select(*columns).from_(self.table())

    def table(self) -> exp.Table:
        """The kept rows' table."""
        return exp.table_(exp.to_identifier(self.handle.name, quoted=True))

    def relation(self):
        """The rows as a relation, for ``FROM _``."""
        return self.con.sql(exp.select("*").from_(self.table()).sql("duckdb"))

    def _own_names(self) -> list[str]:
        # a kept result's columns have unique names (DuckDB renames a repeated one)
        names = getattr(self, "_names", None)
        if names is None and len(set(self.names)) == len(self.names):
            names = self._names = list(self.names)
        if names is None:
            result = self.con._submit(exp.select("*").from_(self.table()).limit(0).sql("duckdb"))
            names = self._names = [d[0] for d in result.description]
        return names


def keep(con, outcome: Outcome) -> Kept:
    """Keep a query's rows (the result is used up; read them through the Kept)."""
    return Kept(con, con._register_collection(outcome.result), outcome.names, outcome.types)


def error_text(e: BaseException, no_last_result: bool = False) -> str:
    """What the CLI prints for an error: DuckDB's message as it is."""
    text = str(e) or type(e).__name__
    # Ctrl-C inside a Python UDF (dbml's, e.g. while it first imports torch) comes back wrapped
    in_udf = "while executing the UDF: KeyboardInterrupt" in text
    if isinstance(e, duckdb.InterruptException) or "INTERRUPT" in text[:40].upper() or in_udf:
        return INTERRUPTED
    if no_last_result and isinstance(e, duckdb.CatalogException) and "Table with name _ does not exist" in text:
        return 'Binder Error: Failed to query last result "_": no result available'
    if not isinstance(e, duckdb.Error) and not text.startswith("Error"):
        text = f"Error: {text}"
    return text
