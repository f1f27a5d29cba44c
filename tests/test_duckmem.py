"""One budget with DuckDB (issue 29, part 5): on the CPU a job's default budget is a share
of its database's memory_limit, and while jobs hold memory DuckDB's limit is lowered by
what they hold and restored after (``dbml.core.duckmem``).

A fresh connection per test, real DuckDB. Where a test needs a job mid-training, ``held``
holds it at its first iteration boundary (after its runner was made, so its budget is
held) until the test lets it go: no assertion depends on timing.
"""

import os
import subprocess
import sys
import textwrap
import threading

import duckdb
import pytest

import dbml
from dbml.core import duckmem
from dbml.core.duckmem import MIN_DUCKDB_BYTES, shown
from dbml.core.jobs import Job
from dbml.core.settings import CPU_LIMIT_SHARE

from helpers import job_of, load, moons, wait_until

SRC = "SELECT x1, x2, label FROM moons"
HOLD_TIMEOUT = 60


def limit(con) -> str:
    return con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]


def as_duckdb_shows(n: int) -> str:
    """``n`` bytes as DuckDB shows a memory_limit of that many (asked of a database of its own)."""
    with duckdb.connect() as c:
        c.execute("SET memory_limit = ?", [f"{n}B"])
        return limit(c)


def train(con, model: str, *args: str) -> dict:
    extra = "".join(f", {a}" for a in args)
    return job_of(con, con.sql(f"SELECT train('{model}', '{SRC}', label := 'label', validation := 0, epochs := 1{extra})"
                               ).fetchall()[0][0])


def start(con, model: str, *args: str) -> int:
    extra = "".join(f", {a}" for a in args)
    return con.sql(f"SELECT train('{model}', '{SRC}', label := 'label', validation := 0, wait := false{extra})"
                   ".job_id").fetchall()[0][0]


def wait_job(con, job_id: int) -> dict:
    return con.sql(f"SELECT wait_job({job_id})").fetchall()[0][0]


class Held:
    """Holds jobs (by model name) at their first iteration boundary until let go; each job
    that arrives there reads memory_limit through its own cursor's database first."""

    def __init__(self):
        self.arrived: dict[str, threading.Event] = {}
        self.go: dict[str, threading.Event] = {}
        self.seen: dict[str, str] = {}

    def hold(self, *models: str) -> None:
        for m in models:
            self.arrived[m], self.go[m] = threading.Event(), threading.Event()

    def wait_arrived(self, model: str) -> None:
        assert self.arrived[model].wait(HOLD_TIMEOUT), f"job {model!r} never reached an iteration boundary"

    def boundary(self, job: Job) -> None:
        arrived = self.arrived.get(job.model)
        if arrived is not None and not arrived.is_set():
            self.seen[job.model] = limit(job._memory._cursor())
            arrived.set()
            assert self.go[job.model].wait(HOLD_TIMEOUT), f"job {job.model!r} was held and never let go"

    def release_all(self) -> None:
        for go in self.go.values():
            go.set()


@pytest.fixture
def held(monkeypatch):
    h = Held()
    step = Job.step

    def held_step(self, rows):
        step(self, rows)   # raises JobCancelled here if cancelled
        h.boundary(self)
    monkeypatch.setattr(Job, "step", held_step)
    yield h
    h.release_all()


@pytest.fixture
def db(con):
    load(con, "moons", moons(640))
    con.execute("SET memory_limit = '1GB'")
    return con


ONE_GB = shown("953.6 MiB").bytes   # '1GB' as DuckDB shows it: the user's limit, in bytes


# -- DuckDB's text -----------------------------------------------------------------------

@pytest.mark.parametrize("n", [10**6, 999_999_999, 10**9, 1_850_000_000, 2**31 - 1, 4 * 2**30, 20_186_155_827])
def test_the_fewest_bytes_of_a_limit_show_as_the_same_text_and_no_more_than_it_stood_for(n):
    text = as_duckdb_shows(n)
    least = shown(text)
    assert least.bytes <= n
    assert as_duckdb_shows(least.bytes) == text
    assert as_duckdb_shows(least.bytes - 1) != text


def test_bytes_show_as_bytes():
    assert shown("1 byte").bytes == 1 and shown("512 bytes").bytes == 512
    with pytest.raises(ValueError, match="not in DuckDB's form"):
        shown("1GB")


# -- the default budget ------------------------------------------------------------------

