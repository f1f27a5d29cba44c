"""Jobs, trials and data-parallel training on a Ray cluster (issue 26).

One local Ray cluster for the whole session (``ray_cluster``: two CPUs, a 200 MB object
store, no dashboard), shut down at the end; the tests that use it are marked slow and
skip without Ray (``pip install 'dbml[ray]'``). What is checked: a job placed on a device
worker stores a model bit-identical to the same train() run locally, with its node and
device in dbml_jobs; the rows reach the worker in bounded chunks through the object store
or as Parquet files past the size setting; two data-parallel workers store the model one
worker trains with the global batch (within ``DP_TOLERANCE``), once; a 16-trial search
spreads over both workers; a worker killed mid-job (``ray.kill``, SIGKILL) fails the job
with an error naming the fix, or with ``max_retries`` resumes it from its last finished
epoch to the same model; cancel and interrupt reach remote jobs; nothing half-written.
Data-parallel jobs (issue 33, part 4) run on the pool's started workers: the next job reuses
the set and its process group, a member dead while idle is replaced as the set forms, a
member killed mid-job fails the job naming the fix or restarts the whole set from its
checkpoint, and a cancel stops every worker and keeps the set.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import duckdb
import pytest
import torch

import dbml
from dbml.core import catalog
from dbml.cluster import placement as dbml_cluster
from dbml.errors import InvalidArgument
from helpers import load, moons, wait_until

# one Ray cluster per test session: under pytest-xdist every test of it runs on one worker
pytestmark = pytest.mark.xdist_group("ray")

# Two workers of a data-parallel job sum their gradients in another order than one worker
# does: after 3 epochs of Adam (213 steps) the weights differed by 3e-7 at most; the bound
# leaves room for other machines' summation orders, and is far below any training change.
DP_TOLERANCE = 1e-5
ARGS = "label := 'label', features := ['x1', 'x2'], arch := 'mlp', hidden := [16, 8]"


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is an extra: pip install 'dbml[ray]'")
    pytest.importorskip("ray.train.torch")
    if not ray.is_initialized():
        # address="local": a cluster of the session's own, never one another process left
        # (/tmp/ray/ray_current_cluster names the last one started on the machine, even a dead one)
        ray.init(address="local", num_cpus=2, object_store_memory=200 * 1024**2, include_dashboard=False)
    yield ray
    dbml_cluster.disconnect()
    ray.shutdown()


@pytest.fixture
def rc(ray_cluster):
    """A fresh dbml connection whose jobs run on the session's cluster, with table ``moons``."""
    c = dbml.connect(latency_model="roofline", progress="off", cluster="ray")
    load(c, "moons", moons(3000))
    yield c
    c.close()


def weights(con, name: str, version: int | None = None) -> dict:
    cur = con.duckdb.cursor()
    v = version or catalog.latest_version(cur, name, fn="test")
    return catalog.load(cur, name, v).module.state_dict()


def cluster_figures(con, name: str) -> dict:
    row = con.execute("SELECT metrics FROM dbml_models WHERE name = ? ORDER BY version DESC LIMIT 1", [name]).fetchall()
    return json.loads(row[0][0])["cluster"]


def train(con, name: str, extra: str = "") -> dict:
    return con.execute(f"SELECT train('{name}', 'moons', {ARGS}{extra})").fetchall()[0][0]


def catalog_whole(con) -> None:
    """Every model row has its weights and every weights row its model: nothing half-written."""
    models = set(con.execute("SELECT name, version FROM dbml.models").fetchall())
    stored = set(con.execute("SELECT name, version FROM dbml.weights").fetchall())
    assert models == stored


def start_job(con, name: str, extra: str = "") -> int:
    return con.execute(f"SELECT train('{name}', 'moons', {ARGS}{extra}, wait := false)").fetchall()[0][0]["job_id"]


def job_row(con, job_id: int) -> dict:
    cols = ["status", "epoch", "node", "device", "queued_for", "error"]
    row = con.execute(f"SELECT {', '.join(cols)} FROM dbml_jobs WHERE job_id = ?", [job_id]).fetchall()[0]
    return dict(zip(cols, row))


