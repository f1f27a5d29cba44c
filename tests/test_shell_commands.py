"""The shell's dot commands: every one DuckDB's CLI lists, named and matched as it names them,
with its messages (DuckDB v1.5.6's ``.help``)."""

import io
import os
from pathlib import Path

import pytest

from dbml.shell import run
from dbml.shell.commands import COMMANDS, find, split_words

# the commands DuckDB's CLI (v1.5.6) lists in its .help
CLI_COMMANDS = """bail binary cd changes columns decimal_sep databases dump display_colors echo edit excel exit headers
help highlight highlight_colors highlight_errors highlight_mode highlight_results import indexes last
large_number_rendering log maxrows maxwidth mode multiline nullvalue open once output pager print progress_bar
prompt quit read read_line_version render_completion render_errors rows safe_mode separator schema shell show
singleline startup_text system tables thousand_sep timer ui_command version width""".split()


def shell(con, text):
    out, err = io.StringIO(), io.StringIO()
    status = run(con, io.StringIO(text), out, err)
    return status, out.getvalue(), err.getvalue()


def test_every_command_of_duckdbs_cli_is_there_with_its_help_and_a_readme_mention():
    names = [c.name for c in COMMANDS]
    assert set(CLI_COMMANDS) <= set(names)
    assert all(c.help and c.usage is not None for c in COMMANDS)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    listed = [c.name for c in COMMANDS if c.extra is not None]   # the deprecated colour commands are left out
    assert [n for n in listed if f"`.{n}" not in readme] == []


@pytest.mark.parametrize("prefix,name", [(".sh", "shell"), (".col", "columns"), (".sep", "separator"),
                                         (".null", "nullvalue"), (".highlight_color", "highlight_colors"),
                                         (".c", "cd"), (".tables", "tables"), (".t", "timer"), (".ta", "tables"),
                                         (".x", None)])
def test_a_prefix_names_the_first_command_that_starts_with_it(prefix, name):
    found = find(prefix[1:])
    assert (found.name if found else None) == name


def test_words_split_as_the_cli_splits_them():
    assert split_words('.output "my file.txt" \'a b\' c\\td "x\\ny"') == ["output", "my file.txt", "a b", "c\td", "x\ny"]


def test_unknown_commands_and_wrong_usage_say_so(con):
    status, _, err = shell(con, ".vfsinfo\n.headers\n.clone\n")
    assert status == 1
    assert err.startswith("Unknown Command Error: Unrecognized command 'vfsinfo'\n")
    assert "Invalid Command Error: Invalid usage of command '.headers'\n\nUsage: '.headers on|off'" in err
    assert "Unrecognized command 'clone'" in err


def test_help_is_the_clis_and_names_dbmls_functions(con):
    _, out, _ = shell(con, ".help\n.help pager\n.help dbml\n.help nothing_like_it\n")
    assert ".bail on|off                             Stop after hitting an error.  Default OFF\n" in out
    assert "Note: Set DUCKDB_PAGER or PAGER environment variable" in out
    assert "train(model, source" in out and "predict(model" in out and "Nothing matches 'nothing_like_it'" in out


def test_show_print_and_the_settings_it_lists(con):
    _, out, _ = shell(con, ".mode csv\n.nullvalue X\n.width 3 -4\n.show\n.print a  b\n.exit\n")
    assert out == ("        echo: off\n     headers: on\n        mode: csv\n   nullvalue: \"X\"\n      output: stdout\n"
                   "colseparator: \",\"\nrowseparator: \"\\r\\n\"\n       width: 3 -4 \n    filename: :memory:\na b\n")


def test_output_and_once_send_results_to_files(con, tmp_path):
    once, kept = tmp_path / "once.txt", tmp_path / "kept.txt"
    _, out, _ = shell(con, f".mode list\n.once {once}\nSELECT 1 AS first;\nSELECT 2 AS second;\n"
                           f".output {kept}\nSELECT 3 AS third;\nSELECT 4 AS fourth;\n.output\nSELECT 5 AS fifth;\n")
    assert once.read_text() == "first\n1\n" and kept.read_text() == "third\n3\nfourth\n4\n"
    assert out == "second\n2\nfifth\n5\n"


