"""The command line: ``python -m dbml <command>``. Thin: each command calls one dbml function."""

from __future__ import annotations

import argparse
import sys

COMMANDS = {
    "shell": "an interactive SQL shell with dbml installed; reads statements from a pipe too",
    "demo": "build demo data, train several models from SQL, predict, evaluate, and print a report",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dbml", description="In-database machine learning for DuckDB.")
    sub = p.add_subparsers(dest="command", required=True)
    shell = sub.add_parser("shell", help=COMMANDS["shell"], description=COMMANDS["shell"])
    shell.add_argument("database", nargs="?", default=":memory:", help="DuckDB database file (default: in memory)")
    demo = sub.add_parser("demo", help=COMMANDS["demo"], description=COMMANDS["demo"])
    demo.add_argument("database", nargs="?", default=":memory:", help="DuckDB database file (default: in memory)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import dbml

    if args.command == "shell":
        from . import shell
        con = dbml.connect(args.database)
        interactive = sys.stdin.isatty()
        lines = shell.interactive_lines() if interactive else sys.stdin
        return shell.run(con, lines, interactive=interactive)
    if args.command == "demo":
        from . import demo
        return demo.main(args.database)
    return 2
