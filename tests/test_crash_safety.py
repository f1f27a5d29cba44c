"""Crash safety on a file database (issue 31): a process killed with SIGKILL during train(),
tune() and export_model(), a second process opening a file the first holds, and a full disk.

Each kill lands at a point the child reached and said so (``crashes.py``); the database is
then opened by this process, which never held it before, as a user's next session would:
its catalog must be consistent (every weights row has its model row and the reverse, each
blob the size its row records, every model loads and predicts), the killed training's model
absent (nothing is half-written), the killed tune() trial shown 'interrupted' and tune() with
the same arguments going on with the search, and no export file presented as complete
that is not. A fast test without subprocesses checks the rule behind 'interrupted': a row
'running' is a dead process's only when the file is opened afresh.
"""

from __future__ import annotations

import math
import shutil

import duckdb
import pytest

import dbml
from dbml.search.trials import ENDED

from crashes import GRID, TUNE, CrashServer

# the tests marked slow start subprocesses and kill one each: in the full suite, not the fast loop
LEFT_RUNNING = ("INSERT INTO dbml.trials (model, trial, status, objective_name, direction, objectives, params, "
                "search, epochs, started_at) VALUES ('k', 0, 'running', 'val_loss', 'minimize', [], '{}', '{}', 0, "
                "now())")


def test_a_trial_left_running_is_shown_interrupted_on_the_next_open_of_the_file_only(tmp_path):
    """A row 'running' is a live search's while this process has the file open (a second
    connection leaves it), a dead process's once the file is opened afresh."""
    path = str(tmp_path / "left.duckdb")
    first = dbml.connect(path)
    first.execute(LEFT_RUNNING)
    second = dbml.connect(path)
    assert second.execute("SELECT status FROM dbml_trials").fetchall() == [("running",)]
    second.close()
    first.close()
    reader = dbml.connect(path, read_only=True)
    assert reader.execute("SELECT status, error FROM dbml_trials").fetchall() == [("interrupted", ENDED)]
    assert reader.execute("SELECT status FROM dbml.trials").fetchall() == [("running",)]   # read-only: not written
    reader.close()
    again = dbml.connect(path)
    assert again.execute("SELECT status, error FROM dbml.trials").fetchall() == [("interrupted", ENDED)]
    again.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    errors = open(tmp_path_factory.mktemp("crash-server") / "stderr", "w+")
    s = CrashServer(errors)
    yield s
    s.close()
    errors.close()


@pytest.fixture(scope="module")
def written(server, tmp_path_factory):
    """A database file holding table t and a model 'base' (version 1), written by a child
    that closed it cleanly."""
    path = tmp_path_factory.mktemp("written") / "crash.duckdb"
    pid = server.run("setup", path)
    assert server.expect("base") == ["1"]
    server.finish(pid)
    assert not path.with_name(path.name + ".wal").exists()   # checkpointed: the file is the whole database
    return path


@pytest.fixture
def db(written, tmp_path):
    """A copy of ``written`` for one test."""
    path = tmp_path / written.name
    shutil.copyfile(written, path)
    return path


def consistent(path, read_only: bool = False) -> dict[str, int]:
    """Open ``path`` (this process never held it) and check its catalog; {model: latest version}."""
    raw = duckdb.connect(str(path), read_only=True)
    try:
        assert raw.sql("SELECT name, version FROM dbml.weights ANTI JOIN dbml.models USING (name, version)"
                       ).fetchall() == [], "weights without their model row"
        assert raw.sql("SELECT name, version FROM dbml.models ANTI JOIN dbml.weights USING (name, version)"
                       ).fetchall() == [], "a model row without its weights"
        sizes = raw.sql("SELECT name, version, bytes, octet_length(weights) FROM dbml.models "
                        "JOIN dbml.weights USING (name, version)").fetchall()
        assert all(recorded == stored for _, _, recorded, stored in sizes), sizes
    finally:
        raw.close()
    con = dbml.connect(str(path), read_only=read_only, latency_model="roofline")
    try:
        latest = dict(con.execute("SELECT name, max(version) FROM dbml_models GROUP BY name").fetchall())
        for name in latest:   # each loads and predicts
            value = con.execute("SELECT predict(?, [0.5])", [name]).fetchall()[0][0]
            assert isinstance(value, int) or math.isfinite(value)
        assert con.execute("SELECT count(*) FROM dbml_jobs").fetchall() == [(0,)]   # a dead process's jobs are gone
        return latest
    finally:
        con.close()


