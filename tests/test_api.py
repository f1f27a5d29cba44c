"""dbml from Python (dbml/api.py): the SQL functions as functions, relations that train once,
progress bars, and the plots."""

from __future__ import annotations

import io
import sys
import threading

import pytest

import dbml
from dbml import notebook
from dbml.core import progress
from helpers import job_of


@pytest.fixture
def pts(con):
    con.execute("CREATE TABLE pts AS SELECT (range % 50) / 50.0 AS a, (range % 50 > 25)::INT AS y FROM range(800)")
    return con


def versions(con, name="m") -> int:
    return con.execute("SELECT count(*) FROM dbml_models WHERE name = ?", [name]).fetchall()[0][0]


@pytest.mark.slow   # ~1.8 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_train_relation_trains_once_however_often_it_is_looked_at(pts):
    r = pts.sql("SELECT train('m', 'pts', label := 'y', epochs := 1)")
    assert versions(pts) == 0                          # lazy, as DuckDB's relations are
    for look in (repr, str, lambda r: r.fetchall(), lambda r: r.to_arrow_table(), lambda r: r.limit(1).fetchall(), len):
        look(r)
    assert versions(pts) == 1                          # six looks, one version
    assert r.fetchall()[0][0]["version"] == 1
    assert type(pts.sql("SELECT a FROM pts")).__name__ == "DuckDBPyRelation"   # plain queries stay DuckDB's
    assert type(pts.sql("SELECT 'train(' AS text")).__name__ == "DuckDBPyRelation"


@pytest.mark.slow   # trains three models
def test_a_train_relation_shows_its_summary_as_columns_and_fetches_the_struct(pts):
    """Issue 32, item 4: in a notebook ``con.sql("SELECT train(...)")`` showed one cell holding
    the whole STRUCT and ``.df()`` one column; shown and as a DataFrame it is the summary's
    fields, one column each (as the shell shows it), while fetched rows stay SQL's STRUCT."""
    pytest.importorskip("pandas")
    r = pts.sql("SELECT train('m', 'pts', label := 'y', epochs := 1)")
    frame = r.df()
    assert list(frame.columns[:4]) == ["model", "version", "status", "rows"] and len(frame) == 1
    assert frame["status"][0] == "finished"
    shown = repr(r)
    assert "status" in shown and "finished" in shown and "struct" not in shown.lower()
    assert r.fetchall()[0][0]["status"] == "finished"                     # the STRUCT, as SQL returns it
    several = pts.sql("SELECT train(n, 'pts', label := 'y', epochs := 1) AS t FROM (VALUES ('a'), ('b')) v(n)").df()
    assert list(several["model"]) == ["a", "b"] and list(several["status"]) == ["finished"] * 2
    assert versions(pts) == 1                                             # shown, framed and fetched: one run


