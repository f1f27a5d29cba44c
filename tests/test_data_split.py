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
