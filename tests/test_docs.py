"""The public surface is documented: every SQL function and CLI command has help and a README line."""

import re
from pathlib import Path

from dbml.cli import COMMANDS, parser
from dbml.udfs import INTERNAL_FUNCTIONS, SQL_FUNCTIONS

README = (Path(__file__).parents[1] / "README.md").read_text()


def installed_functions(con) -> set[str]:
    """Functions and macros dbml added to a connection (those a plain DuckDB connection lacks)."""
    import duckdb
    plain = {r[0] for r in duckdb.connect().execute("SELECT function_name FROM duckdb_functions()").fetchall()}
    ours = {r[0] for r in con.execute("SELECT function_name FROM duckdb_functions()").fetchall()}
    return ours - plain


def test_every_sql_function_has_help_and_a_readme_line(con):
    public = installed_functions(con) - set(INTERNAL_FUNCTIONS)
    assert public == set(SQL_FUNCTIONS)
    for name, help_text in SQL_FUNCTIONS.items():
        assert help_text.strip(), name
        assert f"`{name}(" in README, f"README lacks a reference line for {name}()"


def test_every_cli_command_has_help_and_a_readme_line():
    sub = next(a for a in parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)
    for name in COMMANDS:
        assert sub.choices[name].description, name
        assert f"python -m dbml {name}" in README, name


def readme_table(heading: str) -> list[list[str]]:
    """The rows of the first Markdown table under ``heading``, cells stripped of backticks."""
    section = README.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip().strip("`") for cell in row] for row in rows[2:]]


def _shown(value) -> str:
    """A default as the README writes it: the SQL literal dbml's macros use (dbml.core.source.literal),
    true/false in lower case."""
    from dbml.core.source import literal
    return literal(value).lower() if isinstance(value, bool) else literal(value)


def test_readme_settings_table_is_the_settings_table():
    from dbml.core.settings import SETTINGS
    want = [[s.name, _shown(s.default), s.doc] for s in SETTINGS]
    assert readme_table("### Settings") == want


def test_readme_environment_table_is_config_environment():
    from dbml.scheduler.config import ENVIRONMENT
    want = [[name, default or "unset", effect] for name, (default, effect) in ENVIRONMENT.items()]
    assert readme_table("### Environment variables") == want


def test_registered_functions_are_the_functions_table(con):
    """What DuckDB holds for every UDF: parameter types, return type, side effects, from FUNCTIONS."""
    from dbml.udfs import FUNCTIONS
    got = {r[0]: r[1:] for r in con.execute(
        "SELECT function_name, parameter_types, return_type, has_side_effects FROM duckdb_functions() "
        "WHERE function_type = 'scalar' AND function_name IN (SELECT unnest(?))", [[f.name for f in FUNCTIONS]]).fetchall()}
    want = {f.name: ([str(p) for p in f.params], str(f.returns), bool(f.options().get("side_effects")))
            for f in FUNCTIONS}
    assert got == want and len(got) == len(FUNCTIONS)


def test_train_macro_is_train_params_then_every_setting(con):
    """train()'s named parameters are TRAIN_PARAMS; it passes them, then each setting, then the
    calling connection's id (whose interrupt() reaches the statement's jobs), to dbml_train."""
    from dbml.core.settings import SETTINGS
    from dbml.core.spec import TRAIN_PARAMS
    params, body = con.execute("SELECT parameters, macro_definition FROM duckdb_functions() "
                               "WHERE function_name = 'train'").fetchall()[0]
    assert params == [p.name for p in TRAIN_PARAMS]
    assert re.findall(r"getvariable\('dbml_(\w+)'\)", body) == [s.name for s in SETTINGS]
    udf = con.execute("SELECT parameter_types FROM duckdb_functions() WHERE function_name = 'dbml_train'").fetchall()[0][0]
    assert udf == [p.sql_type for p in TRAIN_PARAMS] + [s.sql_type for s in SETTINGS] + ["BIGINT", "VARCHAR[]"]
    assert body.rstrip().endswith("CAST(current_connection_id() AS BIGINT), dbml_temp_names())")



def test_train_help_and_readme_signature_follow_train_params():
    """The help text names every parameter but wait (documented with wait_job); the README's
    reference line gives each named parameter its TRAIN_PARAMS default."""
    from dbml.core.spec import TRAIN_PARAMS
    named = [p for p in TRAIN_PARAMS if p.name != "wait"]
    help_params = SQL_FUNCTIONS["train"].split("(", 1)[1].split(")", 1)[0]
    assert [a.split(":=")[0].strip() for a in help_params.split(",")] == [p.name for p in named]
    line = README.split("- `train(", 1)[1].split(")`", 1)[0]
    readme = dict(a.split(" := ") for a in re.split(r",\s+", line) if ":=" in a)
    assert readme == {p.name: "..." if p.name == "label" else _shown(p.default) for p in named if not p.required}


def test_readme_documents_every_zoo_arch_and_its_options():
    """The README's zoo table names every built-in arch and each of its options."""
    from dbml.zoo import ARCHS
    zoo_table = README.split("The zoo (", 1)[1].split("`arch := 'auto'` picks", 1)[0]
    for name, arch in ARCHS.items():
        row = next(line for line in zoo_table.splitlines() if f"`{name}`" in line)
        for option in arch.options:
            assert f"`{option}`" in row, (name, option)
