"""SQL text as the shell and ``dbml.execute`` read it: where statements end.

This module is the one owner of that rule: the shell's reader asks :func:`ending` whether
the lines typed so far form whole statements, and every splitter calls
:func:`split_statements`. Statements end at a ``;`` token of the dialect's tokenizer: for
DuckDB, DuckDB's own (``duckdb.tokenize``, the lexer its parser reads with, so the shell's
reader and DuckDB's ``extract_statements`` end statements in the same places); for another
dialect (BigQuery's ``\\'`` escapes, raw and triple-quoted strings), sqlglot's. Each knows
its dialect's strings (``'…'`` with ``''``, DuckDB's ``E'…\\''`` and ``$$…$$``), quoted
identifiers and comments, and reads the text once, so splitting is linear in its length.
DuckDB's ``extract_statements`` cannot split what it cannot parse (BigQuery ML's
``CREATE MODEL ... OPTIONS(...)``), hence a tokenizer rather than the parser.

A script that mixes BigQuery ML with DuckDB SQL is read by both dialects' rules, and
where they end statements in different places (``SELECT 'x\\'; DROP TABLE t; …``, one
statement to BigQuery, three to DuckDB) it is refused rather than guessed
(:class:`AmbiguousScript`). Only the ends are compared: a statement may start at another
token in each (BigQuery's ``#standardSQL`` line is a comment there, not in DuckDB); the
statement's text is then the given dialect's, comment included, which the BigQuery
translation reads as a comment.

>>> split_statements("SELECT 1; SELECT $$a;b$$; -- done")
['SELECT 1', 'SELECT $$a;b$$']
>>> statement_complete("SELECT 'a;"), statement_complete("SELECT 'a;';  -- c")
(False, True)
>>> [ending(t) for t in ("SELECT 'a;", "-- c", "SELECT 1; -- c", "SELECT 1")]
['open', 'blank', 'end', 'more']
"""

from __future__ import annotations

import re
import threading

import duckdb
from sqlglot.dialects import Dialect
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

from ..errors import InvalidArgument

__all__ = ["ending", "statement_complete", "split_statements", "AmbiguousScript", "UnterminatedText"]

# A script that may hold BigQuery ML (model statements or ML.* functions): split by both dialects.
_BIGQUERY_ML = re.compile(r"\bML\s*\.|\bMODEL\b", re.IGNORECASE)


class UnterminatedText(InvalidArgument):
    """The text ends inside a string, a quoted identifier or a block comment."""


class AmbiguousScript(InvalidArgument):
    """BigQuery's and DuckDB's rules end the script's statements in different places."""


# a sqlglot tokenizer holds its state while it reads, so each thread keeps its own, one per dialect
_TOKENIZERS = threading.local()
# DuckDB's tokenizer reports no unterminated string: a ';' on a line of its own after the text
# is a token of its own exactly when the text ends outside strings and block comments
_SENTINEL = "\n;"


def _tokens(text: str, dialect: str) -> list[tuple[int, bool]]:
    """(start, whether it is a ``;``) of each of the dialect's tokens of ``text``, comments
    left out. Raises TokenError where the text ends inside a string, a quoted name or a
    block comment."""
    if dialect == "duckdb":
        tokens = duckdb.tokenize(text + _SENTINEL)
        if not tokens or tokens[-1][0] != len(text) + 1:
            raise TokenError(f"Error tokenizing {text[-40:]!r}")
        comment, operator = duckdb.token_type.comment, duckdb.token_type.operator
        return [(start, kind == operator and text[start] == ";") for start, kind in tokens[:-1] if kind != comment]
    cache = _TOKENIZERS.__dict__
    if dialect not in cache:
        cache[dialect] = Dialect.get_or_raise(dialect).tokenizer_class()
    return [(t.start, t.token_type == TokenType.SEMICOLON) for t in cache[dialect].tokenize(text)]


def _semicolons(text: str, dialect: str) -> tuple[list[tuple[int, int]], bool]:
    """(spans of the statements' tokens, whether the last token is a ';'). Raises TokenError."""
    tokens = _tokens(text, dialect)
    spans, first = [], None
    for start, semicolon in tokens:
        if semicolon:
            if first is not None:
                spans.append((first, start))
            first = None
        elif first is None:
            first = start
    ends = not tokens or tokens[-1][1]
    if first is not None:
        spans.append((first, len(text)))
    return spans, ends


def ending(text: str, dialect: str = "duckdb") -> str:
    """How ``text`` ends: ``"open"`` inside a string, a quoted name or a block comment;
    ``"blank"`` when it holds no token (spaces and comments only); ``"end"`` at a ``;``
    (comments may follow); ``"more"`` otherwise."""
    try:
        tokens = _tokens(text, dialect)
    except TokenError:
        return "open"
    if not tokens:
        return "blank"
    return "end" if tokens[-1][1] else "more"


def statement_complete(text: str, dialect: str = "duckdb") -> bool:
    """Whether ``text`` ends with a ``;`` outside strings and comments (comments may follow)."""
    return ending(text, dialect) == "end"


def split_statements(text: str, dialect: str = "duckdb") -> list[str]:
    """The statements of ``text``, each without its ``;``; empty ones (comments only) left
    out. A text that may hold BigQuery ML is split by BigQuery's rules too, and refused
    (``AmbiguousScript``) where the two disagree; an unterminated string or comment is
    ``UnterminatedText``."""
    if dialect == "bigquery" or not _BIGQUERY_ML.search(text):
        return _split(text, dialect)
    ends = []
    for each in (dialect, "bigquery"):
        try:
            ends.append([end for _, end in _spans(text, each)])
        except UnterminatedText:
            ends.append(None)
    if ends[0] is None and ends[1] is None:
        return _split(text, dialect)    # raises UnterminatedText
    if ends[0] != ends[1]:
        raise AmbiguousScript(
            "the script holds BigQuery ML, and BigQuery's string rules (\\' escapes a quote) and DuckDB's "
            "('' escapes a quote) end its statements in different places; dbml runs neither reading: write "
            "strings without \\' in BigQuery ML scripts")
    return _split(text, dialect)


def _spans(text: str, dialect: str) -> list[tuple[int, int]]:
    try:
        return _semicolons(text, dialect)[0]
    except TokenError as e:
        raise UnterminatedText(f"the SQL text ends inside a string, a quoted name or a block comment "
                               f"({str(e).splitlines()[0][:80]}); close it") from None


def _split(text: str, dialect: str) -> list[str]:
    return [text[start:end].strip() for start, end in _spans(text, dialect)]
