"""python -m dbml shell: input, statements, errors and robustness as in DuckDB's CLI, and the demo.

In-process through ``dbml.shell.run`` where possible; the command line is in
test_shell_options.py, the modes in test_shell_render.py, dot commands in
test_shell_commands.py. DuckDB's own shell tests run against the shell through
``benchmarks/duckdb_shell_conformance.py``.
"""

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dbml
from dbml.shell import run
from dbml.shell.reader import SqlBuffer, all_whitespace


def shell(con, text):
    out, err = io.StringIO(), io.StringIO()
    status = run(con, io.StringIO(text), out, err)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("lines,complete", [
    (["SELECT 1;"], True), (["SELECT 1"], False), (["SELECT ';'"], False), (["SELECT ';';"], True),
    (["SELECT 'it''s';  "], True), (['SELECT 1 AS "a;"'], False), (["SELECT 1; -- done"], True),
    (["SELECT 1 -- not yet;"], False), (["SELECT /* ; */ 1"], False), (["SELECT /* ; */ 1;"], True),
    (["SELECT $$a;", "b$$;"], True), (["SELECT $tag$ ; $x$ ;", "$tag$"], False), (["SELECT $1;"], True),
    (["/*", ";", "*/"], False), (["SELECT 'a", ";", "b';"], True), (["SELECT 1;", "-- trailing ;"], True),
    (["SELECT E'it\\'s';"], True), (["SELECT E'a\\\\';"], True), (["SELECT e'\\';", "x';"], True),
    (["SELECT sE'it\\'s';"], False),
])
def test_a_statement_ends_at_a_semicolon_outside_quotes_dollar_strings_and_comments(lines, complete):
    buf = SqlBuffer()
    assert [buf.add(line) for line in lines][-1] is complete


@pytest.mark.parametrize("text", [
    "SELECT 1; SELECT $$a;b$$; -- done", "SELECT E'a\\';b'; SELECT 2", "SELECT 'a'';b' /* ; */; -- ;\nSELECT 2;",
    'SELECT 1 AS "a;b"; SELECT $tag$ ; $x$ ;$tag$;', "/* c */ SELECT 1;;SELECT 2", "SELECT 'C:\\'",
])
def test_dbml_and_duckdb_end_statements_in_the_same_places(text):
    """``dbml.core.sqltext`` decides where statements end for the reader and every splitter of dbml;
    DuckDB's parser splits the text the shell hands it. The two agree."""
    import duckdb
    from dbml.core.sqltext import split_statements
    ours, theirs = split_statements(text), [s.query for s in duckdb.extract_statements(text)]
    assert len(ours) == len(theirs) and all(o in t for o, t in zip(ours, theirs)), (ours, theirs)


def test_a_line_of_spaces_and_comments_is_no_statement():
    assert all_whitespace("  -- a comment ;") and all_whitespace("/* ; */  ") and not all_whitespace("/* open")
    assert not all_whitespace("SELECT 1")


def test_reading_a_statement_is_linear_in_its_length():
    """Each line is scanned once (the old shell rescanned the buffer: a 2,000-line statement took 31 s)."""
    def read(n):
        buf, t0 = SqlBuffer(), time.perf_counter()
        for i in range(n):
            assert not buf.add(f"  '{i};' || $$x;{i}$$ || /* ; */ {i} -- ; comment")
        assert buf.add(";")
        return time.perf_counter() - t0
    small, large = read(4_000), read(40_000)
    assert large < 2.0 and large < 25 * small, (small, large)


def test_multiline_statements_several_per_line_and_one_left_open_at_the_end(con):
    status, out, err = shell(con, ".mode list\nCREATE TABLE t AS\n  SELECT range AS x FROM range(5);\n"
                                  "SELECT sum(x)\n  AS total\nFROM t; SELECT 'two' AS second;\n"
                                  "SELECT $$a;b$$ AS dollars; -- a comment ;\nSELECT 'no semicolon' AS last")
    assert status == 0, err
    assert out.splitlines() == ["total", "10", "second", "two", "dollars", "a;b", "last", "no semicolon"]


def test_errors_are_duckdbs_messages_and_the_rest_still_runs(con):
    status, out, err = shell(con, "invalid sql;\nSELECT 'reached' AS r;\nSELECT nope;\n")
    assert status == 1 and "reached" in out
    assert err.startswith('Parser Error: syntax error at or near "invalid"\n\nLINE 1: invalid sql;\n        ^^^^^^^\n')
    assert 'Binder Error: Referenced column "nope" was not found' in err and "Traceback" not in err


