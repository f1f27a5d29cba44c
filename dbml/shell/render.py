"""How the shell lays out a result in DuckDB CLI's text modes (``.mode``; ``.help mode``).

DuckDB renders every value: the shell reads each column cast to ``VARCHAR`` by DuckDB (nested
and floating-point columns cast to ``JSON`` first in the json modes), exactly as the CLI
converts its result chunks, so dates, intervals, nested values, infinities and blobs read
as DuckDB writes them. What is left here is the CLI's layout of those strings, which no
duckdb-python API offers: separators, quoting, alignment and the frames of ``box``,
``table``, ``markdown`` and ``latex`` (the CLI's ``shell_renderer.cpp``, byte for byte;
``tests/test_shell_render.py`` holds the CLI's documented outputs). ``duckbox``, the
default, is DuckDB's own box renderer (``dbml/shell/duckbox.py``).

The CLI's csv mode is sqlite's, not DuckDB's CSV writer: rows end in CRLF, any field with
a quote, a control or non-ASCII byte or the separator is quoted, NULL is ``.nullvalue``
and the separator is ``.separator``; ``COPY ... TO`` writes none of these, so csv is laid
out here too.
"""

from __future__ import annotations

import functools
import re
import shutil
import unicodedata
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB

from ..core.source import literal as sql_string
from ..core.source import quote

__all__ = ["Display", "Result", "MODES", "render_text", "render_width", "set_mode", "shown_width", "terminal_height",
           "terminal_width", "varchar_sql"]

# mode -> (column separator, row separator) that .mode sets; None leaves it as it is
MODES: dict[str, tuple[str | None, str | None]] = {
    "ascii": ("\x1f", "\x1e"), "box": (None, None), "column": (None, "\n"), "csv": (",", "\r\n"),
    "duckbox": (None, None), "html": (None, None), "insert": (None, None), "json": (None, None),
    "jsonlines": (None, None), "latex": (None, None), "line": (None, "\n"), "list": ("|", "\n"),
    "markdown": (None, None), "quote": (",", "\n"), "table": (None, None), "tabs": ("\t", None),
    "tcl": (" ", "\n"), "trash": (None, None),
}
_NUMERIC = {"tinyint", "smallint", "integer", "bigint", "hugeint", "utinyint", "usmallint", "uinteger",
            "ubigint", "uhugeint", "float", "double", "decimal"}
_NESTED = {"list", "struct", "map", "union", "array", "variant"}
_JSON_QUOTED = {"ubigint", "hugeint", "uhugeint", "decimal"}   # numbers JSON cannot hold exactly


@dataclass
class Display:
    """The display settings the dot commands and options change (the CLI's ShellState)."""
    mode: str = "duckbox"
    col_sep: str = "|"
    row_sep: str = "\n"
    null_value: str = "NULL"
    header: bool = True
    header_set: bool = False
    widths: list[int] = field(default_factory=list)
    table: str = "table"             # .mode insert TABLE
    newlines: bool = False           # .dump --newlines: strings keep their newlines
    max_rows: int = 40
    max_analyze_rows: int = 0
    max_width: int = 0
    columns: bool = False            # .columns: duckbox column-wise
    large_numbers: str = "default"   # all | footer | off | default
    decimal_sep: str = ""
    thousand_sep: str = ""


@dataclass
class Result:
    """A result as the text modes see it: names, DuckDB types and rows of DuckDB's text."""
    names: list[str]
    types: list          # duckdb.sqltypes.DuckDBPyType
    rows: Iterable[Sequence[str | None]]


def type_id(t) -> str:
    return getattr(t, "id", str(t).lower())


def is_numeric(t) -> bool:
    return type_id(t) in _NUMERIC


