"""SQL is built as a tree, never as text (issue 30, part 2; STYLE.md 12).

Every statement dbml sends is a sqlglot expression or goes through DuckDB's relational
API, rendered once where it runs. This test walks every module of ``dbml/`` (the scheduler,
the SQL functions and the surfaces included) and reports each f-string whose constant text reads as SQL (an upper-case
keyword at a word boundary) and that is not a message: an argument of an exception, a
warning, a log line or a print.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dbml",)

# Upper-case keywords as this code base writes SQL; a message writes them rarely, and then
# it is an argument of an exception or a log call, which the walk skips.
SQL_WORDS = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|FROM|WHERE|SET|ATTACH|DETACH|COPY|PRAGMA"
    r"|VALUES|JOIN|ORDER BY|GROUP BY|LIMIT|MACRO|TABLE|VIEW|DESCRIBE|SUMMARIZE|UNION|CAST|AS)\b")
# A constant part is SQL when it holds a statement keyword, or two keywords of any kind.
STATEMENT_WORDS = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|ATTACH|DETACH|COPY|PRAGMA|DESCRIBE|SUMMARIZE|EXPLAIN"
    r"|SHOW|INSTALL|LOAD|EXPORT|IMPORT|CALL|CHECKPOINT|VACUUM|BEGIN|COMMIT|ROLLBACK|TRUNCATE|MERGE|USE"
    r"|WITH|FROM|WHERE|SET)\b")

# Calls whose f-string arguments are messages, not statements.
MESSAGE_CALLS = re.compile(r"(Error|Exception|Warning|Interrupt|Exit)$")
# (module, function) -> why an f-string there that reads as SQL is kept.
EXCEPTIONS = {
    ("dbml/core/source.py", "_check_physical_plan"): "sqlglot has no EXPLAIN node (it parses one as a Command of "
                                                "text); the source's SQL after it is as_select's tree, rendered",
}
MESSAGE_FUNCS = {"print", "warn", "debug", "info", "warning", "error", "exception", "critical", "log",
                 "echo", "secho", "write", "note", "fail", "skip", "xfail", "add_note", "emit", "say"}


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _enclosing_function(node: ast.AST, parents: dict) -> str:
    while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node = parents.get(node)
    return "" if node is None else node.name


def _is_message(node: ast.AST, parents: dict) -> bool:
    """True when the f-string is (part of) an argument of an exception, a warning or a log line,
    or the operand of a raise/assert."""
    child = node
    parent = parents.get(child)
    while parent is not None:
        if isinstance(parent, ast.Call) and child is not parent.func:
            name = _name(parent.func)
            if MESSAGE_CALLS.search(name) or name in MESSAGE_FUNCS:
                return True
        if isinstance(parent, (ast.Raise, ast.Assert)):
            return True
        if isinstance(parent, (ast.stmt, ast.Lambda)):
            return False
        child, parent = parent, parents.get(parent)
    return False


def _looks_like_sql(node: ast.JoinedStr) -> bool:
    text = " ".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    if STATEMENT_WORDS.search(text):
        return True
    return len(SQL_WORDS.findall(text)) >= 2


def sql_fstrings(root: Path = ROOT) -> list[str]:
    """``path:line`` of every f-string that builds SQL text outside a message."""
    hits = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
            nested = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)
                      for v in ast.walk(n) if v is not n and isinstance(v, ast.JoinedStr)}
            for node in ast.walk(tree):
                if (isinstance(node, ast.JoinedStr) and id(node) not in nested and _looks_like_sql(node)
                        and not _is_message(node, parents)
                        and (path.relative_to(root).as_posix(), _enclosing_function(node, parents))
                        not in EXCEPTIONS):
                    hits.append(f"{path.relative_to(root)}:{node.lineno}")
    return sorted(hits, key=lambda hit: (hit.rsplit(":", 1)[0], int(hit.rsplit(":", 1)[1])))


def test_no_sql_built_as_text():
    hits = sql_fstrings()
    assert not hits, (f"{len(hits)} f-strings build SQL text; build a sqlglot tree (STYLE.md 12) "
                      "and render it where it runs:\n" + "\n".join(hits))


def test_the_walk_finds_sql_and_skips_messages(tmp_path):
    """The checker itself: it finds a statement built as text and leaves messages alone."""
    pkg = tmp_path / "dbml"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        'def f(con, t, e):\n'
        '    con.execute(f"SELECT * FROM {t}")\n'
        '    raise ValueError(f"table {t} not found: SELECT failed")\n'
        '    print(f"DROP {t}")\n'
        '    msg = f"model {t} ready"\n')
    assert sql_fstrings(tmp_path) == ["dbml/m.py:2"]
