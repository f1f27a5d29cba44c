"""tune() (issue 23): hyperparameter search from SQL, trials packed on one device by the shared scheduler.

Tiny tables (a few hundred rows), two or three epochs, roofline latencies: each search takes
a few seconds. What is checked: the trials and their records, the best stored as the next
version and equal bit for bit to the same train() alone, resuming a search, pruning at an
epoch boundary, packing under one budget that is kept, bad input refused with nothing
stored, an interrupt that keeps the ended trials.
"""

from __future__ import annotations

import json
import threading
import time

import duckdb
import pytest
import torch

import dbml
from dbml.core import catalog
from dbml.search import engine as search
from dbml.scheduler.multijob.registry import device_ledger
from helpers import load, moons, wait_until

SPACE = {"lr": {"log_uniform": [1e-3, 0.1]}, "hidden": {"choice": [[8], [16, 8]]},
         "batch_size": {"choice": [32, 64]}}
FIXED = "label := 'label', features := ['x1', 'x2'], arch := 'mlp', epochs := 3, policy := 'tensile'"


@pytest.fixture
def db(con):
    load(con, "moons", moons(300))
    yield con
    con.execute("SET VARIABLE dbml_memory_budget = NULL")


def tune(con, space=SPACE, fixed=FIXED, **search):
    args = "".join(f", {k} := {v!r}" for k, v in search.items())
    return con.execute(f"SELECT * FROM tune('m', 'moons', {fixed}, space := ?{args})", [json.dumps(space)])


def rows_of(result) -> list[dict]:
    names = [d[0] for d in result.description]
    return [dict(zip(names, r)) for r in result.fetchall()]


@pytest.mark.slow   # ~2.9 s: out of the -m 'not slow' inner loop (under a minute)
def test_trials_are_recorded_and_the_best_is_stored_equal_to_training_it_alone(db):
    rows = rows_of(tune(db, trials=5))
    assert [r["trial"] for r in rows] == list(range(5))
    assert {r["status"] for r in rows} <= {"finished", "pruned"} and rows[0]["status"] == "finished"
    assert rows == rows_of(db.execute("SELECT * FROM dbml_trials ORDER BY trial"))
    for r in rows:
        assert set(json.loads(r["params"])) == set(SPACE) and r["job_id"] and r["seconds"] > 0 and r["peak_bytes"] > 0
        assert r["epochs"] == len(r["objectives"]) == (3 if r["status"] == "finished" else r["epochs"])
    finished = [r for r in rows if r["status"] == "finished"]
    best = min(finished, key=lambda r: (r["objective"], r["trial"]))
    assert [r["trial"] for r in rows if r["best"]] == [best["trial"]] and best["objective"] == best["objectives"][-1]
    assert best["version"] == 1 and all(r["version"] is None for r in rows if r is not best)
    params, tuning = db.execute("SELECT params, metrics->'tuning' FROM dbml_models WHERE name = 'm'").fetchall()[0]
    drawn = json.loads(best["params"])
    assert {k: json.loads(params)[k] for k in drawn} == drawn and json.loads(tuning)["trial"] == best["trial"]
    # the trial's model is the one train() makes alone with its arguments (per-epoch validation changes nothing)
    db.execute(f"SELECT train('alone', 'moons', {FIXED}, lr := ?, hidden := ?, batch_size := ?)",
               [drawn["lr"], drawn["hidden"], drawn["batch_size"]])
    tuned, alone = catalog.load(db, "m", 1).module.state_dict(), catalog.load(db, "alone", 1).module.state_dict()
    assert all(torch.equal(tuned[k], alone[k]) for k in alone)
    assert db.execute("SELECT predict('m', [0.5, 0.2]) = predict('alone', [0.5, 0.2])").fetchall() == [(True,)]


