"""benchmarks/memtrack.py, the benchmark's one memory truth: exact on a hand-computed
step, views and frees, other threads, host copies, torch.compile'd regions, and dbml's
ScheduledStep against its own ledger."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.nn.functional as F

from dbml.bench import memtrack
from dbml.bench.memtrack import (MemoryTracker, downsample, host_copy, is_host, live_tensors, mark_host,
                                 measure_step)
from helpers import cnn

F32 = 4


@pytest.fixture
def single_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# -- a step whose peak is computed by hand ---------------------------------------------------
@pytest.mark.usefixtures("single_thread")
def test_peak_of_an_mlp_adam_step_is_the_hand_computed_one():
    """Linear(64 -> 128) and Linear(128 -> 10), no biases, Adam (single-tensor), batch 4.
    W1 = 128*64*4 = 32768 B, W2 = 10*128*4 = 5120 B, P = W1 + W2 = 37888 B.

    Alive throughout: parameters (P), Adam's exp_avg and exp_avg_sq (2P), its two ``step``
    scalars (8 B), the batch x (4*64*4 = 1024 B) and y (4 int64 = 32 B). Gradients were
    freed by ``zero_grad(set_to_none=True)``.

    Backward's largest moment adds both gradients (P) and a few small activations
    (< 5 KB). The optimizer's, with every gradient alive (P) and the loss (4 B), adds for
    W1 ``exp_avg_sq.sqrt()`` and its quotient by the bias correction alive together
    (2 * W1 = 65536 B, more than the activations) before ``addcdiv_``. So the peak is
    4P + 2*W1 + 8 + 1024 + 32 + 4 = 151552 + 65536 + 1068 = 218156 B."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10, bias=False))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    x, y = torch.randn(4, 64), torch.randint(0, 10, (4,))

    def step():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    step()                               # Adam's state exists from here
    opt.zero_grad(set_to_none=True)
    tracker = measure_step(step, live_tensors(model, opt, x, y))
    w1, p = 128 * 64 * F32, (128 * 64 + 10 * 128) * F32
    assert tracker.base_bytes == 3 * p + 8 + 1024 + 32
    assert tracker.device_peak_bytes == 4 * p + 2 * w1 + 8 + 1024 + 32 + 4 == 218156
    assert tracker.host_peak_bytes == 0
    assert tracker.result.ndim == 0


# -- counting rules ---------------------------------------------------------------------
def test_views_count_once_and_frees_stop_counting():
    with MemoryTracker(record=True) as m:
        a = torch.zeros(1000)                          # 4000 B
        v, w = a.view(10, 100), a[::2]                 # views: nothing new
        assert m.current_device_bytes == 4000
        b = (v + 1).sum()                              # 4000 B temporary, then 4 B
        del a, v, w
        c = torch.zeros(10) + b                        # the 4000 B are noticed freed here
    assert m.device_peak_bytes == 8000 + 4
    assert m.current_device_bytes == 4 + 40 + 40 - 40  # b and c; torch.zeros(10) freed
    assert c.shape == (10,)
    assert max(d for _, d, _ in m.timeline) == m.device_peak_bytes
    assert all(t1 <= t2 for (t1, _, _), (t2, _, _) in zip(m.timeline, m.timeline[1:]))


def test_an_input_alive_before_the_call_counts_from_the_start():
    x = torch.ones(1000)
    with MemoryTracker(record=True) as m:
        y = torch.zeros(2000)                          # 8000 B
        del y
        z = x + 1                                      # x discovered: alive throughout
    assert m.device_peak_bytes == 4000 + 8000 and z.numel() == 1000
    assert m.timeline[0][1] == 4000                    # earlier points include x too


def test_another_threads_allocation_counts_only_through_track():
    kept = []
    with MemoryTracker() as m:
        t = threading.Thread(target=lambda: kept.append(torch.ones(500)))   # 2000 B
        t.start(), t.join()
        assert m.current_device_bytes == 0             # a dispatch mode is thread-local
        t = threading.Thread(target=lambda: m.track(kept[0]))
        t.start(), t.join()
        assert m.current_device_bytes == 2000
        m.track(kept[0][:10])                          # the same storage again: a no-op
        kept.clear()
        torch.zeros(1)                                 # the free is noticed at the next op
    assert m.device_peak_bytes == 2000 and m.current_device_bytes == 0


def test_host_copies_count_as_host_never_as_device():
    a = torch.ones(1000)
    with MemoryTracker([a]) as m:
        h = host_copy(a)                               # allocated with the mode suspended
        assert is_host(h) and is_host(h[:10]) and not is_host(a)
        assert (m.current_device_bytes, m.current_host_bytes) == (4000, 4000)
        back = h * 1                                   # a swap-in: device memory again
        h.add_(1)                                      # a host storage used by an op: still host
        t = torch.zeros(250)                           # 1000 B, counted as device...
        mark_host(t)                                   # ...until tagged host
        assert (m.current_device_bytes, m.current_host_bytes) == (8000, 5000)
    assert m.device_peak_bytes == 9000 and m.host_peak_bytes == 5000
    assert torch.equal(back, a) and torch.equal(h, a + 1)


def test_downsample_keeps_the_peak_of_each_bucket():
    timeline = [(float(i), (i * 37) % 101, 0) for i in range(1000)]
    small = downsample(timeline, 50)
    assert len(small) == 50
    assert max(p[1] for p in small) == 100
    assert [p[0] for p in small] == sorted(p[0] for p in small)
    assert downsample(timeline[:10], 50) == timeline[:10]
    with pytest.raises(ValueError, match="n must be positive"):
        downsample(timeline, 0)


