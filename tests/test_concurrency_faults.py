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
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import duckdb
import pytest

import dbml
from dbml import instance as instances
from dbml.jobs import Job

from helpers import load, moons

SRC = "SELECT x1, x2, label FROM moons"
MEET_TIMEOUT = 30   # seconds a job waits for the others at a meeting point (never hang)


@pytest.fixture
def db(con):
    load(con, "moons", moons(320))
    return con


def catalog_rows(con) -> list[tuple]:
    """(name, version, has weights) of every stored model."""
    return con.sql("SELECT m.name, m.version, w.name IS NOT NULL FROM dbml_models m "
                   "LEFT JOIN dbml_weights w USING (name, version) ORDER BY ALL").fetchall()


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
    manager = instances._INSTANCES[db.execute("SELECT dbml_instance_id()").fetchall()[0][0]].jobs
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
                           "error": "train(): lr must be a positive number, got -1.0; pass e.g. lr := 0.01"}
    assert [r[:2] for r in catalog_rows(db)] == [("ok", 1)]


def test_unknown_on_error_names_the_choices(db):
    with pytest.raises(duckdb.Error, match=r"train\(\): unknown on_error 'ignore'; pass on_error := one of "
                                           r"'raise', 'continue'"):
        db.sql(f"SELECT train('m', '{SRC}', label := 'label', on_error := 'ignore')").fetchall()
    assert catalog_rows(db) == []
