"""Colours, as DuckDB's CLI draws them: terminal codes, the elements ``.highlight_colors``
names, and errors with their quoted names and the token under the caret emphasised.

The element and colour tables are the CLI's (``shell_highlight.cpp``); DuckDB's own
tokenizer (``duckdb.tokenize``) finds the tokens of the query an error quotes.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

__all__ = ["COLORS", "ELEMENTS", "Highlighter", "terminal_code", "tokenize_error"]

# the 256 terminal colours by code (0-15: the standard and bright ones)
COLORS = """black red green yellow blue magenta cyan brightgray gray brightred brightgreen brightyellow brightblue
brightmagenta brightcyan white grey0 navyblue darkblue blue3 blue4 blue1 darkgreen deepskyblue4 deepskyblue5
deepskyblue6 dodgerblue3 dodgerblue2 green4 springgreen4 turquoise4 deepskyblue3 deepskyblue7 dodgerblue1
green3 springgreen3 darkcyan lightseagreen deepskyblue2 deepskyblue1 green5 springgreen5 springgreen2 cyan3
darkturquoise turquoise2 green1 springgreen6 springgreen1 mediumspringgreen cyan2 cyan1 darkred1 deeppink4
purple4 purple5 purple3 blueviolet orange4 grey37 mediumpurple4 slateblue3 slateblue4 royalblue1 chartreuse4
darkseagreen4 paleturquoise4 steelblue steelblue3 cornflowerblue chartreuse3 darkseagreen5 cadetblue
cadetblue2 skyblue3 steelblue1 chartreuse5 palegreen3 seagreen3 aquamarine3 mediumturquoise steelblue2
chartreuse2 seagreen2 seagreen1 seagreen4 aquamarine1 darkslategray2 darkred2 deeppink5 darkmagenta
darkmagenta2 darkviolet1 purple2 orange5 lightpink4 plum4 mediumpurple3 mediumpurple5 slateblue1 yellow4
wheat4 grey53 lightslategrey mediumpurple lightslateblue yellow5 darkolivegreen3 darkseagreen lightskyblue3
lightskyblue4 skyblue2 chartreuse6 darkolivegreen4 palegreen4 darkseagreen3 darkslategray3 skyblue1
chartreuse1 lightgreen1 lightgreen2 palegreen1 aquamarine2 darkslategray1 red3 deeppink6 mediumvioletred
magenta3 darkviolet2 purple6 darkorange3 indianred1 hotpink3 mediumorchid3 mediumorchid mediumpurple2
darkgoldenrod lightsalmon3 rosybrown grey63 mediumpurple6 mediumpurple1 gold3 darkkhaki navajowhite3 grey69
lightsteelblue3 lightsteelblue yellow3 darkolivegreen5 darkseagreen6 darkseagreen2 lightcyan3 lightskyblue1
greenyellow darkolivegreen2 palegreen2 darkseagreen7 darkseagreen1 paleturquoise1 red4 deeppink3 deeppink7
magenta4 magenta5 magenta2 darkorange4 indianred2 hotpink4 hotpink2 orchid mediumorchid1 orange3 lightsalmon4
lightpink3 pink3 plum3 violet gold4 lightgoldenrod3 tan mistyrose3 thistle3 plum2 yellow6 khaki3
lightgoldenrod2 lightyellow3 grey84 lightsteelblue1 yellow2 darkolivegreen1 darkolivegreen6 darkseagreen8
honeydew2 lightcyan1 red1 deeppink2 deeppink1 deeppink8 magenta6 magenta1 orangered1 indianred3 indianred4
hotpink hotpink5 mediumorchid2 darkorange salmon1 lightcoral palevioletred1 orchid2 orchid1 orange1 sandybrown
lightsalmon1 lightpink1 pink1 plum1 gold1 lightgoldenrod4 lightgoldenrod5 navajowhite1 mistyrose1 thistle1
yellow1 lightgoldenrod1 khaki1 wheat1 cornsilk1 grey100 grey3 grey7 grey11 grey15 grey19 grey23 grey27 grey30
grey35 grey39 grey42 grey46 grey50 grey54 grey58 grey62 grey66 grey70 grey74 grey78 grey82 grey85 grey89
grey93""".split()
STANDARD = None
INTENSITIES = {"standard": "", "bold": "\033[1m", "underline": "\033[4m", "bold_underline": "\033[1m\033[4m"}

# element -> (colour, intensity) by default
ELEMENTS: dict[str, tuple[str | None, str]] = {
    "error": ("red", "standard"), "keyword": ("green", "standard"), "numeric_constant": ("yellow", "standard"),
    "string_constant": ("yellow", "standard"), "line_indicator": (None, "bold"),
    "database_name": ("orange3", "standard"), "schema_name": ("deepskyblue1", "standard"),
    "table_name": (None, "bold"), "column_name": (None, "standard"), "column_type": ("gray", "standard"),
    "numeric_value": (None, "standard"), "string_value": (None, "standard"), "temporal_value": (None, "standard"),
    "null_value": ("gray", "standard"), "footer": ("gray", "standard"), "layout": ("gray", "standard"),
    "startup_text": ("gray", "standard"), "startup_version": (None, "standard"), "continuation": ("gray", "standard"),
    "continuation_selected": ("green", "standard"), "bracket": (None, "underline"), "comment": ("gray", "standard"),
    "suggestion_catalog_name": ("orange3", "standard"), "suggestion_schema_name": ("deepskyblue1", "standard"),
    "suggestion_table_name": (None, "standard"), "suggestion_column_name": (None, "standard"),
    "suggestion_file_name": (None, "standard"), "suggestion_directory_name": (None, "bold"),
    "suggestion_function_name": (None, "standard"), "suggestion_setting_name": (None, "standard"),
    "table_layout": ("gray", "standard"), "view_layout": (None, "standard"),
    "primary_key_column": (None, "underline"), "prompt": ("darkorange", "bold"),
    "error_emphasis": ("red", "bold"), "error_suggestion": ("red", "bold"), "log_trace": ("blue", "bold"),
    "log_debug": ("yellow", "bold"), "log_info": ("green", "bold"), "log_warning": ("gray", "standard"),
    "none": (None, "standard"),
}


def terminal_code(color: str | None, intensity: str = "standard") -> str:
    code = INTENSITIES[intensity]
    if color is not None:
        index = COLORS.index(color)
        if 1 <= index <= 7:
            code += f"\033[{30 + index}m"
        elif 8 <= index <= 15:
            code += f"\033[{82 + index}m"
        else:
            code += f"\033[38;5;{index}m"
    return code


def _did_you_mean(options: list[str], name: str) -> str:
    close = difflib.get_close_matches(name, options, n=5, cutoff=0.5)
    return "Did you mean " + ", ".join(f'"{c}"' for c in close) + "?" if close else ""


# .highlight_mode (and -dark-mode, -light-mode): the elements each mode recolours
MODES = {
    "mixed": {"keyword": ("green", "standard"), "string_constant": ("yellow", "standard"),
              "numeric_constant": ("yellow", "standard"), "continuation_selected": ("green", "standard"),
              "prompt": ("darkorange", "bold"), "database_name": ("orange3", "standard"),
              "schema_name": ("deepskyblue1", "standard")},
    "dark": {"keyword": ("dodgerblue1", "bold"), "string_constant": ("gold1", "standard"),
             "numeric_constant": ("orchid2", "standard"), "continuation_selected": ("dodgerblue1", "standard"),
             "error": ("indianred3", "standard"), "error_emphasis": ("indianred3", "bold"),
             "error_suggestion": ("indianred3", "bold")},
    "light": {"keyword": ("dodgerblue2", "bold"), "string_constant": ("orange4", "standard"),
              "numeric_constant": ("darkmagenta", "standard"), "continuation_selected": ("dodgerblue2", "standard"),
              "prompt": ("darkorange4", "bold"), "error": ("red3", "standard"), "error_emphasis": ("red3", "bold"),
              "error_suggestion": ("red3", "bold"), "database_name": ("darkorange4", "standard"),
              "schema_name": ("deepskyblue6", "standard")},
}


@dataclass
class Highlighter:
    """Which elements have which colours, and whether to colour at all."""
    enabled: bool = True
    colors: dict = field(default_factory=lambda: dict(ELEMENTS))
    chosen: set = field(default_factory=set)      # set by .highlight_colors: a mode leaves them

    def set_mode(self, mode: str) -> None:
        """``.highlight_mode mixed|dark|light``: that mode's colours, except those the user chose."""
        for element, colour in MODES.get(mode, {}).items():
            if element not in self.chosen:
                self.colors[element] = colour

    def paint(self, text: str, element: str) -> str:
        color, intensity = self.colors[element]
        code = terminal_code(color, intensity)
        return f"{code}{text}\033[00m" if code and self.enabled and text else text

    def set_color(self, element: str, color: str, intensity: str | None) -> str | None:
        """``.highlight_colors ELEMENT COLOR [INTENSITY]``: an error text, or None."""
        if element.lower() not in self.colors:
            return f"Unknown element '{element}', supported options: {', '.join(ELEMENTS)}\n"
        if color.lower() not in COLORS:
            return (f"Unknown highlighting color '{color}'\n{_did_you_mean(COLORS, color.lower())}\n"
                    "Run '.display_colors' for a list of available colors.\n")
        if intensity is not None and intensity.lower() not in INTENSITIES:
            return f"Unknown intensity '{intensity}', supported options: standard, bold, underline\n"
        self.colors[element.lower()] = (color.lower(), (intensity or "standard").lower())
        self.chosen.add(element.lower())
        return None

    def error(self, message: str) -> str:
        """An error message with its parts coloured as the CLI colours them."""
        head, body = "", message
        at = message.find("Error: ")
        if at >= 0:
            head, body = message[:at + 6], message[at + 7:]
        out = [self.paint(head + "\n", "error_emphasis")] if head else []
        spans = tokenize_error(body)
        for (start, element), (end, _) in zip(spans, spans[1:] + [(len(body), "")]):
            out.append(self.paint(body[start:end], element))
        return "".join(out)


