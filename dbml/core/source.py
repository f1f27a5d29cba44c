"""Training and evaluation sources: a table name or exactly one SELECT.

A source is parsed with sqlglot and rebuilt from its syntax tree, so what reaches DuckDB
is always a single query; its columns and types come from DuckDB itself. A SELECT is a
SELECT: two checks stand between a source and anything it could write.

1. Before anything runs, the syntax tree may hold no write anywhere (``WRITE_NODES``: a
   data-modifying CTE, a COPY, ...) and no call to a function with effects (dbml's own,
   from ``dbml.udfs.FUNCTIONS``, and DuckDB's, ``DUCKDB_EFFECTFUL``: ``refused()``).
2. Defence in depth, for what parsing misses (a view that calls ``drop_model``, SQL that
   sqlglot reads differently from DuckDB): DuckDB binds the query into its logical plan
   (``json_serialize_plan``, which runs nothing), and a plan with a write operator
   (``WRITE_OPERATORS``) or a call to a function with effects anywhere is refused.
   ``describe`` does this before the source first runs.

The ``sources`` setting ('tables') further restricts sources to the database's own tables
and views (``check_tables_only``): no files, table functions or attached databases.

>>> as_select("customers", fn="train")
'SELECT * FROM "customers"'
>>> as_select("SELECT a FROM t WHERE split = 'train'", fn="train")
"SELECT a FROM t WHERE split = 'train'"
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import duckdb
import sqlglot
from sqlglot import exp

from ..errors import InvalidArgument, SourceError

NUMERIC_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
                 "UINTEGER", "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL")
INTEGER_TYPES = NUMERIC_TYPES[:10]
CATEGORICAL_TYPES = ("VARCHAR", "BOOLEAN", "ENUM")

# Statements a source's tree may not contain anywhere (a CTE or subquery included).
WRITE_NODES = (exp.Insert, exp.Update, exp.Delete, exp.Merge, exp.Copy, exp.Create, exp.Drop, exp.Alter,
               exp.Attach, exp.Detach, exp.Set, exp.Command, exp.Pragma, exp.Use, exp.Transaction,
               exp.Commit, exp.Rollback, exp.TruncateTable, exp.Export, exp.Install, exp.LoadData,
               exp.Analyze, exp.Grant, exp.Revoke, exp.Refresh, exp.Cache, exp.Uncache)
# Functions a source may not call: DuckDB's with effects, or that run SQL text the checks
# cannot see (nextval advances a sequence, setseed the session's random state, query() runs
# a string as SQL), and dbml's, which dbml.udfs derives from its FUNCTIONS table (the one
# owner of which dbml functions have effects) and hands over with ``refuse_in_sources``.
DUCKDB_EFFECTFUL = ("nextval", "setseed", "query")
_REFUSED: set[str] = set(DUCKDB_EFFECTFUL)
_REFUSED_CALL: list = [None]      # the regex over plan text, rebuilt when _REFUSED grows


def refuse_in_sources(names) -> None:
    """Refuse calls to ``names`` in sources from now on (``dbml.udfs`` calls it with dbml's
    functions and macros that have effects or run SQL text)."""
    _REFUSED.update(n.lower() for n in names)
    _REFUSED_CALL[0] = re.compile(r"\b(" + "|".join(sorted(_REFUSED)) + r")\s*\(", re.IGNORECASE)


def refused() -> frozenset[str]:
    """The function and macro names a source may not call."""
    return frozenset(_REFUSED)


# Logical operators that write (DuckDB's LOGICAL_<name>); any CREATE_*/DROP/ALTER too.
WRITE_OPERATORS = frozenset({
    "INSERT", "DELETE", "UPDATE", "MERGE_INTO", "COPY_TO_FILE", "COPY_DATABASE", "ATTACH", "DETACH",
    "PRAGMA", "SET", "RESET", "LOAD", "TRANSACTION", "VACUUM", "EXPORT", "EXECUTE", "PREPARE",
    "UPDATE_EXTENSIONS"})
# A source runs on dbml's own connection to the database, which cannot see the caller's TEMP
# tables and views: a name not found may be one of those.
TEMP_HINT = (" (a TEMP table or view is not seen: dbml runs the source on its own connection, which cannot "
             "see this connection's TEMP objects; CREATE TABLE or CREATE VIEW in the database instead)")


def quote(name: str) -> str:
    """A column or table name as a quoted DuckDB identifier: the one quoter of names, as text
    (``column`` is the same name in a tree)."""
    return exp.to_identifier(name, quoted=True).sql("duckdb")


def parsed(sql: exp.Expression | str) -> exp.Expression:
    """A tree as it is; SQL text a module still hands over (a source from ``as_select``, an
    expression of the preprocessing) as sqlglot reads it for DuckDB."""
    return exp.maybe_parse(sql, dialect="duckdb")


def column(name: str) -> exp.Column:
    """A column name, quoted, as a sqlglot column: one identifier, whatever it holds (dots, quotes)."""
    return exp.column(exp.to_identifier(name, quoted=True))


def unused_name(base: str, taken) -> str:
    """``base``, or ``base_1``, ``base_2``, ...: the first that is none of ``taken`` (DuckDB's
    names are case-insensitive). dbml's own columns beside a user's (a row's struct, a row
    count) are named so that no user column can be taken for one, or hidden by one."""
    taken = {t.lower() for t in taken}
    name, n = base, 0
    while name.lower() in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def literal(value) -> str:
    """A Python value as a SQL literal, built by sqlglot (``value``): None, a bool, a number
    (finite: ``number``), a str, or a list of them."""
    return value_sql(value).sql("duckdb")


def value_sql(value) -> exp.Expression:
    """A Python value as a sqlglot expression: the one way dbml turns values into SQL."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(int(value)) if value >= 0 else exp.Neg(this=exp.Literal.number(-int(value)))
    if isinstance(value, float):
        return number_tree(value)
    if isinstance(value, (list, tuple)):
        return exp.Array(expressions=[value_sql(v) for v in value])
    return exp.Literal.string(str(value))