@pytest.mark.slow   # ~1.4 s: out of the -m 'not slow' inner loop (under a minute)
def test_the_objective_after_the_last_epoch_is_the_stored_models_validation_metric(db):
    # early_stop := false: the model keeps its last epoch (with early stopping it keeps the best
    # epoch's weights, whose metric is the last epoch's only when that epoch is the best)
    rows = rows_of(tune(db, {"lr": {"choice": [0.01, 0.05]}}, FIXED + ", early_stop := false", objective="val_metric",
                        sampler="grid", pruner="none"))
    assert [r["status"] for r in rows] == ["finished", "finished"]
    best = max(rows, key=lambda r: (r["objective"], -r["trial"]))
    assert best["best"] and 0.5 < best["objective"] <= 1.0
    stored = db.execute("SELECT (metrics->>'val_metric')::DOUBLE FROM dbml_models WHERE name = 'm'").fetchall()
    assert stored == [(best["objective"],)]


@pytest.mark.slow   # ~2.4 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_second_tune_resumes_the_search(db):
    first = rows_of(tune(db, trials=3, sampler="random", pruner="none"))
    second = rows_of(tune(db, trials=2, sampler="random", pruner="none"))
    assert [r["trial"] for r in second] == [3, 4]
    drawn = [r["params"] for r in first + second]
    assert len(set(drawn)) == 5, "a resumed search drew the same parameters again"
    assert db.execute("SELECT count(*), count(*) FILTER (best) FROM dbml_trials").fetchall() == [(5, 1)]
    best = db.execute("SELECT trial, version FROM dbml_trials WHERE best").fetchall()[0]
    versions = db.execute("SELECT max(version) FROM dbml_models WHERE name = 'm'").fetchall()[0][0]
    assert best[1] is not None and versions == (2 if best[0] >= 3 else 1)   # a new version only if the new best is new


@pytest.mark.slow   # ~2.6 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_grid_tries_every_point_once_smallest_first_and_then_is_done(db):
    space = {"batch_size": {"choice": [64, 32]}, "hidden": {"choice": [[16, 8], [8]]}}
    rows = rows_of(tune(db, space, sampler="grid", pruner="none"))
    points = [json.loads(r["params"]) for r in rows]
    assert points[0] == {"batch_size": 32, "hidden": [8]}           # the memory corner first
    assert sorted(map(json.dumps, points)) == sorted({json.dumps({"batch_size": b, "hidden": h})
                                                      for b in (64, 32) for h in ([16, 8], [8])})
    with pytest.raises(duckdb.Error, match=r"every point of space's grid has been tried for model 'm' \(4 trials"):
        tune(db, space, sampler="grid")


@pytest.mark.slow   # ~2.1 s: out of the -m 'not slow' inner loop (under a minute)
def test_pruned_trials_stop_at_an_epoch_boundary_and_give_their_memory_back(db):
    # lr 1e-4 barely moves the loss in 6 epochs: after 5 finished trials, the median prunes it
    space = {"lr": {"choice": [0.05, 0.0001]}}
    fixed = FIXED.replace("epochs := 3", "epochs := 6")
    first = rows_of(tune(db, {"lr": {"choice": [0.05]}}, fixed, trials=5, sampler="random", pruner="none"))
    assert all(r["status"] == "finished" for r in first)
    rows = rows_of(tune(db, space, fixed, trials=3, sampler="random", pruner="median", parallel=1))
    pruned = [r for r in rows if r["status"] == "pruned"]
    assert pruned and all(json.loads(r["params"])["lr"] == 0.0001 and r["epochs"] < 6 for r in pruned)
    for r in pruned:
        job = db.execute("SELECT status, epoch, error FROM dbml_jobs WHERE job_id = ?", [r["job_id"]]).fetchall()[0]
        assert job[0] == "cancelled" and job[1] == r["epochs"] and "was pruned after epoch" in job[2]
    assert device_ledger("cpu").current_bytes == 0


