"""The run's time, estimated from the latency model before training (issue 24 part 2):
``estimated_seconds`` in dbml_jobs (train()'s ``warnings`` says when it is long), and a warning with cheaper
choices when it passes the ``slow_train_seconds`` setting."""

import types

import pytest

from dbml.core.estimate import Estimate, cheaper_choices, estimate
from dbml.zoo import Inputs
from helpers import job_of


def train(con, sql_args: str) -> dict:
    """The job's result and its row of dbml_jobs (best_epoch, estimated_seconds, the memory figures)."""
    return job_of(con, con.sql(f"SELECT train({sql_args})").fetchall()[0][0])


@pytest.fixture
def rows(con):
    con.execute("CREATE TABLE rows AS SELECT hash(range, 1) % 1000 / 1000.0 AS a, hash(range, 2) % 1000 / 1000.0 AS b, "
                "(hash(range, 3) % 3)::INT AS y FROM range(3000)")
    return con


@pytest.mark.slow   # ~0.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_the_estimate_is_said_and_near_the_measured_time(rows):
    r = train(rows, "'m', 'rows', label := 'y', hidden := [64, 64], epochs := 3, early_stop := false")
    measured = rows.sql("SELECT sum(seconds) FROM dbml_epochs WHERE model = 'm'").fetchall()[0][0]
    assert r["estimated_seconds"] > 0
    # a loose bound: a shared 2-core machine's load moves the measured time severalfold
    assert 0.05 * measured <= r["estimated_seconds"] <= 20 * measured, (r["estimated_seconds"], measured)
    assert r["warnings"] is None     # far under the 60 s of slow_train_seconds
    job = rows.sql("SELECT estimated_seconds, warnings FROM dbml_jobs WHERE model = 'm'").fetchall()
    assert job == [(r["estimated_seconds"], None)]


@pytest.mark.slow   # ~0.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_slow_estimate_warns_with_cheaper_choices(rows):
    rows.execute("SET VARIABLE dbml_slow_train_seconds = 1e-6")
    r = train(rows, "'m', 'rows', label := 'y', epochs := 50")
    assert r["warnings"].startswith("estimated ") and "50 epochs of " in r["warnings"]
    assert "cheaper: " in r["warnings"] and "arch := 'linear'" in r["warnings"]   # auto picked an mlp
    # dbml_jobs carried it while the job ran (said before the first iteration)
    assert rows.sql("SELECT warnings FROM dbml_jobs WHERE model = 'm'").fetchall() == [(r["warnings"],)]
    rows.execute("SET VARIABLE dbml_slow_train_seconds = 60")
    assert train(rows, "'m', 'rows', label := 'y', epochs := 2")["warnings"] is None


def test_an_eager_job_plans_nothing_ahead_and_estimates_nothing(rows):
    r = train(rows, "'m', 'rows', label := 'y', epochs := 1, policy := 'eager'")
    assert r["status"] == "finished" and r["estimated_seconds"] is None


def _seq(forward: float, backward: float, optimizer: float):
    ops, t = [], 0.0
    for phase, seconds in (("forward", forward), ("backward", backward), ("optimizer", optimizer)):
        ops.append(types.SimpleNamespace(phase=phase, start=t, end=t + seconds))
        t += seconds
    return types.SimpleNamespace(ops=ops, duration=t)


def test_estimate_counts_iterations_validation_and_the_last_batch_capture():
    est = estimate(_seq(1.0, 2.0, 0.5), n_train=130, n_val=32, batch_size=64, epochs=10, validate_epochs=True,
                   prepare_seconds=4.0)
    assert (est.iterations, est.val_batches, est.iteration, est.forward) == (3, 0.5, 3.5, 1.0)
    # 10 x (3 x 3.5 + 0.5 x 1.0) + the last validation (0.5) + the smaller last batch's capture (4.0)
    assert est.seconds == pytest.approx(10 * 11.0 + 0.5 + 4.0)
    even = estimate(_seq(1.0, 2.0, 0.5), n_train=128, n_val=0, batch_size=64, epochs=2, validate_epochs=True,
                    prepare_seconds=4.0)
    assert even.seconds == pytest.approx(2 * 2 * 3.5)   # no validation rows, no second shape