def number(value) -> str:
    """A finite real number as a SQL numeric literal; anything else raises ValueError.

    The one way statistics read back from the catalog reach generated SQL: a text, a
    bool, NaN or ±Inf never becomes SQL.

    >>> number(0.5), number(-3)
    ('0.5', '-3.0')
    """
    return number_tree(value).sql("duckdb")


def number_tree(value) -> exp.Expression:
    """``number`` as a sqlglot tree: a literal, negated below zero."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    text = repr(float(value))          # digits, '.', 'e', '-' only: value is a finite float
    node = exp.Literal.number(text.lstrip("-"))
    return exp.Neg(this=node) if text.startswith("-") else node


def as_select(source: str | None, *, fn: str, arg: str = "source") -> str:
    """The source as one SELECT statement's SQL (``select_tree`` rendered); raises SourceError
    for anything else."""
    return select_tree(source, fn=fn, arg=arg).sql("duckdb")


def select_tree(source: str | exp.Query | None, *, fn: str, arg: str = "source") -> exp.Query:
    """The source as one SELECT statement's sqlglot tree, which modules pass on and render
    where it runs; raises SourceError for anything else. A tree made here passes as it is
    (its effects checked again)."""
    if isinstance(source, exp.Query):
        _refuse_effects(source, fn=fn, arg=arg)
        return source
    if source is None or not source.strip():
        raise SourceError(f"{fn}(): {arg} is empty; pass a table name or one SELECT statement")
    try:
        statements = [s for s in sqlglot.parse(source, read="duckdb") if s is not None]
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError) as e:
        raise SourceError(f"{fn}(): {arg} is not valid SQL ({_first_line(e)}); "
                          f"pass a table name or one SELECT statement") from None
    if len(statements) != 1:
        raise SourceError(f"{fn}(): {arg} holds {len(statements)} statements; "
                          f"pass a table name or exactly one SELECT statement")
    tree = statements[0]
    if isinstance(tree, exp.Column):  # a bare (possibly dotted) name: a table
        table = exp.Table(this=exp.to_identifier(tree.parts[-1].name, quoted=True),
                          db=_part(tree.parts, -2), catalog=_part(tree.parts, -3))
        return exp.select("*").from_(table)
    if not isinstance(tree, exp.Query):
        kind = tree.key.upper()
        raise SourceError(f"{fn}(): {arg} must be a table name or one SELECT statement, not {kind}; "
                          f"pass e.g. 'SELECT ... FROM ...'")
    _refuse_effects(tree, fn=fn, arg=arg)
    return tree


def _text(select_sql: exp.Query | str) -> str:
    """The source's SELECT as DuckDB runs it: a tree rendered, text as it is."""
    return select_sql if isinstance(select_sql, str) else select_sql.sql("duckdb")


