"""The dot commands that change how the shell shows and reads things: switches (``.echo``,
``.timer``, ``.changes``, ``.headers``...), ``.mode``, separators, widths, ``.maxrows``,
``.show``, ``.prompt``, highlighting and the pager. Each does what DuckDB CLI's does, with
its messages; ``dbml/shell/commands.py`` holds the table that names them.
"""

from __future__ import annotations

from .highlight import COLORS
from .prompt import PromptError, parse_prompt
from .render import c_string, set_mode

OK, FAIL, EXIT, USAGE = 0, 1, 2, -1


def to_bool(shell, text: str) -> bool:
    """The CLI's on/off/yes/no/number, with its warning for anything else."""
    lowered = text.lower()
    if lowered.isdigit() or (lowered.startswith("0x") and len(lowered) > 2):
        return bool(int(lowered, 0) & 0xFFFFFFFF)
    if lowered in ("on", "yes"):
        return True
    if lowered not in ("off", "no"):
        shell.error(f'ERROR: Not a boolean value: "{text}". Assuming "no".')
    return False


def to_int(text: str) -> int:
    """The CLI's StringToInt: sign, 0x hex, digits, a KiB/MB/K... suffix; the rest ignored."""
    sign, i = 1, 0
    if text[:1] in "+-":
        sign, i = (-1 if text[0] == "-" else 1), 1
    rest = text[i:]
    if rest[:2] == "0x":
        digits = ""
        for ch in rest[2:]:
            if ch not in "0123456789abcdefABCDEF":
                break
            digits += ch
        value, rest = int(digits or "0", 16), rest[2 + len(digits):]
    else:
        digits = ""
        for ch in rest:
            if not ch.isdigit():
                break
            digits += ch
        value, rest = int(digits or "0"), rest[len(digits):]
    mult = {"kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "kb": 1000, "mb": 10 ** 6, "gb": 10 ** 9, "k": 1000,
            "m": 10 ** 6, "g": 10 ** 9}.get(rest.lower(), 1)
    return sign * value * mult


def flag(attr: str):
    def handler(shell, words):
        setattr(shell, attr, to_bool(shell, words[1]))
    return handler


def bail(shell, words):
    shell.bail = None if words[1] == "auto" else to_bool(shell, words[1])


def headers(shell, words):
    shell.display.header = to_bool(shell, words[1])
    shell.display.header_set = True


def display_flag(attr: str, value):
    def handler(shell, words):
        setattr(shell.display, attr, value)
    return handler


def separator_char(what: str):
    def handler(shell, words):
        attr = f"{what}_sep"
        if len(words) == 1:
            shell.print(f"current {what} separator: {getattr(shell.display, attr) or ' '}")
        elif len(words) != 2:
            return USAGE
        elif words[1] in ("space", "none"):
            setattr(shell.display, attr, " " if words[1] == "space" else "")
        elif len(words[1].encode()) != 1:
            shell.error(f'.{what}_sep SEP must be one byte, "space" or "none"')
            return FAIL
        else:
            setattr(shell.display, attr, words[1])
    return handler


def large_numbers(shell, words):
    mode = words[1]
    shell.display.large_numbers = mode if mode in ("all", "footer") else \
        ("default" if to_bool(shell, mode) else "off")


def exit_shell(shell, words):
    if len(words) > 2:
        return USAGE
    code = to_int(words[1]) if len(words) > 1 else 0
    if code:
        shell.output.reset()
        raise SystemExit(code)      # a code ends the process at once, as in the CLI
    return EXIT


def max_rows(shell, words):
    if len(words) > 3:
        return USAGE
    if len(words) == 1:
        shell.print(f"current max rows: {shell.display.max_rows}")
        return OK
    shell.display.max_rows = to_int(words[1])
    if len(words) > 2:
        shell.display.max_analyze_rows = to_int(words[2])


def max_width(shell, words):
    if len(words) > 2:
        return USAGE
    if len(words) == 1:
        shell.print(f"current max rows: {shell.display.max_width}")   # sic: the CLI's message
    else:
        shell.display.max_width = to_int(words[1])


def set_output_mode(shell, words):
    if len(words) > 3:
        return USAGE
    if len(words) == 1:
        shell.print(f"current output mode: {shell.display.mode}")
        return OK
    problem = set_mode(shell.display, words[1], words[2] if len(words) > 2 else None)
    if problem:
        shell.error(problem)
        return FAIL


def null_value(shell, words):
    shell.display.null_value = words[1]


