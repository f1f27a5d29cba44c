"""The public surface is documented: every SQL function and CLI command has help and a README line."""

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