def _refuse_effects(tree: exp.Expression, *, fn: str, arg: str) -> None:
    """Any write, or any call to a function with effects, anywhere in the tree: SourceError."""
    refuse_effects(tree, where=f"{fn}()", arg=arg)


def refuse_effects(tree: exp.Expression, *, where: str, arg: str) -> None:
    """Any write, or any call to a function with effects, anywhere in ``tree`` (a query, or
    an expression such as BigQuery ML's TRANSFORM): SourceError, ``where: arg ...``."""
    for node in tree.walk():
        if isinstance(node, WRITE_NODES):
            kind = node.key.upper()
            article = "an" if kind[0] in "AEIOU" else "a"
            raise SourceError(f"{where}: {arg} contains {article} {kind} ({_first_line(node.sql('duckdb'))[:80]!r}); "
                              f"a source must only read: pass a table name or a SELECT without {kind}")
        name = _function_name(node)
        if name in _REFUSED:
            raise SourceError(f"{where}: {arg} calls {name}(), which has effects (or runs SQL text); "
                              f"a source must only read: call {name}() in its own statement")


def _function_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return None


def check_plan(cur: duckdb.DuckDBPyConnection, select_sql: exp.Query | str, *, fn: str, arg: str = "source") -> None:
    """Defence in depth: DuckDB binds the query into its logical plan (``json_serialize_plan``:
    nothing runs), views and macros expanded; a plan that writes or calls a function with
    effects is refused. A query DuckDB cannot plan is refused with DuckDB's error."""
    select_sql = _text(select_sql)
    plan = json.loads(cur.execute("SELECT json_serialize_plan(?)", [select_sql]).fetchall()[0][0])
    if plan.get("error") and "does not support serialization" in str(plan.get("error_message")):
        return _check_physical_plan(cur, select_sql, fn=fn, arg=arg)     # e.g. read_parquet's scan
    if plan.get("error"):
        kind = str(plan.get("error_type", "")).title()
        message = f"{kind} Error: {_first_line(Exception(plan.get('error_message', '')))}"
        if kind == "Catalog":
            raise SourceError(f"{fn}(): {arg} refers to something that does not exist: "
                              f"{message}; check the table name or the SELECT{TEMP_HINT}")
        raise SourceError(f"{fn}(): {arg} failed in DuckDB: {message}; fix the SELECT")
    for node in _plan_nodes(plan.get("plans", [])):
        op = str(node.get("type", ""))
        op = op[len("LOGICAL_"):] if op.startswith("LOGICAL_") else ""
        if op in WRITE_OPERATORS or op.startswith(("CREATE", "DROP", "ALTER")):
            raise SourceError(f"{fn}(): {arg} would write ({op} in its plan); "
                              f"a source must only read: pass a table name or a plain SELECT")
        path = node.get("qname", {}).get("path") if isinstance(node.get("qname"), dict) else None
        name = str(path[-1]).lower() if path else None
        if name in _REFUSED:
            raise SourceError(f"{fn}(): {arg} calls {name}() (seen in its plan, e.g. through a view), "
                              f"which has effects; a source must only read: call it in its own statement")


