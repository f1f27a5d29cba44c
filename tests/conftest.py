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
import warnings

import pytest

import dbml
from dbml.scheduler.latency import calibrate as calibration

# Re-exported for the test files that still import them from here; new code: helpers.
from helpers import linear, load, moons  # noqa: F401

os.environ["DBML_CACHE_DIR"] = tempfile.mkdtemp(prefix="dbml-test-cache-")


# Tests over a second or two in files other sessions own, marked slow here so that
# ``pytest -m "not slow"`` stays under a minute; move each mark into its file (and out of
# this list) when that file is next edited. An entry that matches no collected test of
# its file is reported, so a renamed test cannot silently leave the fast loop slow.
SLOW_ELSEWHERE = {
    "tests/test_concurrent.py::test_concurrent_jobs_stay_within_a_budget_below_their_unscheduled_peaks",
    "tests/test_concurrent.py::test_a_shrinking_job_frees_its_room_before_the_scheduler_gives_it_away",
    "tests/test_runner.py::test_tensile_at_half_the_peak_is_bit_identical[adam-cnn_bn]",
    "tests/test_runner.py::test_tensile_at_half_the_peak_is_bit_identical[adam-mlp]",
    "tests/test_runner.py::test_tensile_at_half_the_peak_is_bit_identical[sgd-cnn_bn]",
    "tests/test_runner.py::test_tensile_at_half_the_peak_is_bit_identical[sgd-mlp]",
    "tests/test_runner.py::test_a_further_graph_no_plan_fits_runs_passively_within_the_jobs_limit",
    "tests/test_runner.py::test_no_scheduler_switch_and_debug_summary",
    "tests/test_runner.py::test_dropout_trains_and_is_never_recomputed",
    "tests/test_planner.py::test_random_plans_are_valid",
    "tests/test_planner.py::test_random_multi_job_plans_are_valid",
    "tests/test_updating.py::test_drift_triggers_exactly_the_replans_the_threshold_implies[0.3-want0]",
    "tests/test_updating.py::test_planner_hook_is_used_for_first_plan_and_replans",
    "tests/test_updating.py::test_offered_plan_waits_for_the_iteration_boundary",
    "tests/test_updating.py::test_drift_triggers_exactly_the_replans_the_threshold_implies[0.95-want1]",
    "tests/test_updating.py::test_drift_triggers_exactly_the_replans_the_threshold_implies[2.0-want2]",
    "tests/test_concurrent.py::test_jobs_with_the_same_architecture_share_one_capture",
    "tests/test_runner.py::test_prepare_plans_before_the_first_batch_from_shapes_alone",
    "tests/test_capuchin.py::test_capuchin_is_bit_identical_passive_first_then_planned[mlp_adam]",
    "tests/test_capuchin.py::test_capuchin_plans_from_the_observed_latencies",
}


def pytest_collection_modifyitems(config, items):
    ids = {item.nodeid for item in items}
    files = {nodeid.split("::")[0] for nodeid in ids}
    for item in items:
        if item.nodeid in SLOW_ELSEWHERE:
            item.add_marker(pytest.mark.slow)
    if any("::" in arg for arg in config.args):
        return   # single tests asked for: the others of their files are not collected
    stale = sorted(n for n in SLOW_ELSEWHERE if n.split("::")[0] in files and n not in ids)
    if stale:
        warnings.warn(pytest.PytestWarning(f"conftest.SLOW_ELSEWHERE names tests that were not collected: "
                                           f"{', '.join(stale)}"))


@pytest.fixture(autouse=True)
def no_unplanned_calibration(request, monkeypatch):
    """Calibrating the latency predictor in-process fails the test unless it is marked
    ``calibrates``. Both entries are replaced: ``calibrate`` (what dbml.latency, the
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