@pytest.mark.slow   # ~1-2 s: trains twice, or several jobs at once
def test_the_cpu_default_budget_is_half_of_memory_limit_and_follows_set(db):
    assert CPU_LIMIT_SHARE == 0.5
    assert train(db, "a")["budget_bytes"] == ONE_GB // 2
    db.execute("SET memory_limit = '3GB'")
    assert train(db, "b")["budget_bytes"] == shown(limit(db)).bytes // 2 == shown("2.7 GiB").bytes // 2
    db.execute("SET memory_limit = '200MB'")   # half would leave DuckDB less than its floor
    assert train(db, "c")["budget_bytes"] == shown("190.7 MiB").bytes - MIN_DUCKDB_BYTES


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_an_explicit_budget_wins_over_the_share(db):
    assert train(db, "own", "memory_budget := '64MB'")["budget_bytes"] == 64 * 10**6
    db.execute("SET VARIABLE dbml_memory_budget = '96MB'")
    assert train(db, "device")["budget_bytes"] == 96 * 10**6


# -- lowered while jobs hold memory, restored after ---------------------------------------

def test_a_running_job_lowers_memory_limit_by_its_budget_and_finishing_restores_it(db, held):
    held.hold("m")
    job = start(db, "m", "memory_budget := '100MB'", "epochs := 2")
    held.wait_arrived("m")
    lowered = as_duckdb_shows(ONE_GB - 100 * 10**6)
    assert held.seen["m"] == lowered == limit(db)
    assert limit(db.cursor()) == lowered   # the whole database's: every cursor sees it
    held.release_all()
    assert wait_job(db, job)["status"] == "finished"
    assert limit(db) == "953.6 MiB"


