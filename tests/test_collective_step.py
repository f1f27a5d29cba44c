"""A data-parallel worker's step under the scheduler: the gradient all-reduce in the graph.

Two workers in two spawned processes, a gloo process group over a FileStore (no Ray),
each running ``DataParallelStep`` (``dbml/core/dataparallel.py``) on the same global
batches, a last one that does not divide evenly and one of a single row (a worker with
none). Checked: the scheduled step under a budget equals the same captured step
unscheduled bit for bit; both equal one worker on the global batches within 1e-5; every
worker's tracked peak is within the budget (the process's real peak reported beside it);
the graphs hold the collectives, bucketed as DDP does, and the plans replay within the
budget without touching a collective's buffer before its wait; a cancelled worker stops
every worker at the same step.
"""

from __future__ import annotations

import copy
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dbml.errors import JobCancelled
from dbml.scheduler.graph.capture import capture
from dbml.scheduler.graph.collective import BUCKET_BYTES, Collective, bucket_indices, is_collective, is_wait
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.graph.sequence import AccessSequence, Op, Phase, TensorInfo, TensorKind
from dbml.scheduler.latency.estimate import Machine, RooflineModel
from dbml.scheduler.plan.gaps import find_gaps

from sequences import check_plan

WORLD = 2
SIZES = (512, 512, 301, 1)  # the global batches: 301 splits 150/151, 1 leaves rank 0 no rows
# SGD with momentum: its update is linear in the gradient, so the bound below measures the
# all-reduce's summation order (Adam's first steps divide near-zero gradients by their own
# size, which makes float32 rounding of order 1e-9 an update difference of order lr)
SPEC = OptimizerSpec(kind="sgd", lr=0.05, momentum=0.9)
# the same in pieces of 64 KiB: what a small budget makes of a large weight (OptimizerSpec.within):
# each piece's gradient is all-reduced as its own tensor
PIECES = OptimizerSpec(kind="sgd", lr=0.05, momentum=0.9, update_chunk_bytes=64 << 10)
BUDGET_SHARE = 0.9          # of the unscheduled peak (the larger worker's); 0.7 is infeasible here
BUCKET = 1 << 16            # small buckets: several all-reduces in each graph
MACHINE = Machine(peak_flops=5e9, memory_bandwidth=5e9, copy_bandwidth=4e8, op_overhead=5e-6)
loss_fn = torch.nn.functional.cross_entropy


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                               torch.nn.ReLU(), torch.nn.Linear(256, 10))


def global_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)) for n in SIZES]


class Job:
    """The job's progress as a worker's step sees it; ``cancel_at``: the step from which
    this worker's job reads as cancelled."""

    def __init__(self, cancel_at: int | None = None):
        self.id, self.cancel_at, self.steps = 7, cancel_at, 0

    def cancelled(self) -> bool:
        self.steps += 1
        return self.cancel_at is not None and self.steps >= self.cancel_at

    def check(self) -> None:
        if self.cancelled():
            raise JobCancelled(f"job {self.id} was cancelled; nothing was stored")


def _run(runner, batches):
    losses = [float(runner.step(x, y)) for x, y in batches]
    runner.finish()
    return losses