@pytest.mark.slow   # ~2.2 s: out of the -m 'not slow' inner loop (under a minute)
def test_trials_are_packed_under_one_budget_that_is_kept(db, monkeypatch):
    monkeypatch.setattr(search, "FUSE_TRIALS", False)   # separate jobs side by side (fused: test_fusion.py)
    db.execute("SET VARIABLE dbml_memory_budget = '60KB'")
    seen, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            seen.append(sum(b > 0 for b in device_ledger("cpu").accounts().values()))
            time.sleep(0.002)

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        # 8 epochs: a trial's steps outlast the other trials' captures (each ~0.3 s, one at a time
        # in the process), which now all come before a trial's first step
        rows = rows_of(tune(db, fixed=FIXED.replace("epochs := 3", "epochs := 8"), trials=6, pruner="none"))
    finally:
        stop.set()
        watcher.join()
    assert all(r["status"] == "finished" for r in rows)
    assert max(seen) >= 2, f"the trials never trained side by side: {max(seen)} at most"
    assert 0 < device_ledger("cpu").peak_bytes <= 60_000


BAD = [
    (None, "tune(): space is missing; pass the parameters to search"),
    ("{}", "tune(): space is empty"),
    ("{'lr': 1", "tune(): space is not valid JSON"),
    ("[1, 2]", "tune(): space must be a JSON object of parameter -> distribution"),
    ('{"lrr": {"uniform": [0.1, 0.2]}}', "tune(): space names 'lrr': tune() searches no parameter 'lrr' "
                                         "(did you mean 'lr'?); it may search lr, batch_size"),
    ('{"epochs": {"int": [1, 5]}}', "tune(): space names 'epochs': epochs is the same for every trial; "
                                    "pass it as epochs := ... instead"),
    ('{"batch_size": {"uniform": [16, 64]}}', "tune(): space's batch_size takes integer values, which uniform "
                                               "does not draw; use int or log_int or choice"),
    ('{"lr": {"choice": ["fast"]}}', "tune(): space's lr takes number values, got \"fast\""),
    ('{"lr": {"log_uniform": [0, 0.1]}}', r"tune(): space's lr: log_uniform needs low > 0"),
    ('{"lr": {"uniform": [0.1, 0.01]}}', r"tune(): space's lr: uniform needs low < high"),
    ('{"lr": {"uniform": [0.1]}}', r"tune(): space's lr: uniform takes [low, high], two numbers"),
    ('{"lr": {"normal": [0.1, 1]}}', r"tune(): space's lr has an unknown distribution 'normal'"),
    ('{"lr": {"log_uniform": [0.1, 1e7]}}', r"tune(): space's lr reaches 10000000.0, which train() refuses: "
                                            r"train(): lr must be a positive number up to 1e+06"),
    ('{"options.width": {"int": [8, 16]}}', r"tune(): space names 'options.width', not an option of arch 'mlp'"),
    ('{"lr": {"uniform": [0.01, 0.1]}}', r"tune(): sampler 'grid' tries listed values, and space's lr is a "
                                         r"uniform range", {"sampler": "grid"}),
    ('{"lr": {"choice": [0.1]}}', "tune(): unknown pruner 'mean'; pass pruner := one of", {"pruner": "mean"}),
    ('{"lr": {"choice": [0.1]}}', "tune(): trials must be a positive integer, got 0", {"trials": 0}),
    ('{"lr": {"choice": [0.1]}}', "tune(): objective 'val_loss' is measured on held-out rows, and validation is 0.0",
     {"validation": 0.0}),
]


@pytest.mark.parametrize("case", BAD, ids=[c[1][7:40] for c in BAD])
@pytest.mark.slow   # ~1.4 s: out of the -m 'not slow' inner loop (under a minute)
def test_bad_input_is_refused_naming_it_and_nothing_is_stored(db, case):
    space, message, *extra = case
    args = "".join(f", {k} := {v!r}" for k, v in (extra[0] if extra else {}).items())
    with pytest.raises(duckdb.Error) as info:
        db.execute(f"SELECT * FROM tune('m', 'moons', {FIXED}, space := ?{args})", [space])
    assert message.replace("\\", "") in str(info.value) or __import__("re").search(message, str(info.value)), \
        str(info.value)
    assert db.execute("SELECT (SELECT count(*) FROM dbml_trials), (SELECT count(*) FROM dbml_models), "
                      "(SELECT count(*) FROM dbml_jobs)").fetchall() == [(0, 0, 0)]