def set_mode(display: Display, name: str, table: str | None = None) -> str | None:
    """``.mode NAME [TABLE]``: the error text, or None. A prefix names the first mode that
    starts with it, as in the CLI (``.mode lin`` is line, ``.mode li`` is list)."""
    if table is not None and not "insert".startswith(name or "x"):
        return "TABLE argument can only be used with .mode insert"
    mode = _find_mode(name)
    if mode is None:
        return ("Error: mode should be one of: ascii box column csv duckbox html insert json jsonlines "
                "latex line list markdown quote table tabs tcl trash ")
    col, row = MODES[mode]
    display.col_sep = col if col is not None else display.col_sep
    display.row_sep = row if row is not None else display.row_sep
    if mode == "column" and display.header_set:
        display.header = True
    if mode == "insert":
        display.table = sql_identifier(table or "table")
    display.mode = "list" if mode == "tabs" else mode
    return None


def _find_mode(name: str) -> str | None:
    """The CLI's matching order: ``lines`` and ``list`` need three letters, others one."""
    order = ["lines", "columns", "list", "html", "tcl", "csv", "tabs", "insert", "quote", "ascii", "markdown",
             "table", "box", "duckbox", "json", "latex", "trash", "jsonlines"]
    for candidate in order:
        if name and candidate.startswith(name) and (candidate not in ("lines", "list") or len(name) > 2):
            return {"lines": "line", "columns": "column"}.get(candidate, candidate)
    return None


def varchar_sql(name: str, t, mode: str) -> exp.Expression:
    """The expression that makes DuckDB render one column (named ``name``) for ``mode``."""
    column: exp.Expression = exp.column(name, quoted=True)
    if mode in ("json", "jsonlines") and (type_id(t) in _NESTED | {"float", "double"}):
        column = exp.cast(column, "JSON", dialect="duckdb")
    return exp.cast(column, "VARCHAR", dialect="duckdb")


def terminal_width() -> int:
    return shutil.get_terminal_size((80, 24)).columns


def terminal_height() -> int:
    """The terminal's lines (``$LINES`` first, as for the width); 0 where stdout is no terminal."""
    return shutil.get_terminal_size((80, 0)).lines


# a terminal's control sequences (colours: ESC [ ... m), which take no columns on the screen
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def shown_width(line: str) -> int:
    """Terminal columns ``line`` takes as the terminal shows it: its colour codes none."""
    return render_width(_ESCAPES.sub("", line) if "\x1b" in line else line)


def render_width(text: str) -> int:
    """Terminal columns ``text`` takes: wide characters two, combining marks none."""
    if text.isascii():
        return len(text)
    width = 0
    for ch in text:
        if unicodedata.combining(ch) or ch in "\u200b\u200d\ufe0f":
            continue
        width += 2 if unicodedata.east_asian_width(ch) in "WF" else 1
    return width


