"""The shell's dot commands: DuckDB CLI's (``.help`` lists them; ``.help -all`` with their
options), the same names, arguments, prefixes and messages, and dbml's ``.jobs``.

``COMMANDS`` is the one table: name, how many words it takes (0: any), usage, help, the
shortest prefix that names it, extended help, handler. A line is split into words as the
CLI splits it (quotes group words; ``"..."`` resolves backslash escapes), and a prefix
names the first command in the table that starts with it (``.sh`` is ``.shell``). The
handlers that touch files or the catalog are in ``dbml/shell/catalog_commands.py``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

from . import catalog_commands as cc
from . import display_commands as ds

__all__ = ["COMMANDS", "Command", "dot_command", "split_words", "print_help"]

OK, FAIL, EXIT, USAGE = 0, 1, 2, -1


@dataclass(frozen=True)
class Command:
    name: str
    words: int                   # words including the command; 0: any number
    usage: str
    help: str
    handler: Callable | None
    prefix: int = 0              # letters a prefix needs (0: any prefix names it)
    extra: str | None = ""       # extended help (.help NAME); None: left out of .help


def split_words(line: str) -> list[str]:
    """A dot command's words, as the CLI splits them."""
    words, i, n = [], 1, len(line)
    while i < n:
        while i < n and line[i].isspace():
            i += 1
        if i >= n:
            break
        if line[i] in "'\"":
            quote, i, word = line[i], i + 1, ""
            while i < n and line[i] != quote:
                if line[i] == "\\" and quote == '"' and i + 1 < n:
                    word += line[i]
                    i += 1
                word += line[i]
                i += 1
            i += 1
            words.append(_backslashes(word) if quote == '"' else word)
        else:
            start = i
            while i < n and not line[i].isspace():
                i += 1
            words.append(_backslashes(line[start:i]))
    return words


_ESCAPES = {"a": "\a", "b": "\b", "t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r", '"': '"', "'": "'",
            "\\": "\\"}


