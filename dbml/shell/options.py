"""``python -m dbml shell [OPTIONS] FILENAME [SQL]``: DuckDB CLI's command line, option for option.

As in the CLI, options are read in two passes: those that shape how the database opens
(``-readonly``, ``-safe``, ``-unsigned``, ``-storage-version``, ``-init``, ``-no-init``,
``-batch``) before it opens, the rest in their order after the init file ran
(``~/.duckdbrc`` unless ``-init FILE`` or ``-no-init``), so ``-c``, ``-f`` and ``-cmd`` run
in the order given and the modes they set apply to what follows. Words after the database
that are not options are SQL or dot commands to run instead of reading stdin. An option
may take one dash or two (``--batch``), and ``_`` for ``-`` (``-storage_version``).
"""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["OPTIONS", "main", "open_database", "usage"]

PROGRAM = "python -m dbml shell"
EXIT = "exit"


@dataclass(frozen=True)
class Option:
    name: str
    takes: str              # the argument's name, '' for none
    help: str
    before: Callable | None = None      # (settings, arg): before the database opens
    after: Callable | None = None       # (shell, settings, arg): after it opened, in order


@dataclass
class Settings:
    database: str = ""
    read_only: bool = False
    safe: bool = False
    init: str | None = None
    run_init: bool = True
    batch: bool | None = None           # None: interactive when stdin is a terminal
    read_stdin: bool = True
    config: dict = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    exit_code: int | None = None


def _mode(name: str, col: str | None = None, row: str | None = None):
    def after(shell, s, arg):
        shell.display.mode = name
        if col is not None:
            shell.display.col_sep = col
        if row is not None:
            shell.display.row_sep = row
    return after


def _set(attr: str, value):
    def before(s, arg):
        setattr(s, attr, value if value is not None else arg)
    return before


def _display(attr: str, value=None):
    def after(shell, s, arg):
        setattr(shell.display, attr, arg if value is None else value)
    return after


def _run(exit_after: bool):
    def after(shell, s, arg):
        if exit_after:
            s.read_stdin = False
        bail = shell.bail if shell.bail is not None else True     # -c and -s stop at an error
        if arg.startswith("."):
            from .commands import dot_command
            rc = dot_command(shell, arg)
            if rc == 2:
                return EXIT if exit_after else None
        else:
            rc = shell.run_sql(arg)
            shell.output.statement_done()
        if rc and bail:
            s.exit_code = rc
            return EXIT
    return after


def _file(shell, s, arg):
    s.read_stdin = False
    if shell.read_file(arg):
        s.exit_code = 1
        return EXIT


def _storage_version(s, arg):
    s.config["storage_compatibility_version"] = arg


def _version(shell, s, arg):
    version, source_id, codename = shell.db.execute("PRAGMA version").fetchall()[0]
    print(f"{version} ({codename}) {source_id}")
    return EXIT


def _help(shell, s, arg):
    print(usage(), end="")
    return EXIT


def _safe(s, arg):
    s.safe = True


def _interactive(shell, s, arg):
    s.batch = False