def _align(text: str, width: int, how: str) -> str:
    space = max(width - render_width(text), 0)
    if how == "left":
        return text + " " * space
    if how == "right":
        return " " * space + text
    return " " * (space // 2) + text + " " * ((space + 1) // 2)


def render_text(result: Result, display: Display, write: Callable[[str], None]) -> None:
    """Write ``result`` in ``display.mode`` (any mode but duckbox and trash)."""
    mode = display.mode
    if mode in _COLUMNAR:
        _columnar(result, display, write, _COLUMNAR[mode])
    else:
        _ROWS[mode](result, display, write)


# -- row-wise modes --------------------------------------------------------------------------

def _rows(result: Result, null: str):
    for row in result.rows:
        yield [null if v is None else v for v in row], [v is None for v in row]


def _list(result: Result, d: Display, write) -> None:
    if d.header:
        write(d.col_sep.join(result.names) + d.row_sep)
    for row, _ in _rows(result, d.null_value):
        write(d.col_sep.join(row) + d.row_sep)


def _ascii(result: Result, d: Display, write) -> None:
    # the CLI's ascii renderer separates with newlines, whatever .separator says
    _list(result, Display(col_sep="\n", row_sep="\n", header=d.header, null_value=d.null_value), write)


def _line(result: Result, d: Display, write) -> None:
    width = max([5] + [len(n.encode()) for n in result.names])
    for i, (row, _) in enumerate(_rows(result, d.null_value)):
        if i:
            write(d.row_sep)
        write("".join(" " * (width - len(n.encode())) + f"{n} = {v}{d.row_sep}" for n, v in zip(result.names, row)))


def _html_escape(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
            .replace("'", "&#39;"))


def _html(result: Result, d: Display, write) -> None:
    if d.header:
        write("<tr>" + "".join(f"<th>{_html_escape(n)}</th>\n" for n in result.names) + "</tr>\n")
    for row, _ in _rows(result, d.null_value):
        write("<tr>" + "".join(f"<td>{_html_escape(v)}</td>\n" for v in row) + "</tr>\n")


def c_string(text: str) -> str:
    """The CLI's C-style quoting: backslash escapes, any non-printable byte as octal."""
    out = ['"']
    for b in text.encode("utf-8", "surrogateescape"):
        ch = chr(b)
        if ch in '\\"\t\n\r':
            out.append({"\\": "\\\\", '"': '\\"', "\t": "\\t", "\n": "\\n", "\r": "\\r"}[ch])
        elif 32 <= b < 127:
            out.append(ch)
        else:
            out.append(f"\\{b:03o}")
    return "".join(out) + '"'


def _tcl(result: Result, d: Display, write) -> None:
    if d.header:
        write(d.col_sep.join(c_string(n) for n in result.names) + d.row_sep)
    for row, _ in _rows(result, d.null_value):
        write(d.col_sep.join(c_string(v) for v in row) + d.row_sep)


def _csv_field(text: str, sep: str) -> str:
    if any(ord(c) <= 31 or ord(c) >= 127 or c in "\"'" for c in text) or (sep and sep in text):
        return '"' + text.replace('"', '""') + '"'
    return text


def _csv(result: Result, d: Display, write) -> None:
    if d.header:
        write(d.col_sep.join(_csv_field(n, d.col_sep) for n in result.names) + d.row_sep)
    for row, _ in _rows(result, d.null_value):
        write(d.col_sep.join(_csv_field(v, d.col_sep) for v in row) + d.row_sep)


def sql_identifier(name: str) -> str:
    """A name as DuckDB's ``SQLIdentifier`` writes it: bare when it is a plain word that is no
    keyword of DuckDB's parser (``duckdb_keywords()``), else quoted (by ``source.quote``, the
    one quoter)."""
    plain = name and not name[0].isdigit() and name.isascii() and all(c.isalnum() or c == "_" for c in name)
    if plain and name.lower() not in _keywords():
        return name
    return quote(name)


@functools.lru_cache(maxsize=1)
def _keywords() -> frozenset[str]:
    import duckdb
    with duckdb.connect() as con:
        return frozenset(r[0] for r in con.execute("SELECT keyword_name FROM duckdb_keywords()").fetchall())


def _quote(result: Result, d: Display, write) -> None:
    bare = [is_numeric(t) or type_id(t) == "boolean" for t in result.types]
    if d.header:
        write(d.col_sep.join(sql_string(n) for n in result.names) + d.row_sep)
    for row, nulls in _rows(result, "NULL"):
        write(d.col_sep.join(v if b or n else sql_string(v) for v, b, n in zip(row, bare, nulls)) + d.row_sep)


def json_string(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ord(ch) <= 0x1f:
            out.append({"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, f"\\u{ord(ch):04x}"))
        else:
            out.append(ch)
    return "".join(out) + '"'


def _json_raw(t) -> bool:
    """Written as DuckDB's text without quotes: numbers, booleans, nested values and JSON."""
    kind = type_id(t)
    return kind == "boolean" or kind in _NESTED or str(t) == "JSON" or (kind in _NUMERIC and kind not in _JSON_QUOTED)


def _json(result: Result, d: Display, write, array: bool = True) -> None:
    raw = [_json_raw(t) for t in result.types]
    keys = [json_string(n) + ":" for n in result.names]
    if array:
        write("[")
    for i, (row, nulls) in enumerate(_rows(result, "null")):
        if i:
            write(",\n" if array else "\n")
        write("{" + ",".join(k + (v if n or r else json_string(v)) for k, v, n, r in zip(keys, row, nulls, raw)) + "}")
    write("]\n" if array else "\n")


def _jsonlines(result: Result, d: Display, write) -> None:
    _json(result, d, write, array=False)


_LINE_BREAKS = re.compile("([\n\r\0])")


def cli_identifier(name: str) -> exp.Identifier:
    """A name as a tree that renders as :func:`sql_identifier` writes it."""
    return exp.Identifier(this=name, quoted=sql_identifier(name) != name)


class CliGenerator(DuckDB.Generator):
    """DuckDB's SQL in the spelling of the CLI's output (``.mode insert``, ``.dump``): a
    row's INSERT with no space before a parenthesis nor after a comma of its columns and
    values (``INSERT INTO t(a,b) VALUES(1,'x')``); everything else as DuckDB's dialect
    writes it. The statements are trees: a name or a value is never text in them."""

    def insert_sql(self, expression: exp.Insert) -> str:
        return "INSERT INTO " + self.sql(expression, "this") + " " + self.sql(expression, "expression")

    def schema_sql(self, expression: exp.Schema) -> str:
        return self.sql(expression, "this") + "(" + ",".join(self.sql(e) for e in expression.expressions) + ")"

    def values_sql(self, expression: exp.Values, values_as_table: bool = True) -> str:
        (row,) = expression.expressions
        return "VALUES(" + ",".join(self.sql(e) for e in row.expressions) + ")"


class CliDebugGenerator(CliGenerator):
    """The spelling of the statements the CLI prints for ``--debug`` (``.schema``): calls
    with no space after their commas, ``a!=b``, ``x IS NOT NULL``."""

    def anonymous_sql(self, expression: exp.Anonymous) -> str:
        return f"{expression.name}(" + ",".join(self.sql(e) for e in expression.expressions) + ")"

    def lower_sql(self, expression: exp.Lower) -> str:
        return f"lower({self.sql(expression, 'this')})"

    def neq_sql(self, expression: exp.NEQ) -> str:
        return f"{self.sql(expression, 'this')}!={self.sql(expression, 'expression')}"

    def not_sql(self, expression: exp.Not) -> str:
        inner = expression.this
        if isinstance(inner, exp.Is) and isinstance(inner.expression, exp.Null):
            return f"{self.sql(inner, 'this')} IS NOT NULL"
        return super().not_sql(expression)


def cli_sql(tree: exp.Expression, debug: bool = False) -> str:
    generator = CliDebugGenerator if debug else CliGenerator
    return generator(dialect="duckdb", normalize_functions=False).generate(tree)


def insert_value(text: str, newlines: bool) -> exp.Expression:
    """A string as a SQL value for .mode insert and .dump; newlines as chr() unless kept."""
    if newlines or not any(c in text for c in "\n\r\0"):
        return exp.Literal.string(text)
    pieces = _LINE_BREAKS.split(text)    # text, a break, text, ...: the breaks as chr(n)
    return exp.Anonymous(this="concat", expressions=[
        exp.Literal.string(p) if i % 2 == 0 else exp.Anonymous(this="chr", expressions=[exp.Literal.number(ord(p))])
        for i, p in enumerate(pieces)])


def _insert(result: Result, d: Display, write) -> None:
    """The CLI's insert mode: each row as the text of an INSERT statement, written out (dbml runs none)."""
    numeric = [is_numeric(t) for t in result.types]
    table = exp.to_table(d.table, dialect="duckdb")
    into = exp.Schema(this=table, expressions=[cli_identifier(n) for n in result.names]) if d.header else table
    for row in result.rows:
        # a number as DuckDB wrote it ('-inf', '-1e+300'): Literal.number would rewrite it
        values = [exp.null() if v is None else exp.Literal(this=v, is_string=False) if num else insert_value(v, d.newlines)
                  for v, num in zip(row, numeric)]
        write(cli_sql(exp.Insert(this=into, expression=exp.Values(expressions=[exp.tuple_(*values)]))) + ";\n")


_ROWS = {"list": _list, "ascii": _ascii, "line": _line, "html": _html, "tcl": _tcl, "csv": _csv, "quote": _quote,
         "json": _json, "jsonlines": _jsonlines, "insert": _insert}


# -- column-wise modes: every row is read first, for the widths ------------------------------

@dataclass(frozen=True)
class _Frame:
    """How one columnar mode frames its rows (the CLI's ModeColumn/Table/Markdown/Box/Latex)."""
    start: str
    sep: str
    end: str
    header: Callable
    footer: Callable | None = None
    convert: Callable[[str], str] | None = None


def _rule(widths, left, mid, right, fill="-"):
    return left + mid.join(fill * (w + 2) for w in widths) + right + "\n"


def _header_row(f: _Frame, names, widths) -> str:
    return f.start + f.sep.join(_align(n, w, "center") for n, w in zip(names, widths)) + f.end


def _column_header(f, names, widths, types, d):
    if not d.header:
        return ""
    aligned = [_align(n, w, "right" if r else "left") for n, (w, r) in zip(names, widths)]
    return "  ".join(aligned) + "\n" + "  ".join("-" * w for w, _ in widths) + "\n"


def _table_header(f, names, widths, types, d):
    return _rule(widths, "+", "+", "+") + _header_row(f, names, widths) + _rule(widths, "+", "+", "+")


def _markdown_header(f, names, widths, types, d):
    rule = "".join("|" + ("-" * (w + 1) + ":" if is_numeric(t) else "-" * (w + 2)) for w, t in zip(widths, types))
    return _header_row(f, names, widths) + rule + "|\n"


def _box_header(f, names, widths, types, d):
    return _rule(widths, "┌", "┬", "┐", "─") + _header_row(f, names, widths) + _rule(widths, "├", "┼", "┤", "─")


def _latex_header(f, names, widths, types, d):
    spec = "".join("r" if type_id(t) in ("tinyint", "smallint", "integer", "bigint", "float", "double", "decimal")
                   else "l" for t in types)
    return "\\begin{tabular}{|" + spec + "|}\n\\hline\n" + _header_row(f, names, widths) + "\\hline\n"


_COLUMNAR = {
    "column": _Frame("", "  ", "\n", _column_header),
    "table": _Frame("| ", " | ", " |\n", _table_header, lambda w: _rule(w, "+", "+", "+")),
    "markdown": _Frame("| ", " | ", " |\n", _markdown_header, convert=lambda v: v.replace("|", "\\|")),
    "box": _Frame("│ ", " │ ", " │\n", _box_header, lambda w: _rule(w, "└", "┴", "┘", "─"),
                  convert=lambda v: v.replace("\n", "\\n")),
    "latex": _Frame("", " & ", " \\\\\n", _latex_header, lambda w: "\\hline\n\\end{tabular}\n"),
}


def _columnar(result: Result, d: Display, write, f: _Frame) -> None:
    convert = f.convert or (lambda v: v)
    names = [convert(n) for n in result.names]
    rows = [[convert(v) for v in row] for row, _ in _rows(result, d.null_value)]
    widths = []
    for i, name in enumerate(names):
        w = d.widths[i] if i < len(d.widths) else 0
        width = max([abs(w), render_width(name)] + [render_width(r[i]) for r in rows])
        widths.append((width, w < 0))
    plain = [w for w, _ in widths]
    if f.header is _column_header:
        write(_column_header(f, names, widths, result.types, d))
    else:
        write(f.header(f, names, plain, result.types, d))
    for row in rows:
        write(f.start + f.sep.join(_align(v, w, "right" if r else "left") for v, (w, r) in zip(row, widths)) + f.end)
    if f.footer is not None:
        write(f.footer(plain))
