"""Training jobs as worker threads: asynchronous jobs, concurrency, cancellation, failures.

No assertion here depends on timing. Where a test needs jobs to be mid-training at the
same moment, it says so through ``gate``, a hook on ``Job.step`` (the iteration boundary
where a job also checks for cancellation): it holds a job there until released, or makes
several jobs meet there (which they can only do if they run at once).
"""

import threading

import duckdb
import pytest

import dbml
from dbml.core.jobs import Job
from dbml.scheduler.latency import estimate
from dbml.scheduler.latency.estimate import Machine
from dbml.scheduler.multijob import registry
from dbml.scheduler.multijob.scheduler import MemoryScheduler
from dbml.scheduler.plan.planner import PAPER, PlanSettings

from helpers import job_of, linear, load, moons, wait_until

SRC = "SELECT x1, x2, label FROM moons"
GATE_TIMEOUT = 60   # seconds a held or meeting job waits before it fails (never hang)


class Gate:
    """Holds or gathers jobs (by model name) at their first iteration boundary."""

    def __init__(self):
        self._held: dict[str, tuple[threading.Event, threading.Event]] = {}   # arrived, released
        self._meet: dict[str, threading.Barrier] = {}

    def hold(self, model: str) -> None:
        self._held[model] = (threading.Event(), threading.Event())

    def meet(self, *models: str) -> None:
        barrier = threading.Barrier(len(models), timeout=GATE_TIMEOUT)
        self._meet.update(dict.fromkeys(models, barrier))

    def arrived(self, model: str) -> None:
        """Wait until the held job stands at its boundary: admitted, planned, one step done."""
        assert self._held[model][0].wait(GATE_TIMEOUT), f"job {model!r} never reached an iteration boundary"

    def release(self, model: str) -> None:
        self._held[model][1].set()

    def release_all(self) -> None:
        for _, released in self._held.values():
            released.set()
        for barrier in self._meet.values():
            barrier.abort()

    def boundary(self, model: str) -> None:   # on the job's thread, once per job
        if model in self._held:
            arrived, released = self._held[model]
            if not arrived.is_set():
                arrived.set()
                assert released.wait(GATE_TIMEOUT), f"job {model!r} was held and never released"
        barrier = self._meet.pop(model, None)
        if barrier is not None:
            barrier.wait()   # BrokenBarrierError (the job fails) unless the others come meanwhile


@pytest.fixture
def gate(monkeypatch):
    g = Gate()
    step = Job.step

    def gated_step(self, rows):
        step(self, rows)           # raises JobCancelled here if cancelled
        g.boundary(self.model)
    monkeypatch.setattr(Job, "step", gated_step)
    yield g
    g.release_all()


@pytest.fixture
def db(con):
    load(con, "moons", moons(960))   # 15 full batches of 64: one graph to capture
    load(con, "lin", linear(500))
    return con


def weights(con, name):
    return con.sql(f"SELECT weights FROM dbml_weights WHERE name = '{name}'").fetchall()[0][0]


def job_rows(con):
    return {r[0]: r for r in con.sql("SELECT job_id, model, status, started, finished, error, progress FROM dbml_jobs")
            .fetchall()}


def status(con, job_id):
    return job_rows(con)[job_id][2]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_async_job_returns_at_once_and_wait_job_gives_its_summary(db, gate):
    # "at once": train(wait := false) returns while its job is held at its first
    # iteration boundary, i.e. before the job could finish (no wall-clock bound).
    gate.hold("async")
    started = db.sql(f"SELECT train('async', '{SRC}', label := 'label', validation := 0, epochs := 3, wait := false)").fetchall()[0][0]
    assert started["status"] in ("queued", "running") and started["version"] is None
    gate.arrived("async")
    assert status(db, started["job_id"]) == "running"
    gate.release("async")
    done = db.sql(f"SELECT wait_job({started['job_id']})").fetchall()[0][0]
    assert done["status"] == "finished" and done["version"] == 1 and done["job_id"] == started["job_id"]
    row = job_rows(db)[started["job_id"]]
    assert row[2] == "finished" and row[6] == 1.0 and row[4] >= row[3]
    # the same job run synchronously gives the same weights
    db.sql(f"SELECT train('sync', '{SRC}', label := 'label', validation := 0, epochs := 3)").fetchall()
    assert weights(db, "async") == weights(db, "sync")
    epochs = db.sql("SELECT epoch, loss FROM dbml_epochs WHERE model = 'async' ORDER BY epoch").fetchall()
    assert [e for e, _ in epochs] == [1, 2, 3] and epochs[-1][1] < epochs[0][1]


