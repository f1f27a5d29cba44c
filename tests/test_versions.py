"""Results people can read and versions they can compare (issue 32, items 4, 5, 6 and 10):
train()'s small result with the rest in dbml_jobs, CREATE MODEL's typed columns, named
probabilities, 'm@N' everywhere, deploy() and its rollback, dbml_leaderboard, the views'
shared column names."""

from __future__ import annotations

import warnings

import duckdb
import pytest

import dbml
from dbml.core.columns import JOB_ROW, TRAIN_RESULT, TRAIN_SUMMARY
from dbml.errors import VersionStored

BASE = "label := 'y', hidden := [8], batch_size := 32, validation := 0.25"
ARGS = BASE + ", epochs := 1"


@pytest.fixture
def two(con):
    """Model 'm' in two versions of different quality (trained on noise, then on the feature
    that decides the label) and a regression model 'r'."""
    con.execute("CREATE TABLE t AS SELECT (i % 10) / 10.0 AS a, ((i * 7919) % 13) / 13.0 AS n, "
                "((i % 10) >= 5)::INTEGER AS y, CASE WHEN i % 10 >= 5 THEN 'hi' ELSE 'lo' END AS s "
                "FROM range(2100) r(i)")
    con.execute(f"SELECT train('m', 'SELECT n AS a, y FROM t', {ARGS}, seed := 1)").fetchall()
    con.execute(f"SELECT train('m', 'SELECT a, y FROM t', {BASE}, lr := 0.05, seed := 1, epochs := 4)").fetchall()
    con.execute("SELECT train('r', 'SELECT a, y::DOUBLE AS y FROM t', label := 'y', epochs := 1)").fetchall()
    return con


def value(con, sql: str, *params):
    return con.execute(sql, list(params)).fetchall()[0][0]


@pytest.mark.slow   # trains three small models (~3 s)
def test_train_returns_a_small_result_and_dbml_jobs_the_rest(two):
    result = value(two, f"SELECT train('m', 'SELECT a, y FROM t', {ARGS})")
    assert list(result) == list(TRAIN_RESULT)
    assert result["version"] == 3 and result["metric"] == "accuracy" and result["status"] == "finished"
    assert not {"msr", "swaps", "passive_swaps", "budget_bytes"} & set(result)
    cur = two.execute("SELECT * FROM dbml_jobs WHERE job_id = ?", [result["job_id"]])
    row = dict(zip([d[0] for d in cur.description], cur.fetchall()[0]))
    assert list(row) == list(JOB_ROW) and set(TRAIN_SUMMARY) <= set(row)
    assert row["version"] == 3 and row["budget_bytes"] > 0 and row["msr"] is not None
    assert row["val_metric"] == result["val_metric"] and row["epochs"] == result["epochs"]
    # the columns form: one column per field, typed
    rel = two.sql(f"SELECT r.* FROM (SELECT train('m', 'SELECT a, y FROM t', {ARGS}) AS r)")
    assert rel.columns == list(TRAIN_RESULT)


@pytest.mark.slow
def test_create_model_returns_trains_columns_each_typed(con):
    con.execute("CREATE TABLE t AS SELECT (i % 10) / 10.0 AS a, ((i % 10) >= 5)::INTEGER AS y FROM range(400) r(i)")
    rel = dbml.execute(con, "CREATE MODEL m OPTIONS (model_type = 'logistic_reg', input_label_cols = ['y'], "
                            "max_iterations = 1) AS SELECT a, y FROM t")
    names, types = [d[0] for d in rel.description], [str(d[1]).upper() for d in rel.description]
    assert names == list(TRAIN_RESULT)
    assert types == [str(t).upper() for t in TRAIN_RESULT.values()]   # none "NULL", as train() types them
    assert rel.fetchall()[0][:2] == ("m", 1)


@pytest.mark.slow
def test_predict_proba_names_each_class(two):
    two.execute("SELECT train('s', 'SELECT a, s FROM t', label := 's', epochs := 1)").fetchall()
    proba = value(two, "SELECT predict_proba('s', [0.9])")
    assert list(proba) == ["hi", "lo"] and sum(proba.values()) == pytest.approx(1)
    assert value(two, "SELECT predict_proba('s', [0.9])['hi']") == proba["hi"]
    assert list(value(two, "SELECT predict_proba('m', [0.9])")) == ["0", "1"]


