"""Issue 21: a stateful test of the catalog and the caches. Hypothesis drives train, drop,
retrain, predict, predictions, evaluate, export and reconnect across two connections and a
read-only one (DuckDB opens a file read-only in a process only while no read-write
connection holds it: the read-only phase closes the other two), and checks every answer
against a model of the catalog: which names exist, at which version, and whether each
learned y = 2x or y = -2x (so a stale cache answers with the wrong sign).

Issue 31 adds tune() (two tiny trials, resumed on the same name) and a reconnect after a
kill: this process lets the file go, another process (``crashes.CrashServer``) opens it and
is killed with SIGKILL in the middle of a train() (as its job starts, mid-epoch, inside the
catalog's transaction) or a tune() (its second trial running), and the file is opened
again. The model of the catalog then also counts each name's trials: a killed trial is
kept, 'interrupted', and none is ever shown 'running'.

``DBML_STATES_STEPS=300 pytest tests/test_catalog_states.py`` runs sequences of that many
steps (the issue's goal); by default a few short ones run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import event, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import dbml
from dbml.search.trials import ENDED

from crashes import CrashServer

NAMES = ("m", "n")
SIGNS = {"pos": 1.0, "neg": -1.0}
TRAIN = ("SELECT train(?, ?, label := 'y', arch := 'linear', epochs := 30, lr := 0.05, batch_size := 32, "
         "policy := 'eager')")
# two trials that each learn the table (seeds drawn), one at a time (a killed one is the second)
TUNE = ("SELECT trial, status, version FROM tune(?, ?, label := 'y', arch := 'linear', epochs := 30, lr := 0.05, "
        "batch_size := 32, policy := 'eager', sampler := 'random', trials := 2, parallel := 1, pruner := 'none', "
        "space := '{\"seed\": {\"int\": [0, 1000000]}}')")
KILLED = ("start", "epoch", "commit", "tune")   # where the other process is killed
STEPS = int(os.environ.get("DBML_STATES_STEPS", "0"))

_server: list[CrashServer] = []


def server() -> CrashServer:
    """The fork server of the kill steps, started on first use (its warm-up is ~10 s of CPU)."""
    if not _server:   # its stderr to a file: pytest's capture may have no file descriptor
        _server.append(CrashServer(tempfile.TemporaryFile("w+")))
    return _server[0]


@pytest.fixture(autouse=True, scope="module")
def stop_server():
    yield
    if _server:
        _server.pop().close()


def dbml_quote(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


class Catalog(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="dbml-states-"))
        self.path = str(self.folder / "c.duckdb")
        setup = dbml.connect(self.path, latency_model="roofline")
        setup.execute("CREATE TABLE pos AS SELECT x / 100 AS x, 2 * x / 100 AS y FROM range(100) t(x)")
        setup.execute("CREATE TABLE neg AS SELECT x / 100 AS x, -2 * x / 100 AS y FROM range(100) t(x)")
        setup.close()
        self.writers: list = []
        self.reader = None
        self.open_writers()
        self.models: dict[str, tuple[int, str]] = {}   # name -> (latest version, table it learned)
        self.trials: dict[str, tuple[int, int]] = {}   # name -> (its trials, of them interrupted)
        self.exports = 0
        self.checks = 0   # the invariants' runs: once at the start, then after each step

    # -- connections ---------------------------------------------------------------------------
    def open_writers(self):
        first = dbml.connect(self.path, latency_model="roofline")
        self.writers = [first, dbml.connect(self.path, latency_model="roofline")]

    def connections(self):
        return self.writers if self.writers else [self.reader]

    @rule(i=st.integers(0, 1))
    def reconnect_one(self, i):
        if self.writers:
            self.writers[i].close()
            self.writers[i] = dbml.connect(self.path, latency_model="roofline")
        else:
            self.reader.close()
            self.reader = dbml.connect(self.path, read_only=True)

    @rule()
    def switch_read_only(self):
        if self.writers:
            for c in self.writers:
                c.close()
            self.writers = []
            self.reader = dbml.connect(self.path, read_only=True)
        else:
            self.reader.close()
            self.reader = None
            self.open_writers()

    # -- writes ---------------------------------------------------------------------------------
    @rule(name=st.sampled_from(NAMES), table=st.sampled_from(sorted(SIGNS)), i=st.integers(0, 1))
    def train(self, name, table, i):
        con = self.connections()[i % len(self.connections())]
        if not self.writers:
            with pytest.raises(duckdb.Error, match="read-only"):
                con.execute(TRAIN, [name, table])
            return
        row = con.execute(TRAIN, [name, table]).fetchall()[0][0]
        version = self.models.get(name, (0, ""))[0] + 1
        assert (row["status"], row["version"]) == ("finished", version)
        self.models[name] = (version, table)

    @rule(name=st.sampled_from(NAMES), i=st.integers(0, 1))
    def drop(self, name, i):
        con = self.connections()[i % len(self.connections())]
        if not self.writers:
            with pytest.raises(duckdb.Error, match="read-only"):
                con.execute("SELECT drop_model(?)", [name])
        elif name in self.models or name in self.trials:   # a name with trials only is dropped too
            assert con.execute("SELECT drop_model(?)", [name]).fetchall() == \
                [(self.models.pop(name, (0, ""))[0],)]
            self.trials.pop(name, None)
        else:
            with pytest.raises(duckdb.Error, match="no model named"):
                con.execute("SELECT drop_model(?)", [name])

    @rule(name=st.sampled_from(NAMES), table=st.sampled_from(sorted(SIGNS)), i=st.integers(0, 1))
    def tune(self, name, table, i):
        con = self.connections()[i % len(self.connections())]
        if not self.writers:
            with pytest.raises(duckdb.Error, match="read-only"):
                con.execute(TUNE, [name, table]).fetchall()
            return
        event("tune")   # --hypothesis-show-statistics: which steps the runs took
        before, interrupted = self.trials.get(name, (0, 0))
        rows = con.execute(TUNE, [name, table]).fetchall()
        # numbers go on from the stored trials (a killed one's included); the best is stored
        # as the next version only if it is one of this call's
        assert [(r[0], r[1]) for r in rows] == [(before, "finished"), (before + 1, "finished")]
        self.trials[name] = (before + 2, interrupted)
        stored = [r[2] for r in rows if r[2] is not None]
        if stored:
            assert stored == [self.models.get(name, (0, ""))[0] + 1]
            self.models[name] = (stored[0], table)

    @rule(name=st.sampled_from(NAMES), table=st.sampled_from(sorted(SIGNS)), at=st.sampled_from(KILLED))
    def killed_elsewhere(self, name, table, at):
        """This process lets the file go; another opens it, writes and is killed with SIGKILL; then
        the file is opened again as before (writable or read-only)."""
        event(f"killed at {at}")
        read_only = not self.writers
        for c in self.connections():
            c.close()
        self.writers, self.reader = [], None
        crash = server()
        if at == "tune":
            pid = crash.run("tune", self.path, TUNE, name, table)
        else:
            pid = crash.run("train", self.path, at, name, table)
        crash.expect("at", timeout=120)
        crash.kill(pid)
        if at == "tune":   # its first trial ended and is kept; the second is interrupted; nothing stored
            count, interrupted = self.trials.get(name, (0, 0))
            self.trials[name] = (count + 2, interrupted + 1)
        if read_only:
            self.reader = dbml.connect(self.path, read_only=True)
        else:
            self.open_writers()

    @rule(via=st.sampled_from(["sql", "execute"]))
    def export_import_database(self, via):
        """EXPORT DATABASE, then IMPORT DATABASE into a new file through dbml (issue 31, item 4):
        the steps after go on in the new file, whose catalog must be the old one's."""
        if not self.writers:
            return
        event(f"export/import via {via}")
        self.exports += 1
        exported = self.folder / f"db{self.exports}"
        self.writers[0].execute("EXPORT DATABASE " + dbml_quote(str(exported)))
        for c in self.writers:
            c.close()
        self.path = str(self.folder / f"c{self.exports}.duckdb")
        fresh = dbml.connect(self.path, latency_model="roofline")
        statement = "IMPORT DATABASE " + dbml_quote(str(exported))
        fresh.sql(statement) if via == "sql" else dbml.execute(fresh, statement)
        fresh.close()
        self.open_writers()

    # -- reads ----------------------------------------------------------------------------------
    @rule(name=st.sampled_from(NAMES), i=st.integers(0, 1))
    def predict(self, name, i):
        con = self.connections()[i % len(self.connections())]
        if name not in self.models:
            with pytest.raises(duckdb.Error, match="no model named"):
                con.execute("SELECT predict(?, [0.5])", [name]).fetchall()
            return
        value = con.execute("SELECT predict(?, [0.5])", [name]).fetchall()[0][0]
        assert value == pytest.approx(SIGNS[self.models[name][1]], abs=0.1)

    @rule(name=st.sampled_from(NAMES), i=st.integers(0, 1))
    def predictions_and_evaluate(self, name, i):
        con = self.connections()[i % len(self.connections())]
        if name not in self.models:
            with pytest.raises(duckdb.Error, match="no model named"):
                con.execute("SELECT evaluate(?, 'pos')", [name]).fetchall()
            return
        table = self.models[name][1]
        got = con.execute("SELECT prediction FROM predictions(?, 'SELECT 0.5 AS x')", [name]).fetchall()[0][0]
        assert got == pytest.approx(SIGNS[table], abs=0.1)
        assert con.execute("SELECT evaluate(?, ?).r2", [name, table]).fetchall()[0][0] > 0.95

    @rule(name=st.sampled_from(NAMES))
    def export(self, name):
        pytest.importorskip("onnx")
        con = self.connections()[0]
        target = self.folder / f"e{self.exports}.onnx"
        self.exports += 1
        if name not in self.models:
            with pytest.raises(duckdb.Error, match="no model named"):
                con.execute("SELECT export_model(?, ?)", [name, str(target)]).fetchall()
            assert not target.exists()
            return
        row = con.execute("SELECT export_model(?, ?)", [name, str(target)]).fetchall()[0][0]
        assert row["version"] == self.models[name][0] and target.stat().st_size > 0

    @invariant()
    def catalog_matches(self):
        self.checks += 1
        con = self.connections()[0]
        rows = con.execute("SELECT name, max(version) FROM dbml_models GROUP BY name ORDER BY name").fetchall()
        assert rows == sorted((n, v) for n, (v, _) in self.models.items())
        orphans = con.execute("SELECT count(*) FROM dbml_weights w ANTI JOIN dbml_models m "
                              "USING (name, version)").fetchall()
        assert orphans == [(0,)]
        assert con.execute("SELECT count(*) FROM dbml_models m ANTI JOIN dbml_weights w "
                           "USING (name, version)").fetchall() == [(0,)]
        trials = con.execute("SELECT model, count(*), count(*) FILTER (status = 'interrupted'), "
                             "count(*) FILTER (status = 'running'), "
                             "bool_and(status <> 'interrupted' OR error = ?) FROM dbml_trials "
                             "GROUP BY model ORDER BY model", [ENDED]).fetchall()
        assert trials == [(n, c, i, 0, True) for n, (c, i) in sorted(self.trials.items())]
        assert con.execute("SELECT count(*) FROM dbml_jobs WHERE status NOT IN ('finished', 'failed', "
                           "'cancelled')").fetchall() == [(0,)]

    def teardown(self):
        event(f"{self.checks - 1} steps")
        for c in self.connections():
            c.close()
        shutil.rmtree(self.folder, ignore_errors=True)


# by default 5 runs of 20 steps; DBML_STATES_STEPS=300: two runs of 300 (Hypothesis's first run is
# its simplest, the first rule again and again; the second draws every step)
Catalog.TestCase.settings = settings(max_examples=2 if STEPS else 5, stateful_step_count=STEPS or 20, deadline=None)
test_catalog_states = pytest.mark.slow(Catalog.TestCase)
