"""An interactive SQL shell with dbml installed (``python -m dbml shell [database]``).

Statements end with ``;`` and may span lines; results print as DuckDB's CLI prints
them. Reads from a pipe too: ``echo "SELECT 1;" | python -m dbml shell x.duckdb``.
"""

from __future__ import annotations

import sys
from typing import Iterable, TextIO

import duckdb

HELP = """\
.help       show this help and the SQL functions dbml adds
.tables     list the tables and views in the database
.quit       leave the shell (also .exit, or end of input)
SQL statements end with ';' and may span several lines."""

PROMPT, CONTINUE = "dbml> ", "  ...> "


def statement_complete(text: str) -> bool:
    """Whether ``text`` ends with a ';' outside quotes and comments."""
    state, last, i = None, "", 0
    while i < len(text):
        ch, pair = text[i], text[i:i + 2]
        if state is None:
            if ch in "'\"":
                state = ch
            elif pair == "--":
                state, i = "line", i + 1
            elif pair == "/*":
                state, i = "block", i + 1
            elif not ch.isspace():
                last = ch
        elif state == "line" and ch == "\n" or state == "block" and pair == "*/" or state == ch:
            i += 1 if state == "block" else 0
            state = None
        i += 1
    return state in (None, "line") and last == ";"


def run_statements(con: duckdb.DuckDBPyConnection, text: str, out: TextIO, err: TextIO) -> bool:
    """Execute every statement in ``text``, printing results; False if one failed."""
    try:
        statements = duckdb.extract_statements(text)
    except duckdb.Error as e:
        print(f"Error: {e}", file=err)
        return False
    for statement in statements:
        try:
            if statement.type == duckdb.StatementType.SELECT or statement.query.lstrip()[:4].upper() in ("FROM", "DESC", "SHOW", "PRAG", "EXPL", "SUMM"):
                print(str(con.sql(statement.query)).rstrip("\n"), file=out)
            else:
                con.execute(statement.query).fetchall()
        except duckdb.Error as e:
            print(f"Error: {e}", file=err)
            return False
        except (KeyboardInterrupt, RuntimeError) as e:   # Ctrl-C: DuckDB says "Query interrupted"
            if isinstance(e, RuntimeError) and "interrupted" not in str(e):
                raise
            print("Error: interrupted (Ctrl-C); the statement was stopped", file=err)
            return False
    return True


def dot_command(con: duckdb.DuckDBPyConnection, line: str, out: TextIO) -> bool:
    """Run a dot command; False when the shell should stop."""
    from .udfs import SQL_FUNCTIONS

    command = line.split()[0]
    if command in (".quit", ".exit"):
        return False
    if command == ".tables":
        names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                           "WHERE table_schema = current_schema() ORDER BY 1").fetchall()]
        print("  ".join(names), file=out)
    elif command == ".help":
        print(HELP + "\n\ndbml SQL functions:\n" + "\n".join(f"  {h}" for h in SQL_FUNCTIONS.values()), file=out)
    else:
        print(f"Error: unknown command {command}; type .help for the commands", file=out)
    return True


def run(con: duckdb.DuckDBPyConnection, lines: Iterable[str], out: TextIO = sys.stdout,
        err: TextIO = sys.stderr, interactive: bool = False) -> int:
    """The shell loop over input lines; returns the exit status (1 if any statement failed)."""
    buffer, status = "", 0
    if interactive:
        print(f"dbml shell on DuckDB {duckdb.__version__}. Statements end with ';'. Type .help for help.", file=out)
    for line in lines:
        if not buffer and line.strip().startswith("."):
            if not dot_command(con, line.strip(), out):
                return status
            continue
        buffer += line if line.endswith("\n") else line + "\n"
        if statement_complete(buffer):
            status |= 0 if run_statements(con, buffer, out, err) else 1
            buffer = ""
    if buffer.strip():
        status |= 0 if run_statements(con, buffer, out, err) else 1
    return status


def interactive_lines() -> Iterable[str]:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    prompt = PROMPT
    while True:
        try:
            line = input(prompt)
        except EOFError:
            print()
            return
        except KeyboardInterrupt:
            print()
            prompt = PROMPT
            continue
        yield line
        prompt = CONTINUE if line.strip() and not line.strip().startswith(".") and not line.rstrip().endswith(";") else PROMPT
