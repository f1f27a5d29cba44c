"""The executor performs plans exactly: hand-made plans (independent of the planner's
choices) exercise swaps, recomputation, cross-iteration swapping and passive swaps.

Every test compares with eager PyTorch bit for bit, checks the event log (no op read
a tensor that was not resident) and compares the executor's ledger with peak.py."""

from __future__ import annotations

import copy

import pytest
import torch

from dbml.scheduler.graph.access import build_sequence
from dbml.scheduler.graph.capture import capture, init_state
from dbml.scheduler.execute.devices import CopyChannel, CpuDevice, CudaDevice, make_device
from dbml.scheduler.latency.estimate import Machine, RooflineModel
from dbml.scheduler.execute.executor import ExecState, ExecutionError, Executor, Program, check_event_log
from dbml.scheduler.plan.liveness import analyse_liveness, release_events
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.plan.peak import analyse_peak, host_at_start
from dbml.scheduler.graph.sequence import Event, EventKind, Plan, TensorKind
from dbml.scheduler.execute.step import EagerStep
from helpers import assert_identical
from sequences import check_plan

SO, SI, R, RC = EventKind.SWAP_OUT, EventKind.SWAP_IN, EventKind.RELEASE, EventKind.RECOMPUTE
MACHINE = Machine(peak_flops=5e9, memory_bandwidth=5e9, copy_bandwidth=2e9, op_overhead=5e-6)
loss_fn = torch.nn.functional.cross_entropy


pytestmark = pytest.mark.usefixtures("one_thread")


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                               torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def deep_mlp():
    layers = [m for _ in range(8) for m in (torch.nn.Linear(64, 64), torch.nn.Tanh())]
    return torch.nn.Sequential(*layers, torch.nn.Linear(64, 10))


def batches(n=3, b=32, shape=(32,)):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(b, *shape, generator=g), torch.randint(0, 10, (b,), generator=g)) for _ in range(n)]


class Harness:
    """A captured step, its sequence, and eager reference parameters."""

    def __init__(self, model_fn=mlp, spec=OptimizerSpec("adam", lr=1e-2), data=None):
        self.model_fn, self.spec = model_fn, spec
        self.data = data or batches()
        torch.manual_seed(0)
        self.model = model_fn()
        self.captured = capture(copy.deepcopy(self.model), loss_fn, spec, self.data[0])
        self.seq = build_sequence(self.captured, RooflineModel(MACHINE))
        self.live = analyse_liveness(self.seq)

    def eager(self):
        m = copy.deepcopy(self.model)
        step = EagerStep(m, loss_fn, self.spec)
        torch.manual_seed(1)
        losses = [step.step(x, y) for x, y in self.data]
        return list(m.parameters()) + list(m.buffers()), losses

    def plan(self, events):
        events = tuple(sorted(events, key=lambda e: (e.trigger, e.delay)))
        peak = analyse_peak(self.seq, events)
        vanilla = analyse_peak(self.seq, release_events(self.seq))
        return Plan(self.seq.job, events, peak.bytes, vanilla.bytes,
                    host_at_start=host_at_start(self.seq, events))

    def run(self, plan, budget=None):
        m = copy.deepcopy(self.model)
        params = [p.detach() for p in m.parameters()]
        state = ExecState(params + [b.detach() for b in m.buffers()]
                          + [t for p in params for t in init_state(self.spec, p).values()])
        ex = Executor(Program(self.captured, self.seq), plan, CpuDevice(), log=True, budget_bytes=budget)
        torch.manual_seed(1)
        losses, peaks = [], []
        try:
            for x, y in self.data:
                losses.append(ex.run(state, x, y))
                peaks.append(ex.iteration_peak)
        finally:
            ex.close()
        n = len(list(m.parameters())) + len(list(m.buffers()))
        for i in range(n):   # bring everything back from the host store
            if state.values[i] is None:
                like = self.captured.placeholders()[i].meta["val"]
                flat = state.host.pop(i)
                state.values[i] = torch.empty(0, dtype=like.dtype).set_(
                    flat.untyped_storage(), 0, like.shape, like.stride())
        return state.values[:n], losses, ex, peaks


