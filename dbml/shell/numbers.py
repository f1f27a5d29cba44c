"""``.large_number_rendering all|footer``, ``.thousand_sep``, ``.decimal_sep`` and ``.maxrows N
ANALYZE`` (column widths from the first ANALYZE rows) in duckbox mode.

These are settings of DuckDB's box renderer that duckdb-python's ``to_box`` does not take,
so for them the box is laid out here, as DuckDB's ``BoxRenderer`` lays it out
(``box_renderer.cpp``: FormatNumber, TryFormatLargeNumber, the large-number footer row,
the row split around ``·`` rows and the footer), over DuckDB's own text of every value
and DuckDB's own type names (read from the header ``to_box`` draws for no rows). Only the
plain case is laid out: a result that would need cutting to the width, or holds a value
DuckDB draws specially (line breaks, wide JSON), is drawn by ``to_box`` with the numbers
as they are. Without these settings the shell never comes here.
"""

from __future__ import annotations

from sqlglot import exp

from .metadata import large_number, truncate
from .render import Display, is_numeric, render_width

__all__ = ["wants_formatting", "formatted_box"]

DOT = "·"
VECTOR = 2048         # rows DuckDB hands the renderer at a time


def wants_formatting(display: Display) -> bool:
    """Whether a setting to_box does not take is on (``.maxrows N ANALYZE`` among them)."""
    return display.large_numbers in ("all", "footer") or bool(display.thousand_sep or display.decimal_sep) \
        or display.max_analyze_rows > 0


def format_number(text: str, display: Display) -> str:
    """A number as the box shows it: readable (``all``), or with the separators."""
    if display.large_numbers == "all":
        readable = large_number(text, display.decimal_sep)
        if readable:
            return readable
    if not display.thousand_sep and not display.decimal_sep:
        return text
    digits = len(text) - len(text.lstrip("0123456789"))
    first = digits % 3 or 3
    out = []
    for i, ch in enumerate(text[:digits]):
        if i == first and display.thousand_sep:
            out.append(display.thousand_sep)
            first += 3
        out.append(ch)
    rest = text[digits:]
    return "".join(out) + (rest.replace(".", display.decimal_sep) if display.decimal_sep else rest)


def _align(text: str, width: int, how: str) -> str:
    pad = width - render_width(text) + 2
    left = 1 if how == "left" else pad - 1 if how == "right" else pad // 2
    return " " * left + text + " " * (pad - left)