def test_df_without_pandas_fails_before_training(pts, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    monkeypatch.setattr(dbml.api.importlib.util, "find_spec", lambda name: None if name == "pandas" else object())
    r = pts.sql("SELECT train('m', 'pts', label := 'y', epochs := 1)")
    with pytest.raises(dbml.InvalidArgument, match=r"df\(\) needs pandas.*pip install 'dbml\[notebook\]'"):
        r.df()
    assert versions(pts) == 0


@pytest.mark.slow   # ~1.4 s: out of the -m 'not slow' inner loop (under a minute)
def test_the_python_api_mirrors_the_sql_functions(pts):
    summary = dbml.train(pts, "m", "pts", label="y", epochs=2, arch="linear", lr=0.1)
    assert summary["status"] == "finished" and summary["epochs"] == 2
    assert dbml.evaluate(pts, "m", "pts")["accuracy"] > 0.8
    table = dbml.predictions(pts, "m", "SELECT a FROM pts WHERE a > 0.9")
    assert table.column_names == ["a", "prediction"] and table.num_rows == 64
    assert [j["model"] for j in dbml.list_jobs(pts)] == ["m"]
    with pytest.raises(dbml.InvalidArgument, match="unknown argument 'lable' \\(did you mean 'label'\\?\\); train\\(\\) takes label, features"):
        dbml.train(pts, "m", "pts", lable="y")
    assert dbml.drop_model(pts, "m") == 1 and versions(pts) == 0


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_progress_bars_follow_the_setting(pts, monkeypatch):
    pytest.importorskip("tqdm")
    assert notebook.renderer_for("off") is None
    assert notebook.renderer_for("auto") is None                   # not a notebook, stderr not a terminal
    assert isinstance(notebook.renderer_for("bars"), notebook.BarsRenderer)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    pts.execute("SET VARIABLE dbml_progress = 'bars'")
    pts.sql("SELECT train('m', 'pts', label := 'y', epochs := 2)").fetchall()
    drawn = err.getvalue()
    assert "m (job 1)" in drawn and "100%" in drawn and "epoch=2/2" in drawn and "loss=" in drawn
    err.truncate(0)
    pts.execute("SET VARIABLE dbml_progress = 'off'")
    pts.sql("SELECT train('m2', 'pts', label := 'y', epochs := 1)").fetchall()
    assert "m2" not in err.getvalue()


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_history_plots_the_stored_losses(pts):
    pytest.importorskip("matplotlib")
    pts.sql("SELECT train('m', 'pts', label := 'y', epochs := 3)").fetchall()
    fig = dbml.plot.history(pts, "m")
    stored = pts.execute("SELECT loss FROM dbml_epochs WHERE model = 'm' ORDER BY epoch").fetchall()
    assert fig.dbml["epoch"] == [1, 2, 3] and fig.dbml["loss"] == [r[0] for r in stored]
    assert fig.dbml["val_metric_name"] == "accuracy" and fig.dbml["val_metric"] is not None
    assert list(fig.axes[0].lines[0].get_ydata()) == fig.dbml["loss"]
    # the validation loss as a curve with one point per epoch, the metric per epoch on the right
    stored = pts.execute("SELECT val_loss, val_metric FROM dbml_epochs WHERE model = 'm' ORDER BY epoch").fetchall()
    lines = {line.get_label(): line for axes in fig.axes for line in axes.lines}
    assert list(lines["validation loss"].get_xdata()) == [1, 2, 3]
    assert list(lines["validation loss"].get_ydata()) == [r[0] for r in stored] == fig.dbml["val_loss"]
    assert list(lines["validation accuracy"].get_ydata()) == [r[1] for r in stored]
    assert {t.get_text() for t in fig.legends[0].get_texts()} >= {"training loss", "validation loss",
                                                                  "validation accuracy"}
    with pytest.raises(dbml.InvalidArgument, match="no model named 'nope'"):
        dbml.plot.history(pts, "nope")


@pytest.mark.slow   # ~1.1 s: out of the -m 'not slow' inner loop (under a minute)
def test_memory_plots_the_plan_of_a_job_under_a_budget(wide):
    pytest.importorskip("matplotlib")
    wide.execute("SET VARIABLE dbml_memory_budget = 1500000")
    summary = job_of(wide, wide.sql("SELECT train('w', 't', label := 'y', epochs := 1, hidden := [256, 256, 256])")
                     .fetchall()[0][0])
    fig = dbml.plot.memory(wide, summary["job_id"])
    data = fig.dbml
    # the plot shows the plan in effect for the job's graph; the summary's peak is the largest of
    # every plan the job ran (replans from measured latencies, the last batch's graph)
    assert max(data["planned_bytes"]) == data["planned_peak_bytes"] <= summary["planned_peak_bytes"]
    assert data["measured_peak_bytes"] == summary["measured_peak_bytes"]
    assert data["events"]["swap_out"] > 0 and data["budget_bytes"] == 1_500_000   # it had to swap to fit
    with pytest.raises(dbml.InvalidArgument, match="no job 999"):
        dbml.plot.memory(wide, 999)


@pytest.mark.slow   # samples a running job for a second and a half
def test_jobs_plots_the_shares_of_running_jobs(pts):
    pytest.importorskip("matplotlib")
    pts.execute("CREATE TABLE big AS SELECT (range % 50) / 50.0 AS a, (range % 50 > 25)::INT AS y FROM range(20000)")
    job = pts.sql("SELECT train('slow', 'big', label := 'y', epochs := 30, early_stop := false, wait := false).job_id").fetchall()[0][0]
    try:
        fig = dbml.plot.jobs(pts, seconds=1.5, interval=0.1)
    finally:
        pts.execute(f"SELECT cancel_job({job})").fetchall()
    assert fig.dbml["jobs"] and list(fig.dbml["jobs"]) == [f"slow (job {job})"]
    assert max(fig.dbml["jobs"][f"slow (job {job})"]) > 0


def test_duckdbs_own_progress_bar_is_off_on_a_dbml_connection():
    """A train() is one row to DuckDB: its bar printed 0 % then 100 % to standard output beside
    dbml's own progress line (and with progress='off'), as the shell and the demo turn it off."""
    con = dbml.connect(progress="off")
    assert con.sql("SELECT current_setting('enable_progress_bar')").fetchall() == [(False,)]
    con.close()