def swap_gaps(h: Harness, min_gap: int = 4):
    """Swap out every activation across its longest gap between accesses, and back in
    one op before the access after the gap."""
    events = list(release_events(h.seq))
    for t in h.seq.tensors:
        if t.kind is not TensorKind.ACTIVATION or t.id in h.seq.outputs:
            continue
        acc = [h.live.gen[t.id]] + list(h.live.accesses[t.id])
        gaps = [(b - a, a, b) for a, b in zip(acc, acc[1:]) if b - a >= min_gap]
        if gaps:
            _, a, b = max(gaps)
            events += [Event(a, 0.0, SO, t.id), Event(b - 2, 0.0, SI, t.id, before=b)]
    return events


# -- bit identity and the ledger --------------------------------------------------------

def test_release_only_plan_matches_eager_and_peak_analysis():
    h = Harness()
    want, want_losses = h.eager()
    plan = h.plan(release_events(h.seq))
    got, losses, ex, peaks = h.run(plan)
    assert_identical(got, want)
    assert all(torch.equal(a, b) for a, b in zip(losses, want_losses))
    assert check_event_log(ex.event_log) == []
    assert peaks == [plan.peak_bytes] * len(peaks)  # release-only: no timing, exact


def test_swaps_are_performed_and_change_nothing():
    h = Harness()
    want, _ = h.eager()
    plan = h.plan(swap_gaps(h))
    assert plan.count(SO) >= 5 and plan.peak_bytes < plan.vanilla_peak_bytes
    got, _, ex, peaks = h.run(plan, budget=plan.peak_bytes)
    assert_identical(got, want)
    assert check_event_log(ex.event_log) == []
    assert ex.totals["swap_outs"] == ex.totals["swap_ins"] == plan.count(SO) * len(h.data)
    assert ex.totals["passive_swaps"] == 0
    assert max(peaks) <= plan.peak_bytes
    assert max(peaks) >= 0.95 * plan.peak_bytes


def test_recompute_reruns_the_generating_op():
    h = Harness()
    want, _ = h.eager()
    events = list(release_events(h.seq))
    picked = _recompute_candidate(h)
    t, a, b = picked
    events += [Event(a, 0.0, R, t), Event(b - 1, 0.0, RC, t, before=b)]
    plan = h.plan(events)
    got, _, ex, _ = h.run(plan)
    assert_identical(got, want)
    assert ex.totals["recomputes"] == len(h.data)
    assert check_event_log(ex.event_log) == []
    logged = [e for e in ex.event_log if e[0] == "recompute"]
    assert logged and all(e[2] == t for e in logged)


def _recompute_candidate(h: Harness):
    """A replayable activation with a gap between two accesses whose generating op's
    inputs are all still alive at the later access."""
    seq, live = h.seq, h.live
    for t in seq.tensors:
        if t.kind is not TensorKind.ACTIVATION or t.not_replayable or t.id in seq.outputs:
            continue
        g = live.gen[t.id]
        acc = list(live.accesses[t.id])
        for a, b in zip([g] + acc, acc):
            if b - a < 3 or a == g:
                continue
            if all(s in seq.initial or live.last_access(s) >= b for s in seq.ops[g].inputs):
                return t.id, a, b
    raise AssertionError("no recompute candidate in the test model")


def test_random_tensor_is_never_recomputed():
    """Dropout's scaled mask released too early (a plan bug): rebuilding it would need
    the random mask again, and the executor refuses to draw a new one."""
    h = Harness()
    mask = next(t for t in h.seq.tensors if t.not_replayable and t.kind is TensorKind.ACTIVATION)
    scaled = h.seq.ops[h.live.accesses[mask.id][0]].outputs[0]
    events = list(release_events(h.seq))
    events.append(Event(h.live.accesses[scaled][0], 0.0, R, scaled))
    plan = Plan(h.seq.job, tuple(sorted(events)), 0, 0)
    with pytest.raises(ExecutionError, match="cannot be recomputed"):
        h.run(plan)


