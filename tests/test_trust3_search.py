"""Issue 31, trust round 3: tune()'s holes (its space, its trial count, resuming, BigQuery ML's
num_trials, two processes), each re-tried as the user would."""

from __future__ import annotations

import pytest

import dbml


def _tab(con, rows: int = 200) -> None:
    con.execute("CREATE TABLE t AS SELECT range::DOUBLE a, (range % 2)::INT y FROM range(?)", [rows])


def _tune(con, args: str, model: str = "m"):
    return con.sql(f"SELECT trial, status, error FROM tune('{model}', 't', label := 'y', epochs := 1, {args})").fetchall()


@pytest.mark.parametrize("space, message", [
    ('{"seed": {"int": [0, 1e300]}}', r"space's seed reaches 1e\+300, which its type BIGINT does not hold "
                                      r"\(from -9223372036854775808 to 9223372036854775807\); pass values in that range"),
    ('{"batch_size": {"int": [1, 1e300]}}', r"space's batch_size reaches 1e\+300, which its type INTEGER does not hold"),
    ('{"batch_size": {"log_int": [1, 3000000000]}}', r"space's batch_size reaches 3000000000, which its type INTEGER"),
    ('{"batch_size": {"choice": [32, 3000000000]}}', r"space's batch_size reaches 3000000000, which its type INTEGER"),
    ('{"hidden": {"choice": [[4, 1e20]]}}', r"space's hidden reaches 1e\+20, which its type INTEGER\[\]"),
    ('{"seed": {"choice": [1, -1e19]}}', r"space's seed reaches -1e\+19, which its type BIGINT"),
], ids=["int-1e300", "batch-1e300", "log-int", "choice", "hidden-element", "negative"])
def test_a_space_reaching_past_its_parameters_type_is_refused_by_name(con, space, message):
    """Items 10 and 19: an integer space up to 1e300 made every trial fail inside DuckDB
    (``TypeError: _submit(): incompatible function arguments``); each number is bounded by the
    type train() takes the parameter as, before any trial runs."""
    _tab(con)
    with pytest.raises(duckdb_error(), match=message):
        _tune(con, f"trials := 1, space := '{space}'")
    assert con.execute("SELECT count(*) FROM dbml_trials").fetchall() == [(0,)]


def test_a_space_up_to_its_types_end_runs(con):
    _tab(con)
    assert _tune(con, """trials := 1, space := '{"seed": {"int": [1, 9223372036854775807]}}'""") == [
        (0, "finished", None)]


@pytest.mark.parametrize("args, space, message", [
    ("", '{"hidden": {"choice": [[64], [0]]}}', r"space's hidden reaches \[0\], which train\(\) refuses: train\(\): "
                                                r"hidden must list positive layer sizes"),
    ("", '{"hidden": {"choice": [[2000000]]}}', r"space's hidden reaches \[2000000\], which train\(\) "
                                                     r"refuses: .*option 'hidden' of arch 'mlp' may list at most"),
    ("", '{"dropout": {"uniform": [0, 5]}}', r"space's dropout reaches 5.0, which train\(\) refuses: train\(\): "
                                             r"dropout must be in \[0, 1\)"),
    ("arch := 'ft_transformer',", '{"options.width": {"choice": [64, -3]}}',
     r"space's options.width reaches -3, which train\(\) refuses: train\(\): option 'width' of arch "
     r"'ft_transformer' must be a positive integer"),
    ("arch := 'linear',", '{"hidden": {"choice": [[4]]}}',
     r"space's hidden reaches \[4\], which train\(\) refuses: train\(\): arch 'linear' has no hidden"),
], ids=["hidden-zero", "hidden-huge", "dropout", "option", "hidden-of-linear"])
def test_every_value_of_a_space_is_checked_by_trains_own_rules(con, args, space, message):
    """Item 19: ``hidden {"choice": [[0]]}`` passed the checks and every trial failed; each
    value a space may draw is checked by train()'s own rules (``models.arguments``) first."""
    _tab(con)
    with pytest.raises(duckdb_error(), match=message):
        _tune(con, f"{args} trials := 1, space := '{space}'")
    assert con.execute("SELECT count(*) FROM dbml_trials").fetchall() == [(0,)]


def test_train_refuses_the_same_values_before_its_job_starts(con):
    """The rule tune() reuses is train()'s: refused when the statement starts, no job run."""
    _tab(con)
    for args, message in (("hidden := [0]", "hidden must list positive layer sizes"),
                          ("dropout := 3", r"dropout must be in \[0, 1\)"),
                          ("arch := 'linear', hidden := [3]", "arch 'linear' has no hidden")):
        with pytest.raises(duckdb_error(), match=message):
            con.sql(f"SELECT train('m', 't', label := 'y', epochs := 1, {args})").fetchall()
    assert con.execute("SELECT count(*) FROM dbml_jobs").fetchall() == [(0,)]


def duckdb_error():
    import duckdb
    return (dbml.InvalidArgument, duckdb.Error)
