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
