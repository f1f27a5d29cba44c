"""``duckbox``, the default mode, and ``EXPLAIN``: DuckDB's own box renderer draws the result.

``RelationResult.to_box`` (what ``DuckDBPyRelation.show()`` prints) is DuckDB's
``BoxRenderer``: types, alignment, NULLs, nested values, wrapping, the cut to ``.maxrows``
and the footer are DuckDB's, byte for byte the CLI's. What duckdb-python leaves out of its
configuration is added after the box is drawn, and only when asked for:

- ``.highlight_results on``: the names, types and NULLs of the box in the CLI's colours
  (NULL is drawn as a private-use marker of the same width, then painted);
- the hint "use .last to show entire result" the CLI puts in the footer of a cut result.

``.large_number_rendering``, ``.thousand_sep`` and ``.decimal_sep`` are DuckDB settings of
the CLI's renderer that duckdb-python does not expose (``dbml/shell/numbers.py``).
"""

from __future__ import annotations

import re

from .engine import UNLIMITED
from .highlight import Highlighter
from .render import Display, render_width

__all__ = ["box", "explain_text", "NULL_MARK"]

NULL_MARK = "\ue000"          # private use: never in a result, one column wide
HINT = "use .last to show entire result"


def box(result, display: Display, width: int | None, highlighter: Highlighter | None = None,
        unlimited: bool = False) -> str:
    """The box of a DuckDB result. ``width``: the terminal's, or None for no limit (a pipe
    or a file); ``unlimited``: ``.last`` and ``.output FILE`` draw every row."""
    max_rows = display.max_rows if display.max_rows >= 0 else UNLIMITED
    max_width = display.max_width or width or UNLIMITED
    if unlimited:
        max_rows = max_width = UNLIMITED
    null = display.null_value
    paint = highlighter is not None and highlighter.enabled
    options = dict(max_width=max_width, max_rows=max_rows, null_value=NULL_MARK * render_width(null) if paint else null)
    if display.columns:
        import duckdb
        options["render_mode"] = duckdb.RenderMode.COLUMNS
    text = result.to_box(**options)
    text = _with_hint(text)
    return _paint(text, highlighter, null) if paint else text


_FOOTER = re.compile(r"^  (\S.*? rows?(?: \([^)]*\))?)( +)(\d+ columns?(?: \(\d+ shown\))?)$")


def _with_hint(text: str) -> str:
    """The CLI's footer names ``.last`` where rows or columns were left out, when there is room
    (the footer line that holds both counts, as DuckDB's BoxRenderer lays it out)."""
    lines = text.split("\n")
    bottom = next((i for i, line in enumerate(lines) if line.startswith("└")), None)
    if bottom is None or bottom + 1 >= len(lines) or "shown)" not in "".join(lines[bottom + 1:]):
        return text
    m = _FOOTER.match(lines[bottom + 1])
    if m is None or len(m.group(2)) < len(HINT) + 10:
        return text
    padding = len(m.group(2)) - len(HINT)
    lines[bottom + 1] = f"  {m.group(1)}{' ' * (padding // 2)}{HINT}{' ' * (padding - padding // 2)}{m.group(3)}"
    return "\n".join(lines)


def _paint(text: str, h: Highlighter, null: str) -> str:
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        if i in (1, 2) and line.startswith("│"):
            element = "column_name" if i == 1 else "column_type"
            cells = line.split("│")
            line = "│".join(_paint_cell(c, h, element) for c in cells)
        out.append(line)
    text = "\n".join(out)
    if NULL_MARK in text:
        mark = NULL_MARK * render_width(null)
        text = text.replace(mark, h.paint(null, "null_value"))
    return text


def _paint_cell(cell: str, h: Highlighter, element: str) -> str:
    core = cell.strip(" ")
    if not core:
        return cell
    left = cell.index(core)
    return cell[:left] + h.paint(core, element) + cell[left + len(core):]


_PLANS = {"logical_plan": "Unoptimized Logical Plan ", "logical_opt": " Optimized Logical Plan  ",
          "physical_plan": "      Physical Plan      "}


def explain_text(rows) -> str:
    """EXPLAIN's rows as the CLI prints them: each plan under a small title box."""
    out = []
    for key, plan in rows:
        if key in _PLANS:
            out.append("\n┌─────────────────────────────┐\n│┌───────────────────────────┐│\n"
                       f"││ {_PLANS[key]} ││\n│└───────────────────────────┘│\n└─────────────────────────────┘\n")
        out.append(plan or "")
    return "".join(out)
