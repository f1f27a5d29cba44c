"""The one place that explains a dbml SQL function called with arguments it does not take.

DuckDB binds a macro's arguments before dbml runs, and answers a misspelt one with
``Binder Error: Macro train() does not support the supplied arguments`` and the whole
signature; a Python UDF's named argument gets ``No function matches the given name and
argument types``. Where dbml runs a statement (a dbml ``Connection``'s ``execute`` and
``sql``, the shell), :func:`explained` turns that error of one of dbml's functions into one
that names the argument and the nearest valid one:

    Binder Error: train(): no argument 'lable'; did you mean 'label'?

The calls are read from the statement with DuckDB's tokenizer; what a macro takes
comes from its definition (``macro_signatures``: ``sql/macros.sql`` and the generated
``train`` and ``tune``), a UDF's from ``SQL_FUNCTIONS``' help text. DuckDB's own error is
kept where the call is not one of dbml's, cannot be read, or its arguments are all known
(a type error): nothing of it is guessed.
"""

from __future__ import annotations

import difflib
import re
from contextlib import contextmanager
from typing import Iterator

import duckdb

from ..core.sqltext import code_tokens

__all__ = ["arguments_explained", "explained", "argument_problems", "nearest"]

# DuckDB's messages for a macro and for a function whose arguments do not bind
_MACRO = re.compile(r'Macro "?(\w+)"?\(\) does not support the supplied arguments')
_FUNCTION = re.compile(r"No function matches the given name and argument types '\"?(\w+)\"?\(")
_WHERE = re.compile(r"\n+(LINE \d+:.*)", re.S)
_IDENTIFIER, _KEYWORD = duckdb.token_type.identifier, duckdb.token_type.keyword


def nearest(name: str, known: list[str] | tuple[str, ...]) -> str | None:
    """The known name closest to ``name``: the longest whose words begin or end ``name``'s
    (``split_method`` -> ``split``, BigQuery's ``data_split_col`` -> ``split_col``), else by spelling (difflib), else the one whose
    words' initials ``name`` is, or that are ``name``'s (``learning_rate`` -> ``lr``)."""
    words = name.split("_")
    inside = [k for k in known if "_" in name and k != name and (
        words[:len(k.split("_"))] == k.split("_") or words[-len(k.split("_")):] == k.split("_"))]
    if inside:
        return max(inside, key=len)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return close[0]

    def initials(word: str) -> str:
        return "".join(part[0] for part in word.split("_") if part)
    for candidate in known:
        if "_" in name and initials(name) == candidate or "_" in candidate and initials(candidate) == name:
            return candidate
    return None


def _calls(statement: str, function: str) -> list[tuple[int, list[str]]]:
    """Each call of ``function`` in ``statement``: (how many arguments by position, the names
    of those given by name, ``name := value`` or ``name => value``), read with DuckDB's tokenizer."""
    tokens, words, names = _read(statement)
    calls = []
    for i in range(len(tokens) - 1):
        if names[i] != function or words[i + 1] != "(" or words[i - 1:i] == ["."]:
            continue
        positional, named, depth, start = 0, [], 0, True
        for j in range(i + 1, len(tokens)):
            word = words[j]
            if start and depth == 1 and word != ")":
                if j + 1 < len(tokens) and words[j + 1] in (":=", "=>") and names[j]:
                    named.append(names[j])
                else:
                    positional += 1
            start = False
            if word in ("(", "[", "{"):
                depth += 1
                start = depth == 1
            elif word in (")", "]", "}"):
                depth -= 1
                if depth == 0:
                    break
            elif word == "," and depth == 1:
                start = True
        calls.append((positional, named))
    return calls


def _read(statement: str) -> tuple[list, list[str], list[str | None]]:
    """``statement``'s tokens (DuckDB's tokenizer), their texts, and each name as DuckDB
    reads it (None for a token that is no identifier or keyword)."""
    tokens = code_tokens(statement)
    names = [_name(text) if kind in (_IDENTIFIER, _KEYWORD) else None for text, kind in tokens]
    return tokens, [text for text, _ in tokens], names


def _name(text: str) -> str:
    """An identifier as DuckDB reads it: unquoted, or folded to lower case."""
    return text[1:-1].replace('""', '"') if text.startswith('"') else text.lower()


def _udf_signature(function: str) -> str:
    """A UDF's call as its help text writes it (``predict(model, [x1, x2, ...] | image | text)``)."""
    from . import SQL_FUNCTIONS
    return SQL_FUNCTIONS[function].split(" -> ")[0]


def argument_problems(function: str, positional: int, named: list[str]) -> list[str]:
    """What is wrong with a call of dbml's ``function`` with ``positional`` arguments by
    position and ``named`` by name, each problem naming the argument and the fix; [] if nothing
    (a type DuckDB could not bind is then its own message)."""
    from . import macro_signatures

    signature = macro_signatures().get(function)
    if signature is None:
        if not named:
            return []
        return [f"no argument by name ({', '.join(map(repr, named))}); pass them in order: {_udf_signature(function)}"]
    known = signature.positional + signature.named
    problems = []
    for name in named:
        if name not in known:
            guess = nearest(name, known)
            if guess is None and name == "version" and "model" in known:   # versions are named with the model
                problems.append("no argument 'version'; name the version with the model, e.g. 'churn@2' "
                                "(SELECT model, version FROM dbml_models lists them)")
                continue
            problems.append(f"no argument {name!r}" + (f"; did you mean {guess!r}?" if guess else ""))
    if problems:
        return problems
    given = set(named) | set(known[:positional])
    missing = [p for p in signature.positional if p not in given]
    if missing:
        problems.append(f"missing argument {', '.join(map(repr, missing))}.")
    if positional > len(known):
        problems.append(f"{positional} arguments given in order; it takes at most {len(known)}.")
    return problems