# -- the setting, without a cluster ---------------------------------------------------------

@pytest.mark.slow   # ~0.9 s: out of the -m 'not slow' inner loop (under a minute)
def test_cluster_setting_refuses_what_it_cannot_use(con):
    load(con, "moons", moons(200))
    with pytest.raises(duckdb.Error, match=r"setting cluster is 'yarn'; SET VARIABLE dbml_cluster = 'local', 'ray'"):
        con.execute("SET VARIABLE dbml_cluster = 'yarn'; SELECT train('m', 'moons', label := 'label')")
    con.execute("SET VARIABLE dbml_cluster = 'local'")
    with pytest.raises(duckdb.Error, match=r"workers := 2 trains on a Ray cluster; SET VARIABLE dbml_cluster = 'ray'"):
        con.execute("SELECT train('m', 'moons', label := 'label', workers := 2)")
    with pytest.raises(InvalidArgument, match=r"^dbml.connect\(\): cannot reach the Ray cluster at ray://127.0.0.1:1 "
                                              r"\(.*\); start one with `ray start --head`"):
        dbml.connect(cluster="ray://127.0.0.1:1")
    assert con.execute("SELECT count(*) FROM dbml.models").fetchall() == [(0,)]


def test_cluster_without_ray_names_the_extra(con, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "ray", None)   # import ray raises ImportError
    load(con, "moons", moons(200))
    con.execute("SET VARIABLE dbml_cluster = 'ray'")
    with pytest.raises(duckdb.Error, match=r"setting cluster needs Ray, which is not installed; "
                                           r"pip install 'dbml\[ray\]'"):
        con.execute("SELECT train('m', 'moons', label := 'label')")
    assert con.execute("SELECT count(*) FROM dbml.models").fetchall() == [(0,)]


# -- placement and the data path --------------------------------------------------------------

@pytest.mark.slow
def test_a_placed_job_stores_the_model_a_local_job_stores(rc):
    rc.execute("SET VARIABLE dbml_cluster = 'local'")
    train(rc, "here", ", epochs := 3")
    rc.execute("SET VARIABLE dbml_cluster = 'ray'")
    for _ in range(2):   # the second finds its device worker warm
        out = train(rc, "there", ", epochs := 3")
    assert out["status"] == "finished" and out["version"] == 2
    local, remote = weights(rc, "here"), weights(rc, "there")
    assert all(torch.equal(local[k], remote[k]) for k in local)
    figures = cluster_figures(rc, "there")
    assert figures["workers"] == 1 and figures["node"] and figures["device"].startswith("cpu")
    assert figures["received"]["rows"] == figures["data"]["rows"] == 3000
    assert figures["dispatch_seconds"] < 2.0   # warm: one actor call (goal 0.5 s; measured ~0.07 s)
    job = job_row(rc, out["job_id"])
    assert job["status"] == "finished" and job["node"] == figures["node"] and job["device"] == figures["device"]
    catalog_whole(rc)


@pytest.mark.slow
def test_rows_go_in_bounded_chunks_or_as_parquet_past_the_size(rc, monkeypatch, tmp_path):
    from dbml.cluster import shipping
    monkeypatch.setattr(shipping, "CHUNK_BYTES", 4096)   # ~250 rows a chunk: 13 chunks
    monkeypatch.setattr(shipping, "WINDOW", 2)
    train(rc, "chunked", ", epochs := 2")
    chunked = cluster_figures(rc, "chunked")
    assert chunked["data"]["how"] == "object store" and chunked["data"]["chunks"] >= 10
    assert 1 <= chunked["data"]["most_in_flight"] <= 2   # never more than the window in the object store
    rc.execute(f"SET VARIABLE dbml_cluster_storage = '{tmp_path}'")
    rc.execute("SET VARIABLE dbml_cluster_parquet_bytes = '10KB'")
    train(rc, "parquet", ", epochs := 2")
    assert cluster_figures(rc, "parquet")["data"]["how"] == "parquet"
    assert not list(tmp_path.iterdir())   # the job's files are gone with it
    rc.execute("SET VARIABLE dbml_cluster = 'local'")
    train(rc, "here", ", epochs := 2")
    a, b, c = weights(rc, "here"), weights(rc, "chunked"), weights(rc, "parquet")
    assert all(torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]) for k in a)


