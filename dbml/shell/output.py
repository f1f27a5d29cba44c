"""Where the shell's output goes (stdout, ``.output``/``.once`` files and pipes, the pager)
and how one result is shown in the current mode.

A write that fails (``.output /dev/full``, a closed pipe) is reported once, as an error
line, never as a traceback; the statement still counts as run.
"""

from __future__ import annotations

import subprocess
from typing import TextIO

from .render import Result, render_text, shown_width, terminal_height, terminal_width, varchar_sql

__all__ = ["Output", "emit", "pages", "show", "show_kept", "system_pager"]

FETCH_ROWS = 2048


class Output:
    """The stream results go to, and the CLI's rules for switching it back to stdout."""

    def __init__(self, stdout: TextIO, err: TextIO, console: bool):
        self.stdout, self.err, self.console = stdout, err, console
        self.stream: TextIO = stdout
        self.name = ""              # '' (stdout), a file name, or '|command'
        self.count = 0              # .once: how many commands until stdout again (the CLI's outCount)
        self._pipe = None
        self._reported = False
        self._on_reset = None       # .excel: open the file once written

    @property
    def to_file(self) -> bool:
        return bool(self.name) and not self.name.startswith("|") and self.name not in ("stdout", "stderr")

    def write(self, text: str) -> None:
        try:
            self.stream.write(text)
        except (OSError, ValueError) as e:
            self._report(e)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (OSError, ValueError) as e:
            self._report(e)

    def _report(self, e: Exception) -> None:
        if self._reported:
            return
        self._reported = True
        where = self.name or "stdout"
        reason = getattr(e, "strerror", None) or str(e)
        try:
            self.err.write(f'Error: cannot write to "{where}": {reason}\n')
            self.err.flush()
        except OSError:
            pass

    def open(self, name: str, once: bool, on_reset=None) -> str | None:
        """``.output NAME`` / ``.once NAME``: the error text, or None; ``off`` fails without
        one and leaves the output on stdout, as in the CLI. ``on_reset`` runs when the output
        goes back to stdout (``.excel`` opens its file then)."""
        self.reset()
        self.count = 2 if once else 0
        self._on_reset = on_reset
        if name in ("stdout", ""):
            return None
        if name == "off":
            return ""
        if name == "stderr":
            self.stream, self.name = self.err, name
            return None
        try:
            if name.startswith("|"):
                self._pipe = subprocess.Popen(name[1:], shell=True, stdin=subprocess.PIPE, text=True,
                                              encoding="utf-8", errors="surrogateescape")
                self.stream = self._pipe.stdin
            else:
                self.stream = open(_expand(name), "w", encoding="utf-8", errors="surrogateescape", newline="")
        except OSError:
            self.stream, self._on_reset = self.stdout, None
            return f'Error: cannot open "{name}"\nError: cannot write to "{name}"' if not name.startswith("|") else \
                f'Error: cannot open pipe "{name[1:]}"'
        self.name = name
        self._reported = False
        return None

    def reset(self) -> None:
        """Back to stdout; a file is closed, a pipe waited for."""
        if self.stream is not self.stdout and self.stream is not self.err:
            try:
                self.stream.close()
            except OSError as e:
                self._report(e)
            if self._pipe is not None:
                self._pipe.wait()
        else:
            self.flush()
        self.stream, self.name, self._pipe, self._reported = self.stdout, "", None, False
        callback, self._on_reset = self._on_reset, None
        if callback is not None:
            callback()

    def statement_done(self) -> None:
        """After SQL ran: a ``.once`` file is done."""
        if self.count:
            self.reset()
            self.count = 0
        else:
            self.flush()

    def command_done(self) -> None:
        """After a dot command ran: count it toward ``.once``."""
        if self.count:
            self.count -= 1
            if self.count == 0:
                self.reset()


def _expand(path: str) -> str:
    import os
    return os.path.expanduser(path)


def system_pager() -> str:
    import os
    return os.environ.get("DUCKDB_PAGER") or os.environ.get("PAGER") or "less -SRX"


def emit(shell, text: str) -> None:
    """Write a drawn result, through the pager where :func:`pages` says so."""
    out, pager = shell.output, shell.pager
    if not pages(shell, text):
        out.write(text)
        return
    out.flush()
    try:
        subprocess.run(pager["command"] or system_pager(), shell=True, input=text, text=True, encoding="utf-8")
    except OSError as e:
        shell.error(f"Error: Failed to start pager process: {e}. Output will be sent to stdout.")
        out.write(text)


def pages(shell, text: str) -> bool:
    """Whether ``text`` goes through the pager, as DuckDB's CLI decides (``ShouldUsePagerForSize``):
    only at an interactive terminal writing to stdout, ``.pager on`` always, automatic when the
    text does not fit the screen: as many lines as the terminal has (or as ``.pager
    set_row_threshold``, if fewer; the threshold alone where the height is unknown), or a line
    wider than the terminal, measured as the terminal shows it (colour codes take no columns).
    Never while input waits on the terminal (typed or pasted ahead): a pager would read it as
    its keys (``.quit`` pasted after a query would lose its ``.q`` to ``less``)."""
    out, pager = shell.output, shell.pager
    if not (shell.interactive and out.console and out.stream is out.stdout) or pager["mode"] == "off":
        return False
    if _input_waiting():
        return False
    if pager["mode"] != "automatic":
        return True
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    height = terminal_height()
    threshold = min(height, pager["min_rows"]) if height else pager["min_rows"]
    return len(lines) >= threshold or max(map(shown_width, lines), default=0) > terminal_width()


