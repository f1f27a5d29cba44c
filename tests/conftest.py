"""Shared fixtures: fresh dbml connections and generated data with known structure.

Tests keep predictors out of the user's cache (``DBML_CACHE_DIR`` points at a temporary
folder) and plan with the roofline estimator unless they test the predictor: plans then
do not depend on a calibration's timings.
"""

import os
import tempfile

import numpy as np
import pyarrow as pa
import pytest

import dbml


os.environ["DBML_CACHE_DIR"] = tempfile.mkdtemp(prefix="dbml-test-cache-")


@pytest.fixture
def one_thread(monkeypatch):
    """Scheduler tests: no scheduler switches from the environment, one PyTorch thread."""
    monkeypatch.delenv("DBML_NO_SCHEDULER", raising=False)
    monkeypatch.delenv("DBML_DEBUG", raising=False)
    import torch
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def con():
    c = dbml.connect(latency_model="roofline")
    yield c
    c.close()


def moons(n: int, seed: int = 0, noise: float = 0.1) -> pa.Table:
    """Two interleaving half circles (scikit-learn's make_moons), with a train/test split column."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, n)
    t = rng.uniform(0, np.pi, n)
    x1 = np.where(label == 0, np.cos(t), 1 - np.cos(t)) + rng.normal(0, noise, n)
    x2 = np.where(label == 0, np.sin(t), 0.5 - np.sin(t)) + rng.normal(0, noise, n)
    split = np.where(rng.uniform(size=n) < 0.8, "train", "test")
    return pa.table({"x1": x1, "x2": x2, "label": label.astype(np.int32), "split": split})


def linear(n: int, seed: int = 0, noise: float = 0.05) -> pa.Table:
    """y = 3 a - 2 b + 0.5 c + 1 + noise: a linear model's R^2 must approach 1."""
    rng = np.random.default_rng(seed)
    a, b, c = rng.normal(size=(3, n))
    y = 3 * a - 2 * b + 0.5 * c + 1 + rng.normal(0, noise, n)
    split = np.where(rng.uniform(size=n) < 0.8, "train", "test")
    return pa.table({"a": a, "b": b, "c": c, "y": y, "split": split})


def load(con, name: str, table: pa.Table) -> None:
    con.register("_dbml_test_src", table)
    con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM _dbml_test_src')
    con.unregister("_dbml_test_src")


@pytest.fixture
def moons_con(con):
    load(con, "moons", moons(3000))
    return con


@pytest.fixture
def wide(con):
    """Table t: 16 numeric features and a binary label y, for MLPs wide enough to schedule."""
    cols = ", ".join(f"(hash(range, {i}) % 1000 / 1000.0) AS f{i}" for i in range(16))
    con.execute(f"CREATE TABLE t AS SELECT *, (f0 + f1 > 1)::INT AS y FROM (SELECT {cols} FROM range(2000))")
    yield con
    con.execute("SET VARIABLE dbml_memory_budget = NULL")