def test_late_or_missing_swap_in_is_passive_and_counted():
    h = Harness()
    want, _ = h.eager()
    events = [e for e in swap_gaps(h) if e.kind is not SI]  # swap-outs only
    plan = Plan(h.seq.job, tuple(sorted(events)), 0, 0)
    got, _, ex, _ = h.run(plan)
    assert_identical(got, want)
    assert ex.totals["passive_swaps"] == plan.count(SO) * len(h.data) > 0
    assert check_event_log(ex.event_log) == []


@pytest.mark.slow   # ~0.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_cross_iteration_swaps_updated_state_and_prefetches_it():
    """Updated optimizer state leaves in the optimizer phase, comes back just before its
    next use in the next iteration: the device never holds params + state together."""
    h = Harness(deep_mlp, data=batches(4, b=4, shape=(64,)))  # parameters and state dominate
    want, _ = h.eager()
    events = list(release_events(h.seq))
    moved = 0
    for n, o in h.seq.updates.items():
        if h.seq.tensors[o].kind is not TensorKind.OPT_STATE or h.seq.tensors[o].nbytes < 1024:
            continue
        first = h.live.accesses[o][0]
        events += [Event(h.live.last_access(n), 0.0, SO, n), Event(first - 1, 0.0, SI, o, before=first)]
        moved += 1
    plan = h.plan(events)
    assert moved >= 4 and len(plan.host_at_start) == moved
    initial = sum(h.seq.tensors[t].nbytes for t in h.seq.initial)
    assert plan.peak_bytes < initial   # below params + optimizer state + batch
    got, _, ex, peaks = h.run(plan, budget=plan.peak_bytes)
    assert_identical(got, want)
    assert check_event_log(ex.event_log) == []
    assert ex.totals["setup_swaps"] == moved          # first iteration only
    assert ex.totals["passive_swaps"] == 0
    assert ex.totals["swap_ins"] == moved * len(h.data)
    assert max(peaks) <= plan.peak_bytes


def test_batchnorm_running_stats_and_last_smaller_batch_graph():
    def cnn():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                                   torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10))
    h = Harness(cnn, OptimizerSpec("sgd", lr=0.05), data=batches(3, 8, (3, 6, 6)))
    want, _ = h.eager()
    got, _, ex, _ = h.run(h.plan(swap_gaps(h, 3)))
    assert_identical(got, want)   # includes running_mean, running_var, num_batches_tracked


def test_batchnorm_recomputed_on_copies_of_its_statistics_is_bit_identical():
    """A recompute of BatchNorm's output (and of ReLU's through it, a chain) re-runs the
    op on copies of its running statistics: the same bits, and the statistics updated once
    per step, as eager updates them."""
    def cnn():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                                   torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10))
    h = Harness(cnn, OptimizerSpec("sgd", lr=0.05), data=batches(3, 8, (3, 6, 6)))
    want, _ = h.eager()
    names = {op.index: op.name for op in h.seq.ops}
    bn_op = next(i for i, n in names.items() if n.startswith("native_batch_norm") and h.seq.ops[i].phase.value == "forward")
    bn_out = h.seq.ops[bn_op].outputs[0]
    relu_op = next(i for i in range(bn_op + 1, len(names)) if bn_out in h.seq.ops[i].inputs and h.seq.ops[i].outputs)
    relu_out = h.seq.ops[relu_op].outputs[0]
    assert not h.seq.tensors[bn_out].not_replayable
    acc = list(h.live.accesses[relu_out])
    a, b = acc[-2], acc[-1]   # relu's output: released after its last forward read, remade for backward
    assert b - a >= 2 and h.live.last_access(bn_out) < b
    events = list(release_events(h.seq)) + [Event(a, 0.0, R, relu_out), Event(b - 1, 0.0, RC, relu_out, b, (bn_out,))]
    plan = h.plan(events)
    check_plan(h.seq, plan)
    got, _, ex, peaks = h.run(plan, budget=plan.peak_bytes)
    assert_identical(got, want)   # includes running_mean, running_var, num_batches_tracked
    assert ex.totals["recomputes"] == len(h.data) and ex.totals["passive_recomputes"] == 0
    assert check_event_log(ex.event_log) == []
    assert max(peaks) <= plan.peak_bytes