@pytest.mark.slow
def test_every_function_takes_a_version_and_deploy_pins_and_rolls_back(two):
    q = "SELECT log_loss FROM evaluate(?, 't')"
    first, second = value(two, q, "m@1"), value(two, q, "m@2")
    assert second != first and value(two, q, "m") == second == value(two, q, "m@latest")
    assert value(two, "SELECT evaluate('m@1', 't').log_loss") == first
    p1 = value(two, "SELECT predict_proba('m@1', [0.9])['1']")
    assert value(two, "SELECT predict_proba('m@2', [0.9])['1']") != p1
    assert value(two, "SELECT count(*) FROM predictions('m@1', 't') WHERE prediction IS NOT NULL") == 2100

    assert value(two, "SELECT deploy('m', version := 1)") == {"model": "m", "version": 1, "pinned": True}
    assert value(two, q, "m") == first and value(two, q, "m@latest") == second
    assert value(two, "SELECT predict_proba('m', [0.9])['1']") == p1
    assert two.execute("SELECT version FROM dbml_models WHERE model = 'm' AND deployed").fetchall() == [(1,)]
    two.execute(f"SELECT train('m', 'SELECT a, y FROM t', {ARGS})").fetchall()   # version 3: the pin holds
    assert value(two, q, "m") == first
    assert value(two, "SELECT deploy('m')") == {"model": "m", "version": 3, "pinned": False}   # roll forward
    assert two.execute("SELECT version FROM dbml_models WHERE model = 'm' AND deployed").fetchall() == [(3,)]
    assert value(two, "SELECT deploy('m@2')")["version"] == 2 and value(two, q, "m") == second

    with pytest.raises(duckdb.Error, match=r"predict\(\): model 'm' has no version 9; pass one of SELECT version "
                                           r"FROM dbml_models WHERE model = 'm', e.g. 'm@1'"):
        two.execute("SELECT predict('m@9', [0.9])").fetchall()
    with pytest.raises(duckdb.Error, match=r"deploy\(\): 'm@1' names version 1 and version := 2 another"):
        two.execute("SELECT deploy('m@1', version := 2)").fetchall()
    with pytest.raises(duckdb.Error, match=r"drop_model\(\): 'm@1' names one version"):
        two.execute("SELECT drop_model('m@1')").fetchall()
    with pytest.raises(duckdb.Error, match=r"train\(\): model name 'x@1' holds '@'"):
        two.execute(f"SELECT train('x@1', 't', {ARGS})").fetchall()
    assert value(two, "SELECT drop_model('m')") == 3
    assert two.execute("SELECT * FROM dbml.deployments").fetchall() == []   # the pin goes with the model
    two.execute(f"SELECT train('m', 'SELECT a, y FROM t', {ARGS})").fetchall()
    assert two.execute("SELECT version, deployed FROM dbml_models WHERE model = 'm'").fetchall() == [(1, True)]


@pytest.mark.slow
def test_the_leaderboard_ranks_versions_by_their_metric(two):
    rows = two.execute("SELECT model, version, metric, value, rank_in_model, rank, deployed FROM dbml_leaderboard "
                       "ORDER BY model, version").fetchall()
    (m1, m2, r1) = rows
    assert [m1[:3], m2[:3], r1[:3]] == [("m", 1, "accuracy"), ("m", 2, "accuracy"), ("r", 1, "r2")]
    assert m2[3] > m1[3]
    assert (m2[4], m2[5], m1[4], m1[5]) == (1, 1, 2, 2)      # the better version first, in its model and overall
    assert (r1[4], r1[5]) == (1, 1)                          # r2 is ranked apart from accuracy
    assert (m1[6], m2[6], r1[6]) == (False, True, True)
    two.execute("SELECT deploy('m', version := 1)").fetchall()
    assert two.execute("SELECT version FROM dbml_leaderboard WHERE model = 'm' AND deployed").fetchall() == [(1,)]


@pytest.mark.slow
def test_tune_says_which_version_its_best_trial_became(two):
    two.execute("SELECT deploy('m', version := 1)").fetchall()
    space = '{"lr": {"choice": [0.01, 0.05]}}'
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = two.execute(f"SELECT trial, best, version FROM tune('m', 'SELECT a, y FROM t', {ARGS}, space := '{space}', "
                           f"trials := 2)").fetchall()
    best = [r for r in rows if r[1]]
    said = [str(w.message) for w in caught if issubclass(w.category, VersionStored)]
    assert len(best) == 1 and best[0][2] == 3
    assert said == [f"tune(): trial {best[0][0]}, the best " + said[0].split("the best ", 1)[1]]
    assert "is stored as version 3 of 'm'; predict('m', ...) still serves version 1, pinned by deploy(); " \
           "deploy('m') serves this one" in said[0]


def test_evaluate_as_a_table_keeps_the_temp_guard(con):
    con.execute("CREATE TEMP TABLE tmp AS SELECT 1.0 AS a, 1 AS y")
    with pytest.raises(duckdb.Error, match="evaluate\\(\\): source reads 'tmp', which on this connection is a "
                                           "TEMP table or view"):
        con.execute("SELECT * FROM evaluate('m', 'tmp')").fetchall()
    with pytest.raises(duckdb.Error, match="evaluate\\(\\): source calls train\\(\\), which has effects"):
        con.execute("SELECT * FROM evaluate('m', 'SELECT train(''q'', ''t'', label := ''y'')')").fetchall()


def test_views_name_a_model_model_and_a_job_job_id(con):
    views = [r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE view_name LIKE 'dbml_%' "
                                       "AND temporary").fetchall()]
    assert {"dbml_models", "dbml_weights", "dbml_epochs", "dbml_trials", "dbml_leaderboard", "dbml_jobs",
            "dbml_memory"} <= set(views)
    for view in views:
        columns = [r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = ?",
                                             [view]).fetchall()]
        assert "id" not in columns, view
        if view in ("dbml_models", "dbml_weights", "dbml_epochs", "dbml_trials", "dbml_leaderboard", "dbml_jobs",
                    "dbml_memory"):
            assert columns[0] in ("model", "job_id") and "model" in columns, (view, columns)


def test_an_older_catalog_opened_read_only_serves_the_latest(tmp_path):
    path = str(tmp_path / "old.duckdb")
    dbml.connect(path).close()
    plain = duckdb.connect(path)
    plain.execute("DROP TABLE dbml.deployments")   # as a catalog written before deploy() was
    plain.close()
    ro = dbml.connect(path, read_only=True)
    assert [d[0] for d in ro.execute("SELECT * FROM dbml_models").description][-1] == "deployed"
    assert ro.execute("SELECT count(*) FROM dbml_leaderboard").fetchall() == [(0,)]
    with pytest.raises(duckdb.Error, match="no model named 'm'"):
        ro.execute("SELECT predict('m@2', [1.0])").fetchall()
    ro.close()