# -- trials ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_16_trial_search_spreads_over_both_workers_and_records_every_trial(rc):
    space = {"lr": {"log_uniform": [1e-3, 0.1]}, "hidden": {"choice": [[8], [16, 8]]},
             "batch_size": {"choice": [32, 64]}}
    rows = rc.execute("SELECT trial, status FROM tune('tuned', 'moons', label := 'label', features := ['x1', 'x2'], "
                      "arch := 'mlp', epochs := 3, space := ?, trials := 16)", [json.dumps(space)]).fetchall()
    assert len(rows) == 16 and {s for _, s in rows} <= {"finished", "pruned"}
    assert rc.execute("SELECT count(*) FROM dbml_trials WHERE model = 'tuned'").fetchall() == [(16,)]
    devices = rc.execute("SELECT count(DISTINCT device) FROM dbml_jobs WHERE model = 'tuned'").fetchall()[0][0]
    assert devices == 2   # both CPU slots of the cluster
    assert rc.execute("SELECT count(*) FROM dbml.models WHERE name = 'tuned'").fetchall() == [(1,)]   # the best
    catalog_whole(rc)


# -- faults -----------------------------------------------------------------------------------------

def _slot(job_id: int):
    c = dbml_cluster.current()
    return wait_until(lambda: c.slot_of(f"{c.session}:{job_id}"), 30, "the job's device worker")


@pytest.mark.slow
def test_a_worker_killed_mid_job_fails_it_naming_the_fix_and_stores_nothing(rc, ray_cluster):
    job_id = start_job(rc, "killed", ", epochs := 200, early_stop := false")
    wait_until(lambda: job_row(rc, job_id)["epoch"] >= 1, 60, "the job's first epoch")
    ray_cluster.kill(_slot(job_id).actor)
    with pytest.raises(duckdb.Error, match=rf"job {job_id} \('killed'\) lost its Ray worker on [\d.]+ \(cpu \(worker "
                                           r"\d+\)\) \(\w+: .*\); nothing was stored; SET VARIABLE dbml_max_retries "
                                           r"= 1 \(or more\) to restart a job from its last finished epoch"):
        rc.execute("SELECT wait_job(?)", [job_id]).fetchall()
    assert job_row(rc, job_id)["status"] == "failed"
    assert rc.execute("SELECT count(*) FROM dbml.models WHERE name = 'killed'").fetchall() == [(0,)]
    catalog_whole(rc)