def _worker(rank: int, store: str, out: str, spec: OptimizerSpec = SPEC) -> None:
    from dbml.core.dataparallel import DataParallelStep
    from dbml.scheduler import procmem
    from dbml.scheduler.execute.devices import CpuDevice
    from dbml.scheduler.execute.spill import SpillFile
    from dbml.scheduler.graph.collective import measure_bandwidth

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, WORLD), rank=rank, world_size=WORLD)
    batches = global_batches()
    assert measure_bandwidth() > 0   # a collective of its own: both workers call it
    bandwidth = 4e8   # pinned, as the machine's figures and the disk's: the same plans every run
    timing = {"latency_model": RooflineModel(MACHINE), "comm_bandwidth": bandwidth}
    plain_model = model()
    collective = Collective.current(bucket_bytes=BUCKET)
    plain = DataParallelStep(plain_model, loss_fn, spec, Job(), policy="none", **timing,
                             collective=collective, job=f"plain{rank}")
    plain_losses = _run(plain, batches)
    vanilla = torch.tensor(plain.stats()["vanilla_peak_bytes"])
    dist.all_reduce(vanilla, op=dist.ReduceOp.MAX)
    budget = int(BUDGET_SHARE * int(vanilla))
    sched_model = model()
    spill = SpillFile(tempfile.mkdtemp(prefix="dbml-dp-spill-"), f"dp{rank}")
    with procmem.watch() as real:
        sched = DataParallelStep(sched_model, loss_fn, spec, Job(), policy="tensile", budget_bytes=budget,
                                 **timing, device=CpuDevice("cpu", spill=spill), log=True,
                                 collective=collective, job=f"sched{rank}")
        try:
            sched_losses = _run(sched, batches)
        except Exception as e:   # noqa: BLE001 - the test reports it with the executor's figures
            sched_losses = f"{type(e).__name__}: {e}; bandwidth {bandwidth:.3g} B/s; " \
                           f"steps {[dict(e.totals) for e in sched.executors()]}"
    stats = sched.stats()
    graphs = {sig: [str(n.target) for n in c.graph.nodes if is_collective(n) or is_wait(n)]
              for sig, c in sched.graphs._graphs.items()}
    result = {"plain": [t.detach().clone() for t in plain_model.state_dict().values()],
              "sched": [t.detach().clone() for t in sched_model.state_dict().values()],
              "plain_losses": plain_losses, "sched_losses": sched_losses, "budget": budget, "stats": stats,
              "real": real.result, "hwm": procmem.hwm_bytes(), "graphs": graphs,
              "schedules": [(g.seq, g.plan) for g in sched.schedules().values()]}
    sched.close()
    plain.close()
    # a worker whose job is cancelled from its second step on stops every worker there
    cancel = DataParallelStep(model(), loss_fn, spec, Job(cancel_at=2 if rank == 1 else None), policy="none",
                              **timing, job=f"cancel{rank}")
    stopped = None
    for i, (x, y) in enumerate(batches):
        try:
            cancel.step(x, y)
        except JobCancelled as e:
            stopped = (i, str(e))
            break
    result["stopped"] = stopped
    cancel.close()
    dist.barrier()
    dist.destroy_process_group()
    torch.save(result, os.path.join(out, f"{rank}.pt"))


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp")
    mp.spawn(_worker, args=(str(out / "store"), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.fixture(scope="module")
def workers_in_pieces(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp-pieces")
    mp.spawn(_worker, args=(str(out / "store"), str(out), PIECES), nprocs=WORLD, join=True)
    return [torch.load(out / f"{r}.pt", weights_only=False) for r in range(WORLD)]


def _one_worker() -> tuple[list[torch.Tensor], list[float]]:
    """One worker training on the global batches, plain PyTorch."""
    from dbml.scheduler.execute.step import EagerStep
    m = model()
    runner = EagerStep(m, loss_fn, SPEC)
    losses = [float(runner.step(x, y)) for x, y in global_batches()]
    return list(m.state_dict().values()), losses


@pytest.mark.slow   # two spawned processes: ~15 s
def test_scheduled_data_parallel_step_is_bit_identical_to_unscheduled(workers):
    for w in workers:
        assert isinstance(w["sched_losses"], list), w["sched_losses"]
        assert w["stats"]["swaps"] + w["stats"]["recomputes"] > 0, "the budget moved nothing"
        for a, b in zip(w["sched"], w["plain"], strict=True):
            assert torch.equal(a, b)
        assert w["sched_losses"] == w["plain_losses"]
    for a, b in zip(workers[0]["sched"], workers[1]["sched"], strict=True):
        assert torch.equal(a, b)   # every worker holds the same model


@pytest.mark.slow   # two spawned processes: ~5 s
def test_weights_in_pieces_keep_the_scheduled_step_bit_identical_and_within_the_budget(workers_in_pieces):
    weights, _ = _one_worker()
    for w in workers_in_pieces:
        assert isinstance(w["sched_losses"], list), w["sched_losses"]
        assert all(len(ops) > 2 * len(bucket_indices(list(model().parameters()), BUCKET))
                   for ops in w["graphs"].values()), "no weight was cut into pieces"
        for a, b, c in zip(w["sched"], w["plain"], weights, strict=True):
            assert torch.equal(a, b) and (a - c).abs().max().item() <= 1e-5
        assert w["sched_losses"] == w["plain_losses"]
        assert w["stats"]["measured_peak_bytes"] <= w["budget"] and w["stats"]["planned_peak_bytes"] <= w["budget"]
    for a, b in zip(workers_in_pieces[0]["sched"], workers_in_pieces[1]["sched"], strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_data_parallel_step_equals_one_worker_on_the_global_batch(workers):
    weights, losses = _one_worker()
    for w in workers:
        for a, b in zip(w["sched"], weights, strict=True):
            assert (a - b).abs().max().item() <= 1e-5
        assert w["sched_losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_every_worker_stays_within_the_budget(workers):
    for rank, w in enumerate(workers):
        s = w["stats"]
        assert s["measured_peak_bytes"] <= w["budget"] and s["planned_peak_bytes"] <= w["budget"]
        assert w["real"] is not None and w["hwm"] > 0
        print(f"worker {rank}: budget {w['budget']} B, tracked peak {s['measured_peak_bytes']} B, "
              f"real: the scheduled step added {w['real'].added} B to the process's resident set "
              f"(exact: {w['real'].exact}), process high-water mark {w['hwm']} B; "
              f"unscheduled {s['vanilla_peak_bytes']} B, "
              f"{s['swaps']} swaps, {s['recomputes']} recomputes")


@pytest.mark.slow
def test_graphs_hold_the_collectives_and_the_plans_hold(workers):
    buckets = len(bucket_indices(list(model().parameters()), BUCKET))
    assert buckets > 1
    for w in workers:
        assert len(w["graphs"]) == len(set(SIZES))
        for targets in w["graphs"].values():
            assert targets == ["_c10d_functional.all_reduce.default"] * buckets + \
                ["_c10d_functional.wait_tensor.default"] * buckets
        for seq, plan in w["schedules"]:
            check_plan(seq, plan, w["budget"])
            _no_move_in_flight(seq, plan)


def _no_move_in_flight(seq: AccessSequence, plan) -> None:
    """No event touches a collective's buffer between its op and its wait (the next access)."""
    for op in seq.ops:
        if not op.collective:
            continue
        for t in op.outputs:
            wait = min(o.index for o in seq.ops if t in o.inputs)
            moved = [e for e in plan.events if e.tensor == t and op.index <= e.trigger < wait]
            assert not moved and t not in plan.host_at_start, moved


@pytest.mark.slow
def test_a_cancelled_worker_stops_every_worker_at_the_same_step(workers):
    assert workers[0]["stopped"][0] == workers[1]["stopped"][0] == 1
    assert "another of its workers" in workers[0]["stopped"][1]
    assert workers[1]["stopped"][1] == "job 7 was cancelled; nothing was stored"


# -- without processes ---------------------------------------------------------------

def test_buckets_follow_ddp():
    """DDP's rebuilt buckets (its own assignment function): every gradient in one bucket,
    in the order they become ready (reverse parameter order); by default the first bucket
    small (closed past dist._DEFAULT_FIRST_BUCKET_BYTES), then 25 MiB ones."""
    grads = [torch.empty(n) for n in (10, 300_000, 20, 3_000_000, 5)]
    assert bucket_indices(grads, BUCKET_BYTES) == [[4, 3], [2, 1, 0]]
    for cap in (4 << 20, 1 << 20, 1 << 16):
        assert [i for b in bucket_indices(grads, cap) for i in b] == [4, 3, 2, 1, 0]
    assert bucket_indices(grads, 1 << 16) == [[4, 3], [2, 1], [0]]


def test_capture_puts_the_all_reduce_in_the_graph():
    """Traced on fake tensors (no process group is needed): the worker's share of the batch,
    the buckets' all-reduces and waits, the wait being the collective's own buffer."""
    c = capture(model(), loss_fn, SPEC, global_batches()[2], collective=Collective(1, WORLD, "0", BUCKET))
    nodes = list(c.graph.nodes)
    issues = [n for n in nodes if is_collective(n)]
    waits = [n for n in nodes if is_wait(n)]
    assert len(issues) == len(waits) == len(bucket_indices(list(model().parameters()), BUCKET)) > 1
    for w in waits:
        assert w.meta["dbml_storage"] == w.args[0].meta["dbml_storage"] and w.meta["dbml_nbytes"] == 0
    x = next(n for n in nodes if n.op == "placeholder" and n.meta["dbml_key"] == ("batch", "x"))
    assert any(tuple(u.meta["val"].shape) == (151, 32) for u in x.users)   # rows 150..301 of 301


def _flight_sequence(collective: bool) -> AccessSequence:
    """A bucket (tensor 1) all-reduced by op 1 into tensor 2, waited for at op 4."""
    t = tuple(TensorInfo(i, f"t{i}", 100, TensorKind.ACTIVATION) for i in range(5))
    ops = (Op(0, "grad", (0,), (1,), 0.0, 1.0, Phase.BACKWARD),
           Op(1, "all_reduce", (1,), (2,), 1.0, 5.0, Phase.BACKWARD, True, collective),
           Op(2, "a", (0,), (3,), 5.0, 6.0, Phase.BACKWARD),
           Op(3, "b", (3,), (4,), 6.0, 7.0, Phase.BACKWARD),
           Op(4, "wait_tensor", (2,), (), 7.0, 7.0, Phase.BACKWARD, collective=False))
    return AccessSequence("j", t, ops, frozenset({0}), outputs=frozenset({2, 4}))


def test_no_gap_while_a_collective_is_in_flight():
    gaps = find_gaps(_flight_sequence(collective=True))
    assert 2 not in gaps.tensor.tolist()
    assert 2 in find_gaps(_flight_sequence(collective=False)).tensor.tolist()   # an ordinary op's output has one


def test_passive_eviction_keeps_a_collective_in_flight():
    """Capuchin's on-demand swap-outs (no plan) never pick a collective's buffer between
    its op and its wait: the other workers' sums are still being written into it."""
    from types import SimpleNamespace

    from dbml.scheduler.execute.evictor import PassiveEvictor
    from dbml.scheduler.execute.program import Program
    from dbml.scheduler.graph.access import build_sequence

    c = capture(model(), loss_fn, SPEC, global_batches()[0], collective=Collective(0, WORLD, "0", BUCKET))
    seq = build_sequence(c, RooflineModel(MACHINE), comm_bandwidth=1e9, copy_bandwidth=1e9)
    prog = Program(c, seq)
    it = SimpleNamespace(res=[True] * len(prog.nbytes), value_of=lambda s: object())
    evictor = PassiveEvictor(prog, it, None, SimpleNamespace(inflight_in=set()), None)
    flying = [(op.outputs[0], op.index, min(o.index for o in seq.ops if op.outputs[0] in o.inputs))
              for op in seq.ops if op.collective]
    assert len(flying) > 1
    for t, issue, wait in flying:   # never re-run; its wait timed as the buffer's bytes over the bandwidth
        assert seq.ops[issue].not_replayable and seq.ops[wait].latency == pytest.approx(seq.tensors[t].nbytes / 1e9)
    for t, issue, wait in flying:
        for k in range(issue + 1, wait + 1):
            assert t not in evictor.victims(k)
        if t not in prog.req[wait + 1]:
            assert t in evictor.victims(wait + 1)   # after its wait, an ordinary buffer


def test_a_groups_bandwidth_measured_at_join_is_not_part_of_which_group_it_is():
    """group.join measures the bandwidth once per group and returns the Group carrying it; the
    driver's Group (without it) still names the same group, so the next job joins nothing anew."""
    from dataclasses import replace
    from dbml.cluster.group import Group
    g = Group("set-1", 0, 2, "127.0.0.1", 29500, "gloo")
    assert replace(g, bandwidth=1.5e9) == g and replace(g, port=29501) != g