def formatted_box(kept, display: Display, max_width: int) -> str | None:
    """The box with numbers formatted, or None where the plain case does not hold."""
    names, types = kept.names, kept.types
    type_names = _type_names(kept)
    if type_names is None:
        return None
    count = exp.select(exp.func("count", exp.Star())).from_(kept.table())
    count = kept.con._submit(count.sql("duckdb")).fetchall()[0][0]
    limit = display.max_rows if display.max_rows >= 0 else count
    shown = count if count <= limit + 3 else limit
    top = shown if shown == count else shown // 2 + shown % 2
    bottom = shown - top
    exprs = [exp.cast(exp.column(f"c{i}"), "VARCHAR") for i in range(len(names))]
    rows = kept.select(exprs).fetchmany(top) if top else []
    tail = _last_rows(kept, exprs, bottom, count)
    footer_mode = display.large_numbers == "footer" and count == 1
    cells = [_cells(r, types, display) for r in rows + tail]
    if cells is None or any(c is None for c in cells):
        return None
    readable = _footer_row(rows, types, display) if footer_mode else None
    numeric = [is_numeric(t) for t in types]
    align = ["middle" if readable else "right" if n else "left" for n in numeric]
    body = cells[:len(rows)] + ([readable] if readable else []) + cells[len(rows):]
    # .maxrows N ANALYZE: the widths come from the first ANALYZE rows, read a vector (2,048 rows) at
    # a time as DuckDB reads them; later values are cut to those widths
    analyzed = -(-display.max_analyze_rows // VECTOR) * VECTOR
    measured = body[:analyzed] if display.max_analyze_rows > 0 else body
    widths = [max([render_width(n), render_width(t)] + [render_width(r[i]) for r in measured])
              for i, (n, t) in enumerate(zip(names, type_names))]
    footer = _footer(count, shown, len(names), display)
    total = 1 + sum(w + 3 for w in widths)
    if footer["must_show"] and total < footer["length"]:
        widths[0] += footer["length"] - total
        total = footer["length"]
    if total > max_width:
        return None
    out = [_rule(widths, "┌", "┬", "┐"), _row(names, widths, ["middle"] * len(widths)),
           _row(type_names, widths, ["middle"] * len(widths)), _rule(widths, "├", "┼", "┤")]
    out += [_row(r, widths, align) for r in body[:len(rows) + (1 if readable else 0)]]
    if bottom:
        out += _divider(body[len(rows) - 1], body[len(rows)], widths, align)
        out += [_row(r, widths, align) for r in body[len(rows):]]
    out.append(_rule(widths, "└", "┴", "┘"))
    return "".join(out) + _footer_text(footer, total, count, len(names))


def _type_names(kept) -> list[str] | None:
    """DuckDB's own names of the types, as its box renderer writes them."""
    header = kept.con._submit(exp.select("*").from_(kept.named().subquery()).limit(0).sql("duckdb"))
    header = header.to_box(max_width=2 ** 62)
    lines = header.split("\n")
    if len(lines) < 3:
        return None
    parts = [p.strip() for p in lines[2].split("│")[1:-1]]
    return parts if len(parts) == len(kept.names) else None


def _last_rows(kept, exprs, bottom: int, count: int) -> list:
    if not bottom:
        return []
    rows = exp.select(*exprs).from_(kept.by_position().subquery()).limit(bottom).offset(count - bottom)
    return kept.con._submit(rows.sql("duckdb")).fetchall()


def _cells(row, types, display: Display) -> list[str] | None:
    out = []
    for value, t in zip(row, types):
        if value is None:
            out.append(display.null_value)
        elif any(ord(c) < 32 for c in value) or render_width(value) > 80:
            return None     # DuckDB escapes or wraps such a value: the plain case does not hold
        else:
            out.append(format_number(value, display) if is_numeric(t) else value)
    return out


def _footer_row(rows, types, display: Display) -> list[str] | None:
    """The footer mode's second row, "(59.99 million)" under each number of a single row."""
    if not rows or not all(is_numeric(t) for t in types):
        return None
    readable = [large_number(v or "", display.decimal_sep) for v in rows[0]]
    return [f"({r})" for r in readable] if all(readable) else None


def _rule(widths, left, mid, right) -> str:
    return left + mid.join("─" * (w + 2) for w in widths) + right + "\n"


def _row(values, widths, align) -> str:
    return "".join("│" + _align(_fit(v, w), w, a) for v, w, a in zip(values, widths, align)) + "│\n"


def _fit(text: str, width: int) -> str:
    """A value wider than its column cut with an ellipsis, as the box renderer cuts it."""
    return text if render_width(text) <= width else truncate(text, width)[0]


def _divider(prev, nxt, widths, align) -> list[str]:
    cells = []
    for i, (w, a) in enumerate(zip(widths, align)):
        if a == "middle":
            cells.append((DOT, "middle"))
            continue
        top, low = min(w, render_width(prev[i])), min(w, render_width(nxt[i]))
        dots = low if top == 0 else top if low == 0 else min(top, low)
        if dots > 1:
            pad = dots - 1
            left = pad // 2 if a == "left" else pad - pad // 2
            cells.append((" " * left + DOT + " " * (pad - left), a))
        else:
            cells.append((DOT, "middle" if dots == 0 else a))
    line = "".join("│" + _align(text, w, a) for (text, a), w in zip(cells, widths)) + "│\n"
    return [line] * 3


def _footer(count: int, shown: int, columns: int, display: Display) -> dict:
    rows = format_number(str(count), display) + " rows"
    readable_rows = ""
    if display.large_numbers == "footer":
        readable = large_number(str(count), display.decimal_sep)
        if readable:
            readable_rows, rows = f"{count} total", readable + " rows"
    shown_str = f"{format_number(str(shown), display)} shown" if shown < count else ""
    length = max(len(rows), len(shown_str) + 2, len(readable_rows) + 2) + 4
    return {"rows": rows, "columns": f"{columns} column" + ("s" if columns > 1 else ""), "shown": shown_str,
            "readable": readable_rows, "length": length, "must_show": shown < count or count == 0}


def _footer_text(f: dict, total: int, count: int, columns: int) -> str:
    both = total >= len(f["rows"]) + len(f["columns"]) + 6 and count >= 10 and columns > 1
    rows_only = total >= f["length"] and (count == 0 or count >= 10)
    if not both and not rows_only:
        return ""
    padding = total - len(f["rows"]) - 4 - (len(f["columns"]) if both else 0)
    extra, shown, readable = "", f["shown"], f["readable"]
    size = len(readable) + len(shown) + (3 if not readable else 5)
    if shown and padding >= size:
        extra = f" ({shown}" + (f", {readable}" if readable else "") + ")"
        padding -= size
        shown = readable = ""
    if both:
        line = f"  {f['rows']}{extra}{' ' * padding}{f['columns']}"
    else:
        line = f"  {' ' * (padding // 2)}{f['rows']}{extra}{' ' * (padding - padding // 2)}"
    out = [line + "\n"]
    if shown and readable and len(readable) + len(shown) + 4 <= total:
        out.append(f"  {shown}{' ' * (total - len(readable) - len(shown) - 4)}{readable}\n")
        shown = readable = ""
    for text in (shown, readable):
        if text:
            out.append(" " + _align(f"({text})", total - 4, "left" if both else "middle") + "\n")
    return "".join(out)