@pytest.mark.slow
def test_a_worker_killed_mid_job_with_retries_resumes_to_the_same_model(rc):
    # early stopping on (patience 5: no stop before epoch 6, so the kill at epoch 3 lands on a
    # running job): the resumed job also stops where, and keeps the epoch, the uninterrupted one does
    extra = ", epochs := 12, batch_size := 16, early_stop := true"
    rc.execute("SET VARIABLE dbml_max_retries = 1")
    job_id = start_job(rc, "resumed", extra)
    wait_until(lambda: job_row(rc, job_id)["epoch"] >= 3, 60, "the job's third epoch")
    os.kill(_slot(job_id).pid, signal.SIGKILL)
    out = rc.execute("SELECT wait_job(?)", [job_id]).fetchall()[0][0]
    assert out["status"] == "finished"
    figures = cluster_figures(rc, "resumed")
    assert figures["retries"] == 1 and 2 <= figures["resumed_from_epoch"]
    rc.execute("SET VARIABLE dbml_cluster = 'local'")
    train(rc, "uninterrupted", extra)
    a, b = weights(rc, "uninterrupted"), weights(rc, "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)   # resumed exactly where it stopped
    resumed, uninterrupted = (json.loads(rc.execute(f"SELECT metrics FROM dbml_models WHERE name = '{name}'")
                                         .fetchall()[0][0]) for name in ("resumed", "uninterrupted"))
    assert [e["epoch"] for e in resumed["history"]] == list(range(1, len(uninterrupted["history"]) + 1))
    assert resumed["best_epoch"] == uninterrupted["best_epoch"] and figures["resumed_from_epoch"] < len(resumed["history"])
    catalog_whole(rc)


@pytest.mark.slow
def test_cancel_and_interrupt_reach_a_remote_job(rc):
    job_id = start_job(rc, "cancelled", ", epochs := 500, early_stop := false")
    wait_until(lambda: job_row(rc, job_id)["epoch"] >= 1, 60, "the job's first epoch")
    rc.execute("SELECT cancel_job(?)", [job_id]).fetchall()
    wait_until(lambda: job_row(rc, job_id)["status"] == "cancelled", 15, "the remote job to stop")
    c = dbml_cluster.current()
    assert c.slot_of(f"{c.session}:{job_id}") is None   # its device worker is free
    watcher = rc.cursor()

    def interrupt_when_running():
        wait_until(lambda: watcher.execute("SELECT count(*) FROM dbml_jobs WHERE model = 'interrupted' "
                                           "AND epoch >= 1").fetchall()[0][0], 60, "the job's first epoch")
        rc.interrupt()
    threading.Thread(target=interrupt_when_running, daemon=True).start()
    started = time.perf_counter()
    # dbml's message, or DuckDB's own when it sees its interrupt flag first as the UDF returns
    # (as tests/test_interrupts.py): the job's row below says what became of it either way
    with pytest.raises(duckdb.Error, match=r"Interrupted: train\(\) was interrupted: job \d+ \('interrupted'\) was "
                                           r"cancelled; nothing was stored|INTERRUPT Error: Interrupted!"):
        rc.execute(f"SELECT train('interrupted', 'moons', {ARGS}, epochs := 500, early_stop := false)").fetchall()
    assert time.perf_counter() - started < 60
    assert rc.execute("SELECT status, error FROM dbml_jobs WHERE model = 'interrupted'").fetchall() == [
        ("cancelled", f"job {job_id + 1} ('interrupted') was cancelled: the statement was interrupted; nothing was stored")]
    assert rc.execute("SELECT count(*) FROM dbml.models WHERE name IN ('cancelled', 'interrupted')").fetchall() == [(0,)]
    catalog_whole(rc)


# -- data-parallel ------------------------------------------------------------------------------

@pytest.mark.slow
def test_two_data_parallel_workers_store_the_one_worker_model(rc, ray_cluster):
    extra = ", epochs := 3, batch_size := 65"   # 65: the global batch splits 32/33
    rc.execute("SET VARIABLE dbml_cluster = 'local'")
    one = train(rc, "one", extra)
    rc.execute("SET VARIABLE dbml_cluster = 'ray'")
    two = train(rc, "two", extra + ", workers := 2")
    assert two["status"] == "finished" and two["version"] == 1
    a, b = weights(rc, "one"), weights(rc, "two")
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= DP_TOLERANCE
    assert abs(one["final_loss"] - two["final_loss"]) <= 1e-4 * abs(one["final_loss"])
    assert rc.execute("SELECT count(*) FROM dbml.models WHERE name = 'two'").fetchall() == [(1,)]
    assert cluster_figures(rc, "two")["workers"] == 2
    # each worker's step is the scheduled one (core/dataparallel.py), within its budget
    memory = rc.execute("SELECT planned_peak_bytes, measured_peak_bytes, budget_bytes FROM dbml_jobs "
                        "WHERE job_id = ?", [two["job_id"]]).fetchall()[0]
    assert memory[0] is not None and memory[1] <= memory[2]
    # issue 33, part 4: the next data-parallel job runs on the same started workers, in the
    # process group the first formed (no new processes, no new rendezvous), to the same model
    c = dbml_cluster.current()
    pids = sorted(s.pid for s in c.slots())
    again = train(rc, "again", extra + ", workers := 2")
    assert again["status"] == "finished"
    assert cluster_figures(rc, "again")["group"]["reused"] and sorted(s.pid for s in c.slots()) == pids
    b2 = weights(rc, "again")
    assert all(torch.equal(b[k], b2[k]) for k in b)
    assert set(cluster_figures(rc, "again")["first_step_seconds"]) == {"0", "1"}   # both workers stepped
    # a member that died while the set was idle: found as the set forms, before the job runs
    # there; the job takes another set (no retry spent: max_retries is 0) and forms its group anew
    rc.execute("SET VARIABLE dbml_max_retries = 0")
    ray_cluster.kill(c.slots()[1].actor)
    after = train(rc, "after_death", extra + ", workers := 2")
    assert after["status"] == "finished"
    figures = cluster_figures(rc, "after_death")
    assert not figures["group"]["reused"] and figures["retries"] == 0
    assert max((a[k] - weights(rc, "after_death")[k]).abs().max().item() for k in a) <= DP_TOLERANCE
    catalog_whole(rc)


@pytest.mark.slow
def test_a_budgeted_data_parallel_jobs_real_memory_stays_within_its_budget(rc):
    """Issue 33, goal 1: a ``workers := 2`` job under ``memory_budget``, its real peak (the
    worker's RSS above its start) within the budget, job after job on the same set. Its
    workers run with one malloc arena (``placement.WORKER_ENV``): with an arena per thread
    (the step's and the copy thread's) the tensors they freed stayed resident beside the
    plan, 20-35 MB over this 67 MB budget in half the jobs (benchmarks/results/
    2026-11-28-vm-2c-issue33-realmem.md)."""
    budget = 67_253_091   # 0.8 x this job's unscheduled peak (benchmarks/dp_real_memory.py)
    sql = ("SELECT train(?, 'moons', label := 'label', features := ['x1', 'x2'], arch := 'mlp', "
           "hidden := [2048, 2048], epochs := 1, batch_size := 512, workers := 2, memory_budget := ?)")
    # a worker's first job pays its process's one-off costs (the compiler stack imported, the
    # process group's buffers: ~60 MB, dp_real_memory's "unscheduled" row); the goal is the jobs after
    assert rc.execute(sql, ["dp_real_0", budget]).fetchall()[0][0]["status"] == "finished"
    for name in ("dp_real_1", "dp_real_2", "dp_real_3"):
        job = rc.execute(sql, [name, budget]).fetchall()[0][0]
        assert job["status"] == "finished"
        real, measured = rc.execute("SELECT real_peak_bytes, measured_peak_bytes FROM dbml_jobs WHERE job_id = ?",
                                    [job["job_id"]]).fetchall()[0]
        assert measured <= budget and real <= budget, (name, real, measured, budget)
    for slot in dbml_cluster.current().slots():
        with open(f"/proc/{slot.pid}/environ", "rb") as f:
            assert b"MALLOC_ARENA_MAX=1" in f.read().split(b"\0")


def _set_of(job_id: int, n: int = 2) -> list:
    """The device workers running data-parallel job ``job_id``, once all ``n`` are placed."""
    c = dbml_cluster.current()
    key = f"{c.session}:{job_id}"
    return wait_until(lambda: [s for s in c.slots() if key in s.jobs and s.ready][:n] if sum(
        key in s.jobs and s.ready for s in c.slots()) == n else None, 60, "the job's worker set")


@pytest.mark.slow
def test_a_data_parallel_worker_killed_mid_job_restarts_the_set_or_fails_naming_the_fix(rc):
    extra = ", epochs := 12, batch_size := 32, early_stop := false, workers := 2"
    job_id = start_job(rc, "dp_killed", extra)   # retries off: the job fails, nothing stored
    wait_until(lambda: job_row(rc, job_id)["epoch"] >= 1, 60, "the job's first epoch")
    os.kill(_set_of(job_id)[1].pid, signal.SIGKILL)
    with pytest.raises(duckdb.Error, match=rf"job {job_id} \('dp_killed'\) lost its Ray worker on [\d.]+ .*; nothing "
                                           r"was stored; SET VARIABLE dbml_max_retries = 1 \(or more\)"):
        rc.execute("SELECT wait_job(?)", [job_id]).fetchall()
    assert rc.execute("SELECT count(*) FROM dbml.models WHERE name = 'dp_killed'").fetchall() == [(0,)]
    rc.execute("SET VARIABLE dbml_max_retries = 1")   # retries on: the whole set restarts from the checkpoint
    job_id = start_job(rc, "dp_resumed", extra)
    wait_until(lambda: job_row(rc, job_id)["epoch"] >= 2, 60, "the job's second epoch")
    os.kill(_set_of(job_id)[0].pid, signal.SIGKILL)
    assert rc.execute("SELECT wait_job(?)", [job_id]).fetchall()[0][0]["status"] == "finished"
    figures = cluster_figures(rc, "dp_resumed")
    assert figures["retries"] == 1 and figures["resumed_from_epoch"] >= 1 and not figures["group"]["reused"]
    train(rc, "dp_uninterrupted", extra)
    a, b = weights(rc, "dp_uninterrupted"), weights(rc, "dp_resumed")
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= DP_TOLERANCE
    catalog_whole(rc)


@pytest.mark.slow
def test_cancel_reaches_every_data_parallel_worker_and_keeps_the_set(rc):
    job_id = start_job(rc, "dp_cancelled", ", epochs := 500, early_stop := false, workers := 2")
    wait_until(lambda: job_row(rc, job_id)["epoch"] >= 1, 60, "the job's first epoch")
    members = _set_of(job_id)
    rc.execute("SELECT cancel_job(?)", [job_id]).fetchall()
    wait_until(lambda: job_row(rc, job_id)["status"] == "cancelled", 15, "the data-parallel job to stop")
    assert all(not s.jobs for s in members)   # both workers free
    assert rc.execute("SELECT count(*) FROM dbml.models WHERE name = 'dp_cancelled'").fetchall() == [(0,)]
    # a cancel is the job's outcome, not a failure: the set and its process group serve the next job
    train(rc, "dp_after", ", epochs := 1, workers := 2")
    assert cluster_figures(rc, "dp_after")["group"]["reused"]
    catalog_whole(rc)


class CountingHandle:
    """A Hub actor's handle that counts the calls made through it, by method."""

    def __init__(self, handle):
        self.handle, self.calls, self._actor_id = handle, {}, handle._actor_id

    def __getattr__(self, name):
        method = getattr(self.handle, name)
        calls = self.calls

        class Counted:
            @staticmethod
            def remote(*args):
                calls[name] = calls.get(name, 0) + 1
                return method.remote(*args)
        return Counted


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_the_hub_is_called_per_worker_process_and_per_driver_not_per_job(ray_cluster):
    """Issue 33, part 2: eight jobs on one worker process report in one call per interval, and
    the driver takes all their updates in one poll per interval; none is lost."""
    from dbml.cluster import worker
    ray = ray_cluster
    from dbml.cluster.hub import Hub
    actor = ray.remote(num_cpus=0, max_concurrency=dbml_cluster.WORKER_CONCURRENCY)(Hub).remote()
    hub = CountingHandle(actor)
    jobs = 8
    reporter = worker.Reporter()
    progresses = [worker.RemoteProgress(worker.Task(f"s:{j}", j, None, None, 0, 0, None, hub), 0, "node", "cpu",
                                        reporter=reporter) for j in range(jobs)]
    poller = dbml_cluster.Poller(ray, hub)
    for p in progresses:
        poller.watch(p.task.key)
        p.start()
    seconds, steps = 2.0, 20
    for s in range(steps):
        for p in progresses:
            p.step(s + 1)
        time.sleep(seconds / steps)
    for p in progresses:
        p.close()   # its last report, directly
    taken = {p.task.key: poller.take(p.task.key) + poller.drain(p.task.key) for p in progresses}
    for key, updates in taken.items():   # every step of every job reached the driver, in order
        assert [r for u in updates for r in u.get("steps", ())] == list(range(1, steps + 1)), key
    calls = hub.calls
    intervals = seconds / worker.REPORT_S
    assert calls.get("report_many", 0) <= 2 * intervals + 2, calls   # one per interval, whatever the jobs
    assert calls.get("poll_all", 0) <= 2 * seconds / dbml_cluster.POLL_S + 2, calls
    assert calls.get("report", 0) == jobs and calls.get("poll", 0) == jobs, calls   # the closing ones only
    ray.kill(actor)
