"""``.prompt MAIN [CONTINUE]``: DuckDB CLI's prompt syntax, parsed and drawn.

A prompt is text with components in braces: ``{color:red}``, ``{color:bold}``,
``{color:reset}``, ``{highlight_element:prompt}``, ``{setting:current_database}`` (also
``current_schema``, ``current_database_and_schema``, ``memory_limit``, ``memory_usage``),
``{sql:SELECT ...}`` (the query's one value) and ``{max_length:N}``; ``\\`` escapes the
next character. Parsing gives the CLI's errors (an unterminated bracket, an unknown
component, a component without its parameter).
"""

from __future__ import annotations

from .highlight import COLORS, ELEMENTS, INTENSITIES, terminal_code

__all__ = ["PromptError", "parse_prompt", "draw_prompt"]

SETTINGS = ("current_database", "current_schema", "current_database_and_schema", "memory_limit", "memory_usage",
            "swap_usage", "swap_max", "bytes_written", "bytes_read")
_KINDS = ("setting", "sql", "color", "highlight_element", "max_length")


class PromptError(ValueError):
    pass


def parse_prompt(prompt: str) -> list[tuple[str, str]]:
    """The prompt's components, ``("text", literal)`` or ``(kind, value)``; PromptError with
    the CLI's message where it does not parse."""
    parts, state, literal, kind, escaped_from = [], "text", "", "", None
    for ch in prompt:
        if escaped_from is not None:
            literal, state, escaped_from = literal + ch, escaped_from, None
        elif ch == "\\":
            escaped_from = state
        elif state == "text":
            if ch == "{":
                parts += [("text", literal)] if literal else []
                literal, state = "", "type"
            else:
                literal += ch
        elif ch == "}":
            parts.append(_component(kind if state == "value" else literal, literal if state == "value" else ""))
            state, literal, kind = "text", "", ""
        elif ch == ":" and state == "type":
            kind, literal, state = literal, "", "value"
        else:
            literal += ch
    if state != "text" or escaped_from is not None:
        raise PromptError(f'Failed to parse prompt "{prompt}" - unterminated bracket or escape')
    return parts + ([("text", literal)] if literal else [])


def _component(kind: str, value: str) -> tuple[str, str]:
    if kind not in _KINDS:
        raise PromptError(f"Unknown bracket type {kind}")
    if not value:
        raise PromptError(f"{kind} requires a parameter")
    if kind == "setting" and value not in SETTINGS:
        raise PromptError(f'unsupported setting "{value}" for setting, supported values: {", ".join(SETTINGS)}')
    if kind == "color" and value not in ("bold", "underline", "reset") and value.lower() not in COLORS:
        raise PromptError(f"Unknown highlighting color '{value}'")
    if kind == "highlight_element" and value.lower() not in ELEMENTS:
        raise PromptError(f"Unknown element '{value}', supported options: {', '.join(ELEMENTS)}")
    return kind, value


_SETTING_SQL = {
    "current_database": "SELECT current_database()", "current_schema": "SELECT current_schema()",
    "current_database_and_schema": "SELECT CASE WHEN current_schema() = 'main' THEN current_database() "
                                   "ELSE current_database() || '.' || current_schema() END",
    "memory_limit": "SELECT current_setting('memory_limit')",
    "memory_usage": "SELECT format_bytes(sum(memory_usage_bytes)::BIGINT) FROM duckdb_memory()",
    "swap_usage": "SELECT format_bytes(sum(temporary_storage_bytes)::BIGINT) FROM duckdb_memory()",
}


def draw_prompt(shell, parts: list[tuple[str, str]]) -> str:
    """The prompt's text now: settings and queries evaluated, colours where highlighting is on."""
    out, limit, paint = [], None, shell.highlight.enabled and shell.output.console
    for kind, value in parts:
        if kind == "text":
            out.append(value)
        elif kind in ("setting", "sql"):
            sql = _SETTING_SQL.get(value, "SELECT ''") if kind == "setting" else value
            try:
                rows = shell.db.execute(sql).fetchall()
                out.append("" if not rows or rows[0][0] is None else str(rows[0][0]))
            except Exception:  # noqa: BLE001 - a prompt never fails
                out.append("")
        elif kind == "max_length":
            limit = int(value) if value.isdigit() else None
        elif paint:
            out.append(_colour(shell, kind, value))
    text = "".join(out)
    return text if limit is None or len(text) <= limit else text[:limit]


def _colour(shell, kind: str, value: str) -> str:
    if kind == "highlight_element":
        color, intensity = shell.highlight.colors[value.lower()]
        return terminal_code(color, intensity)
    if value == "reset":
        return "\033[00m"
    if value in INTENSITIES:
        return INTENSITIES[value]
    return terminal_code(value.lower())
