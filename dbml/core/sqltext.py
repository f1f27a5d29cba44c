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

__all__ = ["ending", "statement_complete", "split_statements", "bigquery_markers", "code_tokens", "AmbiguousScript",
           "UnterminatedText"]



class UnterminatedText(InvalidArgument):
    """The text ends inside a string, a quoted identifier or a block comment."""


class AmbiguousScript(InvalidArgument):
    """BigQuery's and DuckDB's rules end the script's statements in different places."""


# a sqlglot tokenizer holds its state while it reads, so each thread keeps its own, one per dialect
_TOKENIZERS = threading.local()
# DuckDB's tokenizer reports no unterminated string: a ';' on a line of its own after the text
# is a token of its own exactly when the text ends outside strings and block comments
_SENTINEL = "\n;"


# a byte that is not UTF-8, as a stream read with errors="surrogateescape" holds it
UNDECODABLE = re.compile("[\udc80-\udcff]")


def _duckdb_tokens(text: str) -> list[tuple[int, object]]:
    """(start, kind) of DuckDB's tokens of ``text``, comments included, the starts counted
    in characters of ``text`` (DuckDB counts UTF-8 bytes). A byte that is not UTF-8 is one
    character that tokenizes as U+FFFD does (DuckDB refuses the statement that holds it).
    Raises TokenError where the text ends inside a string, a quoted name or a block comment."""
    text = UNDECODABLE.sub("\ufffd", text)
    tokens = duckdb.tokenize(text + _SENTINEL)
    if not text.isascii():
        tokens = [(int(at), kind) for at, (_, kind) in zip(_characters(text + _SENTINEL, [t[0] for t in tokens]),
                                                           tokens)]
    if not tokens or tokens[-1][0] != len(text) + 1:
        raise TokenError(f"Error tokenizing {text[-40:]!r}")
    return tokens[:-1]


def _characters(text: str, offsets: list[int]):
    """The character index of each UTF-8 byte offset into ``text``: the characters that
    start before it (a character starts at each byte that is not a continuation byte)."""
    import numpy as np
    raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    starts = np.concatenate([[0], np.cumsum((raw & 0xC0) != 0x80)])
    return starts[np.asarray(offsets, dtype=np.int64)]


def _tokenizer(dialect: str):
    """This thread's sqlglot tokenizer of ``dialect``."""
    cache = _TOKENIZERS.__dict__
    if dialect not in cache:
        cache[dialect] = Dialect.get_or_raise(dialect).tokenizer_class()
    return cache[dialect]


def _tokens(text: str, dialect: str) -> list[tuple[int, bool]]:
    """(start, whether it is a ``;``) of each of the dialect's tokens of ``text``, comments
    left out. Raises TokenError where the text ends inside a string, a quoted name or a
    block comment."""
    if dialect == "duckdb":
        comment, operator = duckdb.token_type.comment, duckdb.token_type.operator
        return [(start, kind == operator and text[start] == ";") for start, kind in _duckdb_tokens(text)
                if kind != comment]
    return [(t.start, t.token_type == TokenType.SEMICOLON) for t in _tokenizer(dialect).tokenize(text)]


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


def bigquery_markers(text: str) -> bool:
    """Whether ``text`` is written for BigQuery, read as DuckDB reads it or as BigQuery does
    (their tokens: strings and comments are not code): a backquoted name; a line that starts
    with ``#`` not followed by a number (BigQuery's comment; DuckDB's ``#1`` is a column); an
    ``ML.`` function call; a statement that starts ``CREATE [OR REPLACE] MODEL`` or ``DROP
    MODEL``. Anything else is DuckDB's SQL, run as DuckDB reads it (``FROM ml.features``, a
    table named ``model``, ``'C:\\Users\\'``)."""
    if not could_be_bigquery(text):
        return False
    return _marked(text, _duckdb_code(text)) or _marked(text, _bigquery_code(text))


# what every marker of ``_marked`` holds: a backquote, a '#', the word ML or the word MODEL
_MARKER_PARTS = re.compile(r"[`#]|\bml\b|\bmodel\b", re.IGNORECASE)


def could_be_bigquery(text: str) -> bool:
    """Whether ``text`` holds what a BigQuery marker needs (``bigquery_markers``), by one scan
    of the characters: text without is DuckDB's, whatever its length, and is never tokenized
    twice over (a 3 MB expression's sqlglot tokens took 2 GB before DuckDB's own error)."""
    return _MARKER_PARTS.search(text) is not None