@pytest.mark.slow   # ~0.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_budget_too_small_for_the_smallest_trial_stops_the_search_storing_nothing(db):
    db.execute("SET VARIABLE dbml_memory_budget = '2KB'")
    with pytest.raises(duckdb.Error, match=r"tune\(\): even the space's smallest trial \(hidden \[8\], "
                                           r"batch_size 32\) fits no plan in the memory budget; nothing was stored: "
                                           r"train\(\): memory_budget .* SET VARIABLE dbml_memory_budget = '.*KB'"):
        tune(db)
    assert db.execute("SELECT (SELECT count(*) FROM dbml_trials), (SELECT count(*) FROM dbml_models), "
                      "(SELECT count(*) FROM dbml_jobs)").fetchall() == [(0, 0, 1)]
    # an arch drawn from the space has no smallest: every trial runs, and all of them failing tells
    db.execute("SET VARIABLE dbml_memory_budget = '100B'")
    with pytest.raises(duckdb.Error, match=r"tune\(\): no trial fits a plan in the memory budget; nothing was "
                                           r"stored: train\(\): memory_budget"):
        tune(db, {"arch": {"choice": ["mlp", "linear"]}}, FIXED.replace("arch := 'mlp', ", ""), trials=2)
    assert db.execute("SELECT (SELECT count(*) FROM dbml_trials), (SELECT count(*) FROM dbml_jobs)").fetchall() \
        == [(0, 3)]


@pytest.mark.slow   # ~0.8 s: out of the -m 'not slow' inner loop (under a minute)
def test_an_interrupt_stops_the_search_and_keeps_the_ended_trials(db):
    fixed = FIXED.replace("epochs := 3", "epochs := 40, early_stop := false")
    result = {}

    def run():
        try:
            tune(db, {"lr": {"choice": [0.01, 0.02, 0.03, 0.04]}}, fixed, sampler="grid", pruner="none",
                 parallel=1)
        except duckdb.Error as e:
            result["error"] = str(e)

    watcher = db.cursor()   # before the search starts on db: a cursor reads db's settings from db
    thread = threading.Thread(target=run)
    thread.start()
    # a trial ended and the next one's job under way: interrupted between the two, no trial
    # runs and the message (checked below) says 0 were cancelled (one full run did)
    wait_until(lambda: watcher.execute("SELECT (SELECT count(*) FROM dbml_trials WHERE status = 'finished') > 0 "
                                       "AND (SELECT count(*) FROM dbml_jobs WHERE model = 'm' "
                                       "AND status IN ('queued', 'running')) > 0").fetchall()[0][0],
               timeout=60, what="a finished trial and the next one's job")
    # what Connection.interrupt() does first (it then interrupts DuckDB too, whose own "Interrupted!"
    # may reach the caller instead of tune()'s message when it comes first)
    assert db._instance.jobs.interrupt(db._id) == 1
    thread.join(30)
    assert not thread.is_alive()
    assert "tune() was interrupted: 1 ended trial(s) of 'm' are kept in dbml_trials; its best trial 0 is stored as " \
           "version 1 of 'm'; 1 running trial(s) were cancelled and not kept" in result["error"]
    assert watcher.execute("SELECT trial, status, best, version FROM dbml_trials").fetchall() == [(0, "finished", True, 1)]
    assert watcher.execute("SELECT count(*) FROM dbml_jobs WHERE status = 'running'").fetchall() == [(0,)]


