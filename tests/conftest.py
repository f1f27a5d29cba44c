"""Shared fixtures: fresh dbml connections, tables with known structure, and the guard
against unplanned calibrations.

Tests keep predictors out of the user's cache (``DBML_CACHE_DIR`` points at an empty
temporary folder) and plan with the roofline estimator unless they test the predictor:
plans then do not depend on a calibration's timings. A test that calibrates (in this
process) says so with ``@pytest.mark.calibrates``; any other calibration fails the test
(``no_unplanned_calibration``), instead of silently costing ~20 s in whichever test
happens to run first. Markers (pyproject.toml): ``slow`` (calibration, subprocesses,
the demo; ``pytest -m "not slow"`` is the inner loop) and ``calibrates``.

Plain helpers (tables, models, ``wait_until``) are in ``helpers.py``.
"""

import os
import subprocess
import sys
import tempfile

import hypothesis
import pytest

import dbml
from dbml.core import runtime
from dbml.scheduler.latency import calibrate as calibration

from helpers import load, moons


# property tests draw the same examples every run (a test that fails one run in ten is a bug;
# a failure found then is found every run, and is fixed, not retried)
hypothesis.settings.register_profile("dbml", derandomize=True, database=None)
hypothesis.settings.load_profile("dbml")

os.environ["DBML_CACHE_DIR"] = tempfile.mkdtemp(prefix="dbml-test-cache-")
# plans on the CPU's disk tier follow the disk's speed: pinned, so that they do not change
# with a run's measured speed (a test's plan, like its latencies, is the same every run)
os.environ.setdefault("DBML_SPILL_BANDWIDTH", "4e8")


@pytest.fixture(autouse=True)
def no_unplanned_calibration(request, monkeypatch):
    """Calibrating the latency predictor in-process fails the test unless it is marked
    ``calibrates``. Both entries are replaced: ``calibrate`` (what dbml.core.latency, the
    CLI and ``load_or_calibrate`` call) and ``collect_samples`` (the timing every
    calibration runs). The calls are also checked at teardown, so a test whose SQL
    swallows the error still fails."""
    if request.node.get_closest_marker("calibrates"):
        yield
        return
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError(f"{request.node.nodeid} calibrated the latency predictor (~20 s): pass "
                             f"latency_model='roofline' to dbml.connect (or SET VARIABLE dbml_latency_model = "
                             f"'roofline'), or mark the test @pytest.mark.calibrates")
    monkeypatch.setattr(calibration, "calibrate", refuse)
    monkeypatch.setattr(calibration, "collect_samples", refuse)
    yield
    assert not calls, f"{request.node.nodeid} tried to calibrate the latency predictor {len(calls)} time(s)"


@pytest.fixture(autouse=True)
def fresh_runtime():
    """After each test the process's runtime (``dbml.core.runtime``) is put back to a fresh
    process's state where nothing uses it any more (no database open, no job on a device):
    the device schedulers and ledgers, the SIGINT chain, the BigQuery surface's views, the
    decode pool. A test that leaves a database open leaves the runtime as it is. The Ray
    connection stays: test_cluster.py keeps one local cluster per session."""
    yield
    runtime.reset()


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): one worker per core, at most four. Each worker is a
    process that imports torch and trains; more than four on a large machine would mostly
    add start-up and memory. Tests that share a session resource run on one worker: the Ray
    cluster's (``xdist_group("ray")``) and the installed predictor's (``"installed"``)."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


@pytest.fixture(scope="session")
def installed_predictor(tmp_path_factory):
    """``python -m dbml install --quick`` run once, in a subprocess, into a cache folder of
    its own: (the finished process, the folder). The CLI test checks it; the demo test
    plans with it instead of calibrating again."""
    cache = tmp_path_factory.mktemp("installed-cache")
    r = subprocess.run([sys.executable, "-m", "dbml", "install", "--quick"], capture_output=True, text=True,
                       env={**os.environ, "DBML_CACHE_DIR": str(cache)}, timeout=300)
    return r, cache


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
