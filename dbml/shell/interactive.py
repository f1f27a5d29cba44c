"""The prompt: line editing and history through ``readline``, Ctrl-C and Ctrl-D as in DuckDB's CLI.

History keeps whole statements, as DuckDB's CLI does: a statement typed over several lines
is one history entry (on one line: readline's file has one line per entry). It lives in ``$DBML_HISTORY`` (default ``~/.dbml_history``), apart
from DuckDB's own ``~/.duckdb_history`` because it holds dbml statements. Ctrl-C while a
statement runs stops it (its training jobs are cancelled at their next iteration, nothing
stored); at the prompt it drops what was typed. Ctrl-D ends the shell, or at a
continuation prompt drops the unfinished statement.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from .engine import INTERRUPTED
from .reader import SqlBuffer, all_whitespace

__all__ = ["History", "history_path", "interact"]


def history_path() -> Path:
    """``$DBML_HISTORY``, else ``~/.dbml_history``."""
    return Path(os.environ.get("DBML_HISTORY") or Path.home() / ".dbml_history")


class History:
    """``readline``'s history loaded from and saved to :func:`history_path` (nothing where
    readline is missing)."""

    LENGTH = 2000

    def __enter__(self) -> "History":
        try:
            import readline
        except ImportError:
            self.readline = None
            return self
        self.readline, self.path = readline, history_path()
        readline.set_history_length(self.LENGTH)
        try:
            readline.read_history_file(self.path)
        except OSError:   # none yet
            pass
        return self

    def add(self, entry: str, typed_lines: int) -> None:
        """Replace the lines of a statement typed over several lines by the whole statement, on
        one line (readline's history file keeps one line per entry); one with a ``--`` comment
        keeps its lines, which joining would comment out."""
        if self.readline is None or typed_lines <= 1 or "--" in entry:
            return
        entry = " ".join(line.strip() for line in entry.split("\n"))
        length = self.readline.get_current_history_length()
        for _ in range(min(typed_lines, length)):
            self.readline.remove_history_item(self.readline.get_current_history_length() - 1)
        self.readline.add_history(entry)

    def __exit__(self, *exc) -> None:
        if self.readline is not None:
            try:
                self.readline.write_history_file(self.path)
            except OSError:
                pass


def _prompt(shell) -> str:
    """The main prompt: a plain text, or the components .prompt parsed."""
    if isinstance(shell.prompt, str):
        return shell.prompt
    from .prompt import draw_prompt
    return draw_prompt(shell, shell.prompt)


def interact(shell) -> int:
    """Read statements and dot commands at the prompt until ``.quit`` or Ctrl-D."""
    from .commands import dot_command
    if shell.startup_text != "none":
        version = shell.db.execute("PRAGMA version").fetchall()[0]
        print(f"dbml shell on DuckDB {version[0]} ({version[2]})", file=shell.output.stdout)
        if shell.startup_text == "all":
            print('Enter ".help" for usage hints. Statements end with ";".', file=shell.output.stdout)
    buf = SqlBuffer()
    with History() as history:
        while True:
            try:
                line = input(shell.continue_prompt if buf else _prompt(shell))
            except EOFError:                 # Ctrl-D: ends the shell, or drops the statement
                print(file=shell.output.stdout)
                if not buf:
                    break
                buf.clear()
                continue
            except KeyboardInterrupt:        # Ctrl-C at the prompt: the typed text is dropped
                print(file=shell.output.stdout)
                buf.clear()
                continue
            try:
                if not buf and line[:1] == ".":
                    if dot_command(shell, line) == 2:
                        break
                    continue
                if not buf and all_whitespace(line):
                    continue
                if buf.add(line):
                    history.add(buf.text, len(buf.lines))
                    shell.run_sql(buf.text)
                    buf.clear()
                    shell.output.statement_done()
            except (KeyboardInterrupt, duckdb.InterruptException):
                buf.clear()
                shell.error(INTERRUPTED)
    return shell.status
