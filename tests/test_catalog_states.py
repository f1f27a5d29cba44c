"""Issue 21: a stateful test of the catalog and the caches. Hypothesis drives train, drop,
retrain, predict, predictions, evaluate, export and reconnect across two connections and a
read-only one (DuckDB opens a file read-only in a process only while no read-write
connection holds it: the read-only phase closes the other two), and checks every answer
against a model of the catalog: which names exist, at which version, and whether each
learned y = 2x or y = -2x (so a stale cache answers with the wrong sign)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import dbml

NAMES = ("m", "n")
SIGNS = {"pos": 1.0, "neg": -1.0}
TRAIN = ("SELECT train(?, ?, label := 'y', arch := 'linear', epochs := 30, lr := 0.05, batch_size := 32, "
         "policy := 'eager')")


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
        self.exports = 0

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
        elif name in self.models:
            assert con.execute("SELECT drop_model(?)", [name]).fetchall() == [(self.models.pop(name)[0],)]
        else:
            with pytest.raises(duckdb.Error, match="no model named"):
                con.execute("SELECT drop_model(?)", [name])

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
        con = self.connections()[0]
        rows = con.execute("SELECT name, max(version) FROM dbml_models GROUP BY name ORDER BY name").fetchall()
        assert rows == sorted((n, v) for n, (v, _) in self.models.items())
        orphans = con.execute("SELECT count(*) FROM dbml_weights w ANTI JOIN dbml_models m "
                              "USING (name, version)").fetchall()
        assert orphans == [(0,)]

    def teardown(self):
        for c in self.connections():
            c.close()
        shutil.rmtree(self.folder, ignore_errors=True)


# 10 runs of 30 steps: 300 steps in the suite
Catalog.TestCase.settings = settings(max_examples=10, stateful_step_count=30, deadline=None)
test_catalog_states = pytest.mark.slow(Catalog.TestCase)
