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
    value a space may draw is checked by train()'s own rules (``core.arguments.arguments``) first."""
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


@pytest.mark.slow   # ~10 s: trials run until the search has started its second
@pytest.mark.parametrize("sampler, space", [
    ("random", '{"lr": {"uniform": [0.001, 0.1]}}'),
    ("grid", '{"seed": {"int": [0, 9999]}}'),
])
def test_a_search_asks_for_trials_as_it_goes_and_stops_when_interrupted(con, monkeypatch, sampler, space):
    """Item 17: ``tune(sampler := 'random', trials := 1000000000)`` asked for every trial at once
    (17 MB/s, ``interrupt()`` ignored; with 20,000 trials still running 90 s after it). Trials are
    asked (a grid's points enqueued) a bounded round ahead, and an interrupt ends the search
    within one running trial's stop."""
    import threading
    import time

    import optuna

    from dbml.search import engine
    from helpers import wait_until

    asked, enqueued = [], []
    ask, enqueue = optuna.Study.ask, optuna.Study.enqueue_trial
    monkeypatch.setattr(optuna.Study, "ask", lambda self, *a, **k: asked.append(1) or ask(self, *a, **k))
    monkeypatch.setattr(optuna.Study, "enqueue_trial",
                        lambda self, *a, **k: enqueued.append(1) or enqueue(self, *a, **k))
    _tab(con)
    result = {}

    def run():
        try:
            _tune(con, f"sampler := '{sampler}', trials := 10000, space := '{space}'")
        except Exception as e:   # the interrupt
            result["error"] = str(e)
        result["ended"] = time.monotonic()

    watcher = con.cursor()
    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: watcher.execute("SELECT count(*) FROM dbml_trials").fetchall()[0][0] >= 2,
               timeout=120, what="the search's second trial")
    assert len(asked) <= 1 + engine.ASK_AHEAD and len(enqueued) <= 1 + engine.ASK_AHEAD
    interrupted = time.monotonic()
    con.interrupt()
    thread.join(engine.STOP_S)
    assert not thread.is_alive()
    assert "tune() was interrupted" in result["error"] or "INTERRUPT" in result["error"].upper()
    # the search itself stops at once; what is left is the running trials' stop at their next boundary
    assert result["ended"] - interrupted < 30
    assert len(asked) <= 1 + 2 * engine.ASK_AHEAD


@pytest.mark.parametrize("args, message", [
    ("trials := -3", r"tune\(\): trials must be a positive integer, got -3; pass e.g. trials := 20"),
    ("trials := 0", r"tune\(\): trials must be a positive integer, got 0"),
    ("trials := 10001", r"tune\(\): trials := 10001 is more than 10000; pass fewer"),
    ("parallel := 100000", r"tune\(\): parallel := 100000 is more than 256 trials at once; pass fewer, or leave "
                           r"parallel NULL"),
], ids=["negative", "zero", "over", "parallel"])
def test_the_trial_counts_are_bounded_before_any_trial(con, args, message):
    """Item 17: the counts that size a search, refused by name (parallel := 100000 started a job,
    a thread and a cursor, for every trial at once)."""
    _tab(con)
    with pytest.raises(duckdb_error(), match=message):
        _tune(con, f"""{args}, space := '{{"lr": {{"choice": [0.1, 0.01]}}}}'""")
    import dbml.tuning   # the Python surface (BigQuery ML's num_trials has its own bound: test_trust3)
    with pytest.raises(duckdb_error(), match=message):
        dbml.tuning.tune(con, "m", "t", {"lr": {"choice": [0.1, 0.01]}}, label="y",
                         **{k.strip(): int(v) for k, v in [args.split(":=")]})