# -- torch.compile -------------------------------------------------------------------------
def _compiled_graphs() -> int:
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


@pytest.mark.slow
def test_a_compiled_region_runs_compiled_and_its_buffers_are_seen():
    """aot_eager runs the compiled aten graph through the dispatcher at runtime; FX frees
    each intermediate after its last use, so the peak is x + sin + mul = 3 * 400000 B.
    The compile itself (fake tensors) runs with the tracker off and counts nothing."""
    torch._dynamo.reset()

    def f(x):
        return (x.sin() * 2).cos().sum(0)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    x = torch.randn(1000, 100)
    before = _compiled_graphs()
    tracker = measure_step(lambda: compiled(x), [x])   # the first call compiles, under the tracker
    assert _compiled_graphs() == before + 1            # compiled while the tracker was on
    assert tracker.device_peak_bytes == 3 * 400_000 and tracker.ops == 4
    assert torch.equal(tracker.result, f(x))

    class Skipping(MemoryTracker):                     # the default: dynamo skips the frame
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return False

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager")
    before = _compiled_graphs()
    with Skipping([x]):
        compiled(x)
    assert _compiled_graphs() == before
    torch._dynamo.reset()


# -- dbml: the tracker against the runner's ledger ----------------------------------------
def _scheduled_cnn_at_half_the_eager_peak():
    from dbml.scheduler.execute.runner import ScheduledStep
    from dbml.scheduler.execute.step import EagerStep
    from dbml.scheduler.graph.optim import OptimizerSpec
    from dbml.scheduler.latency.estimate import RooflineModel

    spec = OptimizerSpec("adam", lr=1e-3)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(16, 3, 12, 12, generator=g), torch.randint(0, 10, (16,), generator=g)
    torch.manual_seed(0)
    model = cnn()
    eager = EagerStep(copy.deepcopy(model), F.cross_entropy, spec)
    for _ in range(3):
        eager.step(x, y)
    vanilla = measure_step(lambda: eager.step(x, y), live_tensors(eager.model, eager.optimizer, x, y))
    budget = vanilla.device_peak_bytes // 2
    step = ScheduledStep(copy.deepcopy(model), F.cross_entropy, spec, budget_bytes=budget,
                         latency_model=RooflineModel())
    memtrack.instrument(step)   # before its first step: every host buffer is tagged host
    for _ in range(2):
        step.step(x, y)          # planned, past the first (capturing) iteration
    tracker = measure_step(lambda: step.step(x, y), live_tensors(None, None, step.state.values, x, y),
                           instrument=lambda t: memtrack.tracking_dbml(step, t), record=True)
    step.finish()
    return tracker, step, budget


def _check_against_the_ledger(tracker, step, budget):
    ledger_peak = step.stats()["measured_peak_bytes"]
    assert step.executors()[0].counts["swap_outs"] > 0 and tracker.tracked > 0
    assert tracker.host_peak_bytes > 0                  # the swapped-out copies
    assert abs(tracker.device_peak_bytes - ledger_peak) <= 0.02 * ledger_peak, \
        f"tracker {tracker.device_peak_bytes} B, ledger {ledger_peak} B"
    assert tracker.device_peak_bytes <= budget


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_dbml_peak_matches_its_ledger_without_the_reuse_pool(monkeypatch):
    """With the executor's reuse pool off, every device storage is one the ledger counts:
    the tracker's peak is the ledger's (observed: equal), within the budget, and the
    copies the copy thread made are host memory."""
    import dbml.scheduler.execute.program as program
    monkeypatch.setattr(program, "MIN_REUSE_BYTES", 1 << 62)   # no op output taken from a pool
    _check_against_the_ledger(*_scheduled_cnn_at_half_the_eager_peak())


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_dbml_peak_with_the_reuse_pool_stays_within_the_budget():
    """Regression: the tracker found the executor's reuse pool outside the budget (a swap-in
    issued while the pool held buffers did not make it give them back: ledger + pool reached
    462740 B against a 409916 B budget). Every ledger growth now shrinks the pool."""
    _check_against_the_ledger(*_scheduled_cnn_at_half_the_eager_peak())


@pytest.mark.slow
def test_inductor_buffers_are_seen_only_once_reported():
    """Inductor allocates below the dispatcher: its pointwise-only code dispatches no aten
    op at all. With see_inductor_buffers() called before compiling, both outputs count:
    x + out + sums = 240000 + 240000 + 800 B (the fused kernel keeps no intermediate)."""
    def f(x):
        return (x.sin() * 2).cos() + x, x.exp().sum(0)

    x = torch.randn(300, 200)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="inductor")
    compiled(x)
    unseen = measure_step(lambda: compiled(x), [x])
    assert unseen.ops == 0 and unseen.device_peak_bytes == 240_000    # the base only

    memtrack.see_inductor_buffers()
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="inductor")
    compiled(x)
    seen = measure_step(lambda: compiled(x), [x])
    assert seen.ops == 0 and seen.device_peak_bytes == 240_000 + 240_000 + 800
    torch.testing.assert_close(seen.result[0], f(x)[0], atol=1e-4, rtol=1e-4)   # vectorised sin/cos
    torch._dynamo.reset()
