"""Schema as SQL text: ``.schema --indent``'s layout and ``.dump`` (the CLI's ModePrettyRenderer
and DumpTable), over DuckDB's ``sqlite_schema`` view of the catalog."""

from __future__ import annotations

import re
from dataclasses import replace

from sqlglot import exp, parse_one

from .render import Result, cli_identifier, cli_sql, render_text, sql_identifier

__all__ = ["pretty_schema", "dump_database", "dbml_owned"]

_SPACE = " \t\n\r\f\v"
# An entry's schema and whether it is TEMP, read from its SQL (sqlite_schema has no schema column)
_ENTRY = re.compile(r'^CREATE (?:UNIQUE )?(TEMP(?:ORARY)? )?(?:TABLE|VIEW|SEQUENCE|INDEX \S+ ON) '
                    r'(?:("(?:[^"]|"")*"|[^\s."(]+)\.)?')


def dbml_owned(con):
    """A test of whether a ``sqlite_schema`` entry (name, sql) is dbml's own, which .schema
    and .dump leave out: ``dbml.core.home.owns`` (the catalog's home, dbml's TEMP views)."""
    from ..core import home
    where = home.shell_home(con)

    def owned(name: str, sql: str) -> bool:
        match = _ENTRY.match(sql or "")
        if match is None:
            return False
        schema = match.group(2) or "main"
        if schema.startswith('"'):
            schema = schema[1:-1].replace('""', '"')
        database = "temp" if match.group(1) else (where.database if where else "")
        return home.owns(where, database, schema, name)
    return owned


def pretty_schema(sql: str) -> str:
    """One CREATE statement as ``.schema --indent`` prints it: spaces collapsed, and a long
    one with each top-level element of its parenthesis on a line of its own."""
    if sql.startswith(("CREATE VIEW", "CREATE TRIG")):
        return sql + ";\n"
    z: list[str] = []
    for c in sql.lstrip(_SPACE):
        if c in _SPACE and z:
            if z[-1] == "\r":
                z[-1] = "\n"
            if z[-1] in _SPACE or z[-1] == "(":
                continue
        elif c in "()" and z and z[-1] in _SPACE:
            z.pop()
        z.append(c)
    text = "".join(z).rstrip(_SPACE)
    if len(text.encode()) < 79:
        return text + ";\n"
    return _break_lines(text) + ";\n"


def _break_lines(z: str) -> str:
    out, buf, end, depth, lines, i = [], [], None, 0, 0, 0
    while i < len(z):
        c = z[i]
        if c == end:
            end = None
        elif end is not None:
            pass
        elif c in "\"'`":
            end = c
        elif c == "[":
            end = "]"
        elif c == "-" and z[i + 1:i + 2] == "-":
            end = "\n"
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if lines > 0 and depth == 0 and buf:
                out.append("".join(buf) + "\n")
                buf = []
        buf.append(c)
        if depth == 1 and end is None and (c in "(\n" or (c == "," and not _comment_to_eol(z, i + 1))):
            if c == "\n":
                buf.pop()
            out.append("".join(buf) + "\n  ")
            buf, lines = [], lines + 1
            while i + 1 < len(z) and z[i + 1] in _SPACE:
                i += 1
        i += 1
    return "".join(out) + "".join(buf)


def _comment_to_eol(z: str, i: int) -> bool:
    """Whether only spaces and a comment follow position ``i`` on its line."""
    while i < len(z):
        if z[i] == "\n" or z.startswith("--", i):
            return True
        if z[i] not in _SPACE:
            return False
        i += 1
    return True


def _named_like(patterns: list[str]) -> exp.Expression:
    """``name LIKE p ESCAPE '\\'`` for any of the patterns; true without any."""
    likes = [exp.Escape(this=exp.column("name").like(exp.Literal.string(p)), expression=exp.Literal.string("\\"))
             for p in patterns]
    return exp.or_(*likes) if likes else exp.true()


