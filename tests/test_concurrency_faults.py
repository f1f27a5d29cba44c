"""Concurrency and faults: no lost work, nothing half-written.

- Jobs training the same model name at once are all stored, as consecutive versions.
- ``on_error := 'continue'``: a statement training several models returns every row's
  outcome; a failed row stores nothing and disturbs no other row.
- Fault injection (slow): a process killed with SIGKILL at random points of ``train``,
  ``drop_model`` and the catalog write leaves a consistent catalog, and a fresh process
  retrains.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import duckdb
import pytest

from dbml.core.runtime import runtime
from dbml.core.jobs import Job

from helpers import load, moons

# issue 10 reliability tests: whole databases and subprocesses; in the full suite, not the fast loop
pytestmark = pytest.mark.slow

SRC = "SELECT x1, x2, label FROM moons"
MEET_TIMEOUT = 30   # seconds a job waits for the others at a meeting point (never hang)


@pytest.fixture
def db(con):
    load(con, "moons", moons(320))
    return con


def catalog_rows(con) -> list[tuple]:
    """(name, version, has weights) of every stored model."""
    return con.sql("SELECT m.name, m.version, w.name IS NOT NULL FROM dbml.models m "
                   "LEFT JOIN dbml.weights w USING (name, version) ORDER BY ALL").fetchall()


# -- 13. jobs training one name at once --------------------------------------------------------

class VersionWindow:
    """A job's cursor that holds each writer right after it has read the next version, until
    every writer has read one (or ``window`` seconds pass): without one writer at a time,
    they all read the same version."""

    def __init__(self, cur, barrier: threading.Barrier):
        self._cur, self._barrier = cur, barrier

    def execute(self, sql, *args, **kwargs):
        out = self._cur.execute(sql, *args, **kwargs)
        if "max(version)" in sql and "coalesce" in sql:   # catalog.write taking the next version
            try:
                self._barrier.wait()
            except threading.BrokenBarrierError:   # another writer holds the catalog: go on
                pass
        return out

    def __getattr__(self, name):
        return getattr(self._cur, name)


@pytest.mark.slow   # ~5 s: four trainings, one writer held for its window
def test_jobs_training_one_name_at_once_are_all_stored_as_consecutive_versions(db, monkeypatch):
    n = 3
    db.sql("SELECT train('same', 'moons', label := 'label', epochs := 1, validation := 0)").fetchall()   # version 1
    manager = runtime().instances[db.execute("SELECT dbml_instance_id()").fetchall()[0][0]].jobs
    window = threading.Barrier(n, timeout=1.0)
    cursor = manager._cursor
    monkeypatch.setattr(manager, "_cursor", lambda: VersionWindow(cursor(), window))
    start = threading.Barrier(n, timeout=MEET_TIMEOUT)   # all jobs mid-training together
    step, met = Job.step, set()

    def meeting_step(self, rows):
        step(self, rows)
        if self.id not in met:
            met.add(self.id)
            start.wait()
    monkeypatch.setattr(Job, "step", meeting_step)
    rows = db.sql(f"SELECT train('same', '{SRC}', label := 'label', epochs := 2, validation := 0, seed := range) "
                  f"FROM range({n})").fetchall()
    assert sorted(r[0]["version"] for r in rows) == [2, 3, 4]
    assert catalog_rows(db) == [("same", v, True) for v in range(1, n + 2)]
    assert {r[0] for r in db.sql("SELECT status FROM dbml_jobs").fetchall()} == {"finished"}


# -- 14. every row's outcome -------------------------------------------------------------------

THREE = ("SELECT name, train(name, '{src}', label := lbl, epochs := 2, validation := 0{extra}) AS r "
         "FROM (VALUES ('good_a', 'label'), ('bad', 'no_such_label'), ('good_b', 'label')) v(name, lbl) "
         "ORDER BY name")


def test_on_error_continue_returns_every_rows_outcome_and_stores_only_the_good_ones(db):
    tables = db.sql("SELECT database_name, table_name FROM duckdb_tables() ORDER BY ALL").fetchall()
    rows = dict(db.sql(THREE.format(src=SRC, extra=", on_error := 'continue'")).fetchall())
    assert set(rows) == {"good_a", "bad", "good_b"}
    for name in ("good_a", "good_b"):
        assert rows[name]["status"] == "finished" and rows[name]["error"] is None
        assert rows[name]["version"] == 1 and rows[name]["rows"] == 320
    bad = rows["bad"]
    assert bad["status"] == "failed" and bad["version"] is None and bad["job_id"] is not None
    assert bad["error"] == ("train(): source has no column 'no_such_label'; pass label := '<column>' with columns "
                            "from: x1, x2, label")
    # nothing half-written: the good models whole, nothing of the bad one, no scratch table left
    assert catalog_rows(db) == [("good_a", 1, True), ("good_b", 1, True)]
    assert db.sql("SELECT count(*) FROM dbml_weights WHERE name = 'bad'").fetchall() == [(0,)]
    assert db.sql("SELECT database_name, table_name FROM duckdb_tables() ORDER BY ALL").fetchall() == tables
    jobs = dict(db.sql("SELECT model, status FROM dbml_jobs").fetchall())
    assert jobs == {"good_a": "finished", "bad": "failed", "good_b": "finished"}
    preds = db.sql("SELECT count(predict('good_a', [x1, x2])), count(predict('good_b', [x1, x2])) FROM moons")
    assert preds.fetchall() == [(320, 320)]


def test_on_error_raise_raises_the_failed_rows_error_after_the_others_are_stored(db):
    with pytest.raises(duckdb.Error, match=r"train\(\): source has no column 'no_such_label'"):
        db.sql(THREE.format(src=SRC, extra=", on_error := 'raise'")).fetchall()
    assert catalog_rows(db) == [("good_a", 1, True), ("good_b", 1, True)]


def test_on_error_continue_fails_a_row_with_invalid_arguments_alone(db):
    rows = dict(db.sql(f"SELECT name, train(name, '{SRC}', label := 'label', epochs := 1, lr := lr, "
                       f"on_error := 'continue') FROM (VALUES ('ok', 0.01), ('neg', -1.0)) v(name, lr)").fetchall())
    assert rows["ok"]["status"] == "finished"
    assert rows["neg"] == {**rows["neg"], "status": "failed", "job_id": None, "model": "neg",
                           "error": "train(): lr must be a positive number up to 1e+06, got -1.0; pass e.g. lr := 0.01"}
    assert [r[:2] for r in catalog_rows(db)] == [("ok", 1)]


def test_unknown_on_error_names_the_choices(db):
    with pytest.raises(duckdb.Error, match=r"train\(\): unknown on_error 'ignore'; pass on_error := one of "
                                           r"'raise', 'continue'"):
        db.sql(f"SELECT train('m', '{SRC}', label := 'label', on_error := 'ignore')").fetchall()
    assert catalog_rows(db) == []


# -- fault injection: SIGKILL at random points of train, drop_model and the catalog write ------

FAULT_RUNS = 20
FAULT_SEED = 10
ACTIONS = ("train", "drop", "write")
# two jobs of one model at once: their writes race for the next version
TRAIN = ("SELECT train('m', 't', label := 'y', epochs := 2, validation := 0, hidden := [64, 64], "
         "seed := {seed} + range).version FROM range({jobs})")

# A small fork server, started with subprocess.Popen. It imports dbml and trains once on an
# in-memory database (so a child need not import torch or capture the graph again: ~5 s
# each), then forks one child per "run <action>" line. A child is a fresh process for
# DuckDB and dbml: it opens the database file, retrains 'm' (two jobs at once, printing
# "retrained"), then repeats its action until it is killed: train (the same), drop (a
# version of 'd' written, then drop_model('d')) or write (catalog.write of 'm' again and
# again). Before each it prints "at <what>"; if it fails, "failed".
SERVER = textwrap.dedent('''
    import os, sys
    import torch
    torch.set_num_threads(1)
    import dbml
    from dbml.core import catalog

    DB, TRAIN = sys.argv[1], sys.argv[2]


    def say(*words):
        """One line in one write: a child killed mid-print never leaves half a line."""
        os.write(1, (" ".join(map(str, words)) + "\\n").encode())
    TABLE = "CREATE TABLE IF NOT EXISTS t AS SELECT range::DOUBLE AS x, (range % 3 = 0)::INT AS y FROM range(256)"


    def child(action):
        con = dbml.connect(DB, latency_model="roofline")
        con.execute(TABLE)
        say("retrained", os.getpid(), con.sql(TRAIN.format(seed=0, jobs=2)).fetchall())
        cur = con.cursor()
        stored = catalog.load(cur, "m", catalog.latest_version(cur, "m", fn="write"))
        i = 0
        while True:
            i += 1
            if action == "train":
                say("at train")
                con.sql(TRAIN.format(seed=i, jobs=2)).fetchall()
            elif action == "drop":
                say("at write")
                write(cur, "d", stored)
                say("at drop_model")
                con.sql("SELECT drop_model('d')").fetchall()
            else:
                say("at write")
                write(cur, "m", stored)


    def write(cur, name, stored):
        catalog.write(cur, name=name, config=stored.config, prep=stored.preprocessing, params={},
                      metrics={"final_loss": 0.0, "val_metric": 0.0}, rows=256, module=stored.module)


    warm = dbml.connect(latency_model="roofline")
    warm.execute("SET threads = 1")
    warm.execute(TABLE)
    warm.sql(TRAIN.format(seed=0, jobs=1)).fetchall()
    say("ready")
    for line in sys.stdin:
        command, arg = line.split()
        if command == "run":
            pid = os.fork()
            if pid == 0:
                try:
                    child(arg)
                except BaseException as e:
                    say("failed", os.getpid(), type(e).__name__, str(e).replace("\\n", " "))
                finally:
                    os._exit(3)
            say("pid", pid)
        else:   # reap <pid>
            say("exit", os.waitpid(int(arg), 0)[1])
''')


def check_catalog(path, loaded: set) -> int:
    """The catalog after a kill: every model row has its weights, whole (the size it
    recorded), and loads (those not in ``loaded`` yet); no weights without their row.
    Returns how many versions are stored."""
    import torch
    from dbml.core import catalog
    con = duckdb.connect(str(path))
    try:
        orphans = con.sql("SELECT name, version FROM dbml.weights ANTI JOIN dbml.models USING (name, version)")
        assert orphans.fetchall() == [], "weights without their model row"
        rows = con.sql("SELECT m.name, m.version, m.trained_at, m.bytes, octet_length(w.weights) FROM dbml.models m "
                       "LEFT JOIN dbml.weights w USING (name, version) ORDER BY ALL").fetchall()
        for name, version, at, size, stored in rows:
            assert stored == size, f"{name} v{version}: weights {stored} bytes, row says {size}"
            if (name, version, at) not in loaded:
                model = catalog.load(con, name, version)
                assert model.module(torch.zeros(4, len(model.preprocessing.feature_names))).isfinite().all()
                loaded.add((name, version, at))
        return len(rows)
    finally:
        con.close()


class Server:
    """The fault server's process; a thread reads its output as it comes, so a child that
    prints as it works never blocks on a full pipe."""

    def __init__(self, path, stderr):
        self.last_at = None   # what the running child last began: train, drop_model, write
        self.last = None
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(path), TRAIN], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, word: str, timeout: float = 60) -> list[str]:
        """The next line that starts with ``word`` (split)."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                ps = subprocess.run(["ps", "-o", "pid,ppid,stat,wchan:24,cmd", "--ppid", str(self.proc.pid),
                                     "-p", str(self.proc.pid)], capture_output=True, text=True).stdout
                raise AssertionError(f"no {word!r} from the fault server in {timeout} s; last line {self.last!r}; "
                                     f"processes:\n{ps}") from None
            self.last = line
            assert line, f"fault server ended (exit {self.proc.poll()}) waiting for {word!r}"
            assert not line.startswith("failed"), f"a fault run failed by itself: {line}"
            if line.startswith("at "):
                self.last_at = line.split(maxsplit=1)[1].strip()
            if line.startswith(word):
                return line.split()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.mark.slow   # ~40 s: 20 killed processes (a fork server spares 20 imports of torch)
