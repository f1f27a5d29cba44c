"""Where a statement typed or read line by line ends, as DuckDB's CLI decides it.

The CLI collects lines until the text ends with a ``;`` outside quotes, ``$tag$`` strings and
comments (sqlite's ``sqlite3_complete`` rule, DuckDB's ``SQLIsComplete``), then hands the
whole text to DuckDB's parser, which splits it into statements. The CLI rescans the whole
buffer at every line holding a ``;``; :class:`SqlBuffer` keeps the scanner's state between
lines instead, so each character is looked at once and a statement of any length is read
in linear time (a 2,000-line statement used to take 31 s).

>>> buf = SqlBuffer()
>>> buf.add("SELECT 'a;"), buf.add("b'; -- done")
(False, True)
"""

from __future__ import annotations

import re

__all__ = ["SqlBuffer", "all_whitespace"]

# the characters that can change the scanner's state; everything else is plain text
_SPECIAL = re.compile(r"[;'\"$/\-]")
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$")
_SPACE = " \t\n\r\f"


class SqlBuffer:
    """The text of the statement being read, and whether it is complete.

    ``state`` is where the scan stands at the end of the text: ``None`` (plain SQL),
    ``"'"`` or ``'"'`` (inside a quoted string or identifier), ``"E'"`` (an escape string,
    where ``\\'`` does not end it: the CLI's rule misses this and waits for more input),
    ``"/*"`` (a block comment) or ``"$tag$"`` (a dollar-quoted string). ``last`` is the last significant character outside
    them: the text is complete when it is ``;`` (comments and spaces do not count).
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.state: str | None = None
        self.last = ""

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
        self._scan(line)
        return self.complete()

    def complete(self) -> bool:
        return self.state is None and self.last == ";"

    def _scan(self, line: str) -> None:
        i, n = 0, len(line)
        while i < n:
            if self.state is not None:
                i = self._close(line, i)
                continue
            m = _SPECIAL.search(line, i)
            if m is None:
                self._plain(line[i:])
                return
            self._plain(line[i:m.start()])
            i = self._open(line, m.start())

    def _plain(self, text: str) -> None:
        stripped = text.rstrip(_SPACE)
        if stripped:
            self.last = stripped[-1]

    def _open(self, line: str, i: int) -> int:
        """At a special character outside quotes and comments; the index after what it starts."""
        ch, pair = line[i], line[i:i + 2]
        if ch == ";":
            self.last = ";"
        elif ch in "'\"":
            self.state = "E'" if ch == "'" and _escape_string(line, i) else ch
        elif pair == "--":
            return len(line)               # a line comment runs to the end of the line
        elif pair == "/*":
            self.state = "/*"
            return i + 2
        elif ch == "$":
            tag = _DOLLAR_TAG.match(line, i)
            if tag is None:
                self.last = "$"
                return i + 1
            self.state = tag.group(0)
            return tag.end()
        else:
            self.last = ch                 # a lone '/' or '-'
        return i + 1

    def _close(self, line: str, i: int) -> int:
        """Inside a string or comment: the index after its end, or the end of the line."""
        end = {"/*": "*/", "E'": "'"}.get(self.state, self.state)
        j = line.find(end, i)
        while self.state == "E'" and j >= 0 and 0 <= line.find("\\", i, j):
            i = line.find("\\", i, j) + 2     # in E'...' a backslash escapes the next character
            j = line.find(end, i)
        if j < 0:
            return len(line)
        if self.state in ("'", '"', "E'"):
            self.last = self.state        # a string is significant text, not a ';'
        self.state = None
        return j + len(end)


def _escape_string(line: str, i: int) -> bool:
    """Whether the quote at ``i`` opens an E'...' string (backslash escapes, as DuckDB reads it)."""
    return i > 0 and line[i - 1] in "eE" and (i == 1 or not (line[i - 2].isalnum() or line[i - 2] in "_$"))


def all_whitespace(text: str) -> bool:
    """Whether ``text`` holds only spaces and comments (the CLI skips such input)."""
    first = text.lstrip(_SPACE)[:1]
    if first not in ("", "-", "/"):
        return False
    buf = SqlBuffer()
    for line in text.split("\n"):
        buf.add(line)
    return buf.state is None and buf.last == ""
