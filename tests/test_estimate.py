"""The run's time, estimated from the latency model before training (issue 24 part 2):
``estimated_seconds`` in dbml_jobs (train()'s ``warnings`` says when it is long), and a warning with cheaper
choices when it passes the ``slow_train_seconds`` setting."""

import dataclasses
import json
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


def test_estimate_counts_iterations_validation_and_the_measured_start_up():
    est = estimate(_seq(1.0, 2.0, 0.5), n_train=130, n_val=32, batch_size=64, epochs=10, validate_epochs=True,
                   startup=4.0)
    assert (est.iterations, est.val_batches, est.iteration, est.forward) == (3, 0.5, 3.5, 1.0)
    # the start-up (the batch shapes' captures included) + 10 x (3 x 3.5 + 0.5 x 1.0) + the last validation (0.5)
    assert est.seconds == pytest.approx(4.0 + 10 * 11.0 + 0.5)
    even = estimate(_seq(1.0, 2.0, 0.5), n_train=128, n_val=0, batch_size=64, epochs=2, validate_epochs=True)
    assert even.seconds == pytest.approx(2 * 2 * 3.5)   # no validation rows


def test_the_last_smaller_batchs_graph_is_captured_before_the_estimate_not_in_the_first_epoch(rows, monkeypatch):
    """A smaller last batch is a new graph: captured in TrainLoop.prepare, so its capture is
    in the start-up the estimate measures; its plan is made when it comes (a plan made ahead
    would ask the shared planner for room the job does not use yet)."""
    from dbml.core import training

    captured, planned, step = [], [], training.TrainLoop.step

    def first_step(self, x, y):
        if not captured:
            captured.append(len(self.runner.graphs._graphs))
            planned.append(len(self.runner._graphs))
        return step(self, x, y)

    monkeypatch.setattr(training.TrainLoop, "step", first_step)
    r = train(rows, "'m', 'rows', label := 'y', epochs := 2, batch_size := 7, validation := 0")
    assert r["status"] == "finished" and r["estimated_seconds"] is not None and r["rows"] % 7
    assert (captured, planned) == ([2], [1])


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
    assert got.finish == pytest.approx(0.4)
    # kept beside the predictor for the next process, and the kind's other archs start from it
    estimating.forget()
    assert estimating.overheads("cpu", "tabular", "linear") == got
    assert estimating.overheads("cpu", "tabular", "mlp").epoch == pytest.approx(0.05)
    # a kind never trained: the device's streaming and finishing costs, its ops at their predicted scale
    assert estimating.overheads("cpu", "image", "cnn") == Overheads(epoch=got.epoch, batch=got.batch,
                                                                   finish=got.finish)
    assert estimating.overheads("cuda", "image", "cnn") == Overheads()   # nothing ran on that device


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
    assert 0.68 <= estimating.overheads("cpu", "tabular", "mlp").scale <= 0.72


def test_a_budgeted_jobs_iteration_counts_what_its_plan_adds():
    base = dict(n_train=128, n_val=0, batch_size=64, epochs=1, validate_epochs=False)
    assert estimate(_seq(1.0, 2.0, 0.5), **base, plan_extra=0.5).seconds == pytest.approx(2 * 4.0)


def test_a_first_job_teaches_its_one_off_cost_streaming_and_storing_not_the_scale(learned):
    est = estimate(_seq(0.001, 0.002, 0.001), n_train=640, n_val=0, batch_size=64, epochs=2, validate_epochs=False,
                   cold=True)
    # its steps 0.04 s an epoch (0.1 s outside them), 1.0 s after the last
    estimating.learn("cpu", "tabular", "mlp", est, Measured(epochs=[0.14, 0.14], steps=[0.04, 0.04], finish=1.0))
    got = estimating.overheads("cpu", "tabular", "mlp")
    assert (got.scale, got.excess) == (1.0, ())                      # its first calls inflate its steps
    assert (got.epoch, got.finish) == (pytest.approx(0.1), 1.0)      # streaming and storing: as any job's
    # the one-off: what it spent beyond a later job's estimate with those figures
    assert got.cold == pytest.approx(2 * 0.14 + 1.0 - (2 * (10 * 0.004 + 0.1) + 1.0))


def test_the_scale_weighs_each_job_by_its_iterations_per_epoch(learned):
    """A job of 5 iterations an epoch ran its steps at 2.2x their prediction (two graphs'
    switches), jobs of 71 and 282 at 0.9x: the scale is theirs."""
    def job(iterations: int, ratio: float) -> None:
        est = estimate(_seq(0.0002, 0.0002, 0.0001), n_train=64 * iterations, n_val=0, batch_size=64, epochs=2,
                       validate_epochs=False)
        steps = [iterations * 0.0005 * ratio] * 2
        estimating.learn("cpu", "tabular", "linear", est, Measured(epochs=steps, steps=steps, finish=0.1))
    for iterations, ratio in ((5, 2.2), (5, 2.3), (71, 0.9), (5, 2.1), (282, 0.88)):
        job(iterations, ratio)
    assert 0.88 <= estimating.overheads("cpu", "tabular", "linear").scale <= 0.9   # unweighted: 2.1


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


