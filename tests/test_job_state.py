"""Issue 21, per-job state: a job draws its dropout masks from a generator of its own and
sets PyTorch's threads for its own thread only, so jobs running together give the same
models as each alone, and the process's generator and thread count are left as they were."""

from __future__ import annotations

import threading

import pytest
import torch

from dbml.core import threads


def _weights(con, name: str) -> bytes:
    return con.execute("SELECT weights FROM dbml_weights WHERE name = ?", [name]).fetchall()[0][0]


TRAIN = ("SELECT train(?, 'moons', label := 'label', epochs := 3, batch_size := 16, hidden := [32, 32], "
         "dropout := 0.5, seed := 11, policy := ?)")


@pytest.mark.slow   # ~5.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_jobs_with_dropout_running_together_equal_each_alone(moons_con):
    moons_con.execute(TRAIN, ["alone", "tensile"])
    cursors = [moons_con.cursor() for _ in range(3)]
    runs = [threading.Thread(target=c.execute, args=(TRAIN, [f"together{i}", policy]))
            for i, (c, policy) in enumerate(zip(cursors, ("tensile", "tensile", "eager")))]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    alone = _weights(moons_con, "alone")
    # the scheduled jobs draw through the generator kwarg, the eager one through the default
    # generator swapped under the lock: the same masks either way
    assert [_weights(moons_con, f"together{i}") == alone for i in range(3)] == [True] * 3


@pytest.mark.slow   # ~1.5 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_job_leaves_the_processs_generator_as_it_was(moons_con):
    before = torch.get_rng_state()
    moons_con.execute(TRAIN, ["m", "tensile"])
    moons_con.execute(TRAIN, ["e", "eager"])
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.skipif(not threads.per_thread(), reason="PyTorch's thread count is process-wide in this build")
@pytest.mark.slow   # ~0.8 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_jobs_thread_count_is_its_own(moons_con):
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        moons_con.execute("SET VARIABLE dbml_torch_threads = 1")
        moons_con.execute(TRAIN, ["m", "tensile"])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)


@pytest.mark.slow   # ~2.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_cursors_from_many_threads_at_once(con):
    import dbml
    errors = []

    def work():
        for _ in range(20):
            try:
                c = con.cursor()
                assert c.execute("SELECT getvariable('dbml_latency_model')").fetchall() == [("roofline",)]
                c.close()
            except Exception as e:   # noqa: BLE001 - every failure counts
                errors.append(repr(e))
    runs = [threading.Thread(target=work) for _ in range(8)]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    assert errors == []
    assert isinstance(con.cursor(), dbml.Connection)


@pytest.mark.slow   # ~5.0 s: out of the -m 'not slow' inner loop (under a minute)
def test_connecting_and_closing_from_many_threads_at_once(tmp_path):
    import dbml
    path = str(tmp_path / "x.duckdb")
    dbml.connect(path).close()
    errors = []

    def work():
        for _ in range(40):
            try:
                c = dbml.connect(path, latency_model="roofline")
                c.execute("SELECT count(*) FROM dbml_models").fetchall()
                c.close()
            except Exception as e:   # noqa: BLE001
                errors.append(repr(e))
    runs = [threading.Thread(target=work) for _ in range(8)]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    assert errors == []
