"""The dot commands that reach outside the display: files, pipes, other databases, the
catalog (``.open``, ``.read``, ``.output``/``.once``/``.excel``, ``.import``, ``.dump``,
``.schema``, ``.tables``, ``.indexes``, ``.databases``, ``.last``, ``.cd``, ``.shell``).

Each one is the CLI's: the same queries of DuckDB's catalog, the same messages, and in
``-safe`` mode the same refusals (DuckDB's own ``enable_external_access = false`` and
``lock_configuration`` guard the SQL side).
"""

from __future__ import annotations

import os
import subprocess

from sqlglot import exp, parse_one


__all__ = ["change_directory", "databases", "dump", "excel", "import_data", "indexes", "last", "log",
           "open_database", "once", "output", "read", "schema", "system", "tables", "enable_safe_mode", "jobs"]

FAIL, USAGE, HELP = 1, -1, -2    # HELP: failed, print the command's help


def _refuse_in_safe_mode(shell, what: str) -> bool:
    if shell.safe:
        shell.error(f"{what} cannot be used in -safe mode")
        return True
    return False


def enable_safe_mode(shell) -> None:
    shell.safe = True
    for sql in ("SET enable_external_access=false", "SET lock_configuration=true"):
        try:
            shell.db.execute(sql).fetchall()
        except Exception as e:  # noqa: BLE001
            shell.error(f'Failed to execute query "{sql}": {e}')


def jobs(shell, words):
    """dbml's own: the training jobs of this process, with their progress (the dbml_jobs view)."""
    shell.run_sql("SELECT job_id, model, status, epoch, epochs, round(progress, 3) AS progress, "
                  "round(loss, 4) AS loss, round(rows_per_s) AS rows_per_s, error FROM dbml_jobs ORDER BY job_id;")


def change_directory(shell, words):
    if _refuse_in_safe_mode(shell, ".cd"):
        return FAIL
    try:
        os.chdir(words[1])
    except OSError:
        shell.error(f'Cannot change to directory "{words[1]}"')
        return FAIL


def system(shell, words):
    if _refuse_in_safe_mode(shell, ".sh/.system"):
        return FAIL
    if len(words) < 2:
        return USAGE
    command = " ".join(w if " " in w else f'"{w}"' for w in words[1:])
    shell.output.flush()
    status = subprocess.call(command, shell=True, stdout=shell.out if shell.output.name else None)
    if status:
        shell.error(f"System command returns {status}")


def log(shell, words):
    if _refuse_in_safe_mode(shell, ".log"):
        return FAIL
    shell.log_file = None if words[1] == "off" else words[1]


def read(shell, words):
    if _refuse_in_safe_mode(shell, ".read"):
        return FAIL
    return shell.read_file(words[1])


def _output(shell, words, once: bool, excel: bool = False):
    if _refuse_in_safe_mode(shell, ".output/.once/.excel"):
        return FAIL
    name = ""
    for w in words[1:]:
        if w.startswith("-"):
            if w.lstrip("-") in ("bom", "x", "e"):
                continue
            shell.print(f'ERROR: unknown option: "{w}".  Usage:')
            return HELP
        if name:
            shell.print(f'ERROR: extra parameter: "{w}".  Usage:')
            return HELP
        name = w
    on_reset = None
    if excel or "-x" in words or "--x" in words:
        name, on_reset = _spreadsheet(shell)
    problem = shell.output.open(name or "stdout", once or excel, on_reset)
    if problem is not None:
        if problem:
            shell.error(problem)
        return FAIL


