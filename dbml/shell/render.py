"""How the shell prints a result: DuckDB CLI's display modes over an Arrow table.

``render(table, mode, max_rows)`` returns the text of one result in ``duckbox`` (DuckDB's
default: a box with column names and types, long results cut in the middle), ``box``
(the same without types), ``line`` (``column = value``, a row per block), ``csv``,
``json`` (an array of objects) or ``markdown``. A result whose only column is a STRUCT
(``SELECT train(...)``: a summary of some 40 fields) is shown one field per column,
as ``SELECT s.*`` would; ``EXPLAIN`` prints its plan as text.
"""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import date, datetime, time
from decimal import Decimal

import pyarrow as pa

__all__ = ["MODES", "render", "flatten_struct"]

MODES = ("duckbox", "box", "line", "csv", "json", "markdown")
MAX_WIDTH = 40          # a duckbox cell is cut to this many characters


def flatten_struct(table: pa.Table) -> pa.Table:
    """A table whose only column is a STRUCT, as one column per field (else unchanged)."""
    if table.num_columns == 1 and pa.types.is_struct(table.schema.types[0]):
        return pa.Table.from_batches([pa.RecordBatch.from_struct_array(chunk)
                                      for chunk in table.column(0).chunks], schema=pa.schema(table.schema.types[0]))
    return table


def render(table: pa.Table, mode: str = "duckbox", max_rows: int = 40) -> str:
    """The text of one result (no trailing newline)."""
    if table.column_names == ["explain_key", "explain_value"]:
        return "\n".join(str(v) for v in table.column("explain_value").to_pylist()).rstrip("\n")
    table = flatten_struct(table)
    rows = table.to_pylist()
    names = table.column_names
    if mode == "line":
        width = max((len(n) for n in names), default=0)
        return "\n\n".join("\n".join(f"{n:>{width}} = {_text(r[n])}" for n in names) for r in rows)
    if mode == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        writer.writerows([[_text(r[n], null="") for n in names] for r in rows])
        return out.getvalue().rstrip("\n")
    if mode == "json":
        return json.dumps([{n: _json(r[n]) for n in names} for r in rows], ensure_ascii=False)
    if mode == "markdown":
        lines = ["| " + " | ".join(names) + " |", "|" + "|".join("---" for _ in names) + "|"]
        return "\n".join(lines + ["| " + " | ".join(_text(r[n]).replace("|", "\\|") for n in names) + " |"
                                  for r in rows])
    types = [_type_name(t) for t in table.schema.types] if mode == "duckbox" else None
    return _box(names, types, [[_text(r[n]) for n in names] for r in rows], max_rows)


def _box(names: list[str], types: list[str] | None, cells: list[list[str]], max_rows: int) -> str:
    """DuckDB's box: a header (names, then types), a rule, the rows; a long result keeps
    its first and last rows around a row of dots, and says how many rows there were."""
    total = len(cells)
    cut = max_rows > 0 and total > max_rows
    if cut:
        head = (max_rows + 1) // 2
        cells = cells[:head] + [["·"] * len(names)] + cells[total - (max_rows - head):]
    shown = [[_cut(c) for c in row] for row in cells]
    header = [[_cut(n) for n in names]] + ([[_cut(t) for t in types]] if types else [])
    widths = [max([len(r[i]) for r in header + shown] + [1]) for i in range(len(names))]
    line = lambda left, mid, right: left + mid.join("─" * (w + 2) for w in widths) + right   # noqa: E731
    row = lambda values: "│" + "│".join(f" {v:<{w}} " for v, w in zip(values, widths)) + "│"   # noqa: E731
    out = [line("┌", "┬", "┐")] + [row(h) for h in header] + [line("├", "┼", "┤")]
    out += [row(r) for r in shown] or [row([""] * len(names))]
    out.append(line("└", "┴", "┘"))
    if cut:
        out.append(f"  {total:,} rows ({max_rows} shown)")
    elif total == 0:
        out.append("  0 rows")
    return "\n".join(out)


def _cut(text: str) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= MAX_WIDTH else text[:MAX_WIDTH - 1] + "…"


def _text(v, null: str = "NULL") -> str:
    if v is None:
        return null
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else str(v)
    if isinstance(v, (bytes, bytearray)):
        return "".join(chr(b) if 32 <= b < 127 else f"\\x{b:02X}" for b in v[:64])
    if isinstance(v, (dict, list)):
        return json.dumps(_json(v), ensure_ascii=False)
    return str(v)


def _json(v):
    if isinstance(v, dict):
        return {k: _json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json(x) for x in v]
    if isinstance(v, (datetime, date, time)):
        return v.isoformat()
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return _text(v)
    return v


def _type_name(t: pa.DataType) -> str:
    """Arrow's type as DuckDB names it, for the common ones."""
    names = {pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER", pa.int64(): "BIGINT",
             pa.float32(): "FLOAT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR", pa.large_string(): "VARCHAR",
             pa.bool_(): "BOOLEAN", pa.date32(): "DATE", pa.binary(): "BLOB", pa.large_binary(): "BLOB",
             pa.uint8(): "UTINYINT", pa.uint16(): "USMALLINT", pa.uint32(): "UINTEGER", pa.uint64(): "UBIGINT"}
    if t in names:
        return names[t]
    if pa.types.is_timestamp(t):
        return "TIMESTAMP"
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _type_name(t.value_type) + "[]"
    if pa.types.is_struct(t):
        return "STRUCT"
    return str(t).upper()