def test_a_text_that_does_not_parse_runs_none_of_its_statements(con):
    """As in the CLI: DuckDB's parser splits the text; a parse error stops all of it."""
    status, out, err = shell(con, "CREATE TABLE kept(i INT); SELEC 2;\n")
    assert status == 1 and 'syntax error at or near "SELEC"' in err
    assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'kept'").fetchall() == [(0,)]


def test_bail_stops_files_at_their_first_error_but_not_stdin(con, tmp_path):
    script = tmp_path / "s.sql"
    script.write_text("SELEC 1;\nSELECT 'after in file' AS a;\n")
    status, out, err = shell(con, f".read {script}\nSELECT 'after read' AS b;\n")
    assert "after in file" not in out and "after read" in out and status == 1
    _, out, _ = shell(con, f".bail off\n.read {script}\n")
    assert "after in file" in out
    status, out, err = shell(con, ".bail on\nSELECT nope;\nSELECT 'after' AS a;\n")
    assert status == 1 and out == "" and "nope" in err


def test_quit_stops_reading_the_input_it_is_in(con, tmp_path):
    inner = tmp_path / "inner.sql"
    inner.write_text("SELECT 'one' AS x;\n.quit\nSELECT 'two' AS x;\n")
    _, out, _ = shell(con, f".mode list\n.read {inner}\nSELECT 'three' AS x;\n.exit\nSELECT 'four' AS x;\n")
    assert out.split() == ["x", "one", "x", "three"]


def test_a_file_that_reads_itself_stops_with_an_error(con, tmp_path):
    loop = tmp_path / "loop.sql"
    loop.write_text(f"SELECT 1 AS one;\n.read {loop}\n")
    status, out, err = shell(con, f".mode list\n.read {loop}\n")
    assert status == 1 and "Traceback" not in err
    assert f'Error: recursive .read of "{loop}"' in err and out.split() == ["one", "1"]
    other = tmp_path / "other.sql"   # through another file
    other.write_text(f".read {loop}\n")
    loop.write_text(f"SELECT 1 AS one;\n.read {other}\n")
    status, _, err = shell(con, f".read {loop}\n")
    assert status == 1 and err == f'Error: recursive .read of "{loop}"\n'


def test_read_takes_only_regular_files(con, tmp_path):
    for path in ("/dev/zero", tmp_path, tmp_path / "missing.sql"):
        status, _, err = shell(con, f".read {path}\n")
        assert status == 1 and err == f'Error: cannot open "{path}"\n'


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_writing_to_a_full_device_is_one_error_line(con):
    status, out, err = shell(con, ".output /dev/full\nSELECT 1;\nSELECT 2;\n.output\nSELECT 'back' AS b;\n")
    assert err == 'Error: cannot write to "/dev/full": No space left on device\n'
    assert "back" in out


def test_input_without_line_breaks_stops_instead_of_filling_memory(con, monkeypatch):
    from dbml.shell import session
    monkeypatch.setattr(session, "MAX_LINE", 1000)
    out, err = io.StringIO(), io.StringIO()
    status = session.Shell(con, out=out, err=err).process(session.read_lines(io.StringIO("\0" * 5000)))
    assert status == 1 and err.getvalue() == "Error: an input line is longer than 0 MiB; stopped reading\n"


def test_the_last_result_is_the_table_underscore(con):
    status, out, err = shell(con, "FROM _;\n.mode list\nSELECT 42 AS a;\nSELECT a + 100 AS b FROM _;\n"
                                  "SELECT eek;\nSELECT b * 10 AS c FROM _ AS d;\n")
    assert err.startswith('Binder Error: Failed to query last result "_": no result available\n')
    assert out.split() == ["a", "42", "b", "142", "c", "1420"]


def test_changes_timer_echo_and_parameters(con):
    status, out, err = shell(con, "CREATE TABLE t(i INT);\n.changes on\nINSERT INTO t VALUES (1), (2);\n"
                                  "INSERT INTO t VALUES (3);\n.changes off\n.echo on\nSELECT 7 AS seven;\n"
                                  ".echo off\n.timer on\nSELECT 1;\n.timer off\nSELECT ?;\n")
    assert "changes:   2   total_changes: 2\nchanges:   1   total_changes: 3\n" in out
    assert "SELECT 7 AS seven;\n" in out and "Run Time (s): real " in out
    assert err == ("Prepared statement parameters cannot be used directly\nTo use prepared statement parameters, "
                   "use PREPARE to prepare a statement, followed by EXECUTE\n")


def test_only_query_results_print(con):
    status, out, err = shell(con, "CREATE TABLE t(a INT);\nINSERT INTO t VALUES (1);\nUPDATE t SET a = 2;\n"
                                  "SET threads = 2;\nINSERT INTO t VALUES (3) RETURNING a * 10 AS tens;\n"
                                  "CALL pragma_version();\nPIVOT t ON a USING count(*);\n")
    assert status == 0, err
    assert "Count" not in out and "Success" not in out
    assert "tens" in out and "library_version" in out and "│   2   │" in out