def test_released_buffers_are_reused_within_the_planned_peak():
    """Pointwise outputs go over their dying input or into released buffers (no fresh
    allocation); the pool never makes ledger + pool exceed the plan's peak, and results
    stay bit-identical."""
    def wide():
        return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                   torch.nn.ReLU(), torch.nn.Linear(512, 10))
    h = Harness(wide, data=batches(3, b=64, shape=(64,)))
    want, _ = h.eager()
    plan = h.plan(release_events(h.seq))
    got, _, ex, peaks = h.run(plan)
    assert_identical(got, want)
    assert ex.totals["reused_buffers"] > 0
    assert ex.prog.overwrites > 0      # pointwise ops writing over their dying input
    assert ex.reserved_peak <= plan.peak_bytes
    assert peaks == [plan.peak_bytes] * len(peaks)


def test_release_and_swap_in_again_of_a_running_stat_uses_its_new_value():
    """BatchNorm writes its running statistics in place: a host copy made before that
    is stale, and "release, swap in again" must bring back the updated value."""
    def cnn():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                                   torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10))
    h = Harness(cnn, OptimizerSpec("sgd", lr=0.05), data=batches(2, 8, (3, 6, 6)))
    want, _ = h.eager()
    rm = next(t.id for t in h.seq.tensors if t.kind is TensorKind.BUFFER and t.nbytes == 16)
    f, b = h.live.accesses[rm][0], h.live.accesses[rm][-1]
    assert b > f + 2, "the running mean is read again by the backward op"
    events = list(release_events(h.seq)) + [
        Event(-1, 0.0, SO, rm), Event(f - 1, 0.0, SI, rm, before=f),
        Event(f, 0.0, R, rm), Event(b - 1, 0.0, SI, rm, before=b)]
    got, _, ex, _ = h.run(Plan(h.seq.job, tuple(sorted(events)), 0, 0))
    assert_identical(got, want)
    assert ex.totals["refresh_swaps"] == len(h.data)
    assert check_event_log(ex.event_log) == []


# -- invariant checker, devices ---------------------------------------------------------

def test_event_log_checker_reports_nonresident_reads():
    assert check_event_log([("op", 3, (1, 2), (True, False))]) == ["op 3 read tensor 2 while it was not resident"]
    assert check_event_log([("op", 3, (1, 2), (True, True)), ("swap_out", 3, 1)]) == []


def test_copy_channel_runs_jobs_in_issue_order_not_before_issue_time():
    import time
    ch = CopyChannel()
    seen = []
    t0 = time.perf_counter()
    ch.submit(t0 + 0.02, lambda: seen.append(("late", time.perf_counter() - t0)))
    ch.submit(t0, lambda: seen.append(("now", time.perf_counter() - t0)))
    ch.drain()
    ch.close()
    assert [s[0] for s in seen] == ["now", "late"]
    assert seen[1][1] >= 0.02


