"""The CPU's slow tier (issue 29): swapped tensors go to a file in DuckDB's temp
directory, outside the process's memory, and come back bit for bit.

Unit tests of the spill file (round trips across the bounce buffer's chunks, extents
reused, the size limit, removal and the sweep of a crashed process's files), the
executor on it (bit-identical to eager at half the peak, fresh optimizer state never
allocated ahead, the model's own tensors hollow until ``finish``), and train() from SQL
(the summary's spilled and real figures, ``temp_directory`` and
``max_temp_directory_size`` honoured, nothing left behind).
"""

from __future__ import annotations

import copy
import gc
import os
import subprocess
import sys
import textwrap
import time

import duckdb
import pytest
import torch

import dbml
from dbml.scheduler.execute.devices import CpuDevice, Zeros
from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.execute.spill import BLOCK, CHUNK, Parked, SpillFile, SpillFull, file_system, sweep_stale
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler import hostmem, procmem
from dbml.scheduler.errors import InfeasibleBudget

from helpers import assert_same, batches, cnn, load, loss_fn, mlp, moons, state_of, vanilla_peak, job_of


def spill_files(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith("dbml_swap_")) if os.path.isdir(directory) else []


# -- the file ---------------------------------------------------------------------------------

@pytest.mark.parametrize("nbytes", [1, BLOCK - 1, BLOCK, CHUNK + 3 * BLOCK + 17, 2 * CHUNK])
def test_bytes_round_trip_through_the_file(tmp_path, nbytes):
    spill = SpillFile(tmp_path, "j")
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(nbytes))
    e = spill.write(src)
    dst = torch.empty(nbytes, dtype=torch.uint8)
    spill.read(e, dst)
    assert torch.equal(src, dst)
    assert e.offset % BLOCK == 0 and e.capacity % BLOCK == 0 and e.capacity >= nbytes
    assert os.path.getsize(spill.path) >= e.capacity   # the bytes are in the file, not in memory
    spill.close()


def test_the_page_cache_is_bypassed_where_the_file_system_allows(tmp_path):
    spill = SpillFile(tmp_path, "j")
    if file_system(tmp_path) in ("tmpfs", "ramfs", "overlay", ""):
        pytest.skip(f"{file_system(tmp_path) or 'unknown'} file system")
    assert spill.direct, "O_DIRECT should be used on a disk file system"
    spill.close()


def test_extents_are_reused_by_size_so_the_file_holds_the_most_held_at_once(tmp_path):
    spill = SpillFile(tmp_path, "j")
    src = torch.ones(3 * BLOCK, dtype=torch.uint8)
    for _ in range(20):   # twenty iterations swapping the same two tensors
        a, b = spill.write(src), spill.write(src)
        spill.free(a)
        spill.free(b)
    assert spill.peak == 2 * 3 * BLOCK and spill.in_use == 0
    spill.reserve([5 * BLOCK, 5 * BLOCK])   # taken ahead, then free for the iteration's swaps
    end = spill.end
    spill.write(torch.zeros(5 * BLOCK - 1, dtype=torch.uint8))
    assert spill.end == end
    spill.close()


def test_the_limit_refuses_a_swap_and_names_the_setting(tmp_path):
    spill = SpillFile(tmp_path, "j", limit=2 * BLOCK)
    spill.write(torch.zeros(BLOCK, dtype=torch.uint8))
    with pytest.raises(SpillFull, match="max_temp_directory_size"):
        spill.write(torch.zeros(2 * BLOCK, dtype=torch.uint8))
    assert spill.in_use == BLOCK   # the refused swap took nothing
    spill.close()


def test_close_removes_the_file_and_the_sweep_removes_only_dead_processes_files(tmp_path):
    spill = SpillFile(tmp_path, "j")
    spill.write(torch.zeros(10, dtype=torch.uint8))
    assert spill_files(tmp_path) == [spill.path.name]
    spill.close()
    spill.close()   # idempotent
    assert spill_files(tmp_path) == []
    # a crashed process's file: a pid that is not running
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f"dbml_swap_{dead}_job_0.bin").write_bytes(b"x" * 10)
    live = SpillFile(tmp_path, "live")
    (tmp_path / "dbml_swap_notes.txt").write_text("a user's file")
    assert sweep_stale(tmp_path) == [f"dbml_swap_{dead}_job_0.bin"]
    assert spill_files(tmp_path) == sorted([live.path.name, "dbml_swap_notes.txt"])
    live.close()


