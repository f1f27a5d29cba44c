"""An interactive SQL shell with dbml installed (``python -m dbml shell [database]``): the
DuckDB shell for dbml users (DuckDB's own CLI cannot host Python UDFs).

It keeps DuckDB CLI's conventions: statements end with ``;`` and may span lines; dot
commands (``.help`` lists them: ``dbml/shell_commands.py``); display modes
(``dbml/shell_output.py``); ``-c SQL`` and ``-init FILE``; one-line ``Error: …`` messages,
never a traceback. Interactively, line editing and history come from ``readline`` (history
in ``$DBML_HISTORY``, default ``~/.dbml_history``); Ctrl-C cancels the running statement
(its training jobs stop at their next iteration, nothing stored) or clears the line being
typed; Ctrl-D ends the shell, or at a ``...>`` prompt discards the unfinished statement;
a running ``train()`` shows its progress on one line. Reads from a pipe too:
``echo "SELECT 1;" | python -m dbml shell x.duckdb``.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Iterable, TextIO

import duckdb
import pyarrow as pa

from .. import progress
from .render import render
from ..sqltext import split_statements, statement_complete

__all__ = ["Shell", "run", "statement_complete", "split_statements", "open_database", "PROMPT", "CONTINUE"]

PROMPT, CONTINUE = "dbml> ", "  ...> "
# statements whose result is DuckDB's count of changed rows: the CLI prints nothing for them
_COUNTED = {"INSERT", "UPDATE", "DELETE", "CREATE", "COPY", "MULTI", "ATTACH", "DETACH", "LOAD"}


def one_line(e: BaseException) -> str:
    """An error message on one line: ``Error: …``."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
    return f"Error: {text}"


def open_database(database: str, read_only: bool = False):
    """A dbml connection to ``database``, or the one-line error that says why not."""
    import dbml
    try:
        con = dbml.connect(database, read_only=read_only, progress="off")   # it draws its own line
        con.execute("SET enable_progress_bar = false")   # a running train() draws its own line
        return con, None
    except (duckdb.Error, dbml.DbmlError, OSError) as e:
        return None, one_line(e).replace("Error: ", f"Error: cannot open {database!r}: ", 1)