def test_sigkill_at_random_points_leaves_a_consistent_catalog_and_a_retrain_succeeds(tmp_path):
    rng = random.Random(FAULT_SEED)
    path = tmp_path / "faults.duckdb"
    errors = open(tmp_path / "server.err", "w+")
    server = Server(path, errors)
    try:
        server.expect("ready", timeout=120)
        killed, retrains, stored, points, loaded = 0, 0, 0, {}, set()
        for run in range(FAULT_RUNS + 1):
            action = ACTIONS[run % len(ACTIONS)]
            server.send(f"run {action}")
            pid = int(server.expect("pid")[1])
            retrained = server.expect("retrained")   # this fresh process retrained after the last kill
            assert int(retrained[1]) == pid
            retrains += 1
            if run == FAULT_RUNS:   # the last one only retrains
                os.kill(pid, signal.SIGKILL)
                server.send(f"reap {pid}")
                server.expect("exit")
                break
            server.last_at = None
            time.sleep(rng.uniform(0.0, 0.8))
            os.kill(pid, signal.SIGKILL)
            server.send(f"reap {pid}")
            status = int(server.expect("exit", timeout=20)[1])
            points[server.last_at or "retrain"] = points.get(server.last_at or "retrain", 0) + 1
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
                f"run {run} ({action}) ended by itself (status {status}): {open(errors.name).read()[-2000:]}"
            killed += 1
            stored = check_catalog(path, loaded)
        assert killed == FAULT_RUNS and retrains == FAULT_RUNS + 1
        print(f"\nfault injection: {killed} SIGKILLs, during {points}; catalog checked after each "
              f"(weights whole and loading, no orphans; {len(loaded)} versions loaded, {stored} stored at the end); {retrains} retrains in fresh processes")
    finally:
        server.close()
        errors.close()