def _takes(function: str) -> str:
    from . import macro_signatures
    signature = macro_signatures()[function]
    text = f"{function}() takes {', '.join(signature.positional) or 'no argument in order'}"
    return text + (f"; by name: {', '.join(signature.named)}" if signature.named else "")


def explained(statement: str, error: BaseException) -> BaseException | None:
    """DuckDB's binder ``error`` for ``statement`` as one that names the argument of dbml's
    function that does not fit and the fix (the same exception type, DuckDB's ``LINE``
    pointer kept); an ``unnest`` of a table macro's STRUCT as one that names the table form;
    a subquery as a table macro's source as one that names the text form; None where it is
    not about a dbml function's arguments."""
    from . import SQL_FUNCTIONS

    if isinstance(error, duckdb.SerializationException):
        return _unnested(statement, error)
    if not isinstance(error, duckdb.BinderException):
        return None
    text = str(error)
    if _SUBQUERY.search(text):
        return _subquery_source(statement, error)
    match = _MACRO.search(text) or _FUNCTION.search(text)
    function = match.group(1).lower() if match else None
    if function not in SQL_FUNCTIONS:
        return None
    for positional, named in _calls(statement, function):
        problems = argument_problems(function, positional, named)
        if problems:
            from . import macro_signatures
            takes = _takes(function) if function in macro_signatures() else ""
            where = _WHERE.search(text)
            message = f"Binder Error: {function}(): {' '.join(problems)}" + (f"\n{takes}" if takes else "")
            return type(error)(message + (f"\n\n{where.group(1)}" if where else ""))
    return None


# DuckDB's errors for a subquery passed to a table macro: in FROM, and as a scalar argument
_SUBQUERY = re.compile(r"Table function cannot contain subqueries|Subquery returns \d+ columns - expected 1")
_QUERY_WORDS = ("select", "from", "with", "values", "table")


def _subquery_source(statement: str, error: BaseException) -> BaseException | None:
    """``SELECT * FROM predictions('m', (SELECT ...))``: DuckDB binds no subquery as a table
    function's argument; dbml's table macros read their source as a table's name or a
    SELECT's text, which the message shows with the statement's own query."""
    from . import table_macros

    tokens, words, names = _read(statement)
    for i in range(len(tokens) - 1):
        function = names[i]
        if function not in table_macros() or words[i + 1] != "(" or words[i - 1:i] == ["."]:
            continue
        depth = 0
        for j in range(i + 1, len(tokens) - 1):
            if words[j] in ("(", "[", "{"):
                depth += 1
                if depth == 2 and words[j - 1] in ("(", ",") and names[j + 1] in _QUERY_WORDS:
                    from sqlglot import exp
                    text, kind = tokens[i + 2]
                    model = text[1:-1].replace("''", "'") if kind == duckdb.token_type.string_const else "m"
                    call = exp.Anonymous(this=function, expressions=[
                        exp.Literal.string(model), exp.Literal.string("SELECT * FROM t WHERE ...")])
                    example = exp.select(exp.Star()).from_(call).sql("duckdb", normalize_functions=False)
                    return type(error)(f"Binder Error: {function}(): pass its source as a table's name or as a "
                                       f"query's text, not a subquery (DuckDB's table functions take none), "
                                       f"e.g. {example}")
            elif words[j] in (")", "]", "}"):
                depth -= 1
                if depth == 0:
                    break
    return None


# DuckDB's error where unnest() expands a STRUCT whose expression holds a subquery
_UNCOPYABLE = "Cannot copy BoundSubqueryExpression"


def _unnested(statement: str, error: BaseException) -> BaseException | None:
    """``unnest(evaluate(...))``, ``unnest(train(...))``: DuckDB copies the expression of the
    STRUCT it expands, and cannot copy the subquery in the macro (the caller's TEMP tables,
    ``dbml_temp_names()``). A table macro's table form gives its fields as columns; a scalar
    macro's STRUCT expands once it is a subquery's column."""
    from . import macro_signatures, table_macros

    if _UNCOPYABLE not in str(error):
        return None
    tokens, words, names = _read(statement)
    for i in range(len(tokens) - 3):
        function = names[i + 2]
        if names[i] != "unnest" or words[i + 1] != "(" or words[i + 3] != "(" or function not in macro_signatures():
            continue
        from sqlglot import exp
        call = exp.Anonymous(this=function, expressions=[exp.var("...")])
        if function in table_macros():
            table = exp.select(exp.Star()).from_(call).sql("duckdb", normalize_functions=False)
            fix = f"read its fields as a table instead: {table}, with the same arguments"
        else:
            named = exp.select(exp.Anonymous(this="unnest", expressions=[exp.column("r")])).from_(
                exp.select(exp.alias_(call, "r")).subquery()).sql("duckdb", normalize_functions=False)
            fix = f"name its result in a subquery first: {named}, with the same arguments"
        return type(error)(f"Serialization Error: unnest({function}(...)) cannot expand {function}()'s STRUCT "
                           f"(DuckDB cannot copy the subquery inside the macro); {fix}")
    return None


@contextmanager
def arguments_explained(statement) -> Iterator[None]:
    """Runs a statement: DuckDB's binder error for a dbml function called with an argument it
    does not take is raised as :func:`explained` writes it, the original as its cause; so is
    the error of an ``unnest`` of a dbml table macro's STRUCT."""
    try:
        yield
    except (duckdb.BinderException, duckdb.SerializationException) as e:
        better = explained(statement, e) if isinstance(statement, str) else None
        if better is None:
            raise
        raise better from e