def test_copy_channel_reraises_job_errors():
    ch = CopyChannel()
    ch.submit(0.0, lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        ch.drain()
    ch.close()


def test_cpu_device_round_trip_is_bitwise():
    from dbml.scheduler.execute.devices import as_view, storage_bytes
    dev = CpuDevice()
    t = torch.randn(5, 7).t()           # a non-contiguous view
    host = dev.copy_out(storage_bytes(t), dev.compute_marker())
    back = dev.alloc(host.numel())
    dev.use_on_compute(back, dev.copy_in(host, back))
    v = as_view(back, t.dtype, t.shape, t.stride(), t.storage_offset())
    assert torch.equal(v, t) and v.data_ptr() != t.data_ptr()


def test_cuda_backend_interface_on_cpu():
    """The pinned pool and the interface work without a GPU; asking for cuda without one
    is a clear error, not an import error."""
    dev = CudaDevice.__new__(CudaDevice)
    CudaDevice.__init__(dev, "cuda", pin=False) if torch.cuda.is_available() else _cpu_cuda(dev)
    dev.reserve_host([64, 64, 128])
    a = dev.host_buffer(64)
    dev.free_host(a)
    assert dev.host_buffer(64).data_ptr() == a.data_ptr()   # reused, not reallocated
    assert dev.host_buffer(128).numel() == 128
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            make_device("cuda")


def _cpu_cuda(dev):
    import threading
    from collections import defaultdict
    dev.torch_device, dev.pin = torch.device("cuda"), False
    dev._pool, dev._pool_lock, dev._copy_stream = defaultdict(list), threading.Lock(), None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_scheduled_step_equals_eager_within_three_quarters_of_its_peak():
    """The CUDA path end to end (streams, pinned host copies, the allocator's own peak): a
    scheduled Adam step under a budget below eager's allocator peak gives eager's weights bit
    for bit, and once its first iterations have measured the allocator (cuBLAS's workspace and
    every temporary included, not only the plan's tensors), it stays within the budget."""
    from dbml.scheduler.execute.runner import ScheduledStep
    spec = OptimizerSpec("adam", lr=1e-2)
    data = [(x.cuda(), y.cuda()) for x, y in batches(n=4, b=64, shape=(64,))]

    def model():
        torch.manual_seed(0)
        return deep_mlp().cuda()

    eager = model()
    step = EagerStep(eager, loss_fn, spec)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for x, y in data + data:
        step.step(x, y)
    torch.cuda.synchronize()
    vanilla = torch.cuda.max_memory_allocated()   # the process's: batches and workspaces included
    want = [p.detach().cpu() for p in eager.parameters()]
    del step, eager
    probe = ScheduledStep(model(), loss_fn, spec, device="cuda", policy="none")
    probe.step(*data[0])
    tensors = probe.stats()["vanilla_peak_bytes"]   # the graph's own tensors at their peak
    probe.close()
    del probe
    torch.cuda.empty_cache()
    budget = vanilla - tensors // 4   # a quarter of the tensors' peak must be saved
    scheduled = model()
    run = ScheduledStep(scheduled, loss_fn, spec, device="cuda", policy="tensile", budget_bytes=budget)
    for x, y in data:   # its first iterations measure what the allocator holds beside the plan
        run.step(x, y)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for x, y in data:
        run.step(x, y)
    torch.cuda.synchronize()
    steady = torch.cuda.max_memory_allocated()
    run.finish()
    stats = run.stats()
    assert_identical([p.cpu() for p in scheduled.parameters()], want)
    assert stats["swaps"] + stats["recomputes"] > 0, stats   # the budget bound something
    assert run.device_reserve > 0
    assert steady <= budget, (steady, budget, run.device_reserve)


def test_delayed_swap_in_is_issued_when_its_op_starts():
    """A swap-in planned to start inside op j is issued at op j's start (plus the rest
    of its delay), never earlier relative to the ops: slow ops cannot make it early."""
    from dbml.scheduler.execute.executor import _swap_in_slot
    starts, ends = [0.0, 1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0, 5.0]
    slot, delay = _swap_in_slot(Event(0, 1.5, SI, 7, before=4), starts, ends)
    assert (slot, delay) == (2, 0.5)          # performed after op 1, i.e. when op 2 starts
    assert _swap_in_slot(Event(0, 0.25, SI, 7, before=4), starts, ends) == (1, 0.25)
    assert _swap_in_slot(Event(0, 9.0, SI, 7, before=3), starts, ends)[0] == 3   # not after its use


def test_a_swap_in_never_runs_before_its_delayed_swap_out():
    """Compute ahead of the plan: a swap-out due 50 ms after its op, and the swap-in of the
    same tensor issued at the next op, which is due earlier. The channel runs jobs by due
    time, so the swap-in must wait for the swap-out's copy (it once ran first: KeyError)."""
    h = Harness()
    want, _ = h.eager()
    events = list(release_events(h.seq))
    t = next(t for t in h.seq.tensors if t.kind is TensorKind.ACTIVATION and t.id not in h.seq.outputs
             and len(h.live.accesses[t.id]) and h.live.accesses[t.id][-1] - h.live.gen[t.id] >= 3)
    a, b = h.live.gen[t.id], h.live.accesses[t.id][-1]
    events += [Event(a, 0.05, SO, t.id), Event(a + 1, 0.0, SI, t.id, before=b)]
    got, _, ex, _ = h.run(h.plan(events))
    assert_identical(got, want)
    assert ex.totals["swap_outs"] == ex.totals["swap_ins"] == len(h.data)


@pytest.mark.slow   # ~3.6 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_chain_of_recomputation_runs_and_changes_nothing():
    """Copies too slow to hide: the planner recomputes in chains (Event.via); the executor
    remakes each chain's tensors from the resident ones and drops them again, within the
    plan's peak as its limit (as the runner runs it: here the CPU copies far faster than
    the plan assumed, so timing differs; the replay checker holds the plan's analysis to
    the byte, tests/test_planner.py)."""
    from dbml.scheduler.plan.planner import PlanSettings, plan
    slow = Machine(peak_flops=5e9, memory_bandwidth=5e9, copy_bandwidth=2e5, op_overhead=5e-6)
    h = Harness(deep_mlp, data=batches(shape=(64,)))
    h.seq = build_sequence(h.captured, RooflineModel(slow))
    want, _ = h.eager()
    vanilla = plan(h.seq, 1 << 62, policy="none").peak_bytes
    plans = (plan(h.seq, int(vanilla * frac), settings=PlanSettings()) for frac in (0.9, 0.85, 0.8, 0.75, 0.7))
    chosen = next(p for p in plans if any(e.via for e in p.events))
    check_plan(h.seq, chosen)
    got, _, ex, peaks = h.run(chosen, budget=chosen.peak_bytes)
    assert_identical(got, want)
    assert check_event_log(ex.event_log) == []
    assert ex.totals["recomputes"] >= len(h.data) and ex.totals["passive_recomputes"] == 0
    assert max(peaks) <= chosen.peak_bytes


def test_a_passive_swap_in_over_the_budget_waits_for_the_swap_outs_in_flight():
    """A swap-in or recompute the plan did not schedule (passive: a tensor needed before its
    planned return) takes room as a planned one does: over the budget, it waits for the
    swap-outs in flight to land rather than pass the limit. (Without an evictor, TENSILE's
    mode, it used to take the room at once: a rare ``BudgetExceeded`` under load.)"""
    import threading
    import time
    h = Harness()
    budget = 1 << 20
    ex = Executor(Program(h.captured, h.seq), h.plan(release_events(h.seq)), CpuDevice(), budget_bytes=budget)
    try:
        assert ex.evictor is None                       # the plan's mode: no passive evictor
        landed = threading.Event()
        ex.mem.hold(budget - 64)
        ex.mem.on_copy = 4096                           # a swap-out still on the copy channel
        ex.mem.on_compute -= 4096
        ex.transfers.inflight_out.add(-1)

        def copy_lands():
            time.sleep(0.2)
            with ex.mem.cv:
                ex.mem.copied_out(4096)
                ex.transfers.inflight_out.discard(-1)
                landed.set()
                ex.mem.cv.notify_all()

        def swap_in_now(sid, k, service, room):         # the tensor is on the host: swapped in now
            room(1024, k)
            return True

        ex.transfers.fetch = swap_in_now
        threading.Thread(target=copy_lands, daemon=True).start()
        ex._fetch(0, 0)                                 # op 0 needs a tensor that is not resident
        assert landed.is_set(), "the passive swap-in took its room before the swap-out in flight landed"
        assert ex.mem.total + 1024 <= budget
    finally:
        ex.close()