def test_a_duckbox_to_a_file_has_every_row(con, tmp_path):
    target = tmp_path / "all.txt"
    shell(con, f".maxrows 2\n.output {target}\nSELECT * FROM range(100);\n")
    assert "│    50 │" in target.read_text()


def test_open_with_sql_and_its_errors(con, tmp_path, monkeypatch):
    from dbml.shell.options import open_database
    monkeypatch.setenv("MY_DB", str(tmp_path / "via_sql.duckdb"))
    out, err = io.StringIO(), io.StringIO()
    from dbml.shell.session import Shell
    sh = Shell(open_database(":memory:"), out=out, err=err, opener=open_database)
    sh.process([".open -sql \"select getenv('MY_DB');\"", "SELECT database_name FROM duckdb_databases() "
                "WHERE NOT internal AND database_name <> 'dbml_scratch';"])
    assert "via_sql" in out.getvalue() and err.getvalue() == ""
    for words, message in [('-sql "select 1;" -sql "select 2;"', "Error: --sql provided multiple times"),
                           ("-sql", "Error: missing SQL query after --sql"),
                           ('-sql "select 1;" "x.db"', "Error: cannot use both --sql and a FILE argument"),
                           ('-sql "select 1, 2;"', "Error: --sql query returned multiple columns, expected single value"),
                           ('-sql "select unnest([1, 2]);"', "Error: --sql query returned multiple rows"),
                           ('-sql "select NULL;"', "Error: --sql query returned a null value"),
                           ("-sql \"select 'x'::int;\"", "Error: failed to evaluate --sql query")]:
        err.seek(0)
        err.truncate()
        assert sh.process([f".open {words}"]) == 1
        assert message in err.getvalue(), (words, err.getvalue())
    sh.close()


def test_import_reads_csv_json_and_parquet_into_new_or_existing_tables(con, tmp_path):
    (tmp_path / "a.csv").write_text("col_1,col_2\n1,2\n10,20\n")
    (tmp_path / "b.csv").write_text("42\n84\n")
    con.execute(f"COPY (SELECT 7 AS x) TO '{tmp_path / 'c.parquet'}'")
    status, out, err = shell(con, f".mode csv\n.import {tmp_path / 'a.csv'} t\nSELECT * FROM t;\n"
                                  f"CREATE TABLE s(i INTEGER);\n.import \"{tmp_path / 'b.csv'}\" s\nSELECT sum(i) AS s FROM s;\n"
                                  f".import {tmp_path / 'c.parquet'} p\nSELECT x FROM p;\n.import only_file\n")
    assert out.startswith("col_1,col_2\r\n1,2\r\n10,20\r\ns\r\n126\r\nx\r\n7\r\n"
                          "ERROR: missing TABLE argument. Usage:\n.import FILE TABLE")
    assert status == 1


def test_schema_patterns_and_indexes(con):
    _, out, err = shell(con, "CREATE TABLE duckdb_p(a INT, b VARCHAR, c BIT);\nCREATE TABLE p_duck(d INT, f DATE);\n"
                             "CREATE INDEX a_idx ON duckdb_p(a);\n.schema %p\n.schema %z%\n.indexes duck%\n.schema -indent x y\n")
    # as in the CLI, a pattern matches the table an index is on
    assert out == "CREATE INDEX a_idx ON duckdb_p(a);\nCREATE TABLE duckdb_p(a INTEGER, b VARCHAR, c BIT);\na_idx\n"
    assert err == "Usage: .schema ?--indent? ?LIKE-PATTERN?\n"


def test_a_schema_qualified_pattern_matches_schema_dot_name(con):
    """The released CLI (v1.5.6) fails on a dotted pattern (its query reads a column sqlite_master
    lacks); here it matches ``schema.name``, and --debug still prints the CLI's query."""
    status, out, err = shell(con, "CREATE TABLE t1(a INT);\nCREATE SCHEMA s;\nCREATE TABLE s.t2(b INT);\n"
                                  "CREATE VIEW s.v AS SELECT 1;\n.schema main.t*\n.schema s.*\n.schema *.t2\n"
                                  ".schema main.t1\n.schema --debug s.t*\n")
    assert err == "" and status == 0
    assert out == ("CREATE TABLE t1(a INTEGER);\nCREATE TABLE s.t2(b INTEGER);\nCREATE VIEW s.v AS SELECT 1;\n"
                   "CREATE TABLE s.t2(b INTEGER);\nCREATE TABLE t1(a INTEGER);\n"
                   "SQL: SELECT sql FROM sqlite_master WHERE lower(printf('%s.%s',sname,tbl_name)) GLOB 's.t*' "
                   "AND type!='meta' AND sql IS NOT NULL ORDER BY name;\n")