def test_a_failing_job_restores_memory_limit(db, monkeypatch):
    from dbml.core import training
    seen = []

    def fail(cur, *args, **kwargs):
        seen.append(limit(cur))
        raise RuntimeError("boom")
    monkeypatch.setattr(training, "_run_epochs", fail)
    with pytest.raises(duckdb.Error, match="boom"):
        train(db, "f")
    assert seen == [as_duckdb_shows(ONE_GB - ONE_GB // 2)]
    assert limit(db) == "953.6 MiB"


def test_a_cancelled_job_restores_memory_limit(db, held):
    held.hold("c")
    job = start(db, "c", "epochs := 50")
    held.wait_arrived("c")
    assert limit(db) == as_duckdb_shows(ONE_GB - ONE_GB // 2)
    db.sql(f"SELECT cancel_job({job})").fetchall()
    held.release_all()
    with pytest.raises(duckdb.Error, match=r"job \d+ \('c'\) was cancelled; nothing was stored"):
        wait_job(db, job)
    assert limit(db) == "953.6 MiB"


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_the_default_limit_is_restored_byte_for_byte_by_reset(con, held):
    load(con, "moons", moons(640))
    default = duckmem.default_limit()
    assert limit(con) == default
    held.hold("d")
    job = start(con, "d")
    held.wait_arrived("d")
    assert limit(con) != default
    held.release_all()
    wait_job(con, job)
    assert limit(con) == default


@pytest.mark.slow   # ~1-2 s: trains twice, or several jobs at once
def test_a_users_set_during_a_job_is_the_limit_after_it(db, held):
    held.hold("m")
    job = start(db, "m", "memory_budget := '100MB'")
    held.wait_arrived("m")
    db.execute("SET memory_limit = '2GB'")   # the user's, while the job holds 100 MB: in force as set
    assert limit(db) == "1.8 GiB"
    held.release_all()
    wait_job(db, job)
    assert limit(db) == "1.8 GiB"            # and the user's limit after the job
    # the next job takes its share of the user's new limit
    assert train(db, "next")["budget_bytes"] == shown("1.8 GiB").bytes // 2


@pytest.mark.slow   # ~1-2 s: trains twice, or several jobs at once
def test_a_set_during_a_job_is_lowered_from_at_the_next_jobs_hold(db, held):
    held.hold("a", "b")
    first = start(db, "a", "memory_budget := '100MB'")
    held.wait_arrived("a")
    db.execute("SET memory_limit = '2GB'")
    second = start(db, "b", "memory_budget := '200MB'")
    held.wait_arrived("b")
    assert held.seen["b"] == as_duckdb_shows(shown("1.8 GiB").bytes - 300 * 10**6)
    held.release_all()
    for job in (first, second):
        wait_job(db, job)
    assert limit(db) == "1.8 GiB"


@pytest.mark.slow   # ~1-2 s: trains twice, or several jobs at once
def test_jobs_sharing_the_scheduler_hold_its_budget_once_and_own_budgets_add(db, held):
    held.hold("s1", "s2", "own")
    jobs = [start(db, "s1"), start(db, "s2")]
    held.wait_arrived("s1")
    held.wait_arrived("s2")
    assert limit(db) == as_duckdb_shows(ONE_GB - ONE_GB // 2)   # one shared budget, not two
    jobs.append(start(db, "own", "memory_budget := '100MB'"))
    held.wait_arrived("own")
    assert limit(db) == as_duckdb_shows(ONE_GB - ONE_GB // 2 - 100 * 10**6)
    held.go["s1"].set()
    wait_job(db, jobs[0])
    assert limit(db) == as_duckdb_shows(ONE_GB - ONE_GB // 2 - 100 * 10**6)   # s2 still holds the pool
    held.release_all()
    for job in jobs[1:]:
        wait_job(db, job)
    assert limit(db) == "953.6 MiB"


def test_a_budget_that_would_leave_duckdb_too_little_is_refused_naming_the_fix(db):
    with pytest.raises(duckdb.Error, match=r"train\(\): a memory budget of 900\.0 MB would leave DuckDB's "
                                           r"memory_limit \(953\.6 MiB\) less than the 128 MiB its queries need "
                                           r"\(the job's own data among them\); SET memory_limit higher, or pass a "
                                           r"smaller memory_budget := \(or SET VARIABLE dbml_memory_budget\)"):
        train(db, "big", "memory_budget := '900MB'")
    assert limit(db) == "953.6 MiB"
    assert MIN_DUCKDB_BYTES == 128 * 2**20


@pytest.mark.slow   # ~1-2 s: trains twice, or several jobs at once
def test_a_job_waits_while_duckdb_cannot_give_the_memory_back(con):
    """An in-memory database with no temp_directory cannot evict its tables: a job whose
    budget needs memory they hold waits (queued, the limit unchanged) until it is freed."""
    con.execute("SET temp_directory = ''")
    load(con, "moons", moons(640))
    con.execute("SET memory_limit = '400MB'")   # the job's default budget 200 MB: DuckDB would keep 181 MB
    con.execute("CREATE TABLE ballast AS SELECT range AS i, random() AS r FROM range(15000000)")   # ~240 MB
    job = start(con, "w", "epochs := 1")
    wait_until(lambda: con.sql(f"SELECT status FROM dbml_jobs WHERE job_id = {job}").fetchall()[0][0] == "queued",
               timeout=60, what="the job queued for memory")
    assert limit(con) == "381.4 MiB"
    con.execute("DROP TABLE ballast")
    assert wait_job(con, job)["status"] == "finished"
    assert limit(con) == "381.4 MiB"


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_a_job_waiting_for_duckdbs_memory_can_be_cancelled(con):
    con.execute("SET temp_directory = ''")
    load(con, "moons", moons(640))
    con.execute("SET memory_limit = '400MB'")
    con.execute("CREATE TABLE ballast AS SELECT range AS i, random() AS r FROM range(15000000)")
    job = start(con, "w", "epochs := 1")
    wait_until(lambda: con.sql(f"SELECT status FROM dbml_jobs WHERE job_id = {job}").fetchall()[0][0] == "queued",
               timeout=60, what="the job queued for memory")
    con.sql(f"SELECT cancel_job({job})").fetchall()
    with pytest.raises(duckdb.Error, match=r"job \d+ \('w'\) was cancelled"):
        wait_job(con, job)
    assert limit(con) == "381.4 MiB"


def test_a_locked_configuration_is_left_as_it_is(db):
    db.execute("SET lock_configuration = true")
    assert train(db, "m", "memory_budget := '100MB'")["status"] == "finished"   # trains, lowering nothing
    assert limit(db) == "953.6 MiB"


# -- which database ----------------------------------------------------------------------

@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_only_the_jobs_own_database_is_lowered(db, held):
    other = dbml.connect(latency_model="roofline")   # another in-memory database in this process
    other.execute("SET memory_limit = '2GB'")
    held.hold("m")
    job = start(db, "m", "memory_budget := '100MB'")
    held.wait_arrived("m")
    assert limit(db) == as_duckdb_shows(ONE_GB - 100 * 10**6)
    assert limit(other) == "1.8 GiB"
    held.release_all()
    wait_job(db, job)
    other.close()


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_every_connection_to_a_database_file_sees_its_jobs_lowered_limit(tmp_path, held):
    path = str(tmp_path / "f.duckdb")
    con = dbml.connect(path, latency_model="roofline")
    plain = duckdb.connect(path)   # the user's own, without dbml
    load(con, "moons", moons(640))
    con.execute("SET memory_limit = '1GB'")
    held.hold("m")
    job = start(con, "m", "memory_budget := '100MB'")
    held.wait_arrived("m")
    assert limit(plain) == limit(con) == as_duckdb_shows(ONE_GB - 100 * 10**6)
    held.release_all()
    wait_job(con, job)
    assert limit(plain) == "953.6 MiB"
    plain.close()
    con.close()


# -- a query and a job together, in real memory --------------------------------------------

# What the process may hold beyond memory_limit while a query and a job run together: the
# process before any job or query (Python, torch and DuckDB loaded: 376 MB measured) and
# what a job's real memory holds beyond the tracked tensors its budget limits (the ~300 MB
# the wide MLP below adds beyond its 500 MB budget: capture, graph, allocator; issue 29
# parts 1 and 4 cut it). Measured with the script below on a 2-core VM at load 3.4-4.1:
# 476-508 MB over the limit in five runs (the lowering removed, DuckDB keeping its whole
# limit: 973-1,051 MB in three).
RUNTIME_OVERHEAD_BYTES = 700 * 10**6

TOGETHER = textwrap.dedent("""
    import os, sys, threading, time
    import dbml

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    tmp, n = sys.argv[1], int(sys.argv[2])
    con = dbml.connect(os.path.join(tmp, "db.duckdb"), latency_model="roofline", progress="off")
    con.execute("SET enable_progress_bar = false")   # DuckDB's own bar would share stdout
    con.execute("SET temp_directory = ?", [os.path.join(tmp, "spill")])
    con.execute("SET memory_limit = '1GB'")
    con.execute("CREATE TABLE t AS SELECT random() AS a, random() AS b, (random() > 0.5)::INT AS y FROM range(2048)")
    expected = con.execute(f"SELECT {n}, sum((range % 7) * (range % 11)) FROM range({n})").fetchall()[0]
    job = con.sql("SELECT train('m', 't', label := 'y', validation := 0, epochs := 2, hidden := [4096, 4096], "
                  "wait := false).job_id").fetchall()[0][0]
    while con.execute("SELECT progress FROM dbml_jobs WHERE job_id = ?", [job]).fetchall()[0][0] == 0:
        time.sleep(0.05)   # the job holds its budget and trains
    print("LIMIT_DURING", con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])
    spilled, done = [0], threading.Event()

    def watch(cur):
        while not done.is_set():
            spilled[0] = max(spilled[0], cur.execute("SELECT coalesce(sum(size), 0) FROM duckdb_temporary_files()"
                                                     ).fetchall()[0][0])
            time.sleep(0.05)
    watcher = threading.Thread(target=watch, args=(con.cursor(),))
    watcher.start()
    got = con.execute(f\"\"\"SELECT count(*), sum(a.v * b.w) FROM (SELECT range AS k, range % 7 AS v FROM range({n})) a
                          JOIN (SELECT range AS k, range % 11 AS w FROM range({n})) b USING (k)\"\"\").fetchall()[0]
    done.set()
    watcher.join()
    print("JOIN_RIGHT", got == expected)
    print("SPILLED", spilled[0])
    print("JOB_RUNNING_AFTER_JOIN", con.execute("SELECT status FROM dbml_jobs WHERE job_id = ?", [job]).fetchall()[0][0])
    print("JOB", con.sql(f"SELECT wait_job({job}).status").fetchall()[0][0])
    print("LIMIT_AFTER", con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])
    print("HWM", status("VmHWM"))
""")


@pytest.mark.slow   # a subprocess: a hash join that spills beside a training job, ~30-60 s
def test_a_spilling_join_and_a_job_together_stay_within_memory_limit_plus_the_runtime_overhead(tmp_path):
    r = subprocess.run([sys.executable, "-c", TOGETHER, str(tmp_path), str(30_000_000)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert {"HWM", "JOIN_RIGHT"} <= set(out), r.stdout
    assert out["LIMIT_DURING"] == as_duckdb_shows(ONE_GB - ONE_GB // 2)   # the job's default budget held
    assert out["JOIN_RIGHT"] == "True"
    assert int(out["SPILLED"]) > 0   # the join really spilled to temp_directory
    assert out["JOB_RUNNING_AFTER_JOIN"] == "running"   # the two overlapped throughout the join
    assert out["JOB"] == "finished"
    assert out["LIMIT_AFTER"] == "953.6 MiB"
    assert int(out["HWM"]) <= ONE_GB + RUNTIME_OVERHEAD_BYTES, f"VmHWM {int(out['HWM']) / 1e6:.0f} MB"