@pytest.mark.slow   # six jobs: three at once, then each alone
def test_rows_of_one_statement_run_concurrently_and_match_running_alone(db, gate):
    # Concurrently: the three jobs meet at their first iteration boundary, which jobs
    # run one after another could not do (the first would fail at the barrier).
    gate.meet("c1", "c2", "c3")
    rows = db.sql(f"SELECT train(name, '{SRC}', label := 'label', validation := 0, epochs := 2, seed := seed) "
                  f"FROM (VALUES ('c1', 1), ('c2', 2), ('c3', 3)) v(name, seed)").fetchall()
    assert sorted(r[0]["model"] for r in rows) == ["c1", "c2", "c3"]
    for name, seed in (("c1", 1), ("c2", 2), ("c3", 3)):
        db.sql(f"SELECT train('alone_{name}', '{SRC}', label := 'label', validation := 0, epochs := 2, seed := {seed})").fetchall()
        assert weights(db, name) == weights(db, f"alone_{name}")


@pytest.mark.slow   # ~0.9 s: out of the -m 'not slow' inner loop (under a minute)
def test_jobs_from_two_connections_overlap(tmp_path, gate):
    # Overlap: both jobs meet at their first iteration boundary (see above).
    path = str(tmp_path / "two.duckdb")
    a, b = dbml.connect(path, latency_model="roofline"), dbml.connect(path, latency_model="roofline")
    load(a, "moons", moons(960))
    gate.meet("from_a", "from_b")
    ids = [c.sql(f"SELECT train('{n}', '{SRC}', label := 'label', validation := 0, epochs := 2, wait := false).job_id").fetchall()[0][0]
           for c, n in ((a, "from_a"), (b, "from_b"))]
    results = [a.sql(f"SELECT wait_job({i}).status").fetchall()[0][0] for i in ids]
    assert results == ["finished", "finished"]
    jobs = job_rows(b)                                # one job manager per database, whichever connection
    (s1, f1), (s2, f2) = [(jobs[i][3], jobs[i][4]) for i in ids]
    assert s1 < f2 and s2 < f1
    a.close(), b.close()


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_cancel_mid_training_stores_nothing_and_spares_the_others(db, gate):
    # Mid-training: the job is held after its first iteration when it is cancelled.
    gate.hold("doomed")
    doomed = db.sql(f"SELECT train('doomed', '{SRC}', label := 'label', validation := 0, epochs := 200, wait := false).job_id"
                    ).fetchall()[0][0]
    other = db.sql(f"SELECT train('survivor', '{SRC}', label := 'label', validation := 0, epochs := 3, wait := false).job_id"
                   ).fetchall()[0][0]
    gate.arrived("doomed")
    assert job_rows(db)[doomed][6] > 0
    assert db.sql(f"SELECT cancel_job({doomed})").fetchall()[0][0] == "running"
    gate.release("doomed")                            # it stops at its next boundary
    with pytest.raises(duckdb.Error, match=rf"job {doomed} \('doomed'\) was cancelled; nothing was stored"):
        db.sql(f"SELECT wait_job({doomed})").fetchall()
    assert db.sql(f"SELECT wait_job({other}).status").fetchall()[0][0] == "finished"
    assert status(db, doomed) == "cancelled"
    assert db.sql("SELECT name FROM dbml_models").fetchall() == [("survivor",)]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_a_failing_job_fails_alone(db):
    with pytest.raises(duckdb.Error, match=r"loss became (nan|inf)"):
        db.sql("SELECT train(name, src, label := lbl, lr := lr, optimizer := 'sgd', epochs := 3) FROM (VALUES "
               f"('ok', '{SRC}', 'label', 0.01), "
               "('boom', 'SELECT a, b, c, y FROM lin', 'y', 1e5)) v(name, src, lbl, lr)").fetchall()
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


