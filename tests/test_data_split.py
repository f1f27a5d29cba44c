"""k-fold cross-validation inside train() (``folds := k``, issue 32 item 10): k fits, each holding
out one fold of whole rows by the split's hash, scored on it; the stored model is trained as
without folds, its metrics keeping the folds' scores."""

from __future__ import annotations

import json

import duckdb
import pytest

from helpers import load, moons


def cross_validation(con, name: str) -> dict:
    metrics = con.execute("SELECT metrics FROM dbml_models WHERE name = ?", [name]).fetchall()[0][0]
    return json.loads(metrics)["cross_validation"]


@pytest.mark.slow   # six small fits
def test_folds_score_each_fold_once_and_leave_the_model_as_without_them(con):
    load(con, "moons", moons(500, seed=3))
    source = "SELECT x1, x2, label FROM moons"
    with_folds = con.execute(f"SELECT train('cv', '{source}', label := 'label', epochs := 3, folds := 4, "
                             f"task := 'classification')").fetchall()[0][0]
    cv = cross_validation(con, "cv")
    assert cv["folds"] == 4 and cv["metric"] == "accuracy" and [s["fold"] for s in cv["scores"]] == [1, 2, 3, 4]
    held_out = [500 - s["rows"] for s in cv["scores"]]      # each fold's rows, held out once: a partition
    assert sum(held_out) == 500 and all(abs(h - 125) <= 1 for h in held_out)
    scores = [s["val_metric"] for s in cv["scores"]]
    assert cv["mean"] == pytest.approx(sum(scores) / 4) and len(set(scores)) > 1     # the folds differ
    assert all(0.5 < s <= 1 for s in scores)
    # the stored model: the one train() stores without folds (same seed, same split)
    without = con.execute(f"SELECT train('plain', '{source}', label := 'label', epochs := 3, "
                          f"task := 'classification')").fetchall()[0][0]
    assert (with_folds["val_metric"], with_folds["rows"]) == (without["val_metric"], without["rows"])


@pytest.mark.parametrize("folds", [1, 0, 21])
def test_folds_out_of_range_name_the_argument(con, folds):
    load(con, "moons", moons(50))
    with pytest.raises(duckdb.Error,
                       match=f"train\\(\\): folds must be a whole number from 2 to 20, got {folds}; pass e.g. "
                             f"folds := 5 \\(or leave it out: no cross-validation\\)"):
        con.execute(f"SELECT train('m', 'moons', label := 'label', folds := {folds})").fetchall()
    assert con.execute("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]


def test_tune_refuses_folds_rather_than_drop_them(con):
    load(con, "moons", moons(50))
    with pytest.raises(duckdb.Error, match="tune\\(\\): folds := 3 is train\\(\\)'s cross-validation; tune\\(\\) "
                                           "scores each trial on its validation rows: leave folds out"):
        con.execute("SELECT * FROM tune('m', 'moons', label := 'label', space := '{\"lr\": [\"log\", 0.001, 0.1]}', "
                    "trials := 2, folds := 3)").fetchall()
    assert con.execute("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]


# split := 'custom' / 'seq' (BigQuery ML's data_split_method CUSTOM and SEQ): train() holds out the
# rows its column names, and ML.EVALUATE(MODEL m) without rows reads exactly those (one rule, heldout)
SPLIT_TABLE = ("CREATE TABLE t AS SELECT range % 7 AS a, (range * 37) % 11 AS b, "
               "CASE WHEN range % 10 = 3 THEN NULL ELSE range % 4 = 0 END AS held, "
               "(range * 101) % 300 AS ts, "
               "(range % 7) * 2.0 + ((range * 37) % 11) AS y FROM range(300)")


def split_summary(con, split: str, **extra) -> dict:
    args = "".join(f", {k} := {v!r}" for k, v in extra.items())
    return con.execute(f"SELECT train('m', 't', label := 'y', arch := 'linear', epochs := 2, "
                       f"split := '{split}'{args})").fetchall()[0][0]


def evaluated(con, rows: str | None = None) -> dict:
    import dbml
    result = dbml.execute(con, "SELECT * FROM ML.EVALUATE(MODEL m" + (f", ({rows}))" if rows else ")"))
    return dict(zip([d[0] for d in result.description], result.fetchall()[0]))


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_custom_split_holds_out_the_rows_its_column_marks_true(con):
    con.execute(SPLIT_TABLE)
    summary = split_summary(con, "custom", split_col="held")
    true_rows = con.execute("SELECT count(*) FROM t WHERE held").fetchall()[0][0]
    assert summary["rows"] == 300 - true_rows                   # FALSE and NULL train
    assert con.execute("SELECT features FROM dbml_models").fetchall() == [(["a", "b", "ts"],)]   # not a feature
    assert evaluated(con) == pytest.approx(evaluated(con, "SELECT * FROM t WHERE held"), rel=1e-12)
    assert evaluated(con)["r2_score"] == pytest.approx(summary["val_metric"], abs=1e-6)


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_seq_split_holds_out_the_last_share_in_the_columns_order(con):
    con.execute(SPLIT_TABLE)
    summary = split_summary(con, "seq", split_col="ts", validation=0.25)
    assert summary["rows"] == 225 and con.execute("SELECT features FROM dbml_models").fetchall() == [(["a", "b", "held"],)]
    last = "SELECT * FROM t ORDER BY ts OFFSET 225"              # ts is distinct: the last quarter
    assert evaluated(con) == pytest.approx(evaluated(con, last), rel=1e-12)
    assert evaluated(con)["r2_score"] == pytest.approx(summary["val_metric"], abs=1e-6)


@pytest.mark.parametrize("args, message", [
    ("split := 'time'", "train\\(\\): unknown split 'time'; pass split := one of 'random', 'custom', 'seq'"),
    ("split_col := 'held'", "split_col := 'held' is read by split := 'custom' \\(its TRUE rows held out\\) or "
                            "split := 'seq' \\(ordered by it\\); pass one of them, or leave split_col out"),
    ("split := 'custom'", "split := 'custom' splits by a column; pass split_col := '<column>' \\(a BOOLEAN column, "
                          "TRUE for the rows to hold out\\)"),
    ("split := 'custom', split_col := 'held', validation := 0.2",
     "with split := 'custom' the column 'held' decides which rows are held out; leave validation := 0.2 out"),
    ("split := 'seq', split_col := 'ts', folds := 3",
     "folds := 3 splits the rows by their hash, and split := 'seq' by 'ts'; pass one of them"),
    ("split := 'custom', split_col := 'a'",
     "split := 'custom' holds out the rows whose split_col is TRUE, and 'a' is BIGINT; pass a BOOLEAN column"),
    ("split := 'seq', split_col := 'tss'", "source has no column 'tss' \\(did you mean 'ts'\\?\\); pass split_col"),
    ("split := 'seq', split_col := 'ts', features := ['a', 'ts']",
     "split_col 'ts' only splits the rows and cannot be a feature; leave it out of features"),
])
def test_split_arguments_refused_naming_the_fix(con, args, message):
    con.execute(SPLIT_TABLE)
    with pytest.raises(duckdb.Error, match=message):
        con.execute(f"SELECT train('m', 't', label := 'y', epochs := 1, {args})")
    assert con.execute("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]
