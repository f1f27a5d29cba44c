"""SQL text as the shell reads it: where statements end (a ';' outside quotes and comments).

DuckDB's ``extract_statements`` cannot split what it cannot parse (BigQuery ML's
``CREATE MODEL ... OPTIONS(...)``), so the shell and ``dbml.execute`` split here.
"""

from __future__ import annotations

__all__ = ["statement_complete", "split_statements"]


def _scan(text: str):
    """Yield (index, char) of each ';' outside quotes and comments, then (len, '') with
    whether the text ends outside a quote or block comment as the char ('' or 'open')."""
    state, i = None, 0
    while i < len(text):
        ch, pair = text[i], text[i:i + 2]
        if state is None:
            if ch in "'\"":
                state = ch
            elif pair == "--":
                state, i = "line", i + 1
            elif pair == "/*":
                state, i = "block", i + 1
            elif ch == ";":
                yield i, ";"
        elif state == "line" and ch == "\n" or state == "block" and pair == "*/" or state == ch:
            i += 1 if state == "block" else 0
            state = None
        i += 1
    yield len(text), "" if state in (None, "line") else "open"


def statement_complete(text: str) -> bool:
    """Whether ``text`` ends with a ';' outside quotes and comments (comments may follow)."""
    marks = list(_scan(text))
    if marks[-1][1] == "open" or len(marks) < 2:
        return False
    last = marks[-2][0]
    return all(part.strip() == "" for part in _uncommented(text[last + 1:]))


def _uncommented(tail: str) -> list[str]:
    """What follows the last ';' with line comments removed (it may hold only those)."""
    return [line.split("--", 1)[0] for line in tail.splitlines()]


def split_statements(text: str) -> list[str]:
    """The statements of ``text``, each with its ';' removed; empty ones left out."""
    out, start = [], 0
    for i, ch in _scan(text):
        if ch == ";":
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [s.strip() for s in out if s.strip() and any(p.strip() for p in _uncommented(_no_block(s)))]


def _no_block(s: str) -> str:
    while "/*" in s and "*/" in s.split("/*", 1)[1]:
        head, rest = s.split("/*", 1)
        s = head + rest.split("*/", 1)[1]
    return s