def _backslashes(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            i += 1
            ch = text[i]
            if ch in _ESCAPES:
                ch = _ESCAPES[ch]
            elif "0" <= ch <= "7":
                digits = ch
                while len(digits) < 3 and i + 1 < len(text) and "0" <= text[i + 1] <= "7":
                    i += 1
                    digits += text[i]
                ch = chr(int(digits, 8) & 0xFF)
        out.append(ch)
        i += 1
    return "".join(out)


def find(name: str) -> Command | None:
    for command in COMMANDS:
        if len(name) >= command.prefix and command.name.startswith(name) and name:
            return command
    return None


def dot_command(shell, line: str) -> int:
    """Run one dot command line: 0, 1 (it failed) or 2 (stop reading)."""
    words = split_words(line)
    if not words:
        return OK
    command = find(words[0])
    if command is None:
        close = difflib.get_close_matches(words[0], [c.name for c in COMMANDS], n=5, cutoff=0.6)
        hint = ("Did you mean: " + ", ".join(f'".{c}"' for c in close) + "\n") if close else ""
        shell.error(f"Unknown Command Error: Unrecognized command '{words[0]}'\n{hint}Run '.help' for more "
                    "information.")
        rc = FAIL
    else:
        rc = _run(shell, command, words)
    shell.output.command_done()
    return rc


def _run(shell, command: Command, words: list[str]) -> int:
    if command.handler is None:
        shell.error(f'Command "{command.name}" is unsupported in the current version of the CLI')
        return FAIL
    rc = USAGE
    try:
        if command.words == 0 or command.words == len(words):
            rc = command.handler(shell, words)
    except Exception as e:  # noqa: BLE001 - a failing command is a message, never a traceback
        from .engine import error_text
        shell.error(error_text(e))
        return FAIL
    if rc == cc.HELP:
        print_help(shell, command.name)
        return FAIL
    if rc == USAGE:
        shell.error(f"Invalid Command Error: Invalid usage of command '.{words[0]}'\n\n"
                    f"Usage: '.{command.name} {command.usage}'")
        return FAIL
    return rc or OK


def _help(shell, words):
    if len(words) >= 2 and words[1] == "dbml":
        from ..udfs import SQL_FUNCTIONS
        shell.print("dbml's SQL functions (the README has each with its parameters):")
        shell.print("\n".join(f"  {text}" for text in SQL_FUNCTIONS.values()))
        return OK
    if len(words) >= 2:
        if print_help(shell, words[1]) == 0:
            shell.print(f"Nothing matches '{words[1]}'")
    else:
        print_help(shell, None)


def print_help(shell, pattern: str | None) -> int:
    """The CLI's .help layout; with a pattern (or -all) the extended help too. Lines printed."""
    import fnmatch
    extended = pattern is not None
    glob = "" if pattern in (None, "-a", "-all", "--all") else f"{pattern}*"
    entries = []
    for c in COMMANDS:
        if c.extra is None or "DEPRECATED" in c.help or (glob and not fnmatch.fnmatchcase(c.name, glob)):
            continue
        entries.append((f".{c.name}", f" {c.usage}", c.help))
        if extended and c.extra:
            for line in c.extra.split("\n"):
                lead = "  " + "".join("  " for ch in line[:len(line) - len(line.lstrip("\t"))])
                first, _, second = line.lstrip("\t").partition("\t")
                entries.append(("", lead + first, second))
    width = max((len(a) + len(b) + 4 for a, b, c in entries if c), default=0)
    paint = shell.highlight.paint if shell.output.console and shell.highlight.enabled else (lambda t, e: t)
    for name, first, second in entries:
        spaces = " " * (width - len(name) - len(first)) if second else ""
        shell.print(paint(name, "keyword") + paint(first, "string_constant" if name or first.strip()[:1] == "-"
                                                    else "none") + spaces + second)
    if not extended:
        shell.print("\nRun .help --all for extended information")
        shell.print("Run .help dbml for dbml's SQL functions (train, predict, evaluate, ...)")
    return len(entries)


_MODE_HELP = ("MODE is one of:\n\tascii\tColumns/rows delimited by 0x1F and 0x1E\n\tbox\tTables using unicode "
              "box-drawing characters\n\tcsv\tComma-separated values\n\tcolumn\tOutput in columns. (See .width)\n"
              "\tduckbox\tTables with extensive features\n\thtml\tHTML <table> code\n\tinsert\tSQL insert "
              "statements for TABLE\n\tjson\tResults in a JSON array\n\tjsonlines\tResults in a NDJSON\n\tlatex\t"
              "LaTeX tabular environment code\n\tline\tOne value per line\n\tlist\tValues delimited by \"|\"\n\t"
              "markdown\tMarkdown table format\n\tquote\tEscape answers as for SQL\n\ttable\tASCII-art table\n\t"
              "tabs\tTab-separated values\n\ttcl\tTCL list elements\n\ttrash\tNo output")
_OUTPUT_HELP = ("If FILE begins with '|' then open as a pipe\n\t--bom\tPut a UTF8 byte-order mark at the beginning\n\t"
                "-e\tSend output to the system text editor\n\t-x\tSend output as CSV to a spreadsheet (same as "
                "\".excel\")")

COMMANDS: tuple[Command, ...] = (
    Command("bail", 2, "on|off", "Stop after hitting an error.  Default OFF", ds.bail, 3),
    Command("binary", 2, "on|off", "Turn binary output on or off.  Default OFF", ds.flag("binary"), 3),
    Command("cd", 2, "DIRECTORY", "Change the working directory to DIRECTORY", cc.change_directory),
    Command("changes", 2, "on|off", "Show number of rows changed by SQL", ds.flag("changes"), 3),
    Command("columns", 1, "", "Column-wise rendering of query results", ds.display_flag("columns", True)),
    Command("comment", 2, "?COLOR?", "DEPRECATED: Sets the syntax highlighting color used for comment values",
            ds.deprecated_color("comment"), extra=None),
    Command("constant", 2, "?COLOR?", "DEPRECATED: Sets the syntax highlighting color used for constant values",
            ds.deprecated_color("constant"), extra=None),
    Command("cont", 2, "?COLOR?", "DEPRECATED: Sets the syntax highlighting color used for continuation markers",
            ds.deprecated_color("cont"), extra=None),
    Command("cont_sel", 2, "?COLOR?", "DEPRECATED: Sets the syntax highlighting color used for continuation "
            "markers", ds.deprecated_color("cont_sel"), extra=None),
    Command("decimal_sep", 0, "SEP", "Sets the decimal separator used when rendering numbers. Only for duckbox "
            "mode.", ds.separator_char("decimal"), 3),
    Command("databases", 1, "", "List names and files of attached databases", cc.databases, 2),
    Command("dump", 0, "?TABLE?", "Render database content as SQL", cc.dump,
            extra="Options:\n\t--newlines\tAllow unescaped newline characters in output\nTABLE is a LIKE pattern "
                  "for the tables to dump\nAdditional LIKE patterns can be given in subsequent arguments"),
    Command("display_colors", 0, "[bold|underline]", "Display all terminal colors and their names", ds.display_colors),
    Command("echo", 2, "on|off", "Turn command echo on or off", ds.flag("echo"), 3),
    Command("edit", 0, "", "Opens an external text editor to edit a query.", None,
            extra="Notes:\n\t* The editor is read from the environment variables\n\t  DUCKDB_EDITOR, EDITOR, VISUAL "
                  "in-order\n\t* If none of these are set, the default editor is vi\n\t* \\e can be used as an alias "
                  "for .edit"),
    Command("error", 2, "?COLOR?", "DEPRECATED: Sets the syntax highlighting color used for errors",
            ds.deprecated_color("error"), extra=None),
    Command("excel", 0, "", "Display the output of next command in spreadsheet", cc.excel,
            extra="--bom\tPut a UTF8 byte-order mark on intermediate file"),
    Command("exit", 0, "?CODE?", "Exit this program with return-code CODE", ds.exit_shell),
    Command("headers", 2, "on|off", "Turn display of headers on or off", ds.headers),
    Command("help", 0, "?-all? ?PATTERN?", "Show help text for PATTERN", _help),
    Command("highlight", 2, "on|off", "Toggle syntax highlighting in the shell on/off", ds.highlight),
    Command("highlight_colors", 0, "OPTIONS", "Configure highlighting colors", ds.highlight_colors),
    Command("highlight_errors", 2, "on|off", "Turn highlighting of errors on or off",
            ds.highlight_option("highlight_errors")),
    Command("highlight_mode", 2, "mixed|dark|light", "Toggle the highlight mode to dark or light mode",
            ds.highlight_mode),
    Command("highlight_results", 2, "on|off", "Turn highlighting of results on or off",
            ds.highlight_option("highlight_results")),
    Command("import", 0, "FILE TABLE", "Import data from FILE into TABLE", cc.import_data,
            extra="Options:\n\t--csv\tImport data from CSV (read_csv)\n\t--json\tImport data from JSON (read_json)\n\t"
                  "--parquet\tImport data from Parquet (read_parquet)\n\t--[parameter] [value]\tProvides a parameter "
                  "to the reader function\n\tNotes:\n\t* If TABLE does not exist, it is created.\n\t* If file type is "
                  "not selected, the input mode is derived from the file extension\n\t* Generic parameters are passed "
                  "to the reader functions"),
    Command("indexes", 0, "?TABLE?", "Show names of indexes", cc.indexes,
            extra="Notes:\n\t* If TABLE is specified, only show indexes for\n\t  tables matching TABLE using the LIKE "
                  "operator."),
    Command("indices", 0, "?TABLE?", "Show names of indexes", cc.indexes, extra=None),
    Command("jobs", 1, "", "dbml: training jobs of this process and their progress (the dbml_jobs view)", cc.jobs),
    Command("keyword", 2, "?COLOR?", "DEPRECATED: Sets the syntax highlighting color used for keywords",
            ds.deprecated_color("keyword"), extra=None),
    Command("last", 1, "", "Render the last result without truncating", cc.last),
    Command("large_number_rendering", 2, "MODE", "Toggle readable rendering of large numbers (duckbox only)",
            ds.large_numbers, extra="Mode: all|footer|off"),
    Command("log", 2, "FILE|off", "Turn logging on or off.  FILE can be stderr/stdout", cc.log),
    Command("maxrows", 0, "COUNT", "Sets the maximum number of rows for display (default: 40). Only for duckbox "
            "mode.", ds.max_rows),
    Command("maxwidth", 0, "COUNT", "Sets the maximum width in characters. 0 defaults to terminal width. Only for "
            "duckbox mode.", ds.max_width),
    Command("mode", 0, "MODE ?TABLE?", "Set output mode", ds.set_output_mode, extra=_MODE_HELP),
    Command("multiline", 1, "", "Sets the render mode to multi-line", ds.line_mode),
    Command("nullvalue", 2, "STRING", "Use STRING in place of NULL values", ds.null_value),
    Command("open", 0, "?OPTIONS? ?FILE?", "Close existing database and reopen FILE", cc.open_database, 2,
            extra="Options:\n\t--new\tInitialize FILE to an empty database\n\t--nofollow\tDo not follow symbolic "
                  "links\n\t--readonly\tOpen FILE in read-only mode\n\t--sql\tSet FILE using SQL"),
    Command("once", 0, "?FILE?", "Output for the next SQL command only to FILE", cc.once, extra=_OUTPUT_HELP),
    Command("output", 0, "?FILE?", "Send output to FILE or stdout if FILE is omitted", cc.output,
            extra=_OUTPUT_HELP),
    Command("pager", 0, "OPTIONS", "Control pager usage for output", ds.set_pager,
            extra="Options:\n\t[on|off|automatic]\tToggle pager mode (default: automatic)\n\tset_[row|column]_threshold "
                  "THRESHOLD\tIn automatic mode, trigger the pager when the result has more rows/columns than this\n\t"
                  "[pager_command]\tSet the pager command to invoke\nNote: Set DUCKDB_PAGER or PAGER environment "
                  "variable or <cmd> to configure default pager"),
    Command("print", 0, "STRING...", "Print literal STRING", ds.print_words, 3),
    Command("progress_bar", 0, "OPTIONS", "Configure the progress bar display", ds.progress_bar,
            extra="OPTIONS:\n\t--add [COMPONENT]\tAdd a component to the progress bar\n\t--clear\tClear all "
                  "components"),
    Command("prompt", 0, "MAIN CONTINUE", "Replace the standard prompts", ds.set_prompt),
    Command("quit", 0, "", "Exit this program", lambda shell, words: EXIT),
    Command("read", 2, "FILE", "Read input from FILE", cc.read, 3),
    Command("read_line_version", 2, "linenoise|fallback", "Sets the library used for processing interactive input",
            ds.read_line_version),
    Command("render_completion", 2, "on|off", "Toggle displaying of completion prompts in the shell on/off",
            ds.flag("render_completion")),
    Command("render_errors", 2, "on|off", "Toggle rendering of errors in the shell on/off", ds.flag("render_errors")),
    Command("rows", 1, "", "Row-wise rendering of query results (default)", ds.display_flag("columns", False)),
    Command("safe_mode", 0, "", "Enable safe-mode", ds.safe_mode),
    Command("separator", 0, "COL ?ROW?", "Change the column and row separators", ds.separator),
    Command("schema", 0, "?PATTERN?", "Show the CREATE statements matching PATTERN", cc.schema,
            extra="Options:\n\t--indent\tTry to pretty-print the schema"),
    Command("shell", 0, "CMD ARGS...", "Run CMD ARGS... in a system shell", cc.system),
    Command("show", 1, "", "Show the current values for various settings", ds.show_settings),
    Command("singleline", 1, "", "Sets the render mode to single-line", ds.line_mode),
    Command("startup_text", 2, "none|version|all", "Start-up text to display. Set this as the first line in "
            ".duckdbrc", ds.startup_text),
    Command("system", 0, "CMD ARGS...", "Run CMD ARGS... in a system shell", cc.system),
    Command("tables", 0, "?TABLE?", "List names of tables matching LIKE pattern TABLE", cc.tables, 2),
    Command("thousand_sep", 0, "SEP", "Sets the thousand separator used when rendering numbers. Only for duckbox "
            "mode.", ds.separator_char("thousand"), 4),
    Command("timer", 2, "on|off", "Turn SQL timer on or off", ds.flag("timer")),
    Command("ui_command", 0, "[command]", "Set the UI command", ds.ui_command),
    Command("version", 1, "", "Show the version", ds.show_version),
    Command("width", 0, "NUM1 NUM2 ...", "Set minimum column widths for columnar output", ds.set_widths,
            extra="Negative values right-justify"),
)