def tokenize_error(message: str) -> list[tuple[int, str]]:
    """Where each differently coloured part of an error message starts (DuckDB's
    ``Parser::TokenizeError``): quoted names are suggestions, the query after ``LINE n:``
    is tokenized and the token under the caret emphasised."""
    at = message.find("Error:")
    spans = [(0, "error_emphasis"), (at + 6, "error")] if at >= 0 else [(0, "error")]
    start = at + 6 if at >= 0 else 0
    line = message.find("\nLINE ")
    end = line if line >= 0 else len(message)
    quote = None
    for i in range(start, end):
        ch = message[i]
        if quote is not None:
            if ch == quote:
                spans.append((i, "error"))
                quote = None
            elif ch in "\r\n":
                spans.pop()
                quote = None
        elif ch in "\"'":
            spans.append((i + 1, "error_suggestion"))
            quote = ch
    if quote is not None:
        spans.pop()
    if line >= 0:
        spans += _line_tokens(message, line)
    if spans and spans[0][0] > 0:
        spans.insert(0, (0, "none"))
    return sorted(set(spans), key=lambda s: s[0])


def _line_tokens(message: str, line: int) -> list[tuple[int, str]]:
    import duckdb
    spans = [(line + 1, "error_emphasis")]
    q = line + 6
    while q < len(message) and (message[q] == ":" or message[q].isdigit()):
        q += 1
    if q >= len(message):
        return spans
    spans.append((q, "error"))
    q_end = message.find("\n", q)
    q_end = len(message) if q_end < 0 else q_end
    caret = message.find("^", q_end + 1)
    caret = caret - (q_end + 1) - (q - line - 1) if caret >= 0 else None
    kinds = {"keyword": "keyword", "numeric_const": "numeric_constant", "string_const": "string_constant",
             "comment": "line_indicator"}
    for pos, kind in duckdb.tokenize(message[q:q_end]):
        if caret is not None and pos >= caret:
            spans.append((q + caret, "error_emphasis"))
            caret = None
            continue
        spans.append((q + pos, kinds.get(kind.name, "none")))
    return spans