class Shell:
    """The shell's state: connection, display settings, the statement being typed."""

    def __init__(self, con, database: str = ":memory:", out: TextIO = sys.stdout, err: TextIO = sys.stderr,
                 interactive: bool = False):
        self.con, self.database = con, database
        self.stdout, self.err, self.interactive = out, err, interactive
        self.mode, self.max_rows, self.timer, self.bail, self.echo = "duckbox", 40, False, False, False
        self.output: TextIO | None = None    # .output FILE
        self.once: TextIO | None = None      # .once FILE: the next result only
        self.buffer, self.status, self.stopped = "", 0, False

    @property
    def out(self) -> TextIO:
        return self.once or self.output or self.stdout

    # -- input ---------------------------------------------------------------------------
    def feed(self, line: str) -> bool:
        """One input line; False once the shell should stop (.quit, or an error with .bail)."""
        if not self.buffer.strip() and line.strip().startswith("."):
            from .commands import dot_command
            dot_command(self, line.strip())
        else:
            self.buffer += line if line.endswith("\n") else line + "\n"
            if statement_complete(self.buffer):
                text, self.buffer = self.buffer, ""
                self.run_text(text)
        return not self.stopped

    def run_lines(self, lines: Iterable[str]) -> int:
        """Feed every line (a pipe, ``.read``, ``-init``); a statement left without its ';'
        at the end of input runs too, as in DuckDB's CLI. The exit status."""
        for line in lines:
            if not self.feed(line):
                return self.status
        if self.buffer.strip():
            text, self.buffer = self.buffer, ""
            self.run_text(text)
        return self.status

    def interact(self) -> int:
        """Read lines at the prompt until Ctrl-D or .quit."""
        from .commands import History
        print(f"dbml shell on DuckDB {duckdb.__version__}. Statements end with ';'. "
              f"Type .help for help.", file=self.stdout)
        with History():
            while not self.stopped:
                try:
                    line = input(CONTINUE if self.buffer.strip() else PROMPT)
                except EOFError:              # Ctrl-D: ends the shell, or drops the statement
                    print(file=self.stdout)
                    if not self.buffer.strip():
                        break
                    self.buffer = ""
                    continue
                except KeyboardInterrupt:     # Ctrl-C at the prompt: the typed text is dropped
                    print(file=self.stdout)
                    self.buffer = ""
                    continue
                try:
                    self.feed(line)
                except KeyboardInterrupt:
                    self.buffer = ""
                    print("Error: interrupted (Ctrl-C)", file=self.err)
        return self.status

    # -- statements ----------------------------------------------------------------------
    def run_text(self, text: str) -> bool:
        """Run each statement of ``text``; False if one failed."""
        for sql in split_statements(text):
            if self.echo:
                print(sql + ";", file=self.out)
            if not self.run_statement(sql):
                self.status = 1
                if self.bail:
                    self.stopped = True
                return False
        return True

    def run_statement(self, sql: str) -> bool:
        """Execute one statement and print its rows (if it returns any)."""
        t0, c0 = time.perf_counter(), os.times()
        watch = progress.watching(self.con, progress.LineRenderer(self.err)) if self.interactive else nullcontext()
        try:
            with watch:
                table = execute_statement(self.con, sql)
        except (KeyboardInterrupt, RuntimeError) as e:   # Ctrl-C: DuckDB says "interrupted"
            if isinstance(e, RuntimeError) and "interrupted" not in str(e).lower():
                print(one_line(e), file=self.err)
                return False
            print("Error: interrupted (Ctrl-C); the statement was stopped, nothing of it was stored",
                  file=self.err)
            return False
        except Exception as e:  # noqa: BLE001 - every error is one line, never a traceback
            print(one_line(e), file=self.err)
            return False
        if table is not None:
            self.show(table)
        if self.timer:
            c1 = os.times()
            print(f"Run Time (s): real {time.perf_counter() - t0:.3f} user {c1.user - c0.user:.3f} "
                  f"sys {c1.system - c0.system:.3f}", file=self.out)
        return True

    def show(self, table: pa.Table) -> None:
        print(render(table, self.mode, self.max_rows), file=self.out)
        self.out.flush()
        if self.once is not None:
            self.once.close()
            self.once = None

    def reconnect(self, database: str) -> bool:
        """``.open``: the new database, or the old one kept and the error printed."""
        con, error = open_database(database)
        if con is None:
            print(error, file=self.err)
            return False
        self.con.close()
        self.con, self.database = con, database
        return True

    def read_file(self, path: str) -> None:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as e:
            print(f"Error: cannot read {path!r}: {e.strerror or e}", file=self.err)
            self.status = 1
            return
        self.run_lines(lines)


def execute_statement(con, sql: str) -> pa.Table | None:
    """Execute one statement (BigQuery ML syntax rewritten into dbml calls: dbml/bigquery.py);
    its rows as an Arrow table, or None when it returns none (DDL, a SET, or DuckDB's count
    of changed rows, which the CLI does not print)."""
    from ..bigquery import translate
    steps = translate(con, sql)   # BigQuery ML (CREATE MODEL, ML.PREDICT, ...): dbml calls
    if steps is not None:
        for check in steps[:-1]:
            con.execute(check)
        sql = steps[-1]
    kind = _statement_type(sql)
    result = con.execute(sql)
    if result.description is None:
        return None
    names = [d[0] for d in result.description]
    with warnings.catch_warnings():   # "an extra copy": a result is printed once, small or cut
        warnings.simplefilter("ignore")
        table = result.to_arrow_table()
    if names == ["Success"] or names == ["Count"] and kind in _COUNTED:
        return None
    return table


def _statement_type(sql: str) -> str | None:
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error:
        return None   # DuckDB reports the error when it runs it
    return statements[0].type.name if len(statements) == 1 else "MULTI"


def run(con, lines: Iterable[str], out: TextIO = sys.stdout, err: TextIO = sys.stderr,
        interactive: bool = False) -> int:
    """The shell over ``lines`` (or the prompt, when interactive); the exit status (1 if
    any statement failed)."""
    shell = Shell(con, out=out, err=err, interactive=interactive)
    return shell.interact() if interactive else shell.run_lines(lines)
