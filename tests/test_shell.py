"""python -m dbml shell and demo."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dbml
from dbml.shell import run, statement_complete


@pytest.mark.parametrize("text,complete", [
    ("SELECT 1;", True),
    ("SELECT 1", False),
    ("SELECT ';'", False),
    ("SELECT ';';", True),
    ("SELECT 'it''s';  ", True),
    ('SELECT 1 AS "a;"', False),
    ("SELECT 1; -- done", True),
    ("SELECT 1 -- not yet;", False),
    ("SELECT /* ; */ 1", False),
    ("SELECT /* ; */ 1;", True),
])
def test_statement_complete(text, complete):
    assert statement_complete(text) is complete


def shell(con, text):
    out, err = io.StringIO(), io.StringIO()
    status = run(con, io.StringIO(text), out, err)
    return status, out.getvalue(), err.getvalue()


def test_multiline_statements_dot_commands_and_errors(con):
    status, out, err = shell(con, "CREATE TABLE t AS\n SELECT range AS x FROM range(5);\n"
                                  "SELECT sum(x)\n  AS total\nFROM t;\n.tables\nSELECT nope;\nSELECT 'after' AS a;\n")
    assert status == 1                                  # one statement failed ...
    assert "total" in out and "10" in out and "after" in out   # ... and the rest still ran
    assert "dbml_models" in out and " t" in out
    assert 'Referenced column "nope" was not found' in err


def test_help_lists_dbml_functions(con):
    _, out, _ = shell(con, ".help\n")
    assert ".tables" in out and "train(model, source" in out and "predict(model" in out


def test_quit_stops_reading(con):
    _, out, _ = shell(con, "SELECT 1 AS one;\n.quit\nSELECT 2 AS two;\n")
    assert "one" in out and "two" not in out


@pytest.mark.slow
def test_piped_shell_trains_and_a_second_process_predicts(tmp_path):
    db = str(tmp_path / "piped.duckdb")
    script = ("SET VARIABLE dbml_latency_model = 'roofline';\n"
              "CREATE TABLE pts AS SELECT range::DOUBLE AS x, (range % 2 = 0) AS even, range % 3 AS y "
              "FROM range(300);\n"
              "SELECT t.status FROM (SELECT train('m', 'pts', label := 'y', epochs := 1) AS t);\n")
    first = subprocess.run([sys.executable, "-m", "dbml", "shell", db], input=script, text=True,
                           capture_output=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "finished" in first.stdout
    second = subprocess.run([sys.executable, "-m", "dbml", "shell", db], text=True, capture_output=True,
                            input="SELECT count(prediction) AS n FROM predictions('m', 'pts');\n", timeout=300)
    assert second.returncode == 0, second.stderr
    assert "300" in second.stdout
    assert "leaked" not in first.stderr + second.stderr


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path, installed_predictor):
    """The demo as a user runs it, planning with the predictor: the one ``python -m dbml
    install --quick`` made for this session (else the demo would calibrate first)."""
    installed, cache = installed_predictor
    assert installed.returncode == 0, installed.stderr
    predictors = lambda: sorted((p.name, p.stat().st_mtime_ns) for p in cache.iterdir() if p.name != "graphs")  # noqa: E731
    cached = predictors()   # the graph cache (graphs/) may grow; the predictor files must not
    db = str(tmp_path / "demo.duckdb")
    r = subprocess.run([sys.executable, "-m", "dbml", "demo", db], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "DBML_CACHE_DIR": str(cache)})
    assert r.returncode == 0, r.stderr
    assert "Report: 8 models trained in SQL" in r.stdout and "identical weights" in r.stdout
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


# --- DuckDB CLI's conventions -----------------------------------------------------------------

def test_every_statement_that_returns_rows_prints_them_and_counts_do_not(con):
    status, out, err = shell(con, "CREATE TABLE t(a INT, b VARCHAR);\n"
                                  "INSERT INTO t VALUES (1, 'x'), (2, NULL) RETURNING a * 10 AS tens;\n"
                                  "INSERT INTO t VALUES (3, 'z');\nUPDATE t SET a = 4 WHERE a = 3;\n"
                                  "CALL pragma_version();\nPIVOT t ON b USING count(*);\nSHOW TABLES;\n")
    assert status == 0, err
    assert "tens" in out and "10" in out and "20" in out             # INSERT ... RETURNING
    assert "library_version" in out                                   # CALL
    assert "│ x " in out.replace("│ x      ", "│ x ") and "│ z " in out.replace("│ z      ", "│ z ")   # PIVOT's columns
    assert "Count" not in out                                         # changed-row counts are not printed


def test_modes_print_the_same_rows_each_way(con):
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES (1, 'a,b'), (2, NULL)) v(n, s)")
    outputs = {m: shell(con, f".mode {m}\nSELECT * FROM t ORDER BY n;\n")[1] for m in
               ("line", "csv", "json", "markdown", "box", "duckbox")}
    assert outputs["line"].split("\n\n")[0].split() == ["n", "=", "1", "s", "=", "a,b"]
    assert outputs["csv"].splitlines() == ["n,s", '1,"a,b"', "2,"]
    assert outputs["json"].strip() == '[{"n": 1, "s": "a,b"}, {"n": 2, "s": null}]'
    assert outputs["markdown"].splitlines()[:3] == ["| n | s |", "|---|---|", "| 1 | a,b |"]
    assert "INTEGER" in outputs["duckbox"] and "INTEGER" not in outputs["box"] and "┌" in outputs["box"]
    _, _, err = shell(con, ".mode yaml\n")
    assert "unknown mode 'yaml'; modes are duckbox, box, line, csv, json, markdown" in err


def test_maxrows_cuts_the_middle_and_says_how_many(con):
    _, out, _ = shell(con, ".maxrows 4\nSELECT range AS r FROM range(100);\n")
    body = [line for line in out.splitlines() if line.startswith("│")]
    assert [c.strip("│ ") for c in body[2:]] == ["0", "1", "·", "98", "99"]
    assert "100 rows (4 shown)" in out


def test_output_once_read_echo_timer_and_schema(con, tmp_path):
    script = tmp_path / "setup.sql"
    script.write_text("CREATE TABLE s(id INT);\nINSERT INTO s VALUES (7);\n.tables\n")
    once, kept = tmp_path / "once.txt", tmp_path / "kept.txt"
    _, out, err = shell(con, f".read {script}\n.once {once}\nSELECT 1 AS first;\nSELECT 2 AS second;\n"
                             f".output {kept}\nSELECT 3 AS third;\nSELECT 4 AS fourth;\n.output\n"
                             ".echo on\n.timer on\nSELECT id FROM s;\n.schema s\n.schema nope\n")
    assert err.strip() == "Error: no table or view named 'nope'; .tables lists them"
    assert "first" in once.read_text() and "second" not in once.read_text()
    assert "third" in kept.read_text() and "fourth" in kept.read_text()
    assert "first" not in out and "second" in out and "third" not in out
    assert " s" in out.splitlines()[0] or "s" in out.split()   # .tables from the file
    assert "SELECT id FROM s;" in out and "Run Time (s): real" in out and "CREATE TABLE s(id INTEGER);" in out


def test_bail_stops_at_the_first_error(con):
    status, out, err = shell(con, ".bail on\nSELECT nope;\nSELECT 'after' AS a;\n")
    assert status == 1 and "after" not in out and len(err.strip().splitlines()) == 1


def test_errors_are_one_line_and_unknown_commands_say_so(con):
    _, _, err = shell(con, "SELECT * FROM missing_table;\n.frobnicate\n.maxrows lots\n")
    lines = err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("Error: ") for line in lines), lines
    assert "missing_table" in lines[0] and ".frobnicate" in lines[1] and ".maxrows 100" in lines[2]


def test_a_train_summary_prints_one_field_per_column(con):
    con.execute("CREATE TABLE pts AS SELECT range::DOUBLE AS x, range % 2 AS y FROM range(200)")
    _, out, err = shell(con, ".mode line\nSELECT train('m', 'pts', label := 'y', epochs := 1);\n")
    fields = dict(map(str.strip, line.split(" = ", 1)) for line in out.splitlines() if " = " in line)
    assert fields["model"] == "m" and fields["status"] == "finished" and fields["epochs"] == "1", err


@pytest.mark.slow   # two shells as subprocesses
def test_c_and_init_on_the_command_line(tmp_path):
    init = tmp_path / "init.sql"
    init.write_text("CREATE TABLE greet AS SELECT 'hello' AS word;\n.mode csv\n")
    db = str(tmp_path / "c.duckdb")
    r = subprocess.run([sys.executable, "-m", "dbml", "shell", db, "-init", str(init), "-c",
                        "SELECT word FROM greet; SELECT 2 AS two;"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["word", "hello", "two", "2"]
    bad = subprocess.run([sys.executable, "-m", "dbml", "shell", db, "-c", "SELECT nope;"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.startswith("Error: ") and "Traceback" not in bad.stderr


@pytest.mark.slow   # shells as subprocesses
def test_an_unopenable_or_locked_database_is_a_one_line_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dbml", "shell", str(tmp_path / "no" / "such" / "dir.duckdb"),
                        "-c", "SELECT 1;"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("Error: cannot open ") and len(r.stderr.strip().splitlines()) == 1
    db = str(tmp_path / "locked.duckdb")
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, sys; c = duckdb.connect({db!r}); "
                               "print('open', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        r = subprocess.run([sys.executable, "-m", "dbml", "shell", db, "-c", "SELECT 1;"],
                           capture_output=True, text=True, timeout=120)
    finally:
        holder.communicate("", timeout=30)
    assert r.returncode == 1 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith(f"Error: cannot open {db!r}: ") and "lock" in r.stderr.lower()