def separator(shell, words):
    if not 2 <= len(words) <= 3:
        return USAGE
    shell.display.col_sep = words[1]
    if len(words) == 3:
        shell.display.row_sep = words[2]


def set_widths(shell, words):
    shell.display.widths = [to_int(w) for w in words[1:]]


def print_words(shell, words):
    shell.print(" ".join(words[1:]))


def set_prompt(shell, words):
    if len(words) >= 2:
        try:
            shell.prompt = parse_prompt(words[1])
        except PromptError as e:
            shell.error(str(e))
            return FAIL
    if len(words) >= 3:
        shell.continue_prompt = words[2]


def show_settings(shell, words):
    d = shell.display
    rows = [("echo", "on" if shell.echo else "off"), ("headers", "on" if d.header else "off"), ("mode", d.mode),
            ("nullvalue", c_string(d.null_value)), ("output", shell.output.name or "stdout"),
            ("colseparator", c_string(d.col_sep)), ("rowseparator", c_string(d.row_sep)),
            ("width", "".join(f"{w} " for w in d.widths)), ("filename", shell.database)]
    shell.print("\n".join(f"{name:>12.12}: {value}" for name, value in rows))


def show_version(shell, words):
    import duckdb
    version, source_id, codename = shell.db.execute("PRAGMA version").fetchall()[0]
    shell.print(f"DuckDB {version} ({codename}) {source_id}\ndbml shell, duckdb-python {duckdb.__version__}")


def highlight(shell, words):
    shell.highlight.enabled = to_bool(shell, words[1])


def highlight_option(attr: str):
    def handler(shell, words):
        setattr(shell, attr, to_bool(shell, words[1]))
    return handler


def highlight_colors(shell, words):
    if not 3 <= len(words) <= 4:
        return USAGE
    problem = shell.highlight.set_color(words[1], words[2], words[3] if len(words) == 4 else None)
    if problem:
        shell.error(problem.rstrip("\n"))
        return FAIL


def highlight_mode(shell, words):
    if words[1] not in ("mixed", "dark", "light", "auto"):
        return USAGE
    shell.highlight.set_mode(words[1])


def deprecated_color(element: str):
    def handler(shell, words):
        shell.error(f"WARNING: .{element} [COLOR] will be removed in a future release, use .render_color {element} "
                    f"{words[1]} instead")
        return highlight_colors(shell, ["highlight_colors", element if element != "cont_sel" else
                                         "continuation_selected", words[1]])
    return handler


def display_colors(shell, words):
    if any(w not in ("bold", "underline") for w in words[1:]):
        return USAGE
    intensity = "bold_underline" if {"bold", "underline"} <= set(words[1:]) else (words[1] if len(words) > 1
                                                                                   else "standard")
    from .highlight import terminal_code
    shell.print(" ".join(f"{terminal_code(c, intensity)}{c}\033[00m" if shell.highlight.enabled else c
                         for c in COLORS) + " ")


def startup_text(shell, words):
    if words[1] not in ("all", "version", "none"):
        return USAGE
    shell.startup_text = words[1]


def read_line_version(shell, words):
    if words[1] not in ("linenoise", "fallback"):
        return USAGE
    shell.read_line_version = words[1]


def line_mode(shell, words):
    if len(words) != 1:
        return USAGE


def progress_bar(shell, words):
    if not 2 <= len(words) <= 3 or words[1] not in ("--clear", "--add") \
            or (words[1] == "--clear") != (len(words) == 2):
        return USAGE


def ui_command(shell, words):
    shell.ui_command = "CALL " + " ".join(words[1:])


def safe_mode(shell, words):
    from .catalog_commands import enable_safe_mode
    enable_safe_mode(shell)


def set_pager(shell, words):
    pager = shell.pager
    if len(words) == 1:
        shell.print(f"Pager mode: {pager['mode']}")
        if pager["mode"] == "automatic":
            wide = "terminal" if not shell.display.max_width else f"{shell.display.max_width} characters"
            shell.print(f"Trigger pager when rows exceed {pager['min_rows']} or result set is wider than {wide}", "")
        if pager["mode"] != "off" or pager["command"]:
            shell.print(f"Pager command: {pager['command']}")
        return OK
    if words[1] == "set_row_threshold":
        if len(words) != 3:
            return USAGE
        pager["min_rows"] = to_int(words[2])
        return OK
    if len(words) != 2:
        return USAGE
    if words[1] in ("on", "off", "automatic"):
        pager["mode"] = words[1]
        if words[1] == "on" and not pager["command"]:
            from .output import system_pager
            pager["command"] = system_pager()
    else:
        pager["command"] = words[1]