def test_prompt_errors_are_the_clis(con):
    _, _, err = shell(con, ".prompt {\n.prompt \\\\\n.prompt \"{yyy}\"\n.prompt \"{sql}\"\n.prompt \"{color:xxx}\"\n"
                           ".prompt \"{color:red}D \" \"  ...\"\n")
    assert err.splitlines() == ['Failed to parse prompt "{" - unterminated bracket or escape',
                                'Failed to parse prompt "\\" - unterminated bracket or escape',
                                "Unknown bracket type yyy", "sql requires a parameter",
                                "Unknown highlighting color 'xxx'"]


def test_highlight_colour_errors(con):
    _, _, err = shell(con, ".highlight_colors column_nameXX red\n.highlight_colors column_name redXX\n"
                           ".highlight_colors column_name red boldXX\n.highlight_colors column_name red bold zz\n")
    assert "Unknown element 'column_nameXX'" in err and "Unknown highlighting color 'redXX'" in err
    assert "Unknown intensity 'boldXX'" in err and "Usage: '.highlight_colors OPTIONS'" in err


def test_highlighted_errors_colour_the_suggestion(con):
    _, _, err = shell(con, ".highlight_errors on\nCREATE TABLE lineitem(l_extendedprice INT);\n"
                           "SELECT * FROM lineitem WHERE l_extendedpric = 5;\n")
    assert "\x1b[1m\x1b[31ml_extendedprice\x1b[00m" in err


@pytest.mark.parametrize("command", [".sh ls", ".cd ..", ".log file", ".import file.csv tbl", ".open new_file",
                                     ".output out", ".once out", ".excel out", ".read myfile.sql"])
@pytest.mark.slow   # ~0.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_safe_mode_refuses_what_reaches_outside(con, command):
    status, _, err = shell(con, f".safe_mode\n{command}\n")
    assert status == 1 and "cannot be used in -safe mode" in err


def test_safe_mode_locks_duckdbs_own_guards(con):
    status, _, err = shell(con, ".safe_mode\nSET memory_limit = '1GB';\nCOPY (SELECT 42) TO 'x.csv';\n")
    assert "locked" in err and "disabled" in err


