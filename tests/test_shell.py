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