@pytest.fixture
def slow_copies(monkeypatch):
    """Roofline figures fixed, with copies so slow (100 KB/s) that no swap can hide behind
    the ops: every plan is then the job's unscheduled peak, whatever this machine
    measures or however loaded it is. (With the measured figures two WIDE jobs need
    2.63 MB together; on a machine whose ops are slow against its copies, under 2.2 MB.)"""
    machine = Machine(peak_flops=5e10, memory_bandwidth=1e10, copy_bandwidth=1e5, op_overhead=5e-6)
    monkeypatch.setattr(estimate, "measure_machine", lambda device="cpu": machine)
    # ...under the paper's planner, which plans no swap that makes compute wait (dbml's
    # default would stall for the copies and fit both jobs): a fresh shared scheduler with it
    monkeypatch.setattr(registry.DEVICES, "schedulers", {})
    monkeypatch.setattr(registry, "MemoryScheduler", lambda budget, settings=None, **kw:
                        MemoryScheduler(budget, settings or PlanSettings(**PAPER), **kw))


@pytest.mark.slow
def test_jobs_that_do_not_fit_together_queue_and_run_later(wide, gate, slow_copies):
    # one such job needs its unscheduled peak, ~1.9 MB (slow_copies): two cannot share 2.5 MB
    budget = 2_500_000
    wide.execute(f"SET VARIABLE dbml_memory_budget = {budget}")
    gate.hold("first")
    first = wide.sql(f"SELECT train('first', {WIDE}, epochs := 3, wait := false).job_id").fetchall()[0][0]
    gate.arrived("first")                     # admitted and mid-training: it holds its share until it ends
    second = wide.sql(f"SELECT train('second', {WIDE}, epochs := 2, wait := false).job_id").fetchall()[0][0]

    def memory_once_second_asked():
        rows = {r[0]: r[1:] for r in wide.sql("SELECT job_id, status, waiting_jobs, budget_bytes "
                                              "FROM dbml_memory").fetchall()}
        return rows if second in rows else None
    # dbml_memory lists a job once the scheduler holds it: running (admitted) or queued (waiting)
    rows = wait_until(memory_once_second_asked, 60, "the second job to ask for memory")
    assert rows == {first: ("running", 1, budget), second: ("queued", 1, budget)}
    assert status(wide, second) == "queued" and status(wide, first) == "running"
    gate.release("first")                     # first ends and leaves: the second is admitted ...
    for job in (first, second):               # ... and runs: both finish
        assert wide.sql(f"SELECT wait_job({job}).status").fetchall()[0][0] == "finished"
    r = job_of(wide, wide.sql(f"SELECT wait_job({second})").fetchall()[0][0])
    assert r["measured_peak_bytes"] <= budget
    (peak,), = wide.sql("SELECT DISTINCT global_measured_peak_bytes FROM dbml_memory").fetchall()
    assert peak <= budget                     # never both at once on the device


@pytest.mark.slow   # three jobs of 256-wide MLPs
def test_three_jobs_below_the_sum_of_their_unscheduled_peaks_stay_within_the_budget(wide):
    # each needs ~2.0 MB unscheduled and ~1.3 MB scheduled: 4.5 MB holds all three only scheduled
    budget = 4_500_000
    wide.execute(f"SET VARIABLE dbml_memory_budget = {budget}")
    rows = wide.sql(f"SELECT train(name, {WIDE}, epochs := 3, seed := seed) "
                    f"FROM (VALUES ('w1', 1), ('w2', 2), ('w3', 3)) v(name, seed)").fetchall()
    summaries = [job_of(wide, r[0]) for r in rows]
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