@pytest.mark.skipif(os.name == "nt", reason="a POSIX shell")
def test_shell_and_cd_run_and_move(con, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, out, err = shell(con, f".shell echo quack\n.cd {tmp_path}\n.cd /no/such/dir\n")
    assert status == 1 and err == 'Cannot change to directory "/no/such/dir"\n'


def test_jobs_lists_dbmls_training_jobs(con):
    status, out, err = shell(con, ".jobs\n")
    assert status == 0 and "job_id" in out and "rows_per_s" in out, err


def test_a_prompt_draws_its_settings_and_queries(con):
    from dbml.shell.prompt import draw_prompt, parse_prompt
    from dbml.shell.session import Shell
    sh = Shell(con, out=io.StringIO(), err=io.StringIO())
    assert draw_prompt(sh, parse_prompt("{color:red}{setting:current_database}{color:reset} {sql:SELECT 6 * 7} D ")) \
        == "memory 42 D "


def test_the_pager_takes_a_long_result_at_an_interactive_terminal(con, tmp_path):
    from dbml.shell.session import Shell
    paged = tmp_path / "paged.txt"
    out = io.StringIO()
    sh = Shell(con, out=out, err=io.StringIO(), interactive=True, console=True)
    sh.process([f".pager 'cat > {paged}'", ".pager set_row_threshold 8", "SELECT 1 AS short;",
                "SELECT * FROM range(20);"])
    assert "short" in out.getvalue() and "│    19 │" not in out.getvalue()
    assert "│    19 │" in paged.read_text()


def test_excel_writes_the_next_result_as_csv_and_restores_the_mode(con, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")     # no xdg-open: the CLI's message, the file stays
    status, out, err = shell(con, ".excel\nSELECT 1 AS a;\n.mode\n")
    path = err.split("[", 1)[1].split(" ", 1)[1].rstrip("]\n")
    assert open(path, newline="").read() == "a\r\n1\r\n" and out == "current output mode: duckbox\n"
    os.unlink(path)


def _paged(con, tmp_path, monkeypatch, lines, *, columns=120, rows=40):
    """The shell at a fake interactive terminal of ``columns`` x ``rows``: what went to stdout,
    what the pager (a file here) got."""
    from dbml.shell.session import Shell
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("LINES", str(rows))
    paged = tmp_path / "paged.txt"
    paged.unlink(missing_ok=True)
    out = io.StringIO()
    sh = Shell(con, out=out, err=io.StringIO(), interactive=True, console=True)
    sh.process([f".pager 'cat > {paged}'", *lines])
    return out.getvalue(), paged.read_text() if paged.exists() else ""


def test_a_result_that_fits_the_terminal_is_not_paged_though_coloured(con, tmp_path, monkeypatch):
    """A one-row box as wide as a 120-column terminal, its header coloured: the colour codes
    take no columns, so it fits and is printed, not paged (they were counted as width)."""
    out, paged = _paged(con, tmp_path, monkeypatch, ["SELECT repeat('x', 300) AS s, 42 AS n;"])
    assert "\x1b[" in out and "42" in out and paged == ""
    from dbml.shell.render import shown_width
    assert max(shown_width(line) for line in out.splitlines()) <= 120 < max(len(line) for line in out.splitlines())


def test_the_pager_takes_what_is_taller_or_wider_than_the_terminal(con, tmp_path, monkeypatch):
    # a box of n rows takes n + 5 lines; the prompt needs one more
    out, paged = _paged(con, tmp_path, monkeypatch, [".maxrows 100", "SELECT * FROM range(34);"], rows=40)
    assert "│    33 │" in out and paged == ""
    out, paged = _paged(con, tmp_path, monkeypatch, [".maxrows 100", "SELECT * FROM range(35);"], rows=40)
    assert "│    34 │" in paged and "│    34 │" not in out
    out, paged = _paged(con, tmp_path, monkeypatch, [".maxrows 100", "SELECT * FROM range(35);"], rows=50)
    assert "│    34 │" in out and paged == ""
    out, paged = _paged(con, tmp_path, monkeypatch, [".maxwidth 200", "SELECT repeat('y', 130) AS s;"])
    assert "y" * 130 in paged and out == ""


def test_input_typed_ahead_is_never_read_by_the_pager(con, tmp_path, monkeypatch):
    """Text pasted after a long query waits on the terminal: the result is printed, not paged,
    and the text is left for the shell to read (less took '.q' of '.quit' and the shell hung)."""
    import os
    import sys
    read, write = os.pipe()
    os.write(write, b".quit\n")
    os.close(write)
    with os.fdopen(read) as pending:
        monkeypatch.setattr(sys, "stdin", pending)
        out, paged = _paged(con, tmp_path, monkeypatch, [".maxrows 100", "SELECT * FROM range(60);"])
        assert "│    59 │" in out and paged == ""
        assert pending.read() == ".quit\n"


def test_output_off_fails_quietly_and_a_path_that_cannot_be_opened_says_so(con, tmp_path):
    """As the CLI: ``.output off`` prints no error and the output stays on stdout; a path that
    cannot be opened says it cannot be opened and cannot be written to."""
    status, out, err = shell(con, ".mode list\n.output off\nSELECT 1 AS a;\n")
    assert err == "" and out.split() == ["a", "1"] and status == 1
    bad = tmp_path / "missing" / "file.txt"
    status, out, err = shell(con, f".mode list\n.output {bad}\nSELECT 1 AS a;\n")
    assert err == f'Error: cannot open "{bad}"\nError: cannot write to "{bad}"\n' and out.split() == ["a", "1"]