def _spreadsheet(shell):
    """``.excel``: the next result as CSV in a temporary file, opened in the desktop's program
    for it once written (xdg-open, open, start); the display comes back as it was."""
    import sys
    import tempfile
    from dataclasses import replace

    from .render import set_mode
    saved = replace(shell.display)
    set_mode(shell.display, "csv")
    path = tempfile.mkstemp(suffix=".csv")[1]

    def opened():
        shell.display = saved
        opener = {"darwin": "open", "win32": "start"}.get(sys.platform, "xdg-open")
        if subprocess.call(f"{opener} {path}", shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
            shell.error(f"Failed: [{opener} {path}]")
    return path, opened


def output(shell, words):
    return _output(shell, words, once=False)


def once(shell, words):
    return _output(shell, words, once=True)


def excel(shell, words):
    return _output(shell, words, once=True, excel=True)


def open_database(shell, words):
    """``.open [--new] [--readonly] [--sql QUERY | FILE]``: on failure the CLI keeps going on
    an in-memory database and says which file it could not open."""
    if _refuse_in_safe_mode(shell, ".open"):
        return FAIL
    new = read_only = False
    name, sql, i = None, None, 1
    while i < len(words) and words[i].startswith("-"):
        option = words[i].lstrip("-")
        if option == "new":
            new = True
        elif option == "readonly":
            read_only = True
        elif option == "sql":
            if sql is not None:
                shell.error("Error: --sql provided multiple times")
                return FAIL
            if i + 1 >= len(words):
                shell.error("Error: missing SQL query after --sql")
                return FAIL
            i += 1
            sql = words[i]
            name = _single_value(shell, sql)
            if name is None:
                return FAIL
        elif option != "nofollow":
            shell.error(f"unknown option: {words[i]}")
            return FAIL
        i += 1
    if sql is not None and i < len(words):
        shell.error("Error: cannot use both --sql and a FILE argument")
        return FAIL
    if sql is None and i < len(words):
        name = words[i]
    if new and name:
        try:
            os.unlink(name)
        except OSError:
            pass
    shell.reopen(name or ":memory:", read_only)


def _single_value(shell, sql: str) -> str | None:
    """``.open --sql``: the one value the query returns, or None after saying what is wrong."""
    try:
        result = shell.db._submit(sql)
        rows = result.fetchall() if result.return_type == "query_result" else None
    except Exception as e:  # noqa: BLE001
        shell.error(f"Error: failed to evaluate --sql query '{sql}': {e}")
        return None
    problem = ("returned no rows" if not rows else "returned multiple rows" if len(rows) > 1 else
               "returned multiple columns" if len(rows[0]) != 1 else "returned a null value" if rows[0][0] is None
               else None)
    if problem:
        expected = "" if problem == "returned a null value" else ", expected single value"
        shell.error(f"Error: --sql query {problem}{expected}")
        return None
    return str(rows[0][0])


def last(shell, words):
    if shell.last is not None:
        from .output import show_kept
        show_kept(shell, shell.last, "", "SELECT", unlimited=True)


def import_data(shell, words):
    """``.import FILE TABLE``: DuckDB's reader for the file (by its extension, or --csv,
    --json, --parquet; other --name value pairs are the reader's parameters) into TABLE,
    created when missing, in one transaction."""
    if _refuse_in_safe_mode(shell, ".import"):
        return FAIL
    file_name = table = function = None
    params: dict[str, str] = {}
    i = 1
    while i < len(words):
        w = words[i][1:] if words[i].startswith("--") else words[i]
        if not w.startswith("-"):
            if file_name is None:
                file_name = w
            elif table is None:
                table = w
            else:
                shell.print(f'ERROR: extra argument: "{w}".  Usage:')
                return HELP
        elif w in ("-csv", "-json", "-parquet"):
            function = f"read_{w[1:]}"
        elif w != "-v":
            if i + 1 >= len(words):
                shell.print(f'ERROR: expected an argument for generic parameter: "{w[1:]}".  Usage:')
                return HELP
            params[w[1:]] = words[i + 1]
            i += 1
        i += 1
    if table is None:
        shell.print(f"ERROR: missing {'FILE' if file_name is None else 'TABLE'} argument. Usage:")
        return HELP
    function = function or _reader_for(file_name)
    if function == "read_csv":
        params.setdefault("ignore_errors", "true")
    return _import(shell, file_name, table, function, params)


def _reader_for(file_name: str) -> str:
    readers = {".parquet": "read_parquet", ".csv": "read_csv", ".tsv": "read_csv", ".tbl": "read_csv",
               ".json": "read_json", ".jsonl": "read_json", ".ndjson": "read_json", ".avro": "read_avro",
               ".xlsx": "read_xlsx"}
    for suffix, reader in readers.items():
        if any(file_name.endswith(suffix + c) for c in ("", ".gz", ".zst")):
            return reader
    return "read_csv"


def _import(shell, file_name, table, function, params) -> int:
    db = shell.db
    exists = db.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND schema_name = "
                        "current_schema() AND database_name = current_database()", [table]).fetchall()[0][0]
    args = [exp.EQ(this=exp.column(k, quoted=True), expression=exp.Literal.string(v)) for k, v in params.items()]
    rows = exp.select("*").from_(exp.Anonymous(this=function, expressions=[exp.Literal.string(file_name), *args]))
    target = exp.table_(exp.to_identifier(table, quoted=True))
    load = exp.insert(rows, target) if exists else exp.Create(this=target, kind="TABLE", expression=rows)
    try:
        db.execute("BEGIN TRANSACTION").fetchall()
        db.execute(load.sql("duckdb")).fetchall()
        db.execute("COMMIT").fetchall()
    except Exception as e:  # noqa: BLE001
        try:
            db.execute("ROLLBACK").fetchall()
        except Exception:  # noqa: BLE001
            pass
        shell.error(f"Failed To Import Error: Failed to import from file '{file_name}'\n")
        shell.error(str(e))
        return FAIL
    return 0