def test_cheaper_choices_name_fewer_epochs_a_cheap_arch_and_smaller_images():
    est = Estimate(iteration=1.0, forward=0.3, iterations=20, val_batches=0.0, epochs=20, validate_epochs=False)
    spec = types.SimpleNamespace(settings=types.SimpleNamespace(slow_train_seconds=60.0), shape=None)
    image = types.SimpleNamespace(arch="resnet18", inputs=Inputs("image", shape=(3, 96, 96)))
    assert cheaper_choices(est, image, spec) == ["epochs := 3", "arch := 'cnn'", "image_size := [48, 48]"]
    text = types.SimpleNamespace(arch="transformer", inputs=Inputs("tokens", vocab=100, max_len=16))
    assert cheaper_choices(est, text, spec) == ["epochs := 3", "arch := 'bow'"]


# -- issue 32: start-up, fixed costs learned from the jobs that ran, a fresh process's first job --

from dbml.core import estimate as estimating   # noqa: E402
from dbml.core.estimate import Measured, Overheads   # noqa: E402


@pytest.fixture
def learned(tmp_path, monkeypatch):
    """An empty cache directory for the learned figures, read afresh."""
    monkeypatch.setenv("DBML_CACHE_DIR", str(tmp_path))
    estimating.forget()
    yield tmp_path
    estimating.forget()


def test_the_estimate_counts_the_start_up_and_the_learned_fixed_costs():
    fixed = Overheads(scale=1.5, epoch=2.0, batch=0.5, finish=3.0, cold=7.0)
    base = dict(n_train=128, n_val=0, batch_size=64, epochs=2, validate_epochs=False)
    bare = estimate(_seq(1.0, 2.0, 0.5), **base)
    assert bare.seconds == pytest.approx(2 * 2 * 3.5)
    warm = estimate(_seq(1.0, 2.0, 0.5), **base, startup=5.0, learned=fixed)
    # start-up + 2 epochs x (2 iterations x (3.5 x 1.5 + 0.5) + 2.0) + finish 3.0
    assert warm.seconds == pytest.approx(5.0 + 2 * (2 * 5.75 + 2.0) + 3.0)
    cold = estimate(_seq(1.0, 2.0, 0.5), **base, startup=5.0, learned=fixed, cold=True)
    assert cold.seconds == pytest.approx(warm.seconds + 7.0)   # the first job's one-off costs, only cold


def test_learn_fits_per_epoch_per_batch_and_per_iteration_costs_from_jobs_of_two_sizes(learned):
    def job(iterations: int) -> None:
        est = estimate(_seq(0.001, 0.002, 0.001), n_train=64 * iterations, n_val=0, batch_size=64, epochs=3,
                       validate_epochs=False)
        # each step 5 ms for its 4 ms of ops; outside the steps 50 ms an epoch and 2 ms a batch;
        # 0.4 s after the last epoch
        steps = [iterations * 0.005 for _ in range(3)]
        estimating.learn("cpu", "tabular", "linear", est, Measured(
            epochs=[s + 0.05 + 0.002 * iterations for s in steps], steps=steps, finish=0.4))
    job(5)
    job(50)
    got = estimating.overheads("cpu", "tabular", "linear")
    assert got.epoch == pytest.approx(0.05) and got.batch == pytest.approx(0.002)
    assert got.scale == pytest.approx(1.25)
    assert 0.2 < got.finish <= 0.4                         # moving towards 0.4 (LEARNING_RATE)
    # kept beside the predictor for the next process, and the kind's other archs start from it
    estimating.forget()
    assert estimating.overheads("cpu", "tabular", "linear") == got
    assert estimating.overheads("cpu", "tabular", "mlp").epoch == pytest.approx(0.05)
    assert estimating.overheads("cpu", "image", "cnn") == Overheads()   # a kind never trained: none