def test_parked_tensors_come_back_bit_for_bit_and_their_extents_are_reused(tmp_path):
    spill = SpillFile(tmp_path, "j")
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(300, 7, generator=g), torch.randn(64, 64, generator=g).t(),   # not contiguous
               torch.tensor(3.5, dtype=torch.float64), torch.zeros(0), torch.arange(5) > 2,
               torch.randn(CHUNK // 4 + 3, generator=g)]                                # across the bounce buffer
    kept = Parked(spill, iter(tensors))
    assert len(kept) == len(tensors) and spill.in_use > 0
    back = list(kept)
    for a, b in zip(tensors, back):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    into = [torch.empty_like(t) for t in tensors]
    kept.read_into(into)
    assert all(torch.equal(a, b) for a, b in zip(tensors, into))
    with pytest.raises(ValueError, match="a torch.float32 \\(3,\\) tensor for a torch.float32 \\(300, 7\\) copy"):
        kept.read_into([torch.empty(3)] + into[1:])
    end = spill.end
    kept.free()
    assert spill.in_use == 0
    again = Parked(spill, tensors)   # the next epoch's copy: in the same extents, the file no longer
    assert spill.end == end
    again.free()
    spill.close()


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_an_early_stopping_jobs_best_weights_wait_in_the_spill_file_and_come_back_exactly(tmp_path, monkeypatch):
    """Under a budget on the CPU the copy of the best epoch's weights is kept on disk, not
    beside the budget in RAM; the stored model is still that epoch's, as eager PyTorch's."""
    parked = []
    real_init = Parked.__init__

    def counting(self, spill, tensors):
        real_init(self, spill, tensors)
        parked.append(len(self))
    monkeypatch.setattr(Parked, "__init__", counting)
    con = dbml.connect(latency_model="roofline")
    con.execute(f"SET temp_directory = '{tmp_path}'")
    load(con, "moons", moons(600))
    args = ("label := 'label', features := ['x1','x2'], hidden := [256, 256], epochs := 12, batch_size := 64, "
            "lr := 0.3, early_stop := true, patience := 2")
    eager = job_of(con, con.execute(f"SELECT train('e', 'moons', {args}, policy := 'eager')").fetchall()[0][0])
    assert parked == []   # no budget: no spill file, the copy in memory
    budget = int(0.9 * eager["measured_peak_bytes"])
    kept = job_of(con, con.execute(f"SELECT train('k', 'moons', {args}, memory_budget := {budget})").fetchall()[0][0])
    assert eager["best_epoch"] < eager["epochs"], "the test needs a run whose last epoch is not its best"
    assert kept["best_epoch"] == eager["best_epoch"] and len(parked) >= 1
    w = con.execute("SELECT name, weights FROM dbml_weights ORDER BY name").fetchall()
    assert w[0][1] == w[1][1]
    assert spill_files(tmp_path) == []
    con.close()


# -- the executor on it -------------------------------------------------------------------------

@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
@pytest.mark.parametrize("model_fn, shape", [(mlp, (32,)), (cnn, (3, 12, 12))], ids=["mlp", "cnn_bn"])
def test_training_through_the_disk_is_bit_identical_to_eager(tmp_path, model_fn, shape):
    spec = OptimizerSpec("adam", lr=1e-3)
    data = batches(4, b=16, shape=shape)
    torch.manual_seed(0)
    model = model_fn()
    vanilla = vanilla_peak(copy.deepcopy(model), spec, *data[0])
    budget = vanilla // 2
    eager, scheduled = copy.deepcopy(model), copy.deepcopy(model)
    torch.manual_seed(1)
    runner = EagerStep(eager, loss_fn, spec)
    want = [runner.step(x, y) for x, y in data]
    runner.finish()

    def run(budget):
        device = CpuDevice(spill=SpillFile(tmp_path, "t"))
        step = ScheduledStep(scheduled, loss_fn, spec, policy="tensile", budget_bytes=budget, device=device)
        torch.manual_seed(1)
        try:
            return step, [step.step(x, y) for x, y in data]
        except InfeasibleBudget:
            step.close()
            raise

    try:
        step, got = run(budget)
    except InfeasibleBudget as e:
        # feasibility follows the latencies (a swap must fit between two uses): on a faster
        # machine half the peak can be out of reach; the smallest feasible budget still swaps
        assert e.min_budget < vanilla
        budget, scheduled = e.min_budget, copy.deepcopy(model)
        step, got = run(budget)
    stats = step.stats()
    step.finish()
    step.close()
    assert_same(got, want)
    assert_same(state_of(scheduled), state_of(eager))
    assert stats["measured_peak_bytes"] <= budget
    assert stats["swaps"] > 0 and stats["spilled_peak_bytes"] > 0
    assert spill_files(tmp_path) == []


def test_fresh_optimizer_state_is_not_allocated_ahead():
    """Adam's moments start as Zeros host copies: a plan that keeps them on the host
    allocates nothing for them until the optimizer phase; results stay eager's (the
    bit-identity tests above and in test_runner cover that)."""
    spec = OptimizerSpec("adam", lr=1e-3)
    model = mlp()
    step = ScheduledStep(model, loss_fn, spec, policy="none")
    zeros = [h for h in step.state.host.values() if isinstance(h, Zeros)]
    moments = [p for p in model.parameters() if p.requires_grad]
    assert len(zeros) == 2 * len(moments)
    assert sum(z.nbytes for z in zeros) == 2 * sum(p.numel() * p.element_size() for p in moments)
    x, y = batches(1)[0]
    step.step(x, y)
    assert not step.state.host   # all resident under a plan that keeps nothing on the host
    step.close()


def test_with_a_spill_file_the_model_holds_no_copy_until_finish(tmp_path):
    spec = OptimizerSpec("sgd", lr=0.1)
    model = mlp()
    before = [t.clone() for t in state_of(model)]
    step = ScheduledStep(model, loss_fn, spec, policy="tensile", budget_bytes=10**9,
                         device=CpuDevice(spill=SpillFile(tmp_path, "h")))
    # the model's tensors are untouched placeholders of the same layout: the state holds the values
    assert all(t.shape == b.shape and t.dtype == b.dtype for t, b in zip(state_of(model), before))
    assert_same([v.detach() for v in step.values()], before)
    x, y = batches(1)[0]
    step.step(x, y)
    step.finish()
    step.close()
    assert not any(torch.equal(t, b) for t, b in zip(list(model.parameters()), before[:len(list(model.parameters()))]))


def test_bounded_malloc_is_in_force_while_a_budgeted_disk_job_runs(tmp_path):
    if not hostmem.keep_freed_host_memory():
        pytest.skip("malloc is not managed here (DBML_HOST_MALLOC=system or not glibc)")
    before = hostmem._state.get("bounded", 0)   # another test's step may still be running
    step = ScheduledStep(mlp(), loss_fn, OptimizerSpec("adam"), policy="tensile", budget_bytes=10**9,
                         device=CpuDevice(spill=SpillFile(tmp_path, "b")))
    assert hostmem._state.get("bounded") == before + 1
    step.close()
    assert hostmem._state.get("bounded") == before
    dropped = ScheduledStep(mlp(), loss_fn, OptimizerSpec("adam"), policy="tensile", budget_bytes=10**9,
                            device=CpuDevice(spill=SpillFile(tmp_path, "c")))
    assert hostmem._state.get("bounded") == before + 1
    del dropped   # never closed: collected, it leaves the bounded mode too
    gc.collect()
    assert hostmem._state.get("bounded") == before


BOUNDED_PROBE = """
import torch
from dbml.scheduler import hostmem, procmem
assert hostmem.keep_freed_host_memory()
with hostmem.bounded():
    big = [torch.ones(1 << 18) for _ in range(64)]   # 1 MiB blocks
    held = procmem.rss_bytes()
    del big[::2]   # every other one: in the heap, holes between blocks still held
    print(held - procmem.rss_bytes())
"""


def test_a_bounded_jobs_freed_megabyte_blocks_go_back_to_the_os():
    """A data-parallel worker's half-batch activations are 1-2 MB: under a budget they must not
    settle in the heap (the threshold was 4 MiB: its first job held 17 MB over its budget)."""
    if not hostmem.keep_freed_host_memory():
        pytest.skip("malloc is not managed here (DBML_HOST_MALLOC=system or not glibc)")
    assert hostmem.BOUNDED_MMAP <= 1 << 20
    out = subprocess.run([sys.executable, "-c", BOUNDED_PROBE], capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) >= 24 << 20, out.stdout   # of the 32 MiB freed


def test_the_real_memory_watch_sees_an_allocation():
    # freed memory an earlier test of this worker left in malloc's heap (kept: hostmem) would
    # serve the allocation without the process growing: given back first
    hostmem.give_back_freed_host_memory()
    with procmem.watch() as w:
        big = torch.ones(64 << 20, dtype=torch.uint8)   # 64 MiB, touched
        # held long enough for the sampler (every SAMPLE_S) to read it on a loaded machine:
        # where an earlier test's larger peak hides this one from the kernel's mark, the
        # sampler's reading is the figure (one run under xdist at load 12 read 46 of 64 MiB)
        time.sleep(0.25)
        del big
    assert w.result is not None and w.result.added >= 48 << 20


# -- from SQL -----------------------------------------------------------------------------------

def _train(con, budget: str = "120KB", model: str = "m") -> dict:
    """train()'s result with its job's row of dbml_jobs (the memory figures)."""
    return job_of(con, con.execute(f"SELECT train('{model}', 'moons', label := 'label', arch := 'mlp', epochs := 2, "
                                   f"early_stop := false, policy := 'tensile', memory_budget := '{budget}') AS t"
                                   ).fetchone()[0])


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_a_budgeted_job_spills_to_the_databases_temp_directory_and_leaves_nothing(tmp_path):
    db = tmp_path / "shop.duckdb"
    con = dbml.connect(str(db), latency_model="roofline")
    load(con, "moons", moons(2000))
    summary = _train(con)
    assert summary["status"] == "finished"
    assert summary["spilled_peak_bytes"] > 0 and summary["swaps"] > 0
    assert summary["real_peak_bytes"] is not None and summary["real_peak_bytes"] >= 0
    assert spill_files(str(db) + ".tmp") == []
    con.close()


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_temp_directory_off_keeps_swaps_in_memory(tmp_path):
    con = dbml.connect(latency_model="roofline")
    con.execute("SET temp_directory = ''")
    load(con, "moons", moons(2000))
    summary = _train(con)
    assert summary["status"] == "finished" and summary["swaps"] > 0
    assert summary["spilled_peak_bytes"] is None
    con.close()


def test_max_temp_directory_size_bounds_the_spill_with_an_error_naming_it(tmp_path):
    con = dbml.connect(latency_model="roofline")
    con.execute(f"SET temp_directory = '{tmp_path}'")
    con.execute("SET max_temp_directory_size = '4KB'")
    load(con, "moons", moons(2000))
    with pytest.raises(duckdb.Error, match=r"max_temp_directory_size.*nothing was stored"):
        _train(con)
    assert con.execute("SELECT count(*) FROM dbml_models").fetchone()[0] == 0
    assert spill_files(tmp_path) == []
    con.close()


@pytest.mark.slow
def test_a_budget_lowers_the_processs_real_memory(tmp_path):
    """In fresh processes, measured from outside (ru_maxrss of each child): a job at a
    quarter of its peak adds less real memory than the same job unbudgeted."""
    script = textwrap.dedent(f"""
        import resource, sys, torch
        from dbml.scheduler.execute.devices import CpuDevice
        from dbml.scheduler.execute.runner import ScheduledStep
        from dbml.scheduler.execute.spill import SpillFile
        from dbml.scheduler.graph.optim import OptimizerSpec
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[m for _ in range(3) for m in (torch.nn.Linear(2048, 2048), torch.nn.ReLU())],
                                    torch.nn.Linear(2048, 10))
        x, y = torch.randn(256, 2048), torch.randint(0, 10, (256,))
        budget = int(sys.argv[1]) or None
        dev = CpuDevice(spill=SpillFile({str(tmp_path)!r}, "r"))
        step = ScheduledStep(model, torch.nn.functional.cross_entropy, OptimizerSpec("adam"),
                             policy="tensile" if budget else "none", budget_bytes=budget, device=dev)
        for _ in range(3):
            step.step(x, y)
        print(step.stats()["vanilla_peak_bytes"])
    """)

    vanilla = int(subprocess.run([sys.executable, "-c", script, "0"], capture_output=True, text=True,
                                 check=True).stdout.split()[-1])
    # each child's own peak, by /usr/bin/time-like accounting: run them through a wrapper
    wrapper = "import resource, subprocess, sys; subprocess.run(sys.argv[1:]); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    peaks = {}
    for budget in (0, vanilla // 4):
        out = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-c", script, str(budget)],
                             capture_output=True, text=True, check=True)
        peaks[budget] = int(out.stdout.split()[-1]) * 1024
    assert peaks[vanilla // 4] < peaks[0] - vanilla // 4, peaks


def test_a_spilling_jobs_weights_are_made_under_the_bounded_allocator(tmp_path, monkeypatch):
    """Made before its runner entered hostmem.bounded, a job's weights came from the heap; once
    swapped out and freed they left holes the process kept: one weight matrix (16.8 MB) over a
    67 MB budget in two of three runs of benchmarks/dp_real_memory.py's local first job."""
    if not hostmem.keep_freed_host_memory():
        pytest.skip("malloc is not managed here (DBML_HOST_MALLOC=system or not glibc)")
    import dbml.core.training as training
    seen = []
    build = training.models.build_seeded
    monkeypatch.setattr(training.models, "build_seeded",
                        lambda *a, **k: seen.append(hostmem._state.get("bounded", 0)) or build(*a, **k))
    con = dbml.connect(latency_model="roofline", progress="off")
    con.execute(f"SET temp_directory = '{tmp_path}'")
    con.execute("CREATE TABLE t AS SELECT range % 7 / 7.0 AS x, range % 2 AS y FROM range(300)")
    con.execute("SELECT train('m', 't', label := 'y', epochs := 1, hidden := [64], memory_budget := '2MB')").fetchall()
    con.close()
    assert seen and seen[0] >= 1, seen


TIER_FIRST_JOB = textwrap.dedent("""
    import json, os, sys
    os.environ.pop("DBML_SPILL_BANDWIDTH", None)   # no tier pinned, none calibrated (a fresh cache dir)
    import dbml
    from dbml.scheduler import procmem
    from dbml.scheduler.execute import spill
    measured = spill.measure_tier
    calls = []
    def probe(directory, *args, **kwargs):
        calls.append(bool(procmem._SAMPLER._watches))   # a job's real-memory watch open?
        with procmem.watch() as w:
            tier = measured(directory, *args, **kwargs)
        calls.append(w.result.added)
        return tier
    spill.measure_tier = probe
    con = dbml.connect(latency_model="roofline", progress="off")
    con.execute("CREATE TABLE t AS SELECT range % 7 / 7.0 AS x, range % 2 AS y FROM range(500)")
    r = con.execute("SELECT train('m', 't', label := 'y', epochs := 1, memory_budget := 2000000)").fetchall()[0][0]
    real = con.execute("SELECT real_peak_bytes FROM dbml_jobs WHERE job_id = ?", [r["job_id"]]).fetchall()[0][0]
    print(json.dumps(calls + [r["warnings"], real]))
""")


@pytest.mark.slow
def test_the_spill_tiers_probe_is_the_processs_not_a_first_jobs(tmp_path):
    """Where no install calibrated the file system DuckDB spills to, the first job measures its
    speed: before the job's real memory is watched (it was inside it: a worker set's first job
    held 94 MB for a 67 MB budget), through 8 MB of buffers (it was 64 MB: the whole probe
    written from one tensor and read into another)."""
    import json
    out = subprocess.run([sys.executable, "-c", TIER_FIRST_JOB], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "DBML_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    inside_a_job, added, warnings, real = json.loads(out.stdout.strip().splitlines()[-1])
    assert inside_a_job is False
    assert added < 24e6, added
    # a first job's one-off costs pass a 2 MB budget: its result says so, with the figures
    assert real > 2_000_000 and "real memory: the process grew by" in warnings, (real, warnings)
    assert "more than its budget of 2.0 MB" in warnings and "pass a larger memory_budget" in warnings