def _schema_rows(like: exp.Expression, columns: list[str], condition: str) -> exp.Select:
    """``SELECT columns FROM sqlite_schema`` where ``like`` and ``condition`` hold."""
    return exp.select(*columns).from_("sqlite_schema").where(exp.paren(like)).where(condition, dialect="duckdb")


def dump_database(shell, patterns: list[str], newlines: bool) -> int:
    db, write = shell.db, shell.output.write
    like = _named_like(patterns)
    write("BEGIN TRANSACTION;\n")
    errors = 0
    owned = dbml_owned(db)
    from ..core import home
    where = home.shell_home(db)
    schemas = parse_one("SELECT DISTINCT table_schema FROM information_schema.tables WHERE table_schema NOT IN "
                        "('main', $home) AND table_schema NOT LIKE 'pg_%' AND table_schema != 'information_schema' "
                        "ORDER BY table_schema", read="duckdb")
    schemas = exp.replace_placeholders(schemas, home=exp.Literal.string(where.schema if where else "main"))
    tables = _schema_rows(like, ["name"], "type = 'table'")
    for (schema,) in db.execute(schemas.where(exp.column("table_name").isin(query=tables)).sql("duckdb")).fetchall():
        create = exp.Create(kind="SCHEMA", exists=True, this=exp.Table(db=cli_identifier(schema)))
        write(cli_sql(create) + ";;\n")
    entries = _schema_rows(like, ["name", "type", "sql"], "type = 'table' AND sql NOT NULL").order_by(
        "tbl_name = 'sqlite_sequence'", dialect="duckdb")
    for name, kind, sql in db.execute(entries.sql("duckdb")).fetchall():
        if owned(name, sql):
            continue
        write(sql + ";\n")
        if kind == "table" and not _dump_rows(shell, name, newlines):
            errors += 1
            break
    others = _schema_rows(like, ["sql", "name"], "sql NOT NULL AND type IN ('index', 'trigger', 'view')")
    for sql, name in db.execute(others.sql("duckdb")).fetchall():
        if not owned(name, sql):
            write(sql + ("\n;\n" if "--" in sql else ";\n"))
    write("ROLLBACK; -- due to errors\n" if errors else "COMMIT;\n")
    return 0


def _dump_rows(shell, table: str, newlines: bool) -> bool:
    """One table's rows as INSERT statements (the insert mode, without column names)."""
    from . import engine
    db = shell.db
    found = db.execute("SELECT table_catalog, table_schema FROM information_schema.tables WHERE table_name = ? AND "
                       "table_type='BASE TABLE' AND table_catalog = current_database() "
                       "ORDER BY (table_schema='main') DESC LIMIT 1", [table]).fetchall()
    database, schema = found[0] if found else ("", "")
    # qualified by the database too: a TEMP view of the same name (dbml's dbml_models) is found before main's table
    source = exp.table_(exp.to_identifier(table, quoted=True), db=exp.to_identifier(schema, quoted=True),
                        catalog=exp.to_identifier(database, quoted=True) if database else None)
    columns = [r[0] for r in db.execute("SELECT name FROM pragma_table_info(?) ORDER BY cid",
                                        [source.sql("duckdb")]).fetchall()]
    if not columns:
        return False
    query = exp.select(*(exp.column(c, quoted=True) for c in columns)).from_(source)
    outcome = engine.run(db, query.sql("duckdb"))
    kept = engine.keep(db, outcome)
    display = replace(shell.display, mode="insert", header=False, newlines=newlines,
                      table=sql_identifier(schema) + "." + sql_identifier(table) if schema else sql_identifier(table))
    exprs = [exp.cast(exp.column(f"c{i}"), "VARCHAR") for i in range(len(kept.names))]
    result = kept.select(exprs)
    rows = iter(lambda: result.fetchmany(2048), [])
    render_text(Result(kept.names, kept.types, (row for batch in rows for row in batch)), display,
                shell.output.write)
    return True