@pytest.mark.slow   # ~20 s: eleven trials (TPE learns from its history past ten), then three resumes
def test_a_search_resumed_with_another_space_goes_on(con):
    """Item 10: ``tune()`` resumed with a changed distribution raised Optuna's ``ValueError:
    CategoricalDistribution does not support dynamic value space``. A resumed search goes on:
    numbered after the stored trials, drawing from the new space, learning from the stored
    trials it could have drawn; the model's best is the best of them all."""
    _tab(con, 60)
    first = _tune(con, """sampler := 'random', trials := 11, space := '{"lr": {"choice": [0.1, 0.01]}}'""")
    assert [t for t, _, _ in first] == list(range(11))
    for number, space in ((11, '{"lr": {"choice": [0.1, 0.001]}}'),
                          (13, '{"lr": {"log_uniform": [0.001, 0.05]}}'),
                          (15, '{"lr": {"uniform": [0.001, 0.2]}, "batch_size": {"choice": [16, 32]}}')):
        rows = _tune(con, f"trials := 2, space := '{space}'")
        assert rows == [(number, "finished", None), (number + 1, "finished", None)]
    import json
    params = [json.loads(p) for p, in con.execute("SELECT params FROM dbml_trials WHERE trial >= 11 ORDER BY trial")
              .fetchall()]
    assert all(p["lr"] in (0.1, 0.001) for p in params[:2])
    assert all(0.001 <= p["lr"] <= 0.05 for p in params[2:4])
    assert all(0.001 <= p["lr"] <= 0.2 and p["batch_size"] in (16, 32) for p in params[4:])
    assert con.execute("SELECT count(*) FROM dbml_trials WHERE best").fetchall() == [(1,)]