# -- the catalog --------------------------------------------------------------------------

_TABLES = """
SELECT columns.database_name, columns.schema_name, columns.table_name,
       list(struct_pack(column_name, data_type, is_primary_key := c.column_index IS NOT NULL) ORDER BY column_index),
       t.estimated_size, t.table_oid
FROM duckdb_columns() columns
LEFT JOIN duckdb_tables() t USING (table_oid)
LEFT JOIN (SELECT table_oid, UNNEST(constraint_column_indexes) + 1 column_index FROM duckdb_constraints()
           WHERE constraint_type = 'PRIMARY KEY') c USING (table_oid, column_index)
WHERE NOT columns.internal AND columns.schema_name ILIKE $schema AND columns.table_name ILIKE $name
GROUP BY ALL
"""


def tables(shell, words):
    """``.tables [PATTERN]``: every table and view of every attached database, as boxes."""
    if len(words) > 2:
        return USAGE
    pattern = words[1] if len(words) > 1 else ""
    schema, name = "%", f"%{pattern}%"
    try:
        parts = [p.strip('"') for p in _qualified(shell, pattern)]
        if len(parts) >= 2:
            schema, name = f"%{parts[0]}%", f"%{parts[1]}%"
    except ValueError:
        shell.error(f"Usage: .tables ?TABLE?\nInvalid pattern: {pattern}")
        return FAIL
    from .metadata import ColumnInfo, TableInfo, max_render_width, render_tables, shell_paint
    found = []
    from ..core import home
    where = home.shell_home(shell.db)   # dbml's own objects are left out (home.owns)
    for db, sch, table, columns, size, oid in shell.db.execute(_TABLES, {"schema": schema, "name": name}).fetchall():
        if home.owns(where, db, sch, table):
            continue
        cols = [ColumnInfo(c["column_name"], c["data_type"], primary_key=c["is_primary_key"]) for c in columns]
        found.append(TableInfo(table, cols, db, sch, size, is_view=oid is None))
    found.sort(key=lambda t: (t.database, t.schema))
    shell.output.write(render_tables(found, max_render_width(shell), shell_paint(shell)))


def _qualified(shell, pattern: str) -> list[str]:
    """A pattern's dotted parts as DuckDB's QualifiedName reads them (quotes group)."""
    parts, current, quoted, i = [], "", False, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == '"':
            if quoted and pattern[i + 1:i + 2] == '"':
                current += '"'
                i += 1
            elif not quoted and current:
                raise ValueError(pattern)
            else:
                quoted = not quoted
        elif ch == "." and not quoted:
            parts.append(current)
            current = ""
        else:
            current += ch
        i += 1
    if quoted:
        raise ValueError(pattern)
    return parts + [current]


