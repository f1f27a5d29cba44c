"""The shell's dot commands (``.help`` prints them) and its history file.

As in DuckDB's CLI: ``.mode``, ``.output``/``.once``, ``.read``, ``.timer``, ``.maxrows``,
``.schema``, ``.tables``, ``.open``, ``.bail``, ``.echo``, ``.help``, ``.quit``/``.exit``;
and dbml's ``.jobs`` (the ``dbml_jobs`` view: training jobs and their progress).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from .render import MODES

__all__ = ["COMMANDS", "dot_command", "History", "history_path"]

Shell = object   # dbml.shell.Shell, which imports this module: the handlers' argument

COMMANDS: dict[str, str] = {
    ".bail on|off": "stop after the first error (default off)",
    ".echo on|off": "print each statement before running it",
    ".exit": "leave the shell (also .quit, or Ctrl-D at the prompt)",
    ".help": "show this help and the SQL functions dbml adds",
    ".jobs": "dbml's training jobs of this process, with their progress (the dbml_jobs view)",
    ".maxrows N": "show at most N rows of a result in duckbox/box mode (default 40; 0: all)",
    ".mode MODE": f"how results print: {', '.join(MODES)} (default duckbox)",
    ".once FILE": "write the next result to FILE",
    ".open FILE": "close this database and open FILE (created if missing)",
    ".output [FILE]": "write results to FILE, or back to the screen without one",
    ".quit": "leave the shell",
    ".read FILE": "run the statements and dot commands in FILE",
    ".schema [TABLE]": "the CREATE statements of the tables and views (of TABLE only)",
    ".tables": "list the tables and views in the database",
    ".timer on|off": "print how long each statement ran",
}


def history_path() -> Path:
    """``$DBML_HISTORY``, else ``~/.dbml_history``."""
    return Path(os.environ.get("DBML_HISTORY") or Path.home() / ".dbml_history")


class History:
    """Line editing and history for ``input()`` through the standard ``readline`` module,
    loaded from and saved to :func:`history_path` (nothing, where readline is missing)."""

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

    def __exit__(self, *exc) -> None:
        if self.readline is not None:
            try:
                self.readline.write_history_file(self.path)
            except OSError:
                pass


def dot_command(shell: Shell, line: str) -> None:
    """Run one dot command on ``shell``."""
    name, _, arg = line.partition(" ")
    arg = arg.strip()
    handler = _HANDLERS.get(name)
    if handler is None:
        shell.status = 1
        print(f"Error: unknown command {name}; type .help for the commands", file=shell.err)
        return
    handler(shell, arg)


def _switch(attr: str) -> Callable[[Shell, str], None]:
    def set_switch(shell: Shell, arg: str) -> None:
        if arg.lower() not in ("on", "off"):
            print(f"Error: {attr} takes on or off, e.g. .{attr} on", file=shell.err)
            return
        setattr(shell, attr, arg.lower() == "on")
    return set_switch


def _mode(shell: Shell, arg: str) -> None:
    if not arg:
        print(f"current output mode: {shell.mode}", file=shell.out)
    elif arg in MODES:
        shell.mode = arg
    else:
        print(f"Error: unknown mode {arg!r}; modes are {', '.join(MODES)}", file=shell.err)


def _maxrows(shell: Shell, arg: str) -> None:
    if not arg.isdigit():
        print("Error: .maxrows takes a number of rows, e.g. .maxrows 100 (0: all)", file=shell.err)
        return
    shell.max_rows = int(arg)


def _open_file(shell: Shell, arg: str):
    try:
        return open(arg, "w")
    except OSError as e:
        print(f"Error: cannot write {arg!r}: {e.strerror or e}", file=shell.err)
        return None


def _output(shell: Shell, arg: str) -> None:
    if shell.output is not None:
        shell.output.close()
    shell.output = _open_file(shell, arg) if arg else None


def _once(shell: Shell, arg: str) -> None:
    if not arg:
        print("Error: .once takes a file name, e.g. .once result.txt", file=shell.err)
        return
    shell.once = _open_file(shell, arg)


def _needs(what: str, example: str, action: Callable[[Shell, str], object]) -> Callable[[Shell, str], None]:
    def command(shell: Shell, arg: str) -> None:
        if not arg:
            print(f"Error: {what}, e.g. {example}", file=shell.err)
            return
        action(shell, arg)
    return command


def _quit(shell: Shell, arg: str) -> None:
    shell.stopped = True


def _tables(shell: Shell, arg: str) -> None:
    names = [r[0] for r in shell.con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
        "ORDER BY 1").fetchall()]
    print("  ".join(names), file=shell.out)


def _schema(shell: Shell, arg: str) -> None:
    rows = shell.con.execute(
        "SELECT name, sql FROM (SELECT table_name AS name, sql FROM duckdb_tables() WHERE NOT internal "
        "AND NOT temporary UNION ALL SELECT view_name, sql FROM duckdb_views() WHERE NOT internal "
        "AND NOT temporary) WHERE $name IS NULL OR name = $name ORDER BY name",
        {"name": arg or None}).fetchall()
    if arg and not rows:
        print(f"Error: no table or view named {arg!r}; .tables lists them", file=shell.err)
        return
    for _, sql in rows:
        print(sql.rstrip(";") + ";", file=shell.out)


def _jobs(shell: Shell, arg: str) -> None:
    shell.run_statement("SELECT id AS job_id, model, status, epoch, epochs, round(progress, 3) AS progress, "
                        "round(loss, 4) AS loss, round(rows_per_s) AS rows_per_s, error FROM dbml_jobs "
                        "ORDER BY id")


def _help(shell: Shell, arg: str) -> None:
    from ..udfs import SQL_FUNCTIONS
    width = max(len(c) for c in COMMANDS)
    lines = [f"{c:<{width}}  {h}" for c, h in COMMANDS.items()]
    lines += ["", "SQL statements end with ';' and may span several lines.", "", "dbml SQL functions:"]
    lines += [f"  {h}" for h in SQL_FUNCTIONS.values()]
    print("\n".join(lines), file=shell.out)


_HANDLERS: dict[str, Callable[[Shell, str], None]] = {
    ".bail": _switch("bail"), ".echo": _switch("echo"), ".timer": _switch("timer"),
    ".exit": _quit, ".quit": _quit, ".help": _help, ".jobs": _jobs, ".maxrows": _maxrows,
    ".mode": _mode, ".once": _once, ".output": _output, ".schema": _schema, ".tables": _tables,
    ".open": _needs(".open takes a database file", ".open shop.duckdb", lambda s, a: s.reconnect(a)),
    ".read": _needs(".read takes a file of statements", ".read setup.sql", lambda s, a: s.read_file(a)),
}