OPTIONS: tuple[Option, ...] = (
    Option("ascii", "", "set output mode to 'ascii'", after=_mode("ascii", "\x1f", "\x1e")),
    Option("bail", "", "stop after hitting an error", after=lambda shell, s, a: setattr(shell, "bail", True)),
    Option("batch", "", "force batch I/O", _set("batch", True)),
    Option("box", "", "set output mode to 'box'", after=_mode("box")),
    Option("column", "", "set output mode to 'column'", after=_mode("column")),
    Option("cmd", "COMMAND", 'run "COMMAND" before reading stdin', after=_run(False)),
    Option("csv", "", "set output mode to 'csv'", after=_mode("csv", ",")),
    Option("c", "COMMAND", 'run "COMMAND" and exit', _set("batch", True), _run(True)),
    Option("dark-mode", "", "use dark mode colors", after=lambda shell, s, a: shell.highlight.set_mode("dark")),
    Option("echo", "", "print commands before execution", after=lambda shell, s, a: setattr(shell, "echo", True)),
    Option("f", "FILENAME", "read/process named file and exit", _set("batch", True), _file),
    Option("init", "FILENAME", "read/process named file", _set("init", None)),
    Option("header", "", "turn headers on", after=_display("header", True)),
    Option("h", "", "show help message", _set("batch", True), _help),
    Option("help", "", "show help message", _set("batch", True), _help),
    Option("html", "", "set output mode to HTML", after=_mode("html")),
    Option("interactive", "", "force interactive I/O", after=_interactive),
    Option("json", "", "set output mode to 'json'", after=_mode("json")),
    Option("jsonlines", "", "set output mode to 'jsonlines'", after=_mode("jsonlines")),
    Option("light-mode", "", "use light mode colors", after=lambda shell, s, a: shell.highlight.set_mode("light")),
    Option("line", "", "set output mode to 'line'", after=_mode("line")),
    Option("list", "", "set output mode to 'list'", after=_mode("list")),
    Option("markdown", "", "set output mode to 'markdown'", after=_mode("markdown")),
    Option("newline", "SEP", "set output row separator. Default: '\\n'", after=_display("row_sep")),
    Option("no-init", "", "skip processing the init file", _set("run_init", False)),
    Option("no-stdin", "", "exit after processing options instead of reading stdin",
           after=lambda shell, s, a: setattr(s, "read_stdin", False)),
    Option("noheader", "", "turn headers off", after=_display("header", False)),
    Option("nullvalue", "TEXT", "set text string for NULL values. Default 'NULL'", after=_display("null_value")),
    Option("quote", "", "set output mode to 'quote'", after=_mode("quote")),
    Option("readonly", "", "open the database read-only", _set("read_only", True)),
    Option("s", "COMMAND", 'run "COMMAND" and exit', _set("batch", True), _run(True)),
    Option("safe", "", "enable safe-mode", _safe),
    Option("separator", "SEP", "set output column separator. Default: '|'", after=_display("col_sep")),
    Option("storage-version", "VER", "database storage compatibility version to use. Default: 'v0.10.0'",
           _storage_version),
    Option("table", "", "set output mode to 'table'", after=_mode("table")),
    Option("ui", "", "launches a web interface using the ui extension (configurable with .ui_command)",
           after=lambda shell, s, a: _run(False)(shell, s, shell.ui_command)),
    Option("unredacted", "", "allow printing unredacted secrets",
           lambda s, a: s.config.__setitem__("allow_unredacted_secrets", True)),
    Option("unsigned", "", "allow loading of unsigned extensions",
           lambda s, a: s.config.__setitem__("allow_unsigned_extensions", True)),
    Option("version", "", "show DuckDB version", after=_version),
)


def usage() -> str:
    """``-help``: the CLI's usage text, with this program's name."""
    rows = [(f"  -{o.name}", o.takes, o.help) for o in OPTIONS]
    width = max(len(n) + len(t) + (1 if t else 0) for n, t, _ in rows)
    lines = [f"Usage: {PROGRAM} [OPTIONS] FILENAME [SQL]", "",
             "FILENAME is the name of a DuckDB database. A new database is created",
             "if the file does not previously exist.", "", "OPTIONS:"]
    for name, takes, text in rows:
        left = f"{name} {takes}" if takes else name
        lines.append(f"{left}{' ' * (width - len(left) + 4)}{text}")
    return "\n".join(lines) + "\n"


def _find(word: str) -> Option | None:
    for candidate in (word, word.replace("_", "-")):
        for option in OPTIONS:
            if option.name == candidate:
                return option
    return None


def parse(argv: list[str]) -> tuple[Settings, list] | int:
    """The first pass: database, extra commands, and each option's call in order; an exit
    status when an option is unknown or lacks its argument."""
    s, calls, i = Settings(), [], 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-"):
            if not s.database:
                s.database = word
            else:
                s.read_stdin, s.batch = False, True
                s.commands.append(word)
            i += 1
            continue
        name = word[2:] if word.startswith("--") else word[1:]
        option = _find(name)
        if option is None:
            close = difflib.get_close_matches(f"-{name}", [f"-{o.name}" for o in OPTIONS], n=3, cutoff=0.6)
            hint = ("Did you mean: " + ", ".join(f'"{c}"' for c in close) + "\n") if close else ""
            sys.stderr.write(f"Unknown Option Error: Unrecognized option '-{name}'\n{hint}"
                             f"Run '{PROGRAM} -help' for a list of options.\n")
            return 1
        arg = None
        if option.takes:
            if i + 1 >= len(argv):
                sys.stderr.write(f"Missing Argument Error: Argument '-{option.name}' needs 1 arguments, but got 0\n"
                                 f"OPTION:\n  -{option.name} {option.takes}    {option.help}\n\n"
                                 f"Run '{PROGRAM} -help' for a list of options.\n")
                return 1
            i += 1
            arg = argv[i]
        if option.before is not None:
            option.before(s, arg)
        calls.append((option, arg))
        i += 1
    s.database = s.database or ":memory:"
    return s, calls