def databases(shell, words):
    from .metadata import ColumnInfo, TableInfo, max_render_width, render_tables, shell_paint
    rows = shell.db.execute("SELECT name, file FROM pragma_database_list").fetchall()
    cols = [ColumnInfo(n, "(memory)" if f is None else f) for n, f in rows if n != "dbml_scratch"]
    shell.output.write(render_tables([TableInfo("databases", cols)], max_render_width(shell), shell_paint(shell)))


def indexes(shell, words):
    if len(words) > 2:
        return USAGE
    pattern = words[1] if len(words) > 1 else "%"
    rows = shell.db.execute("SELECT name FROM sqlite_schema WHERE type='index' AND tbl_name LIKE ?",
                            [pattern]).fetchall()
    names = [r[0] for r in rows]
    if not names:
        return 0
    width = max(len(n) for n in names)
    columns = max(80 // (width + 2), 1)
    count = (len(names) + columns - 1) // columns
    for i in range(count):
        shell.print("".join(("" if j < count else "  ") + names[j].ljust(width) for j in range(i, len(names), count)))


SCHEMA_SOURCE = parse_one(
    "(SELECT 'table' AS type, table_name AS name, table_name AS tbl_name, sql, schema_name AS sname FROM duckdb_tables"
    " UNION ALL SELECT 'view', view_name, view_name, sql, schema_name FROM duckdb_views"
    " UNION ALL SELECT 'index', index_name, table_name, sql, schema_name FROM duckdb_indexes) AS sqlite_master",
    read="duckdb")


def schema(shell, words):
    indent, pattern = False, None
    for w in words[1:]:
        if w.lstrip("-") == "indent" and w.startswith("-"):
            indent = True
        elif w.lstrip("-") == "debug" and w.startswith("-"):
            continue
        elif pattern is None:
            pattern = w
        else:
            shell.error("Usage: .schema ?--indent? ?LIKE-PATTERN?")
            return FAIL
    kept = [parse_one("type != 'meta'", read="duckdb"), parse_one("NOT sql IS NULL", read="duckdb")]
    match = None
    if pattern:
        glob = any(c in pattern for c in "*?[")
        column = "lower(printf('%s.%s',sname,tbl_name))" if "." in pattern else "lower(tbl_name)"
        subject = parse_one(column, read="duckdb")
        match = (exp.Glob(this=subject, expression=exp.Literal.string(pattern)) if glob else
                 exp.Escape(this=subject.like(exp.Literal.string(pattern)), expression=exp.Literal.string("\\")))
    where = exp.and_(*([match] if match is not None else []), *kept)
    if any(w.lstrip("-") == "debug" for w in words[1:] if w.startswith("-")):
        # the CLI's own text for --debug, printed and never run, in the CLI's spelling
        from .render import cli_sql
        shown = exp.select("sql").from_("sqlite_master").where(where).order_by("name", dialect="duckdb")
        shell.print("SQL: " + cli_sql(shown, debug=True) + ";")
        return 0
    # sqlite_master, as DuckDB defines it, with each entry's schema (``sname``): the released CLI
    # queries sqlite_master for a dotted pattern too, which has none, and fails
    # ("Referenced column "sname" not found"); its --debug text above stays the CLI's
    source = SCHEMA_SOURCE if pattern and "." in pattern else exp.to_table("sqlite_master")
    query = exp.select("sql", "name").from_(source).where(where).order_by("name", dialect="duckdb")
    from .schema_text import dbml_owned, pretty_schema
    owned = dbml_owned(shell.db)
    for text, name in shell.db.execute(query.sql("duckdb")).fetchall():
        if not owned(name, text):
            shell.output.write(pretty_schema(text) if indent else text + "\n")


def dump(shell, words):
    """``.dump [--newlines] [PATTERN...]``: the schema and rows as SQL, in one transaction."""
    from .schema_text import dump_database
    patterns, newlines = [], False
    for w in words[1:]:
        if w.startswith("-"):
            if w.lstrip("-") != "newlines":
                shell.error(f'Unknown option "{w}" on ".dump"')
                return FAIL
            newlines = True
        else:
            patterns.append(w)
    return dump_database(shell, patterns, newlines)
