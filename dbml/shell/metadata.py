"""Tables as DuckDB's CLI draws them: ``.tables``, ``.databases`` and ``DESCRIBE`` in duckbox mode.

Each table is a small box: its name, then one line per column (name, lowercase type,
constraints), its estimated row count; boxes of one schema are packed side by side and
under each other within the width, under a line naming the database and the schema.
This is the CLI's own layout (``shell_render_table_metadata.cpp``, ported; no duckdb-python
API draws it); the catalog facts come from DuckDB (``duckdb_columns()``, ``DESCRIBE``).
dbml's own objects (its catalog tables, the ``dbml_*`` views, the scratch database) are
left out of ``.tables``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .render import render_width, terminal_width

__all__ = ["TableInfo", "ColumnInfo", "describe_name", "render_describe", "render_tables", "large_number",
           "truncate"]

SPLIT_THRESHOLD, MIN_COMPONENT = 20, 5


@dataclass
class ColumnInfo:
    name: str
    type: str
    primary_key: bool = False
    not_null: bool = False
    unique: bool = False
    default: str = ""


@dataclass
class TableInfo:
    name: str
    columns: list[ColumnInfo]
    database: str = ""
    schema: str = ""
    estimated_size: int | None = None
    is_view: bool = False


def large_number(numeric: str, decimal_sep: str = ".") -> str:
    """``59986052`` -> ``59.99 million`` (DuckDB's BoxRenderer::TryFormatLargeNumber), or ''."""
    if len(numeric) <= 5:
        return ""
    negative = numeric.startswith("-")
    digits = numeric[1:] if negative else numeric
    digits = digits.split(".", 1)[0]
    if not digits.isdigit() or len(digits) > 19 or int(digits) > 10 ** 19:
        return ""
    number = int(digits)
    base, unit = 0, ""
    for b, name in ((10 ** 6, "million"), (10 ** 9, "billion"), (10 ** 12, "trillion"), (10 ** 15, "quadrillion"),
                    (10 ** 18, "quintillion")):
        if number + b // 200 >= b:
            base, unit = b, name
    if not unit:
        return ""
    text = str((number + base // 200) // (base // 100))
    return f"{'-' if negative else ''}{text[:-2]}{decimal_sep or '.'}{text[-2:]} {unit}"


def truncate(text: str, width: int) -> tuple[str, int]:
    """``text`` cut to ``width`` columns with an ellipsis; the text and its width."""
    have = render_width(text)
    if have <= width:
        return text, have
    out, used = "", 0
    for ch in text:
        w = render_width(ch)
        if used + w > width - 1:
            break
        out, used = out + ch, used + w
    return out + "…", used + 1


class _Table:
    """One table's box: its components measured (the CLI's ShellTableRenderInfo)."""

    def __init__(self, table: TableInfo, decimal_sep: str = "."):
        self.table = table
        self.name, self.name_width = table.name, render_width(table.name)
        constraints = any(c.not_null or c.unique or c.default for c in table.columns)
        rows = []
        for c in table.columns:
            kind = c.type.lower()
            comps = [(c.name, "primary_key_column" if c.primary_key else "column_name"),
                     ("decimal" if kind.startswith("decimal") else kind, "column_type")]
            if constraints:
                parts = (["not null"] if c.not_null else []) + (["unique"] if c.unique else []) + \
                        ([f"default {c.default}"] if c.default else [])
                comps.append((" ".join(parts), "column_type"))
            rows.append([[text, render_width(text), element] for text, element in comps])
        count = 2 + constraints
        self.widths = [max([r[i][1] for r in rows] + [0]) for i in range(count)]
        self.splits = [rows]
        self.width = max(self.name_width + 4, self.per_column())
        self.size_text = None
        if table.estimated_size is not None:
            size = str(table.estimated_size)
            self.size_text = (large_number(size, decimal_sep) or size) + " rows"
            self.width = max(self.width, render_width(self.size_text) + 4)

    def per_column(self, widths=None) -> int:
        widths = self.widths if widths is None else widths
        return 4 + sum(widths) + len(widths) - 1

    def column_lines(self) -> int:
        return len(self.splits[0])

    def line_count(self) -> int:
        return self.column_lines() + 4 + (2 if self.size_text is not None else 0)

    def truncate(self, max_width: int) -> None:
        if self.width <= max_width:
            return
        self.name, self.name_width = truncate(self.name, max_width - 4)
        if self.per_column() > max_width:
            if self.widths[0] + len(self.widths) * MIN_COMPONENT > max_width:
                self.widths[0] = max_width - len(self.widths) * MIN_COMPONENT
            total = self.per_column()
            for i in range(1, len(self.widths)):
                if total <= max_width:
                    break
                if self.widths[i] <= MIN_COMPONENT:
                    continue
                cut = min(total - max_width, self.widths[i] - MIN_COMPONENT)
                self.widths[i] -= cut
                total -= cut
            for row in self.splits[0]:
                for i, comp in enumerate(row):
                    comp[0], comp[1] = truncate(comp[0], self.widths[i])
        self.width = max_width

    def split(self, max_width: int) -> None:
        columns = self.splits[0]
        if len(columns) <= SPLIT_THRESHOLD:
            return
        most = (len(columns) + SPLIT_THRESHOLD - 1) // SPLIT_THRESHOLD
        fits = max_width // self.per_column()
        if fits <= 1:
            return
        count = min(most, fits)
        self.splits = [columns[i::count] for i in range(count)]
        self.width = max(self.width, count * self.per_column())


@dataclass
class _Stack:
    """Tables drawn one under another; stacks stand side by side (the CLI's TableMetadataLine)."""
    tables: list
    width: int
    height: int
    widths: list[int] = field(default_factory=list)

    def line(self, paint, idx: int, last: bool) -> str:
        for t in self.tables:
            if idx < t.line_count():
                return _table_line(paint, t, self, idx)
            idx -= t.line_count()
        return "" if last else paint(" " * self.width, "layout")


def _table_line(paint, t: _Table, stack: _Stack, idx: int) -> str:
    w, layout = stack.width, "view_layout" if t.table.is_view else "table_layout"
    if idx == 0:
        return paint("┌" + "─" * (w - 2) + "┐", layout)
    if idx == 1:
        space = w - t.name_width - 2
        return paint("│" + " " * (space // 2), layout) + paint(t.name, "table_name") + \
            paint(" " * (space - space // 2) + "│", layout)
    lines = t.column_lines()
    if 2 < idx < lines + 3:
        return _column_line(paint, t, stack, idx - 3, layout)
    if idx == 2 or (t.size_text is not None and idx == lines + 3):
        return paint("│" + " " * (w - 2) + "│", layout)
    if t.size_text is not None and idx == lines + 4:
        space = w - render_width(t.size_text) - 2
        return paint("│" + " " * (space // 2), layout) + paint(t.size_text, "comment") + \
            paint(" " * (space - space // 2) + "│", layout)
    return paint("└" + "─" * (w - 2) + "┘", layout)


def _column_line(paint, t: _Table, stack: _Stack, column: int, layout: str) -> str:
    per_column = t.per_column(stack.widths)
    extra = stack.width - len(t.splits) * per_column
    per_split = extra // len(t.splits)
    out = []
    for n, split in enumerate(t.splits):
        last = n + 1 == len(t.splits)
        lead = "│" if n == 0 else " "
        if column < len(split):
            out.append(paint(lead + " ", layout))
            for i, (text, width, element) in enumerate(split[column]):
                out.append(paint(text, element))
                pad = stack.widths[i] - width + 1
                if extra > 0:
                    add = extra if last else per_split
                    pad, extra = pad + add, extra - add
                out.append(paint(" " * pad, layout))
        else:
            out.append(paint(" " * (per_column - 1), layout))
        out.append(paint("│" if last else " ", layout))
    return "".join(out)


def _pack(tables: list[_Table], max_width: int) -> list[list[_Stack]]:
    """Greedy: the tallest table opens a display; smaller ones join a stack below another
    table where the height allows, or a new stack beside while the width allows."""
    tables = sorted(tables, key=lambda t: -t.line_count())
    placed, displays = set(), []
    for i, first in enumerate(tables):
        if i in placed:
            continue
        placed.add(i)
        stacks = [_Stack([first], first.width, first.line_count(), list(first.widths))]
        total_width, height = first.width, first.line_count()
        for j in range(i + 1, len(tables)):
            t = tables[j]
            if j in placed or t.line_count() > height:
                continue
            added = False
            for s in stacks:
                if s.height + t.line_count() > height:
                    continue
                widths = [max(a, b) for a, b in zip(s.widths, t.widths)] + s.widths[len(t.widths):]
                new_width = max(t.width, s.width, 3 + sum(w + 1 for w in widths))
                if total_width + new_width - s.width > max_width:
                    continue
                total_width += new_width - s.width
                s.widths, s.width, s.height = widths, new_width, s.height + t.line_count()
                s.tables.append(t)
                added = True
                break
            if not added and total_width + t.width <= max_width:
                stacks.append(_Stack([t], t.width, t.line_count(), list(t.widths)))
                total_width += t.width
                added = True
            if added:
                placed.add(j)
        stacks.sort(key=lambda s: -s.height)
        displays.append((first.table.database, first.table.schema, stacks, total_width, height))
    return displays


def _title(paint, text: str, width: int, element: str) -> str:
    text, size = truncate(text, width - 4)
    lines = width - size - 4
    return paint(" " + "─" * (lines // 2) + " " + text + " " + "─" * (lines - lines // 2) + " \n", element)


def render_tables(tables: list[TableInfo], max_width: int, paint=None) -> str:
    """The text of a list of tables (``.tables``, ``.databases``, DESCRIBE)."""
    paint = paint or (lambda text, element: text)
    infos = [_Table(t) for t in tables]
    for t in infos:
        t.truncate(max_width)
        t.split(max_width)
    groups: dict = {}
    for t in infos:
        groups.setdefault(t.table.database, {}).setdefault(t.table.schema, []).append(t)
    displays = [d for db in sorted(groups) for schema in sorted(groups[db]) for d in _pack(groups[db][schema], max_width)]
    title_width = 0
    for db, schema, _, width, _ in displays:
        title_width = max(title_width, min(max_width, max(render_width(db), render_width(schema)) + 6), width)
    out, last_db, last_schema = [], None, None
    for db, schema, stacks, _, height in displays:
        if db and db != last_db:
            out.append(_title(paint, db, title_width, "database_name"))
            last_db, last_schema = db, None
        if schema and schema != last_schema:
            out.append(_title(paint, schema, title_width, "schema_name"))
            last_schema = schema
        for idx in range(height):
            out.append("".join(s.line(paint, idx, n + 1 == len(stacks)) for n, s in enumerate(stacks)))
            out.append(paint("\n", "layout"))
    return "".join(out)


def describe_name(db, sql: str, names: list[str]) -> str | None:
    """The table a ``DESCRIBE``/``SHOW`` statement describes ('Describe' for a query), or
    None when ``sql`` is no such statement (DuckDB's parser decides: json_serialize_sql)."""
    if names[:2] != ["column_name", "column_type"] or sql.lstrip()[:4].lower() not in ("desc", "show"):
        return None
    tree = json.loads(db.execute("SELECT json_serialize_sql(?)", [sql]).fetchall()[0][0])
    if tree.get("error"):
        return None
    node = tree["statements"][0]["node"]
    ref = node.get("from_table") or {}
    if ref.get("type") != "SHOW_REF" or ref.get("show_type") not in ("DESCRIBE", "SHOW"):
        return None
    if ref.get("table_name"):
        return ref["table_name"]
    inner = (ref.get("query") or {}).get("from_table") or {}
    return inner.get("table_name") or "Describe" if inner.get("type") == "BASE_TABLE" else "Describe"


def render_describe(shell, name: str, rows) -> str:
    columns = [ColumnInfo(r[0], r[1], primary_key=r[3] == "PRI", not_null=r[2] == "NO", unique=r[3] == "UNI",
                          default=r[4] or "") for r in rows]
    return render_tables([TableInfo(name, columns)], max_render_width(shell), shell_paint(shell))


def max_render_width(shell) -> int:
    return max(shell.display.max_width or terminal_width(), 80)


def shell_paint(shell):
    """Colours for these boxes: on a terminal (the CLI colours them in a pipe too)."""
    if shell.output.console and shell.highlight.enabled and shell.output.stream is shell.output.stdout:
        return shell.highlight.paint
    return None