@pytest.mark.parametrize("mode", ["duckbox", "box", "line", "csv", "json", "jsonlines", "markdown", "insert", "html",
                                  "tcl", "quote", "latex", "table", "column", "list", "ascii", "tabs"])
@pytest.mark.slow   # ~1.5 s: out of the -m 'not slow' inner loop (under a minute)
def test_every_value_of_test_all_types_shows_in_every_mode(con, mode):
    status, out, err = shell(con, f".mode {mode}\nSELECT * FROM test_all_types();\n")
    assert status == 0 and err == "", err
    assert "Traceback" not in out and "294247-01-10 04:00:54" in out and "5877642-06-25 (BC)" in out


def test_bigquery_ml_parse_errors_are_duckdbs_when_nothing_is_bigquery(con):
    status, _, err = shell(con, "CREATE MODLE m AS SELECT 1;\n")
    assert status == 1 and err.startswith('Parser Error: syntax error at or near "MODLE"')


@pytest.mark.slow
def test_piped_shell_trains_and_a_second_process_predicts(tmp_path):
    db = str(tmp_path / "piped.duckdb")
    script = ("SET VARIABLE dbml_latency_model = 'roofline';\n"
              "CREATE TABLE pts AS SELECT range::DOUBLE AS x, (range % 2 = 0) AS even, range % 3 AS y "
              "FROM range(300);\n.mode line\n"
              "SELECT t.status FROM (SELECT train('m', 'pts', label := 'y', epochs := 1) AS t);\n")
    first = subprocess.run([sys.executable, "-m", "dbml", "shell", db], input=script, text=True,
                           capture_output=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "status = finished" in first.stdout
    second = subprocess.run([sys.executable, "-m", "dbml", "shell", db, "-csv"], text=True, capture_output=True,
                            input="SELECT count(prediction) AS n FROM predictions('m', 'pts');\n", timeout=300)
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines() == ["n", "300"]
    assert "leaked" not in first.stderr + second.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("installed")   # one `dbml install --quick` for the session (conftest)
def test_demo_runs_end_to_end(tmp_path, installed_predictor):
    """The demo as a user runs it, planning with the predictor: the one ``python -m dbml
    install --quick`` made for this session (else the demo would calibrate first)."""
    installed, cache = installed_predictor
    assert installed.returncode == 0, installed.stderr
    predictors = lambda: sorted((p.name, p.stat().st_mtime_ns) for p in cache.iterdir()  # noqa: E731
                                if p.name not in ("graphs", "startup", "overheads.json"))
    cached = predictors()   # graphs/, startup/ and the estimate's learned overheads.json may change; the predictor must not
    db = str(tmp_path / "demo.duckdb")
    r = subprocess.run([sys.executable, "-m", "dbml", "demo", db], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "DBML_CACHE_DIR": str(cache)})
    assert r.returncode == 0, r.stderr
    assert "Report: 8 models trained in SQL" in r.stdout and "identical weights" in r.stdout
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert re.findall(r"trains (\w+) models", readme) == ["eight", "eight"]   # as the README says
    assert "FROM read_blob('" in r.stdout and "circle_0.png" in r.stdout   # the image step, as printed
    assert predictors() == cached   # it did not calibrate
    con = dbml.connect(db, latency_model="roofline")
    acc = dict(con.sql("""SELECT name, evaluate(name, 'SELECT * FROM ' || source || ' WHERE split = ''test''').accuracy
                          FROM (VALUES ('moons_mlp', 'moons'), ('shapes_cnn', 'shapes'), ('tickets', 'tickets'))
                               AS v(name, source)""").fetchall())
    assert acc["moons_mlp"] > 0.95 and acc["shapes_cnn"] > 0.9 and acc["tickets"] > 0.9, acc
    archs = dict(con.sql("SELECT name, arch FROM dbml_models WHERE name IN ('shapes_cnn', 'tickets')").fetchall())
    assert archs == {"shapes_cnn": "cnn", "tickets": "transformer"}
    assert con.sql("SELECT count(*) FROM shapes").fetchall() == [(1200,)]   # every PNG file was read
    con.close()


@pytest.mark.slow   # trains the quickstart's model: 20 epochs
def test_quickstart_script_runs_in_the_shell(con):
    script = (Path(__file__).parents[1] / "demo" / "quickstart.sql").read_text()
    status, out, err = shell(con, script)
    assert status == 0, err
    assert "accuracy" in out and "moons_mlp" in out
    assert con.sql("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]  # dropped at the end
