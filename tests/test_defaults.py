"""Good models without tuning (issue 24 part 1): early stopping that keeps the best epoch,
a learning rate and a validation share chosen for the job, and warnings about the label."""

import json

import pytest

from dbml.core.spec import default_lr, default_validation
from helpers import job_of


def train(con, sql_args: str) -> dict:
    """The job's result and its row of dbml_jobs (best_epoch, estimated_seconds, the memory figures)."""
    return job_of(con, con.sql(f"SELECT train({sql_args})").fetchall()[0][0])


@pytest.fixture
def noisy(con):
    """300 rows whose label is noise: a wide MLP at a large lr overfits within a few epochs."""
    con.execute("CREATE TABLE noisy AS SELECT hash(range, 1) % 1000 / 1000.0 AS a, "
                "hash(range, 2) % 1000 / 1000.0 AS b, hash(range, 3) % 1000 / 1000.0 AS c, "
                "(hash(range, 4) % 2)::INT AS y FROM range(300)")
    return con


def epochs_of(con, model: str) -> list[tuple]:
    return con.sql(f"SELECT epoch, val_loss, best FROM dbml_epochs WHERE model = '{model}' "
                   "ORDER BY epoch").fetchall()


@pytest.mark.slow   # ~0.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_early_stop_stops_after_patience_and_keeps_the_best_epoch(noisy):
    r = train(noisy, "'n', 'noisy', label := 'y', epochs := 60, lr := 0.05, hidden := [256, 256], patience := 3")
    history = epochs_of(noisy, "n")
    assert r["epochs"] == len(history) < 60          # stopped early
    losses = [loss for _, loss, _ in history]
    best = min(range(len(losses)), key=losses.__getitem__) + 1
    assert r["best_epoch"] == best and r["epochs"] == best + 3    # no better epoch in `patience`
    assert [b for *_, b in history].count(True) == 1 and history[best - 1][2]
    # the stored weights are the best epoch's: the final validation loss is that epoch's
    assert r["val_loss"] == pytest.approx(losses[best - 1], rel=1e-5)
    assert r["val_loss"] < losses[-1]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_early_stop_false_trains_every_epoch_and_keeps_the_last(noisy):
    r = train(noisy, "'n', 'noisy', label := 'y', epochs := 8, lr := 0.05, early_stop := false")
    assert r["epochs"] == 8 and r["best_epoch"] is None
    # no validation per epoch unless asked: the history has no val_loss
    assert [loss for _, loss, _ in epochs_of(noisy, "n")] == [None] * 8


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_lr_and_validation_null_are_chosen_per_job_and_stored(noisy):
    r = train(noisy, "'n', 'noisy', label := 'y', epochs := 2, arch := 'linear', optimizer := 'sgd'")
    params = json.loads(noisy.sql("SELECT params FROM dbml_models WHERE name = 'n'").fetchall()[0][0])
    assert params["lr"] == default_lr("linear", "sgd") == 0.1
    assert params["validation"] == default_validation(300) == 0.25
    assert r["rows"] == pytest.approx(300 * 0.75, abs=25)   # the split hashes rows: close to the share
    assert default_validation(100_000) == 0.1 and default_validation(1000) == 0.2


@pytest.mark.parametrize("arg, message", [("patience := 0", "patience must be a positive integer"),
                                          ("lr := -1", "lr must be a positive number")])
def test_bad_patience_and_lr_name_the_argument(noisy, arg, message):
    with pytest.raises(Exception, match=message):
        train(noisy, f"'n', 'noisy', label := 'y', {arg}")
    assert noisy.sql("SELECT count(*) FROM dbml_models WHERE name = 'n'").fetchall()[0][0] == 0


@pytest.mark.slow   # ~1.0 s: out of the -m 'not slow' inner loop (under a minute)
def test_an_identifier_label_is_warned_about(con):
    con.execute("CREATE TABLE ids AS SELECT range AS id, range % 7 AS x FROM range(100)")
    r = train(con, "'i', 'ids', label := 'id', task := 'classification', epochs := 1")
    assert "100 classes in 100 rows" in r["warnings"] and "task := 'regression'" in r["warnings"]
    r = train(con, "'x', 'ids', label := 'x', epochs := 1")
    assert r["warnings"] is None


@pytest.mark.slow   # ~1.9 s: out of the -m 'not slow' inner loop (under a minute)
def test_the_validation_rows_are_chosen_by_source_row_not_by_features(noisy):
    """Models of one source with other features hold out the same rows (hashed as the source
    gives them, not as encoded), so their validation figures compare."""
    rows = {train(noisy, f"'n', 'noisy', label := 'y', features := {f}, epochs := 1")["rows"]
            for f in ("['a']", "['b', 'c']", "['a', 'b', 'c']")}
    assert len(rows) == 1 and 200 < rows.pop() < 250
