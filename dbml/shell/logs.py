"""DuckDB's log entries printed as the CLI prints them (``WARNING:``, ``TRACE:...`` lines).

DuckDB's CLI registers its own log storage, ``shell_log_storage`` (``ShellLogStorage`` in
``tools/shell/shell_renderer.cpp``), enables logging at WARNING level into it, and prints
each entry as it is written. duckdb-python cannot register a log storage, so the shell
gives DuckDB's own file storage a CSV file in a temporary directory, at the same level,
and after each statement prints the entries the file gained, in the CLI's form:

* WARNING, ERROR, FATAL: ``LEVEL:``, then the message, then an empty line; a warning
  already printed once is not printed again (errors always are);
* TRACE, DEBUG, INFO: one line, ``LEVEL:type``, the seconds since the shell started, and
  the message with its whitespace collapsed.

Every log setting stays DuckDB's: ``CALL enable_logging(...)``, ``SET logging_level``,
``FROM duckdb_logs`` act on that storage as they would on the CLI's; a statement that
moves logging to another storage (``storage = 'stdout'``, a file of the user's) leaves the
shell's file, whose last entry is then DuckDB's "The logging settings have been changed"
warning. ``storage = 'shell_log_storage'`` (the CLI's name; ``shell_log_sink`` in
DuckDB 2.0) names the shell's file again.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import tempfile
import time

import duckdb
from sqlglot import exp

__all__ = ["ShellLog", "SHELL_STORAGES", "elapsed", "sanitized"]

SHELL_STORAGES = ("shell_log_storage", "shell_log_sink")   # the CLI's storage, by DuckDB's versions
LOUD = ("WARNING", "ERROR", "FATAL")
PREFIX_WIDTH, ELAPSED_WIDTH = 20, 8                        # ShellLogStorage's columns
_ELEMENT = {"TRACE": "log_trace", "DEBUG": "log_debug", "INFO": "log_info", "WARNING": "log_warning"}


def elapsed(micros: int) -> str:
    """The time since the shell started as the CLI writes it (FormatElapsed), right-aligned:
    ``12.12`` under a minute, ``2'12.12`` under an hour, ``01h02'12`` beyond."""
    micros = max(micros, 0)
    second, minute, hour = 10 ** 6, 60 * 10 ** 6, 3600 * 10 ** 6
    rounded = (micros + 5000) // 10000 * 10000 if micros < hour else (micros + second // 2) // second * second
    if rounded < minute:
        text = f"{rounded / second:.2f}"
    elif rounded < hour:
        text = f"{rounded // minute}'{(rounded % minute) / second:05.2f}"
    else:
        total = rounded // second
        text = f"{total // 3600:02d}h{total % 3600 // 60:02d}'{total % 60:02d}"
    return text.rjust(ELAPSED_WIDTH)


def sanitized(message: str) -> str:
    """A message on one line (SanitizeLogMessage): each run of whitespace and control
    characters becomes one space, none at either end."""
    out, space = [], False
    for c in message:
        if ord(c) < 0x20 or ord(c) == 0x7F or c == " ":
            if not space and out:
                out.append(" ")
            space = True
            continue
        out.append(c)
        space = False
    return "".join(out).rstrip(" ")


class ShellLog:
    """The shell's log storage on one database: where DuckDB writes, and what was printed."""

    def __init__(self, con):
        self.directory = tempfile.mkdtemp(prefix="dbml-shell-log-")
        self.path = os.path.join(self.directory, "log.csv")
        self.start = time.perf_counter()
        self.offset = 0
        self.header: list[str] | None = None
        self.printed: set[str] = set()
        con.execute(exp.select("*").from_(exp.Anonymous(this="enable_logging", expressions=[
            _named("level", exp.Literal.string("warning")), *self.storage()])).sql("duckdb")).fetchall()

    def storage(self) -> list[exp.Expression]:
        """The named arguments of ``enable_logging`` that write into the shell's file."""
        return [_named("storage", exp.Literal.string("file")),
                _named("storage_config", exp.Struct(expressions=[
                    exp.PropertyEQ(this=exp.Literal.string("path"), expression=exp.Literal.string(self.path)),
                    exp.PropertyEQ(this=exp.Literal.string("normalize"), expression=exp.false())]))]

    def statement(self, sql: str) -> str:
        """``sql`` with the CLI's storage, ``storage = 'shell_log_storage'`` in an
        ``enable_logging`` call, as the shell's file (DuckDB does not know the name); other
        statements as they are."""
        if "enable_logging" not in sql.lower():
            return sql
        tokens = _tokens(sql)
        words = [text.lower() for text, _, _ in tokens]
        for i, (text, kind, start) in enumerate(tokens):
            if kind == duckdb.token_type.string_const and text[1:-1].lower() in SHELL_STORAGES \
                    and i >= 2 and words[i - 1] in ("=", ":=", "=>") and words[i - 2] == "storage":
                arguments = ", ".join(a.sql("duckdb") for a in self.storage())
                return sql[:tokens[i - 2][2]] + arguments + sql[start + len(text):]
        return sql

    def entries(self) -> list[dict]:
        """The entries DuckDB wrote into the shell's file since the last call."""
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return []
        if size < self.offset:      # the file was started again (enable_logging named it anew)
            self.offset, self.header = 0, None
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        self.offset = size      # DuckDB writes whole rows at once, each starting a new line
        rows = list(csv.reader(io.StringIO(data.decode("utf-8", "replace"), newline="")))
        if self.header is None and rows:
            self.header, rows = rows[0], rows[1:]
        return [dict(zip(self.header, row)) for row in rows if len(row) == len(self.header)]

    def lines(self, entries: list[dict], paint=None) -> str:
        """The entries as the CLI prints them; ``paint(text, element)`` colours a part."""
        paint = paint or (lambda text, element: text)
        out = []
        for entry in entries:
            level, kind, message = entry.get("log_level", ""), entry.get("type", ""), entry.get("message", "")
            if level in LOUD:
                if level == "WARNING":
                    if message.lower() in self.printed:
                        continue
                    self.printed.add(message.lower())
                element = "log_warning" if level == "WARNING" else "error"
                out.append(paint(f"{level}:\n", element) + paint(f"{message}\n\n", element))
                continue
            prefix = f"{level}:{kind}"
            gap = " " * (PREFIX_WIDTH - len(prefix)) if len(prefix) < PREFIX_WIDTH else "  "
            micros = int((time.perf_counter() - self.start) * 10 ** 6)
            out.append(paint(prefix, _ELEMENT.get(level, "none")) + f"{gap}{elapsed(micros)}  {sanitized(message)}\n")
        return "".join(out)

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _named(name: str, value: exp.Expression) -> exp.Expression:
    return exp.PropertyEQ(this=exp.to_identifier(name), expression=value)


def _tokens(sql: str) -> list[tuple[str, object, int]]:
    """DuckDB's tokens of ``sql`` other than comments: (text, kind, where it starts)."""
    try:
        spans = duckdb.tokenize(sql)
    except Exception:  # noqa: BLE001 - DuckDB's reading ends inside a string: nothing to replace
        return []
    ends = [start for start, _ in spans[1:]] + [len(sql)]
    return [(sql[start:end].strip(), kind, start) for (start, kind), end in zip(spans, ends)
            if kind != duckdb.token_type.comment]
