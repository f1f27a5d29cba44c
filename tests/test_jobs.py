"""Training jobs as worker threads: asynchronous jobs, concurrency, cancellation, failures."""

import threading
import time

import duckdb
import pytest

import dbml

from conftest import linear, load, moons

SRC = "SELECT x1, x2, label FROM moons"


@pytest.fixture
def db(con):
    load(con, "moons", moons(3000))
    load(con, "lin", linear(500))
    return con


def weights(con, name):
    return con.sql(f"SELECT weights FROM dbml_weights WHERE name = '{name}'").fetchall()[0][0]


def job_rows(con):
    return {r[0]: r for r in con.sql("SELECT id, model, status, started, finished, error, progress FROM dbml_jobs")
            .fetchall()}


def test_async_job_returns_at_once_and_wait_job_gives_its_summary(db):
    t0 = time.perf_counter()
    started = db.sql(f"SELECT train('async', '{SRC}', label := 'label', epochs := 6, wait := false)").fetchall()[0][0]
    assert time.perf_counter() - t0 < 5 and started["status"] in ("queued", "running")
    assert started["version"] is None
    assert job_rows(db)[started["job_id"]][2] in ("queued", "running")
    done = db.sql(f"SELECT wait_job({started['job_id']})").fetchall()[0][0]
    assert done["status"] == "finished" and done["version"] == 1 and done["job_id"] == started["job_id"]
    row = job_rows(db)[started["job_id"]]
    assert row[2] == "finished" and row[6] == 1.0 and row[4] >= row[3]
    # the same job run synchronously gives the same weights
    db.sql(f"SELECT train('sync', '{SRC}', label := 'label', epochs := 6)").fetchall()
    assert weights(db, "async") == weights(db, "sync")
    epochs = db.sql("SELECT epoch, loss FROM dbml_epochs WHERE model = 'async' ORDER BY epoch").fetchall()
    assert [e for e, _ in epochs] == [1, 2, 3, 4, 5, 6] and epochs[-1][1] < epochs[0][1]


def test_rows_of_one_statement_run_concurrently_and_match_running_alone(db):
    rows = db.sql(f"SELECT train(name, '{SRC}', label := 'label', epochs := 4, seed := seed) "
                  f"FROM (VALUES ('c1', 1), ('c2', 2), ('c3', 3)) v(name, seed)").fetchall()
    ids = sorted(r[0]["job_id"] for r in rows)
    jobs = job_rows(db)
    spans = [(jobs[i][3], jobs[i][4]) for i in ids]
    assert all(a[0] < b[1] and b[0] < a[1] for a in spans for b in spans)  # the running intervals overlap
    for name, seed in (("c1", 1), ("c2", 2), ("c3", 3)):
        db.sql(f"SELECT train('alone_{name}', '{SRC}', label := 'label', epochs := 4, seed := {seed})").fetchall()
        assert weights(db, name) == weights(db, f"alone_{name}")


def test_jobs_from_two_connections_overlap(tmp_path):
    path = str(tmp_path / "two.duckdb")
    a, b = dbml.connect(path), dbml.connect(path)
    load(a, "moons", moons(3000))
    ids = [c.sql(f"SELECT train('{n}', '{SRC}', label := 'label', epochs := 4, wait := false).job_id").fetchall()[0][0]
           for c, n in ((a, "from_a"), (b, "from_b"))]
    results = [a.sql(f"SELECT wait_job({i}).status").fetchall()[0][0] for i in ids]
    assert results == ["finished", "finished"]
    jobs = job_rows(b)
    (s1, f1), (s2, f2) = [(jobs[i][3], jobs[i][4]) for i in ids]
    assert s1 < f2 and s2 < f1
    a.close(), b.close()


def test_cancel_mid_training_stores_nothing_and_spares_the_others(db):
    slow = db.sql(f"SELECT train('doomed', '{SRC}', label := 'label', epochs := 200, wait := false).job_id").fetchall()[0][0]
    other = db.sql(f"SELECT train('survivor', '{SRC}', label := 'label', epochs := 3, wait := false).job_id").fetchall()[0][0]
    while job_rows(db)[slow][6] == 0:
        time.sleep(0.05)
    assert db.sql(f"SELECT cancel_job({slow})").fetchall()[0][0] == "running"
    with pytest.raises(duckdb.Error, match=rf"job {slow} \('doomed'\) was cancelled; nothing was stored"):
        db.sql(f"SELECT wait_job({slow})").fetchall()
    assert db.sql(f"SELECT wait_job({other}).status").fetchall()[0][0] == "finished"
    assert job_rows(db)[slow][2] == "cancelled"
    assert db.sql("SELECT name FROM dbml_models").fetchall() == [("survivor",)]