def open_database(database: str, read_only: bool = False, config: dict | None = None):
    """A DuckDB connection to ``database`` with dbml installed (no progress bars: the shell
    draws its own line). DuckDB's errors pass through: the shell prints them."""
    import duckdb
    import dbml

    from .engine import check
    con = duckdb.connect(database, read_only=read_only, config=config or {})
    try:
        check(con)
        installed = dbml.install(con, preload=False, progress="off")
        # DuckDB's own bar would draw over the line a running train() draws (interactive.py)
        dbml.no_duckdb_progress_bar(con)
        _add_getenv(con)
        return installed
    except BaseException:
        con.close()
        raise


def _add_getenv(con) -> None:
    """``getenv(name)``, which DuckDB's CLI adds (its "shell" extension): an environment
    variable's value, '' when unset; refused when external access is disabled."""
    import duckdb
    probe = con.cursor()

    def getenv(name: str) -> str:
        if not probe.execute("SELECT current_setting('enable_external_access')").fetchall()[0][0]:
            raise PermissionError("getenv is disabled through configuration")
        return os.environ.get(name, "")
    con.create_function("getenv", getenv, [duckdb.sqltype("VARCHAR")], duckdb.sqltype("VARCHAR"))


def main(argv: list[str]) -> int:
    """Run the shell as DuckDB's CLI runs; the exit status."""
    parsed = parse(argv)
    if isinstance(parsed, int):
        return parsed
    s, calls = parsed
    from .engine import error_text
    try:
        con = open_database(s.database, s.read_only, s.config)
    except Exception as e:  # noqa: BLE001 - a database that cannot be opened is a message
        sys.stderr.write(error_text(e) + "\n")
        return 1
    return _session(con, s, calls)


def _session(con, s: Settings, calls: list) -> int:
    from .session import Shell
    stdin_tty = sys.stdin.isatty()
    interactive = stdin_tty if s.batch is None else not s.batch
    _text_streams()
    shell = Shell(con, s.database, sys.stdout, sys.stderr, interactive=interactive,
                  console=sys.stdout.isatty(), opener=lambda name, ro: open_database(name, ro, s.config))
    try:
        if s.safe:
            from .catalog_commands import enable_safe_mode
            enable_safe_mode(shell)
        if s.run_init and _init(shell, s):
            return 1
        for option, arg in calls:
            if option.after is not None and option.after(shell, s, arg) == EXIT:
                return s.exit_code or 0
        interactive = interactive if s.batch is None else not s.batch
        shell.interactive = interactive
        if not s.read_stdin:
            return _extra_commands(shell, s)
        if interactive and stdin_tty:
            from ..core import preload
            preload.start()   # imported while the user types the first statement
            return shell.interact()
        from .session import read_lines
        return shell.process(read_lines(sys.stdin))
    finally:
        shell.output.reset()
        shell.close()


def _init(shell, s: Settings) -> int:
    """The init file: ``-init FILE`` (which must exist), else ``~/.duckdbrc`` if there is one;
    1 when it failed and the shell should stop (unless ``.bail off`` said otherwise in it)."""
    path = s.init if s.init is not None else os.path.expanduser("~/.duckdbrc")
    if not os.path.isfile(path):
        if s.init is None:
            return 0
        shell.error(f'IO Error: Failed to open file "{path}"')
        failed = True
    else:
        failed = _run_init_file(shell, path)
    if failed and shell.bail is not False:
        shell.error(f'Encountered errors while executing init file "{path}". Exiting.')
        return 1
    return 0


def _run_init_file(shell, path: str) -> bool:
    """Run the init file, saying so on stderr first ("-- Loading resources from ..."), as the
    CLI does unless the file's first lines set ``.startup_text`` to something else."""
    import itertools

    from .commands import dot_command
    from .session import INIT, read_lines
    with open(path, encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        lines = read_lines(f)
        for line in lines:
            if not line.startswith(".startup_text"):
                if shell.startup_text == "all":
                    shell.error(f"-- Loading resources from {path}")
                return bool(shell.process(itertools.chain([line], lines), INIT))
            dot_command(shell, line.rstrip("\n"))
    return False


def _extra_commands(shell, s: Settings) -> int:
    from .commands import dot_command
    for command in s.commands:
        if command.startswith("."):
            rc = dot_command(shell, command)
            if rc:
                return 0 if rc == 2 else rc
        elif shell.run_sql(command):
            return 1
        shell.output.statement_done()
    return 0


def _text_streams() -> None:
    """stdout and stderr write UTF-8 whatever the locale, and never translate newlines; stdin
    reads UTF-8 as files are read (``Shell.read_file``): a byte that is not UTF-8 fails its
    statement, not the reading."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            stream.reconfigure(encoding="utf-8", errors="surrogateescape")
        except (AttributeError, ValueError):
            pass