def test_one_job_far_off_its_prediction_does_not_set_the_scale_of_the_others(learned):
    """The scale is the median of the last jobs' ratios: a long job that ran 4.5x its
    prediction (a loaded machine, copies waited on) among jobs at 0.7x leaves it near 0.7."""
    def job(ops: float, ratio: float) -> None:
        est = estimate(_seq(ops / 3, ops / 3, ops / 3), n_train=640, n_val=0, batch_size=64, epochs=1,
                       validate_epochs=False)
        steps = [10 * ops * ratio]
        estimating.learn("cpu", "tabular", "mlp", est, Measured(epochs=steps, steps=steps, finish=0.1))
    for ops, ratio in ((0.001, 0.7), (0.002, 0.72), (0.1, 4.5), (0.001, 0.68)):
        job(ops, ratio)
    assert estimating.overheads("cpu", "tabular", "mlp").scale == pytest.approx(0.71)


def test_a_budgeted_jobs_iteration_counts_what_its_plan_adds():
    base = dict(n_train=128, n_val=0, batch_size=64, epochs=1, validate_epochs=False)
    assert estimate(_seq(1.0, 2.0, 0.5), **base, plan_extra=0.5).seconds == pytest.approx(2 * 4.0)


def test_a_first_job_teaches_only_its_one_off_cost(learned):
    est = estimate(_seq(0.001, 0.002, 0.001), n_train=640, n_val=0, batch_size=64, epochs=2, validate_epochs=False,
                   cold=True)
    estimating.learn("cpu", "tabular", "mlp", est, Measured(epochs=[0.04, 0.04], steps=[0.04, 0.04], finish=1.0))
    got = estimating.overheads("cpu", "tabular", "mlp")
    assert got.cold == pytest.approx(0.5 * (1.0 + 0.08 - est.seconds))   # half way from none
    assert (got.scale, got.epoch, got.finish) == (1.0, 0.0, 0.0)


@pytest.mark.slow   # ~2 s: two trainings
def test_a_linear_models_estimate_includes_its_fixed_costs_once_one_ran(rows, learned):
    from dbml.core.training import first_job
    first_job()   # a process's first job teaches only its one-off costs: this one is never it, whatever ran before
    train(rows, "'m', 'rows', label := 'y', arch := 'linear', epochs := 3, early_stop := false")
    (key, fixed), = [(k, v) for k, v in estimating._table().items() if k.endswith("/tabular/linear")]
    assert fixed.finish > 0 and fixed.epoch + fixed.batch > 0   # storing, streaming: learned from the job
    second = train(rows, "'m', 'rows', label := 'y', arch := 'linear', epochs := 3, early_stop := false")
    # every part of an estimate is >= 0: the second says at least its epochs' and its finish's fixed costs
    assert second["estimated_seconds"] >= fixed.finish + 3 * fixed.epoch


FRESH = """
import json, sys
import dbml
from dbml.core import training
said = []
def recording(*args, **kwargs):
    said.append({"startup": kwargs["startup"], "cold": kwargs["cold"]})
    return estimate(*args, **kwargs)
estimate, training.estimate = training.estimate, recording
con = dbml.connect()
con.execute("CREATE TABLE t AS SELECT range % 7 AS a, range % 3 AS y FROM range(200)")
for _ in range(2):
    con.sql("SELECT train('m', 't', label := 'y', epochs := 1)").fetchall()
print(json.dumps(said))
"""


@pytest.mark.slow   # ~6 s: a fresh process imports torch
def test_a_fresh_processs_first_job_counts_its_start_up_and_one_off_costs_a_warm_one_not():
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, timeout=300, check=True)
    first, second = json.loads(out.stdout.strip().splitlines()[-1])
    assert first["cold"] and not second["cold"]
    # the first statement imported torch and the scheduler before its estimate: seconds, not milliseconds
    assert first["startup"] > 0.5 and first["startup"] > 3 * second["startup"]