def test_a_failing_job_fails_alone(db):
    with pytest.raises(duckdb.Error, match=r"loss became (nan|inf)"):
        db.sql("SELECT train(name, src, label := lbl, lr := lr, optimizer := 'sgd', epochs := 3) FROM (VALUES "
               f"('ok', '{SRC}', 'label', 0.01), "
               "('boom', 'SELECT a, b, c, y FROM lin', 'y', 1e30)) v(name, src, lbl, lr)").fetchall()
    jobs = {r[1]: r for r in job_rows(db).values()}
    assert jobs["ok"][2] == "finished" and jobs["boom"][2] == "failed"
    assert "loss became" in jobs["boom"][5]
    assert db.sql("SELECT name FROM dbml_models").fetchall() == [("ok",)]


def test_unknown_job(db):
    with pytest.raises(duckdb.Error, match=r"wait_job\(\): no job 12345 in this database; see SELECT"):
        db.sql("SELECT wait_job(12345)").fetchall()
    with pytest.raises(duckdb.Error, match=r"cancel_job\(\): no job 12345"):
        db.sql("SELECT cancel_job(12345)").fetchall()


WIDE = "'SELECT * FROM t', label := 'y', hidden := [256, 256], batch_size := 256"


def test_jobs_that_do_not_fit_together_queue_and_run_later(wide):
    # one such job needs at least ~1.3 MB (2.0 MB unscheduled): two cannot share 2.5 MB
    wide.execute("SET VARIABLE dbml_memory_budget = 2500000")
    first = wide.sql(f"SELECT train('first', {WIDE}, epochs := 12, wait := false).job_id").fetchall()[0][0]
    while job_rows(wide)[first][6] == 0:
        time.sleep(0.02)
    second = wide.sql(f"SELECT train('second', {WIDE}, epochs := 2, wait := false).job_id").fetchall()[0][0]
    seen = set()
    while job_rows(wide)[first][2] == "running":
        seen.add(job_rows(wide)[second][2])
        memory = wide.sql("SELECT job_id, status, waiting_jobs, budget_bytes FROM dbml_memory").fetchall()
        if any(m[1] == "queued" for m in memory):
            assert all(m[2] == 1 and m[3] == 2500000 for m in memory)
        time.sleep(0.02)
    assert "queued" in seen                                  # it waited for memory ...
    for job in (first, second):                              # ... and then ran: both finished
        assert wide.sql(f"SELECT wait_job({job}).status").fetchall()[0][0] == "finished"
    r = wide.sql(f"SELECT wait_job({second})").fetchall()[0][0]
    assert r["measured_peak_bytes"] <= 2500000


def test_three_jobs_below_the_sum_of_their_unscheduled_peaks_stay_within_the_budget(wide):
    # each needs ~2.0 MB unscheduled and ~1.3 MB scheduled: 4.5 MB holds all three only scheduled
    budget = 4_500_000
    wide.execute(f"SET VARIABLE dbml_memory_budget = {budget}")
    rows = wide.sql(f"SELECT train(name, {WIDE}, epochs := 3, seed := seed) "
                    f"FROM (VALUES ('w1', 1), ('w2', 2), ('w3', 3)) v(name, seed)").fetchall()
    summaries = [r[0] for r in rows]
    assert all(s["status"] == "finished" for s in summaries)
    assert sum(s["vanilla_peak_bytes"] for s in summaries) > budget
    (held, peak, planned), = wide.sql("SELECT DISTINCT global_held_bytes, global_measured_peak_bytes, "
                                      "global_planned_peak_bytes FROM dbml_memory").fetchall()
    assert held == 0 and planned == 0                     # all done: nothing held or planned
    assert max(s["measured_peak_bytes"] for s in summaries) <= peak <= budget


def test_a_job_too_big_for_the_device_budget_fails_at_once_naming_the_budget_it_needs(wide):
    wide.execute("SET VARIABLE dbml_memory_budget = 100000")
    with pytest.raises(duckdb.Error, match=r"train\(\): memory_budget 0\.1 MB \(100000 bytes\) is below the smallest "
                                           r"budget .*; SET VARIABLE dbml_memory_budget = '[0-9.]+[KM]B' or more"):
        wide.sql(f"SELECT train('huge', {WIDE}, epochs := 1)").fetchall()
    assert wide.sql("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]
