"""The shell's state and its input loop: DuckDB's CLI (``tools/shell/shell.cpp``) for dbml.

Lines are read from the prompt, a pipe, ``-f``/``.read`` files or ``-c``; a line starting
with ``.`` is a dot command (``dbml/shell/commands.py``); other lines collect until the text
ends with ``;`` outside quotes and comments (``dbml/shell/reader.py``), and DuckDB's parser
splits that text into the statements that run, one result each (``dbml/shell/output.py``).
BigQuery ML statements, which DuckDB's parser refuses, are rewritten into dbml calls
(``dbml/bigquery/``). Errors are DuckDB's messages as the CLI prints them, never a
traceback. Reading a file stops at its first error (``.bail`` changes that), stdin goes on.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import nullcontext
from typing import Iterable, TextIO

import duckdb

from ..core.runtime import runtime
from ..core.sqltext import UNDECODABLE
from . import engine
from .highlight import Highlighter
from .engine import INTERRUPTED, error_text
from .logs import ShellLog
from .output import Output
from .reader import SqlBuffer, all_whitespace
from .render import Display

__all__ = ["Shell", "PROMPT", "CONTINUE", "STANDARD", "FILE", "INIT", "run"]

PROMPT, CONTINUE = "dbml> ", "  ...> "
STANDARD, FILE, INIT = "standard", "file", "init"      # where input comes from: bail defaults differ
EXIT = 2                                               # a dot command's "stop reading"
MAX_LINE = 64 * 2 ** 20                                # characters in one line (stdin from /dev/zero)


class LineTooLong(Exception):
    pass


def read_lines(stream) -> Iterable[str]:
    """The lines of a stream, each at most MAX_LINE characters: input without line breaks
    (``< /dev/zero``) ends with an error instead of filling memory."""
    while True:
        line = stream.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE:
            raise LineTooLong()
        yield line


class Shell:
    """One shell session: the connection, the display settings and where output goes."""

    def __init__(self, con, database: str = ":memory:", out: TextIO = sys.stdout, err: TextIO = sys.stderr,
                 interactive: bool = False, console: bool = False, opener=None):
        self.con, self.database, self.opener = con, database, opener
        self.display = Display()
        self.output = Output(out, err, console)
        self.err = err
        self.interactive = interactive
        self.echo = self.changes = self.timer = self.safe = False
        self.bail: bool | None = None                  # None: bail in files, not at the prompt
        self.highlight = Highlighter(enabled=True)
        self.highlight_results: bool | None = None     # None: when writing to a terminal
        self.highlight_errors: bool | None = None
        self.last: engine.Kept | None = None
        self.last_changes = self.total_changes = 0
        self.prompt, self.continue_prompt = PROMPT, CONTINUE
        self.pager = {"mode": "automatic", "command": "", "min_rows": 50}
        self.startup_text, self.ui_command, self.read_line_version = "all", "CALL start_ui()", "readline"
        self.reading: set[str] = set()                 # the files being read: one reading itself is refused
        self.status = 0
        self.log = ShellLog(self.db)

    def logged(self, own: bool = False) -> None:
        """Print the log entries DuckDB wrote since the last call, as the CLI prints them
        (``dbml/shell/logs.py``); ``own``: the shell's own queries (drawing a result, a dot
        command's) are left out of the query log, the CLI does not run them."""
        entries = self.log.entries()
        if own:
            entries = [e for e in entries if e.get("type") != "QueryLog"]
        if not entries:
            return
        paint = self.highlight.paint if self.highlight.enabled and self.output.console else None
        self.output.flush()
        print(self.log.lines(entries, paint), end="", file=self.output.stdout, flush=True)

    @property
    def db(self):
        """The DuckDB connection itself (a dbml Connection wraps it)."""
        return getattr(self.con, "duckdb", self.con)

    @property
    def out(self) -> TextIO:
        return self.output.stream

    def print(self, text: str = "", end: str = "\n") -> None:
        self.output.write(text + end)

    def error(self, message: str) -> None:
        """An error as the CLI prints it (DuckDB's message as it is), on stderr."""
        if not message.endswith("\n"):
            message += "\n"
        if self.highlight_errors and self.highlight.enabled:
            message = self.highlight.error(message.rstrip("\n")) + "\n"
        self.output.flush()
        try:
            self.err.write(message)
            self.err.flush()
        except OSError:
            pass

    # -- input -----------------------------------------------------------------------------
    def bails(self, mode: str) -> bool:
        return self.bail if self.bail is not None else mode in (FILE, INIT)

    def process(self, lines: Iterable[str], mode: str = STANDARD) -> int:
        """Run every line (without their newlines); 1 if anything failed, else 0. Stops at
        ``.quit``/``.exit``, and at the first error where ``bails(mode)``."""
        from .commands import dot_command
        try:
            return self._process(lines, mode, SqlBuffer(), dot_command)
        except LineTooLong:
            self.error(f"Error: an input line is longer than {MAX_LINE // 2 ** 20} MiB; stopped reading")
            return 1

    def _process(self, lines, mode, buf, dot_command) -> int:
        errors = 0
        for line in lines:
            if errors and self.bails(mode):
                break
            line = line[:-1] if line.endswith("\n") else line
            line = line[:-1] if line.endswith("\r") else line
            if not buf and (not line.strip() or all_whitespace(line)):
                self._echo(line)
            elif not buf and line[:1] in (".", "#"):
                self._echo(line)
                rc = dot_command(self, line) if line[:1] == "." else 0
                self.logged(own=True)
                if rc == EXIT:
                    return 1 if errors else 0
                errors += rc
            elif buf.add(line):
                errors += self.run_sql(buf.text)
                buf.clear()
                self.output.statement_done()
            elif buf.blank():
                self._echo(buf.text)
                buf.clear()
        if buf and not buf.blank() and not (errors and self.bails(mode)):
            errors += self.run_sql(buf.text)
            self.output.statement_done()
        return 1 if errors else 0

    def _echo(self, text: str) -> None:
        if self.echo:
            print(text, file=self.output.stdout)

    def read_file(self, path: str, mode: str = FILE) -> int:
        """Run a file's lines (``.read``, ``-f``, ``-init``); 1 if it failed or cannot be read.
        Only regular files are read: ``.read /dev/zero`` is refused, as in the CLI, and so is a
        file that is already being read (it reads itself, directly or through others)."""
        canonical = os.path.realpath(path)
        if canonical in self.reading:
            self.error(f'Error: recursive .read of "{path}"')
            return 1
        try:
            if not os.path.isfile(path):
                raise OSError
            f = open(path, encoding="utf-8", errors="surrogateescape", newline="\n")
        except OSError:
            self.error(f'Error: cannot open "{path}"')
            return 1
        self.reading.add(canonical)
        try:
            with f:
                return self.process(read_lines(f), mode)
        finally:
            self.reading.discard(canonical)

    def interact(self) -> int:
        from .interactive import interact
        return interact(self)

    def reopen(self, database: str, read_only: bool = False) -> None:
        """``.open``: close this database and open another; where it cannot be opened the
        error is printed and the shell goes on in memory, as the CLI does."""
        self.close()
        try:
            self.con = self.opener(database, read_only)
            self.database = database
        except Exception as e:  # noqa: BLE001
            self.error(error_text(e))
            self.con, self.database = self.opener(":memory:", False), ":memory:"
        self.log = ShellLog(self.db)
        if self.safe:
            from .catalog_commands import enable_safe_mode
            enable_safe_mode(self)

    def close(self) -> None:
        self.last = None
        try:
            self.con.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass
        self.log.close()

    # -- statements ------------------------------------------------------------------------
    def run_sql(self, text: str) -> int:
        """Run the statements of ``text`` (RunOneSqlLine); 1 if one failed."""
        bad = UNDECODABLE.search(text)
        if bad:   # DuckDB's parser refuses such text; the input goes on with the next statement
            self.error(f"Error: the statement holds the byte 0x{ord(bad.group()) - 0xDC00:02x}, which is not "
                       f"UTF-8; DuckDB reads SQL as UTF-8: convert the input (e.g. iconv -f latin1 -t utf-8)")
            self.status = 1
            return 1
        t0, c0 = time.perf_counter(), os.times()
        ok = self.execute_sql(text)
        if self.timer:
            c1 = os.times()
            print(f"Run Time (s): real {time.perf_counter() - t0:.3f} user {c1.user - c0.user:f} "
                  f"sys {c1.system - c0.system:f}", file=self.output.stdout)
        if not ok:
            self.status = 1
            return 1
        if self.changes:
            self.print(f"changes: {self.last_changes:3d}   total_changes: {self.total_changes}")
        return 0

    def execute_sql(self, text: str) -> bool:
        """Every statement of ``text``, in order, until one fails (ExecuteSQL)."""
        try:
            statements = self.db.extract_statements(text)
        except duckdb.ParserException as e:
            return self._bigquery_or_error(text, e)
        except duckdb.Error as e:
            self.error(str(e))
            return False
        for statement in statements:
            sql = statement.query.lstrip()
            if self.echo:
                print(sql, file=self.output.stdout)
            if statement.named_parameters:
                self.error("Prepared statement parameters cannot be used directly\nTo use prepared statement "
                           "parameters, use PREPARE to prepare a statement, followed by EXECUTE")
                return False
            if not self.execute(sql, statement.type.name):
                return False
        return True

    def _bigquery_or_error(self, text: str, error: Exception) -> bool:
        """DuckDB cannot parse ``text``: BigQuery ML statements in it become dbml calls,
        anything else is DuckDB's parse error (and nothing of the text runs, as in the CLI)."""
        from ..bigquery import looks_like_bigquery
        from ..errors import InvalidArgument
        from ..core.sqltext import could_be_bigquery, split_statements
        if not could_be_bigquery(text):   # DuckDB's text: its error, without reading it again
            self.error(str(error))
            return False
        try:
            pieces = split_statements(text)
        except InvalidArgument as e:   # an unterminated string, a script the dialects split differently
            self.error(error_text(e))
            return False
        if not any(looks_like_bigquery(p) for p in pieces):
            self.error(str(error))
            return False
        for piece in pieces:
            if not self._bigquery_statement(piece):
                return False
        return True

    def _bigquery_statement(self, sql: str) -> bool:
        from ..bigquery import translate
        try:
            query = translate(self.con, sql)   # CREATE/DROP MODEL run here; query reads their result
        except Exception as e:  # noqa: BLE001 - an error is a message, never a traceback
            self.error(error_text(e))
            return False
        if self.echo:
            print(sql, file=self.output.stdout)
        return self.execute(query, "SELECT")

    def execute(self, sql: str, kind: str) -> bool:
        """Run one statement and show what it returned (ExecuteStatement)."""
        from .output import show
        watch = nullcontext()
        if self.interactive and self.output.console:
            from ..core import progress
            watch = progress.watching(self.con, progress.LineRenderer(self.err))
        self.output.flush()     # DuckDB's stdout log storage writes to the same stream, unbuffered
        rt = runtime()
        started = time.perf_counter()
        try:
            # a Ctrl-C stops the statement at once (the main thread waits inside DuckDB, where
            # Python's handler would run only once the statement ended)
            with watch, rt.interrupting(self.db):
                outcome = engine.run(self.db, self.log.statement(sql), self.last)
            changes = outcome.changes
        except KeyboardInterrupt:
            self.logged()
            self.error(INTERRUPTED)
            return False
        except Exception as e:  # noqa: BLE001 - every error is DuckDB's message, never a traceback
            self.logged()
            self.error(INTERRUPTED if rt.ctrl_c_since(started) else error_text(e, self.last is None))
            return False
        self.logged()
        if changes is not None:
            self.last_changes = changes
            self.total_changes += changes
        if outcome.kind != "query_result":
            return True
        self.last = show(self, outcome, sql, kind)
        self.logged(own=True)
        return True


def run(con, lines: Iterable[str], out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """The shell over ``lines`` (a script or a pipe) on a connection; the exit status."""
    shell = Shell(con, out=out, err=err)
    try:
        return shell.process(lines)
    finally:
        shell.log.close()