def _duckdb_code(text: str) -> list[int]:
    """The starts of DuckDB's tokens of ``text`` that are code (not strings or comments)."""
    try:
        tokens = _duckdb_tokens(text)
    except Exception:   # noqa: BLE001 - DuckDB's reading ends inside a string, or it refuses the text
        return []
    comment, string = duckdb.token_type.comment, duckdb.token_type.string_const
    return [start for start, kind in tokens if kind not in (comment, string)]


def code_tokens(text: str) -> list[tuple[str, object]]:
    """DuckDB's tokens of ``text`` other than comments: (the token's text, its
    ``duckdb.token_type``); [] where DuckDB's reading ends inside a string or a comment."""
    try:
        tokens = _duckdb_tokens(text)
    except Exception:   # noqa: BLE001 - DuckDB's reading ends inside a string, or it refuses the text
        return []
    ends = [start for start, _ in tokens[1:]] + [len(text)]
    return [(text[start:end].strip(), kind) for (start, kind), end in zip(tokens, ends)
            if kind != duckdb.token_type.comment]


def _bigquery_code(text: str) -> list[int]:
    try:
        tokens = _tokenizer("bigquery").tokenize(text)
    except Exception:   # noqa: BLE001 - BigQuery's reading ends inside a string
        return []
    strings = (TokenType.STRING, TokenType.RAW_STRING, TokenType.NATIONAL_STRING, TokenType.BYTE_STRING)
    return [t.start for t in tokens if t.token_type not in strings]


def _marked(text: str, code: list[int]) -> bool:
    words = [_word(text, start) for start in code]
    for i, (start, word) in enumerate(zip(code, words)):
        if word.startswith("`"):
            return True
        if word == "#" and (start == 0 or text[:start].rstrip(" \t").endswith("\n")) and \
                not (i + 1 < len(words) and words[i + 1][:1].isdigit() and code[i + 1] == start + 1):
            return True
        if word.upper() == "ML" and words[i + 1:i + 2] == ["."] and words[i + 3:i + 4] == ["("]:
            return True
    for s in [0] + [i + 1 for i, w in enumerate(words) if w == ";"]:
        head = [w.upper() for w in words[s:s + 4]]
        if head[:2] in (["CREATE", "MODEL"], ["DROP", "MODEL"]) or head == ["CREATE", "OR", "REPLACE", "MODEL"]:
            return True
    return False


_WORD = re.compile(r"`[^`]*`?|\w+|\S")


def _word(text: str, start: int) -> str:
    return _WORD.match(text, start).group(0)


def split_statements(text: str, dialect: str = "duckdb") -> list[str]:
    """The statements of ``text``, each without its ``;``; empty ones (comments only) left
    out. A text written for BigQuery (``bigquery_markers``) is split by BigQuery's rules
    too, and refused (``AmbiguousScript``) where the two disagree: whatever it holds, a
    write DuckDB would read where BigQuery reads a comment or a string does not run. An
    unterminated string or comment is ``UnterminatedText``. Any other text is split as
    DuckDB reads it."""
    if dialect == "bigquery" or not bigquery_markers(text):
        return _split(text, dialect)
    bigquery, duck = _split_or_none(text, "bigquery"), _split_or_none(text, dialect)
    if bigquery == [] and duck and all(s.startswith("#") for s in duck):
        return []   # BigQuery's comments only
    if bigquery is None and not duck:
        return _split(text, "bigquery")   # raises UnterminatedText: a lone backquote, say
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
            "the script is written for BigQuery (a backquoted name, a # comment, ML. or MODEL), and BigQuery's "
            "rules (\\' escapes a quote, # starts a comment) and DuckDB's ('' escapes a quote) end its statements "
            "in different places; dbml runs neither reading: write strings without \\' and comments with -- "
            "in such scripts")
    return _split(text, dialect)


def _split_or_none(text: str, dialect: str) -> list[str] | None:
    try:
        return _split(text, dialect)
    except UnterminatedText:
        return None


def _spans(text: str, dialect: str) -> list[tuple[int, int]]:
    try:
        return _semicolons(text, dialect)[0]
    except TokenError as e:
        raise UnterminatedText(f"the SQL text ends inside a string, a quoted name or a block comment "
                               f"({str(e).splitlines()[0][:80]}); close it") from None


def _split(text: str, dialect: str) -> list[str]:
    return [text[start:end].strip() for start, end in _spans(text, dialect)]