def _check_physical_plan(cur: duckdb.DuckDBPyConnection, select_sql: str, *, fn: str, arg: str) -> None:
    """The fallback where the logical plan cannot be serialized: EXPLAIN's physical plan (runs
    nothing); its operators, and the calls written in its expressions (not under an alias)."""
    plan = json.loads(cur.execute(f"EXPLAIN (FORMAT JSON) {select_sql}").fetchall()[0][1])
    for node in _plan_nodes(plan):
        op = str(node.get("name", "")).strip().upper().removeprefix("BATCH_")
        if op in WRITE_OPERATORS or op.startswith(("CREATE", "DROP", "ALTER")):
            raise SourceError(f"{fn}(): {arg} would write ({op} in its plan); "
                              f"a source must only read: pass a table name or a plain SELECT")
        call = (_REFUSED_CALL[0] or refuse_in_sources(()) or _REFUSED_CALL[0]).search(
            json.dumps(node.get("extra_info", {})))
        if call:
            raise SourceError(f"{fn}(): {arg} calls {call.group(1).lower()}() (seen in its plan, e.g. through a "
                              f"view), which has effects; a source must only read: call it in its own statement")


def _plan_nodes(value):
    """Every JSON object in a serialized plan: operators and expressions alike."""
    if isinstance(value, dict):
        yield value
        for child in value.values():
            yield from _plan_nodes(child)
    elif isinstance(value, list):
        for child in value:
            yield from _plan_nodes(child)


def check_not_temp(select_sql: exp.Query | str, temp_names, *, fn: str, arg: str = "source") -> None:
    """Refuse a source that names one of the calling connection's TEMP tables or views
    (``temp_names``, from the ``dbml_temp_names()`` macro): dbml runs it on its own connection,
    which cannot see them, and would read the database's object of the same name if there
    is one."""
    temp = {n.lower() for n in temp_names or ()}
    if not temp:
        return
    tree = parsed(select_sql)
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if (isinstance(table.this, exp.Identifier) and name in temp and name not in ctes
                and (not table.catalog or table.catalog.lower() == "temp")):
            raise SourceError(f"{fn}(): {arg} reads {table.name!r}, which on this connection is a TEMP table or "
                              f"view; dbml runs sources on its own connection to the database, which cannot see "
                              f"TEMP objects (and would read the database's own {table.name!r} if there is one): "
                              f"CREATE TABLE or CREATE VIEW in the database instead, under a name of its own")


def check_tables_only(cur: duckdb.DuckDBPyConnection, select_sql: exp.Query | str, *, fn: str,
                      arg: str = "source") -> None:
    """The ``sources = 'tables'`` setting: every table the query reads is a table or view of
    the current database (or a CTE). Files, table functions and attached databases: SourceError."""
    tree = parsed(select_sql)
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    fix = "SET VARIABLE dbml_sources = 'any' to allow it, or load the data into a table first"
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            raise SourceError(f"{fn}(): {arg} reads {table.this.sql('duckdb')[:80]!r}, a table function, but "
                              f"sources are restricted to the database's tables and views; {fix}")
        if not table.db and not table.catalog and table.name.lower() in ctes:
            continue
        if not _is_local_relation(cur, table):
            raise SourceError(f"{fn}(): {arg} reads {table.sql('duckdb')!r}, which is not a table or view of this "
                              f"database (a file or an attached database?), but sources are restricted to the "
                              f"database's tables and views; {fix}")


def _is_local_relation(cur: duckdb.DuckDBPyConnection, table: exp.Table) -> bool:
    catalog, schema = table.catalog or None, table.db or None
    rows = cur.execute("""
        WITH r AS (SELECT database_name, schema_name, table_name AS name FROM duckdb_tables()
                   UNION ALL SELECT database_name, schema_name, view_name FROM duckdb_views() WHERE NOT internal)
        SELECT count(*) FROM r
        WHERE database_name = current_database() AND lower(name) = lower(?)
          AND (CASE WHEN ? IS NOT NULL THEN lower(?) = lower(current_database()) AND lower(schema_name) = lower(?)
                    WHEN ? IS NOT NULL THEN lower(schema_name) = lower(?)
                       OR (lower(?) = lower(current_database()) AND schema_name = current_schema())
                    ELSE schema_name = current_schema() END)""",
                       [table.name, catalog, catalog, schema, schema, schema, schema]).fetchall()
    return rows[0][0] > 0


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