@pytest.mark.slow   # ~1.2 s: out of the -m 'not slow' inner loop (under a minute)
def test_python_api_the_surface_for_other_layers_the_plot_and_drop_model(db):
    import dbml.tuning
    rows = dbml.tune(db, "m", "moons", label="label", features=["x1", "x2"], epochs=2, trials=2,
                     space={"hidden": {"choice": [[8], [4]]}}, sampler="grid")
    assert [json.loads(r["params"]) for r in rows] == [{"hidden": [4]}, {"hidden": [8]}]
    with pytest.raises(dbml.InvalidArgument, match="dbml.tune\\(\\): unknown argument 'trails' \\(did you mean 'trials'\\?\\)"):
        dbml.tune(db, "m", "moons", trails=3)
    # BigQuery ML's names (the BigQuery layer's num_trials): algorithm and objective
    more = dbml.tuning.tune(db, "n", "moons", {"lr": {"choice": [0.01, 0.05]}}, algorithm="GRID_SEARCH",
                            objective="ACCURACY", pruner="none", label="label", features=["x1", "x2"], epochs=2)
    assert [r["objective_name"] for r in more] == ["val_metric", "val_metric"]
    assert dbml.tuning.trials(db, "n") == more and dbml.tuning.best(db, "n")["version"] == 1
    with pytest.raises(dbml.InvalidArgument, match="objective 'roc_auc' is not measured by tune"):
        dbml.tuning.tune(db, "n", "moons", {}, objective="roc_auc")
    fig = dbml.plot.trials(db, "n")
    assert [t for t, _ in fig.dbml["finished"]] == [0, 1] and fig.dbml["best"] == [dbml.tuning.best(db, "n")["trial"]]
    assert set(fig.dbml["importance"]) <= {"lr"}
    assert dbml.drop_model(db, "m") == 1
    assert db.execute("SELECT DISTINCT model FROM dbml_trials").fetchall() == [("n",)]


def test_tune_has_effects_and_no_source_may_call_it(db):
    from dbml.api import has_effects
    assert has_effects("SELECT * FROM tune('m', 't', space := '{}')")
    with pytest.raises(duckdb.Error, match="tune"):
        db.execute("SELECT train('x', 'SELECT * FROM moons, tune(''m'', ''moons'')', label := 'label')")