def test_a_resumed_search_learns_from_the_stored_trials_its_space_could_draw():
    """The study a resumed search makes (``studies.make_study``): the stored trials whose values
    the new space draws, each under the new space's distribution; the others left out."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, distribution_to_json

    from dbml.core.spec import TrainSpec
    from dbml.search.studies import make_study
    from dbml.search.tunespec import make_request

    def record(trial, lr, dist):
        return {"trial": trial, "status": "finished", "objective": 0.5, "objectives": [0.5],
                "search": {"params": {"lr": lr, "seed": trial},
                           "distributions": {"lr": distribution_to_json(dist),
                                             "seed": distribution_to_json(CategoricalDistribution([0, 1, 2]))}}}

    old = CategoricalDistribution([0.1, 0.01])
    stored = [record(0, 0.1, old), record(1, 0.01, old), record(2, 0.05, FloatDistribution(0.001, 0.2))]
    base = TrainSpec(model="m", source="t", label="y")
    for space, kept, dist in (('{"lr": {"choice": [0.1, 0.001]}}', [0], CategoricalDistribution([0.1, 0.001])),
                              ('{"lr": {"uniform": [0.001, 0.06]}}', [1, 2], FloatDistribution(0.001, 0.06)),
                              ('{"lr": {"choice": [0.5]}}', [], None)):
        study = make_study(make_request(base, space, 2, None, "val_loss", "median", "tpe"), stored)
        assert [t.params["lr"] for t in study.trials] == [stored[i]["search"]["params"]["lr"] for i in kept]
        assert all(t.distributions == {"lr": dist} for t in study.trials)
        study.ask({"lr": dist or CategoricalDistribution([0.5])})   # the stored trials' distributions agree


_DNN = "CREATE MODEL m OPTIONS(model_type='dnn_classifier', input_label_cols=['y'], max_iterations=1, {}) AS SELECT * FROM t"


@pytest.mark.parametrize("options, message", [
    ("num_trials=4, hidden_units=HPARAM_CANDIDATES([[8], [0]])",
     r"train\(\) refuses \{\"hidden_units\": \[0\]\}, a point of its search space: train\(\): hidden must list "
     r"positive layer sizes"),
    ("num_trials=4, dropout=HPARAM_CANDIDATES([0.1, 1.5])",
     r"train\(\) refuses \{\"dropout\": 1.5\}, a point of its search space: train\(\): dropout must be in \[0, 1\)"),
    ("num_trials=4, batch_size=HPARAM_CANDIDATES([16, 0]), hparam_tuning_algorithm='RANDOM_SEARCH'",
     r"train\(\) refuses trial 2 \(\{\"batch_size\": 0\}\): train\(\): batch_size must be a positive integer"),
    ("num_trials=4, batch_size=HPARAM_RANGE(16, 1e12)",   # the default, a Bayesian search: its range's ends
     r"train\(\) refuses \{\"batch_size\": 1000000000000\}, a point of its search space: Conversion Error: .* "
     r"INT32; keep the option's HPARAM_RANGE or HPARAM_CANDIDATES to values train\(\) takes; nothing was trained$"),
    ("num_trials=4, batch_size=HPARAM_RANGE(16, 1e12), hparam_tuning_algorithm='RANDOM_SEARCH'",
     r"train\(\) refuses trial 4 \(\{\"batch_size\": 242795452383\}\): Conversion Error: .* out of range for the "
     r"destination type INT32; keep the option's HPARAM_RANGE or HPARAM_CANDIDATES to values train\(\) takes; "
     r"nothing was trained$"),
    ("dropout=3", r"train\(\) refuses its options: train\(\): dropout must be in \[0, 1\)"),
], ids=["hidden", "dropout", "batch-size", "batch-size-cast", "batch-size-cast-random", "no-trials"])
def test_create_model_with_trials_stores_all_of_them_or_nothing(con, options, message):
    """Item 15: if a later trial of ``num_trials`` was refused, the earlier ones stayed stored with
    no BigQuery ML record. Every trial's arguments are checked by train()'s rules first."""
    _tab(con, 100)
    with pytest.raises(dbml.InvalidArgument, match=message):
        dbml.execute(con, _DNN.format(options))
    assert con.execute("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]
    assert con.execute("SELECT count(*) FROM dbml_jobs").fetchall() == [(0,)]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_create_model_with_valid_trials_stores_each(con):
    _tab(con, 100)
    rows = dbml.execute(con, _DNN.format("num_trials=2, batch_size=HPARAM_RANGE(16, 64)")).fetchall()
    assert [r[:2] for r in rows] == [(1, 1), (2, 2)]
    assert len(dbml.execute(con, "SELECT * FROM ML.TRIAL_INFO(MODEL m)").fetchall()) == 2


_TUNER = """
import sys
import dbml
con = dbml.connect(sys.argv[1], latency_model="roofline")
con.execute("CREATE TABLE IF NOT EXISTS t AS SELECT range::DOUBLE a, (range % 2)::INT y FROM range(200)")
print("connected", flush=True)
rows = con.sql("SELECT trial, status FROM tune('m', 't', label := 'y', epochs := 1, trials := 4, "
               "space := '{\\"lr\\": {\\"uniform\\": [0.001, 0.1]}}')").fetchall()
