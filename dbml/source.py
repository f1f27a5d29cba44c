"""Training and evaluation sources: a table name or exactly one SELECT.

A source is parsed with sqlglot and rebuilt from its syntax tree, so what reaches DuckDB
is always a single read-only query; its columns and types come from DuckDB itself.

>>> as_select("customers", fn="train")
'SELECT * FROM "customers"'
>>> as_select("SELECT a FROM t WHERE split = 'train'", fn="train")
"SELECT a FROM t WHERE split = 'train'"
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import sqlglot
from sqlglot import exp

from .errors import InvalidArgument, SourceError

NUMERIC_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
                 "UINTEGER", "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL")
INTEGER_TYPES = NUMERIC_TYPES[:10]
CATEGORICAL_TYPES = ("VARCHAR", "BOOLEAN", "ENUM")


def quote(name: str) -> str:
    """A column or table name as a quoted DuckDB identifier."""
    return exp.to_identifier(name, quoted=True).sql("duckdb")


def literal(value) -> str:
    """A Python str / number / bool as a SQL literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(float(value)) if isinstance(value, float) else str(value)
    return exp.Literal.string(str(value)).sql("duckdb")


def as_select(source: str | None, *, fn: str, arg: str = "source") -> str:
    """The source as one SELECT statement's SQL; raises SourceError for anything else."""
    if source is None or not source.strip():
        raise SourceError(f"{fn}(): {arg} is empty; pass a table name or one SELECT statement")
    try:
        statements = [s for s in sqlglot.parse(source, read="duckdb") if s is not None]
    except sqlglot.errors.ParseError as e:
        raise SourceError(f"{fn}(): {arg} is not valid SQL ({_first_line(e)}); "
                          f"pass a table name or one SELECT statement") from None
    if len(statements) != 1:
        raise SourceError(f"{fn}(): {arg} holds {len(statements)} statements; "
                          f"pass a table name or exactly one SELECT statement")
    tree = statements[0]
    if isinstance(tree, exp.Column):  # a bare (possibly dotted) name: a table
        table = exp.Table(this=exp.to_identifier(tree.parts[-1].name, quoted=True),
                          db=_part(tree.parts, -2), catalog=_part(tree.parts, -3))
        return exp.select("*").from_(table).sql("duckdb")
    if not isinstance(tree, exp.Query):
        kind = tree.key.upper()
        raise SourceError(f"{fn}(): {arg} must be a table name or one SELECT statement, not {kind}; "
                          f"pass e.g. 'SELECT ... FROM ...'")
    return tree.sql("duckdb")


def _part(parts, i):
    return exp.to_identifier(parts[i].name, quoted=True) if len(parts) >= -i else None


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0][:200]


@dataclass(frozen=True)
class Column:
    name: str
    type: str

    @property
    def base_type(self) -> str:
        return self.type.split("(")[0].upper()

    @property
    def is_numeric(self) -> bool:
        return self.base_type in NUMERIC_TYPES

    @property
    def is_integer(self) -> bool:
        return self.base_type in INTEGER_TYPES

    @property
    def is_categorical(self) -> bool:
        return self.base_type in CATEGORICAL_TYPES


def describe(cur: duckdb.DuckDBPyConnection, select_sql: str, *, fn: str, arg: str = "source") -> list[Column]:
    """The source's columns, from DuckDB. Unknown tables and columns become SourceErrors."""
    try:
        rel = cur.sql(select_sql)
        return [Column(n, str(t)) for n, t in zip(rel.columns, rel.types)]
    except duckdb.CatalogException as e:
        raise SourceError(f"{fn}(): {arg} refers to something that does not exist: "
                          f"{_first_line(e)}; check the table name or the SELECT") from None
    except duckdb.Error as e:
        raise SourceError(f"{fn}(): {arg} failed in DuckDB: {_first_line(e)}; fix the SELECT") from None


def resolve_column(columns: list[Column], name: str, *, fn: str, arg: str) -> Column:
    """The column called ``name`` (case-insensitive, as DuckDB matches), or an error with a suggestion."""
    for c in columns:
        if c.name == name:
            return c
    for c in columns:
        if c.name.lower() == name.lower():
            return c
    hint = _suggest(name, [c.name for c in columns])
    fix = {"label": "pass label := '<column>'", "features": "pass features := ['<column>', ...]"}.get(
        arg, "include it in the SELECT")
    raise InvalidArgument(f"{fn}(): source has no column {name!r}{hint}; {fix} "
                          f"with columns from: {', '.join(c.name for c in columns)}")


def _suggest(name: str, names: list[str]) -> str:
    import difflib
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