def test_the_estimate_said_again_from_the_first_steps_counts_what_is_left_at_their_median():
    est = estimate(_seq(1.0, 2.0, 0.5), n_train=640, n_val=64, batch_size=64, epochs=3, validate_epochs=True,
                   learned=Overheads(epoch=0.5, batch=0.1, finish=2.0))
    # 25 of 30 iterations done in 40 s, their steps 1.5 s: 5 left at 1.5 + 0.1; no epoch's stream left to
    # start, one epoch's validation (1 batch x 1.0) and the last one's; the finish
    assert estimating.remeasured(est, 40.0, 25, [1.4, 1.5, 9.0]) == pytest.approx(40 + 5 * 1.6 + 0 + 1 + 1 + 2.0)
    assert not estimating.timed_enough([0.01] * 19) and estimating.timed_enough([0.01] * 20)
    assert estimating.timed_enough([0.4] * 3) and not estimating.timed_enough([0.4, 0.7])   # a second's worth


@pytest.mark.slow   # ~2 s: two trainings
def test_a_prediction_far_off_is_said_again_from_the_jobs_first_steps(rows, learned):
    """Jobs like this one taught a step scale 40,000x too high: the prediction said before training
    is far off, the estimate said again after its first steps is near the measured time."""
    first = train(rows, "'m', 'rows', label := 'y', arch := 'linear', epochs := 4, early_stop := false")
    for k in [k for k in estimating._table() if "/tabular/" in k]:
        known = estimating._table()[k]
        estimating._table()[k] = dataclasses.replace(known, scale=40000 * known.scale)
    r = train(rows, "'m', 'rows', label := 'y', arch := 'linear', epochs := 4, early_stop := false")
    predicted = rows.sql("SELECT (metrics->>'predicted_seconds')::DOUBLE FROM dbml_models "
                         "WHERE name = 'm' AND version = 2").fetchall()[0][0]
    assert predicted > 5 * r["seconds"], (predicted, r["seconds"])
    # the slow-job warning follows the estimate: the prediction passed 60 s, the first steps did not
    assert predicted > 60 and r["warnings"] is None, (predicted, r["warnings"])
    # a loose bound: a shared 2-core machine's load moves a short job's time
    assert 0.4 * r["seconds"] <= r["estimated_seconds"] <= 2.5 * r["seconds"], (r["estimated_seconds"], r["seconds"])
    assert first["estimated_seconds"] is not None


def test_streaming_costs_are_the_kinds_whichever_arch_taught_them(learned):
    """A linear model that ran only 5-iteration epochs takes the per-batch cost the kind's
    50-iteration MLP jobs showed, with its own scale and finish."""
    def job(arch: str, iterations: int, finish: float) -> None:
        est = estimate(_seq(0.001, 0.002, 0.001), n_train=64 * iterations, n_val=0, batch_size=64, epochs=2,
                       validate_epochs=False)
        steps = [iterations * 0.004 for _ in range(2)]
        estimating.learn("cpu", "tabular", arch, est, Measured(
            epochs=[s + 0.05 + 0.002 * iterations for s in steps], steps=steps, finish=finish))
    job("linear", 5, 0.2)
    job("mlp", 50, 0.4)
    got = estimating.overheads("cpu", "tabular", "linear")
    assert got.epoch == pytest.approx(0.05) and got.batch == pytest.approx(0.002)   # the kind's line
    assert got.finish == pytest.approx(0.2) and got.scale == pytest.approx(1.0)     # the arch's own


def test_figures_this_version_cannot_read_are_learned_afresh_not_a_failed_train(rows, learned):
    """overheads.json is shared by every dbml on the machine: an entry of another version's
    form (or a hand edit) is left out, and training goes on."""
    (learned / "overheads.json").write_text(json.dumps({
        "cpu/tabular/linear": {"scale": "fast", "excess": [[1]]},
        "cpu/tabular/*": {"scale": 1.0, "excess": [[0.1, 0.2, 5]], "rests": []},
        "cpu/*/*": [1, 2],
        "cpu/image/cnn": {"scale": 2.0, "epoch": 0.1, "excess": [[0.1, 0.2]], "rests": [[5, 0.1]], "future": 1},
    }))
    estimating.forget()
    assert set(estimating._table()) == {"cpu/image/cnn"}   # an older version's pairs and an unknown field: read
    r = train(rows, "'m', 'rows', label := 'y', arch := 'linear', epochs := 2")
    assert r["status"] == "finished" and r["estimated_seconds"] is not None


def test_the_slow_warning_said_from_the_first_steps_names_their_time():
    est = estimate(_seq(0.001, 0.002, 0.001), n_train=6400, n_val=0, batch_size=64, epochs=50, validate_epochs=False)
    spec = types.SimpleNamespace(settings=types.SimpleNamespace(slow_train_seconds=60.0), shape=None)
    text = types.SimpleNamespace(arch="transformer", inputs=Inputs("tokens", vocab=100, max_len=16))
    assert estimating.slow_warning(est, text, spec) is None           # predicted: 50 x 100 x 4 ms = 20 s
    steps = [0.02] * 20                                                # measured: 20 ms a step
    warning = estimating.slow_warning(estimating.timed(est, steps), text, spec, seconds=101.0)
    assert warning.startswith("estimated 101 s to train (50 epochs of 100 iterations, 20.0 ms each, timed over "
                              "its first steps)") and "epochs := 30" in warning and "arch := 'bow'" in warning