print(rows, flush=True)
con.close()
"""


@pytest.mark.slow   # ~40 s: a second interpreter tunes
def test_a_second_process_tuning_the_same_model_gets_the_lock_error_then_resumes(tmp_path):
    """Item 17's probe: two processes tuning one model of a file database. The second cannot open
    the file while the first tunes (DuckDB's lock, which names the process); once the first has
    ended, it goes on with the same search: trials numbered after the first's, one best."""
    import os
    import subprocess
    import sys

    import duckdb

    path = str(tmp_path / "tuned.duckdb")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    first = subprocess.Popen([sys.executable, "-c", _TUNER, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert first.stdout.readline().strip() == "connected"
        with pytest.raises(duckdb.IOException, match=r"Could not set lock on file .*tuned.duckdb.*Conflicting lock "
                                                     rf"is held in .*\(PID {first.pid}\)"):
            dbml.connect(path)
        out, err = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0, err
    assert out.strip().splitlines()[-1] == str([(n, "finished") for n in range(4)])   # after a progress bar
    con = dbml.connect(path, latency_model="roofline")
    try:
        rows = con.sql("""SELECT trial, status FROM tune('m', 't', label := 'y', epochs := 1, trials := 2,
                          space := '{"lr": {"uniform": [0.001, 0.1]}}')""").fetchall()
        assert rows == [(4, "finished"), (5, "finished")]
        assert con.execute("SELECT count(*), count(*) FILTER (best) FROM dbml_trials").fetchall() == [(6, 1)]
        # every stored version is a trial's, the best's the latest
        assert con.execute("SELECT max(version) FROM dbml_models WHERE name = 'm'").fetchall() == \
            con.execute("SELECT version FROM dbml_trials WHERE best").fetchall()
    finally:
        con.close()


def test_hostile_space_json_is_refused_by_name(con):
    """Probes of tune()'s space: JSON nested past Python's decoder (a raw ``RecursionError``), a
    choice of 200,000 values (each checked, and weighed by TPE at every trial: 43 s for one trial),
    a 1 MB value (repeated whole in the message)."""
    import json

    import dbml.tuning
    _tab(con, 50)
    for space, message in (("[" * 100000 + "]" * 100000, r"tune\(\): space is nested too deeply to be a search space"),
                           ('{"lr": ' + "[" * 100000 + "]" * 100000 + "}", r"space is nested too deeply"),
                           (json.dumps({"seed": {"choice": list(range(200000))}}),
                            r"space's seed: choice lists 200000 values, more than 10000; list fewer, or draw from a "
                            r"range \(int, uniform\)")):
        with pytest.raises(duckdb_error(), match=message):
            dbml.tuning.tune(con, "m", "t", space, label="y", trials=1, epochs=1)
    with pytest.raises(duckdb_error(), match=r"""space's optimizer reaches "x{79}\.\.\., which train\(\) refuses"""):
        dbml.tuning.tune(con, "m", "t", {"optimizer": {"choice": ["x" * 1_000_000]}}, label="y", trials=1)
    assert con.execute("SELECT count(*) FROM dbml_trials").fetchall() == [(0,)]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_a_model_name_that_is_code_stays_a_name_in_the_statement_a_message_suggests(con):
    """A probe with names that are code: the objective message suggested ``DELETE FROM dbml.trials
    WHERE model = 'a\\'b"c; DROP TABLE t; --'`` (Python's repr), which DuckDB reads as a DELETE and
    a DROP TABLE t. The statements it suggests are built as trees, the name a literal in them."""
    import re

    import dbml.tuning
    _tab(con, 50)
    name = "a'b\"c; DROP TABLE t; --"
    space = {"lr": {"choice": [0.1, 0.01]}}
    assert [r["trial"] for r in dbml.tuning.tune(con, name, "t", space, label="y", trials=1, epochs=1)] == [0]
    with pytest.raises(duckdb_error()) as refused:
        dbml.tuning.tune(con, name, "t", space, label="y", trials=1, epochs=1, objective="loss")
    suggested = re.search(r"start afresh after (DELETE FROM .*?) \((SELECT drop_model\(.*\)) drops them too\)",
                          str(refused.value), re.IGNORECASE)
    assert suggested.group(1) == """DELETE FROM dbml.trials WHERE model = 'a''b"c; DROP TABLE t; --'"""
    assert suggested.group(2).lower() == """select drop_model('a''b"c; drop table t; --')"""
    con.execute(suggested.group(1))   # what the user runs: the trials of that model go, table t stays
    assert con.execute("SELECT count(*) FROM dbml_trials").fetchall() == [(0,)]
    assert con.execute("SELECT count(*) FROM t").fetchall() == [(50,)]
    assert [r["trial"] for r in dbml.tuning.tune(con, name, "t", space, label="y", trials=1, epochs=1,
                                                 objective="loss")] == [0]