def test_an_older_database_opened_read_only_has_an_empty_dbml_trials(tmp_path):
    path = str(tmp_path / "old.duckdb")
    with dbml.connect(path, latency_model="roofline") as con:
        con.execute("DROP TABLE dbml.trials")          # as a database written before tune() existed
    with dbml.connect(path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM dbml_trials").fetchall() == [(0,)]
    with dbml.connect(path) as con:                    # opened writable, it gains the table
        assert con.execute("SELECT count(*) FROM dbml.trials").fetchall() == [(0,)]


def test_runner_values_read_weights_on_the_host_without_moving_them():
    """What a per-epoch validation reads mid-training (StepRunner.values): the weights of the
    moment, though the plan keeps some on the host between iterations, and nothing moves."""
    import copy

    from dbml.scheduler import OptimizerSpec
    from dbml.scheduler.execute.runner import ScheduledStep
    from dbml.scheduler.execute.step import EagerStep
    from helpers import batches, deep_narrow, loss_fn, state_of

    spec, data = OptimizerSpec("sgd", lr=0.1), batches(4, 32, (64,))
    torch.manual_seed(0)
    model = deep_narrow()
    eager, scheduled = EagerStep(copy.deepcopy(model), loss_fn, spec), None
    budget = int(sum(p.numel() * 4 for p in model.parameters()) * 2 * 0.9)
    scheduled = ScheduledStep(copy.deepcopy(model), loss_fn, spec, budget_bytes=budget)
    for x, y in data[:2]:
        eager.step(x, y), scheduled.step(x, y)
    on_host = dict(scheduled.state.host)
    assert on_host, "some state should be on the host between iterations"
    assert all(torch.equal(a, b) for a, b in zip(scheduled.values(), eager.values(), strict=True))
    assert scheduled.state.host.keys() == on_host.keys() and all(scheduled.state.host[k] is v for k, v in on_host.items())
    for x, y in data[2:]:
        eager.step(x, y), scheduled.step(x, y)
    scheduled.finish()
    assert all(torch.equal(a, b) for a, b in zip(state_of(scheduled.model), state_of(eager.model)))


def test_the_bench_estimates_a_peer_peak_from_its_trials_overlap():
    from dbml.bench.tune import _concurrent_peak
    assert _concurrent_peak([(0, 10, 5), (2, 4, 3), (4, 6, 7), (11, 12, 100)]) == 100
    assert _concurrent_peak([(0, 10, 5), (2, 5, 3), (4, 6, 7)]) == 15


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_one_best_trial_rule_for_the_search_the_stored_trials_and_bigquery_ml():
    """studies.best_trial is the rule; trials.ROWS_SQL states it in SQL and agrees on random
    trials with ties, no objective and NaN; BigQuery ML's optimal trial is it, maximising."""
    import math
    import random
    from dbml.search import trials
    from dbml.bigquery.tuning import optimal
    from dbml.search.studies import best_trial
    rng = random.Random(0)
    con = duckdb.connect()
    for case in range(200):
        direction = rng.choice(("minimize", "maximize"))
        rows = [(n, rng.choice([None, math.nan, *(float(rng.randint(0, 3)) for _ in range(4))]))
                for n in rng.sample(range(1, 20), rng.randint(1, 6))]
        con.execute("CREATE OR REPLACE TABLE t (model VARCHAR, trial INTEGER, status VARCHAR, direction VARCHAR, "
                    "objective DOUBLE)")
        con.executemany("INSERT INTO t VALUES ('m', ?, ?, ?, ?)",   # a trial without an objective failed
                        [(n, "failed" if v is None else "finished", direction, v) for n, v in rows])
        sql = [t for (t,) in con.execute(f"SELECT trial FROM (SELECT *, {trials._BEST} AS best FROM t) WHERE best")
               .fetchall()]
        assert sql == ([] if best_trial(rows, direction) is None else [best_trial(rows, direction)]), (case, rows)
    assert best_trial([(3, 0.5), (1, 0.9), (2, 0.9)], "maximize") == 1 == optimal([(3, 0.5), (1, 0.9), (2, 0.9)])
    assert best_trial([(1, None), (2, None)], "maximize") is None and optimal([(2, None), (1, None)]) == 1


@pytest.mark.slow   # ~6 s: a search of 6 trials and each trained alone
def test_a_search_reads_its_source_once_and_writes_its_trials_together_each_equal_to_train_alone(db, monkeypatch):
    """Issue 32: the per-trial fixed costs. The source is read, encoded and materialised once
    for every trial (training.SharedRows), not once per trial; the trials that start or end
    together are written in one statement; each trial's model is still the one train() makes
    alone with its arguments, and no scratch table is left."""
    from dbml.core import training
    from dbml.search import trials as store

    reads, writes, kept = [], [], {}
    read, save, keep = training._read, store.save, search.Search._keep_if_best
    monkeypatch.setattr(training, "_read", lambda *a, **k: reads.append(a[5]) or read(*a, **k))
    monkeypatch.setattr(store, "save", lambda cur, *records: writes.append(len(records)) or save(cur, *records))

    def keeping(self, trial):
        if trial.trained is not None:
            kept[trial.number] = {k: v.clone() for k, v in trial.trained.module.state_dict().items()}
        return keep(self, trial)
    monkeypatch.setattr(search.Search, "_keep_if_best", keeping)
    space = {"lr": {"choice": [0.003, 0.01, 0.03]}, "hidden": {"choice": [[8], [16, 8]]}}
    rows = rows_of(tune(db, space=space, sampler="grid", pruner="none"))
    assert len(rows) == 6 and all(r["status"] == "finished" for r in rows)
    assert len(reads) == 1, reads                           # one reading for six trials in several jobs
    writes = [n for n in writes if n]
    # a start and an end row each and the best's stored version, in fewer writes than rows
    assert sum(writes) == 13 and len(writes) < 10, writes
    assert db.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'dbml_scratch'").fetchall() == [(0,)]
    for r in rows:
        name = f"alone{r['trial']}"
        db.execute(f"SELECT train('{name}', 'moons', {FIXED}, lr := ?, hidden := ?)",
                   [json.loads(r["params"])["lr"], json.loads(r["params"])["hidden"]])
        alone = catalog.load(db, name, 1).module.state_dict()
        assert all(torch.equal(kept[r["trial"]][k], alone[k]) for k in alone), r["params"]