def _input_waiting(stream=None) -> bool:
    """Whether the shell's input (a terminal) has text waiting to be read."""
    import select
    import sys
    try:
        return bool(select.select([(stream or sys.stdin).fileno()], [], [], 0)[0])
    except (OSError, ValueError, AttributeError):   # no file descriptor (a test's StringIO), or Windows
        return False


def show(shell, outcome, sql: str, kind: str):
    """Print what a query returned in the shell's mode; its rows, kept (the shell's last
    result: ``_``, ``.last``). A duckbox is drawn by DuckDB from the result itself. A dbml
    function's one-row STRUCT (``train()``, ``evaluate()``) is shown as its fields (:func:`fields`)."""
    from . import engine
    if kind == "SELECT" and _one_dbml_struct(outcome, sql):
        kept = engine.keep(shell.db, outcome)
        if fields(shell, kept):
            return kept
        show_kept(shell, kept, sql, kind)
        return kept
    if shell.display.mode == "duckbox" and kind != "EXPLAIN" and not _describes(shell, sql, outcome.names):
        from .numbers import wants_formatting
        if wants_formatting(shell.display):
            kept = engine.keep(shell.db, outcome)
            emit(shell, _formatted_box(shell, kept))
            return kept
        text = _box(shell, outcome.result)
        kept = engine.keep(shell.db, outcome)
        emit(shell, text)
        return kept
    kept = engine.keep(shell.db, outcome)
    show_kept(shell, kept, sql, kind)
    return kept


def _one_dbml_struct(outcome, sql: str) -> bool:
    """One STRUCT column, from a statement that calls one of dbml's SQL functions."""
    if len(outcome.types) != 1 or not str(outcome.types[0]).upper().startswith("STRUCT("):
        return False
    from ..core.sqltext import code_tokens
    from ..udfs import SQL_FUNCTIONS
    words = [text.lower() for text, _ in code_tokens(sql)]
    return any(word in SQL_FUNCTIONS and after == "(" for word, after in zip(words, words[1:]))


def fields(shell, kept) -> bool:
    """Show kept rows that are one STRUCT in one row as the STRUCT's fields, one column each,
    as ``SELECT unnest(train(...))`` shows them (DuckDB expands the STRUCT); the rows kept (``_``,
    ``.last``) stay the STRUCT that SQL returns. False where there is not exactly one row."""
    from sqlglot import exp

    from . import engine
    rows = kept.con._submit(exp.select(exp.func("count", exp.Star())).from_(kept.table()).sql("duckdb"))
    if rows.fetchall()[0][0] != 1:
        return False
    query = exp.select(exp.func("unnest", exp.column("c0"))).from_(kept.by_position().subquery())
    result = kept.con._submit(query.sql("duckdb"))
    description = result.description or []
    outcome = engine.Outcome("query_result", result, [d[0] for d in description], [d[1] for d in description])
    show(shell, outcome, "", "SELECT")
    return True


def _describes(shell, sql: str, names: list[str]) -> bool:
    from .metadata import describe_name
    return describe_name(shell.db, sql, names) is not None


def _box(shell, result, unlimited: bool = False) -> str:
    from .duckbox import box
    out, display = shell.output, shell.display
    console = out.console and out.stream is out.stdout
    highlight = shell.highlight_results if shell.highlight_results is not None else console
    width = terminal_width() if console else None
    return box(result, display, width, shell.highlight if highlight else None,
               unlimited or (out.to_file and not display.max_width))


def _formatted_box(shell, kept, unlimited: bool = False) -> str:
    """A box with the CLI's number formatting (``dbml/shell/numbers.py``), where it applies."""
    from .engine import UNLIMITED
    from .numbers import formatted_box
    out = shell.output
    console = out.console and out.stream is out.stdout
    width = shell.display.max_width or (terminal_width() if console and not unlimited else UNLIMITED)
    return formatted_box(kept, shell.display, width) or _box(shell, kept.select(), unlimited)


def show_kept(shell, kept, sql: str, kind: str, unlimited: bool = False) -> bool:
    """Print kept rows in the shell's mode (``.last``: every row, however many)."""
    from .duckbox import explain_text
    display, out = shell.display, shell.output
    if kind == "EXPLAIN":
        out.write(explain_text(kept.select().fetchall()))
        return True
    if display.mode == "trash":
        return True
    if display.mode == "duckbox":
        from .metadata import describe_name, render_describe
        name = describe_name(shell.db, sql, kept.names) if sql else None
        if name is not None:
            emit(shell, render_describe(shell, name, kept.select().fetchall()))
        else:
            emit(shell, _box(shell, kept.select(), unlimited))
        return True
    exprs = [varchar_sql(f"c{i}", t, display.mode) for i, t in enumerate(kept.types)]
    render_text(Result(list(kept.names), list(kept.types), _rows(kept.select(exprs))), display, out.write)
    return True


def _rows(result):
    while True:
        batch = result.fetchmany(FETCH_ROWS)
        if not batch:
            return
        yield from batch