def describe(cur: duckdb.DuckDBPyConnection, select_sql: exp.Query | str, *, fn: str,
             arg: str = "source") -> list[Column]:
    """The source's columns, from DuckDB, once its plan passed ``check_plan``.
    Unknown tables and columns become SourceErrors."""
    try:
        check_plan(cur, select_sql, fn=fn, arg=arg)
        rel = cur.sql(_text(select_sql))
        return [Column(n, str(t)) for n, t in zip(rel.columns, rel.types)]
    except duckdb.CatalogException as e:
        raise SourceError(f"{fn}(): {arg} refers to something that does not exist: "
                          f"{_first_line(e)}; check the table name or the SELECT{TEMP_HINT}") from None
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
    fix = {"label": "pass label := '<column>'", "features": "pass features := ['<column>', ...]",
           "split_col": "pass split_col := '<column>'"}.get(
        arg, "include it in the SELECT")
    raise InvalidArgument(f"{fn}(): source has no column {name!r}{hint}; {fix} "
                          f"with columns from: {', '.join(c.name for c in columns)}")


def label_and_text(columns: list[Column], label: str | None, text, *, fn: str) -> tuple[Column, set[str]]:
    """The label's column and the names of the text columns (``text :=``) among ``columns``,
    or InvalidArgument naming the argument and the fix."""
    if label is None:
        raise InvalidArgument(f"{fn}(): label is missing; pass label := '<column>' naming the column to predict")
    label_col = resolve_column(columns, label, fn=fn, arg="label")
    return label_col, {resolve_column(columns, t, fn=fn, arg="text").name for t in text or ()}


def job_source(cur: duckdb.DuckDBPyConnection, spec, *, fn: str = "train") -> tuple[exp.Query, list[Column]]:
    """A training job's source (a ``TrainSpec``'s) as one SELECT and its columns, checked: tables
    only under the ``sources`` setting, and the label and text columns it names there. A job
    runs this before it imports torch (``dbml.core.instance``), so a misnamed column fails at once."""
    select_sql = select_tree(spec.source, fn=fn)
    if spec.settings.sources == "tables":
        check_tables_only(cur, select_sql, fn=fn)
    columns = describe(cur, select_sql, fn=fn)
    label_and_text(columns, spec.label, spec.text, fn=fn)
    split_column(columns, spec, fn=fn)
    return select_sql, columns


def split_column(columns: list[Column], spec, *, fn: str = "train") -> Column | None:
    """The column ``split := 'custom'`` or ``'seq'`` splits by (``split_col``), checked: not the
    label or a feature (it only splits), BOOLEAN for 'custom'; None for the hash split."""
    if spec.split_col is None:
        return None
    col = resolve_column(columns, spec.split_col, fn=fn, arg="split_col")
    if spec.label is not None and col.name.lower() == spec.label.lower():
        raise InvalidArgument(f"{fn}(): split_col {col.name!r} is the label; pass split_col := another column")
    if spec.features is not None and col.name.lower() in {f.lower() for f in spec.features}:
        raise InvalidArgument(f"{fn}(): split_col {col.name!r} only splits the rows and cannot be a feature; "
                              f"leave it out of features")
    if spec.split == "custom" and col.base_type != "BOOLEAN":
        raise InvalidArgument(f"{fn}(): split := 'custom' holds out the rows whose split_col is TRUE, and "
                              f"{col.name!r} is {col.type}; pass a BOOLEAN column, e.g. SELECT *, "
                              f"{col.name} = 1 AS held_out FROM ... with split_col := 'held_out'")
    return col


def _suggest(name: str, names: list[str]) -> str:
    import difflib
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