@pytest.mark.slow
@pytest.mark.parametrize("point", ["start", "epoch", "commit"])
def test_a_training_killed_leaves_the_catalog_without_its_model(server, db, point):
    pid = server.run("train", db, point)
    server.expect("at", timeout=60)
    server.kill(pid)
    assert consistent(db) == {"base": 1}
    con = dbml.connect(str(db), latency_model="roofline")
    try:
        with pytest.raises(duckdb.Error, match="no model named 'm'"):
            con.execute("SELECT predict('m', [0.5])").fetchall()
    finally:
        con.close()


@pytest.mark.slow
def test_a_tune_killed_shows_its_trial_interrupted_and_resumes_with_the_same_arguments(server, db):
    pid = server.run("tune", db)
    assert server.expect("saved") == ["0", "running"]
    assert server.expect("saved") == ["0", "finished"]
    assert server.expect("saved") == ["1", "running"]
    server.expect("at")
    server.kill(pid)
    trials = ("SELECT trial, status, error, params->>'batch_size' FROM dbml_trials WHERE model = 'k' "
              "ORDER BY trial")
    # read-only, nothing is rewritten, and the row is shown interrupted all the same
    assert consistent(db, read_only=True) == {"base": 1}
    con = dbml.connect(str(db), read_only=True)
    try:
        shown = con.execute(trials).fetchall()
        assert [r[:3] for r in shown] == [(0, "finished", None), (1, "interrupted", ENDED)]
        killed = int(shown[1][3])
        assert con.execute("SELECT status FROM dbml.trials WHERE trial = 1").fetchall() == [("running",)]
    finally:
        con.close()
    # writable: the first open records it
    assert consistent(db) == {"base": 1}   # the best is stored when tune() ends: nothing yet
    con = dbml.connect(str(db), latency_model="roofline")
    try:
        assert con.execute("SELECT status, error FROM dbml.trials WHERE trial = 1").fetchall() == \
            [("interrupted", ENDED)]
        # the same call goes on: numbers continue, the interrupted point is tried again, then the rest
        assert sorted(con.execute(TUNE).fetchall()) == [(2, "finished"), (3, "finished")]
        done = dict(con.execute("SELECT trial, (params->>'batch_size')::INT FROM dbml_trials WHERE model = 'k' "
                                "AND status = 'finished'").fetchall())
        assert set(done.values()) == GRID and killed in (done[2], done[3])
        assert con.execute("SELECT count(*) FROM dbml_trials WHERE status = 'running'").fetchall() == [(0,)]
    finally:
        con.close()
    assert consistent(db) == {"base": 1, "k": 1}


@pytest.mark.slow
@pytest.mark.parametrize("point, before", [("save", False), ("replace", True)])
def test_an_export_killed_leaves_no_file_presented_as_complete(server, db, tmp_path, point, before):
    onnx = pytest.importorskip("onnx")
    target = tmp_path / "out" / "base.onnx"
    target.parent.mkdir()
    if before:   # an earlier export stays as it was
        dbml.export_model(con := dbml.connect(str(db), latency_model="roofline"), "base", str(target))
        con.close()
        earlier = target.read_bytes()
    pid = server.run("export", db, point, target)
    server.expect("at")
    server.kill(pid)
    if before:
        assert target.read_bytes() == earlier
    else:
        assert not target.exists()
    # what the kill left is a hidden temporary file, never a name that ends in .onnx
    assert [p.name for p in target.parent.iterdir() if p.name != target.name and not
            (p.name.startswith(".") and p.name.endswith(".onnx.tmp"))] == []
    assert consistent(db) == {"base": 1}
    con = dbml.connect(str(db), latency_model="roofline")
    try:
        assert con.execute("SELECT export_model('base', ?, overwrite := true).version", [str(target)]
                           ).fetchall() == [(1,)]
    finally:
        con.close()
    onnx.checker.check_model(onnx.load(str(target)))


@pytest.mark.slow
def test_a_second_process_gets_duckdbs_lock_error_and_nothing_is_damaged(server, db):
    pid = server.run("hold", db)
    server.expect("at")
    try:
        for read_only in (False, True):
            with pytest.raises(duckdb.IOException, match=rf"Could not set lock on file .*crash\.duckdb.*PID {pid}"):
                dbml.connect(str(db), read_only=read_only)
    finally:
        server.kill(pid)
    assert consistent(db) == {"base": 1}


@pytest.mark.slow
def test_a_full_disk_fails_the_commit_and_keeps_the_earlier_models(server, db):
    # the file may not grow past 256 KiB: the WAL of a 1 MB model's commit cannot be written
    pid = server.run("full", db, 256 * 1024)
    error = " ".join(server.expect("error"))
    assert "Failed to commit" in error and "File too large" in error and "crash.duckdb.wal" in error, error
    assert server.expect("models") == ["1"]   # the connection goes on, with the models it had
    server.finish(pid)
    assert consistent(db) == {"base": 1}
