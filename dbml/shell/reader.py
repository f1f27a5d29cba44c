"""Where a statement typed or read line by line ends, by :mod:`dbml.core.sqltext`'s rule.

The CLI collects lines until the text ends with a ``;`` outside quotes, ``$tag$`` strings and
comments, then hands the whole text to DuckDB's parser, which splits it into statements.
Whether the text has ended is :func:`dbml.core.sqltext.ending`'s answer (DuckDB's own tokenizer,
the lexer of the parser that then splits the text), the rule every splitter of dbml uses. :class:`SqlBuffer` asks it about
the lines since the last place the tokens were whole, not the whole buffer, so a statement
of any length is read in linear time (the CLI rescans the buffer at every line holding a
``;``: a 2,000-line statement used to take 31 s).

>>> buf = SqlBuffer()
>>> buf.add("SELECT 'a;"), buf.add("b'; -- done")
(False, True)
"""

from __future__ import annotations

from ..core.sqltext import ending

__all__ = ["SqlBuffer", "all_whitespace"]

# Inside a string, a quoted name or a block comment, only a line holding one of these can
# close it (a quote, a $tag$, */): other lines are not read again.
_CLOSERS = ("'", '"', "$", "*/", "`")


class SqlBuffer:
    """The text of the statement being read, and how it ends.

    ``ending`` is :func:`dbml.core.sqltext.ending`'s answer for the whole text: ``"blank"``
    (spaces and comments), ``"open"`` (inside a string, quoted name or block comment),
    ``"end"`` (complete: its last token is ``;``) or ``"more"``.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ending = "blank"
        self._open: list[str] = []      # the lines since the tokens were last whole
        self._whole = "blank"           # the ending of the text before them

    def __bool__(self) -> bool:
        return bool(self.lines)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def clear(self) -> None:
        self.__init__()

    def add(self, line: str) -> bool:
        """Append one line (without its newline); whether the text now forms whole statements."""
        if not self.lines:
            line = line.lstrip()
        self.lines.append(line)
        self._open.append(line)
        if self.ending == "open" and not any(c in line for c in _CLOSERS):
            return False
        tail = ending("\n".join(self._open))
        if tail == "open":
            self.ending = "open"
        else:
            self._open = []
            self.ending = self._whole = self._whole if tail == "blank" else tail
        return self.complete()

    def complete(self) -> bool:
        return self.ending == "end"

    def blank(self) -> bool:
        """Whether the text holds only spaces and comments."""
        return self.ending == "blank"


def all_whitespace(text: str) -> bool:
    """Whether ``text`` holds only spaces and comments (the CLI skips such input)."""
    return ending(text) == "blank"
