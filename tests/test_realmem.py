"""A budgeted CPU job's real memory (issue 33): the process's resident memory, not only
the tracked tensors, stays within the budget once the job has measured what it holds
besides them (``ScheduledStep._remeasure_real``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# hidden [2048, 2048] on 2 features, batch 512, Adam: 84 MB unscheduled. At this budget, before
# the fix: planned at 67.3 MB (the budget less the bounce buffer), real 76-89 MB in 5 of 5 runs;
# after: planned at 50-58 MB, real 55-72 MB (what malloc's heap keeps beside the plan varies)
BUDGET = 75_000_000

SCRIPT = textwrap.dedent("""
    import gc, json, sys, torch
    from dbml.scheduler import hostmem, procmem
    from dbml.scheduler.execute.devices import CpuDevice
    from dbml.scheduler.execute.runner import DEVICE_CHECKS, ScheduledStep
    from dbml.scheduler.execute.spill import SpillFile
    from dbml.scheduler.graph.optim import OptimizerSpec
    budget, directory = int(sys.argv[1]), sys.argv[2]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(512, 2, generator=g), torch.randint(0, 2, (512,), generator=g)

    def job(name, steady):
        base = procmem.rss_bytes()   # before the model: what the job adds, as real_peak_bytes counts it
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(2, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                                    torch.nn.ReLU(), torch.nn.Linear(2048, 2))
        step = ScheduledStep(model, torch.nn.functional.cross_entropy, OptimizerSpec("adam"), budget_bytes=budget,
                             device=CpuDevice(spill=SpillFile(directory, name)), job=name, share_graphs="mlp")
        for _ in range(DEVICE_CHECKS):
            step.step(x, y)
        with procmem.watch() as w:
            for _ in range(steady):
                step.step(x, y)
        out = {"real": w.result.peak_rss - base, "reserve": step.device_reserve,
               "tracked": step.stats()["measured_peak_bytes"], "planner": step.planner.budget_bytes}
        step.finish()
        step.close()
        del step, model
        gc.collect()
        hostmem.give_back_freed_host_memory()   # as train() does after each job
        return out

    job("first", 0)   # the process's one-off costs (imports, first calls), as a first train() pays them
    print(json.dumps(job("second", 8)))
""")


@pytest.mark.slow
def test_a_budgeted_jobs_real_memory_stays_within_its_budget(tmp_path):
    """In a fresh process (earlier tests' memory would hide the peak): the second job of an
    architecture, after its first iterations, adds no more resident memory than its budget,
    because the runner took what the process holds beside the plan's tensors off the
    planner's budget (without that: 76-89 MB at this budget, the plan alone at 67 MB)."""
    import json
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(BUDGET), str(tmp_path)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.split("\n")[-2])
    assert r["reserve"] is not None and r["reserve"] > 0, r   # it measured something beside the tensors
    assert r["tracked"] <= r["planner"] < BUDGET, r            # and planned with less than the budget
    assert r["real"] <= BUDGET, r


def test_only_a_budgeted_job_waits_for_the_one_off_set_up():
    """A job no budget of the user's bounds skips preload.ready()'s warm-up (0.2 s of a
    script's first train()); the first budgeted job of the process runs it."""
    script = textwrap.dedent("""
        import dbml
        from dbml.core.runtime import runtime
        con = dbml.connect(latency_model="roofline", progress="off")
        con.execute("CREATE TABLE t AS SELECT range % 7 / 7.0 AS x, range % 2 AS y FROM range(200)")
        con.execute("SELECT train('m', 't', label := 'y', epochs := 1)").fetchall()
        assert not runtime().jobs_warmed.locked(), "an unbudgeted job warmed up"
        con.execute("SELECT train('b', 't', label := 'y', epochs := 1, memory_budget := '64MB')").fetchall()
        assert runtime().jobs_warmed.locked(), "a budgeted job did not warm up"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "DBML_NO_PRELOAD": "0"})
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_first_jobs_one_off_set_up_runs_before_its_figures_and_draws_nothing_from_the_users_generator():
    """preload.ready(), before a job's real-memory watch: the process's imports, first trace
    and first real step happen once, outside the job's real_peak_bytes; neither it nor the
    job changes the process's random generator (the user's)."""
    script = textwrap.dedent("""
        import sys, torch, dbml
        from dbml.core import preload
        from dbml.core.runtime import runtime
        torch.manual_seed(7)
        state = torch.get_rng_state()
        preload.ready()
        assert runtime().jobs_warmed.locked(), "the one-off set-up did not run"
        assert "pandas" not in sys.modules, "ready() imported pandas under the job's peak"
        assert torch.equal(torch.get_rng_state(), state), "the preload drew from the process's generator"
        con = dbml.connect(latency_model="roofline", progress="off")
        con.execute("CREATE TABLE t AS SELECT range % 7 / 7.0 AS x, range % 2 AS y FROM range(200)")
        con.execute("SELECT train('m', 't', label := 'y', epochs := 1)").fetchall()
        assert torch.equal(torch.get_rng_state(), state), "the job drew from the process's generator"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_job_past_its_budget_always_grows_its_reserve(tmp_path):
    """A spilling job measured 0.6 MB past its budget with 0.7 MB beside its plan's tensors:
    within the 1 MB slack, so it kept its plan and stayed past the budget for every iteration
    (benchmarks/realmem_phases.py, round 7). Past the budget the reserve grows always, by the
    slack more than what was found."""
    import torch
    from dbml.scheduler.execute.devices import CpuDevice
    from dbml.scheduler.execute.runner import REAL_SLACK, ScheduledStep
    from dbml.scheduler.execute.spill import SpillFile
    from dbml.scheduler.graph.optim import OptimizerSpec
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    step = ScheduledStep(model, torch.nn.functional.cross_entropy, OptimizerSpec("adam"), budget_bytes=20_000_000,
                         device=CpuDevice(spill=SpillFile(str(tmp_path), "j")), job="j")
    try:
        step.step(x, y)
        g = next(iter(step._graphs.values()))
        kept = step.device_reserve or 0
        over = 600_000
        # what the process held beyond the plan's tensors: 0.7 MB, within the slack
        g.executor.iteration_peak = step.budget_bytes + over - (step.real_reserve or 0) - 700_000
        step._grow_device_reserve(g, step.budget_bytes + over, slack=REAL_SLACK)
        assert step.device_reserve >= kept + over + REAL_SLACK, (kept, step.device_reserve)
        # within the budget, what is within the slack changes nothing
        again = step.device_reserve
        step._grow_device_reserve(g, step.budget_bytes - 1, slack=REAL_SLACK)
        assert step.device_reserve == again
    finally:
        step.close()


def test_a_first_jobs_first_iteration_holds_back_a_margin_until_it_has_measured(tmp_path):
    """A process's first spilling job of an architecture ran its first iteration on a plan
    for its whole budget (less the bounce buffer) before anything had measured what the
    process holds beside such a plan, and passed the budget by that (2.1-2.5 MB in 4 of 6
    runs of benchmarks/dp_real_memory.py). Its first iteration now holds back a margin;
    the plans after it are made for what it measured; the next job of the architecture
    starts from that measurement, without the margin."""
    import torch
    from dbml.scheduler.execute.devices import CpuDevice
    from dbml.scheduler.execute.runner import FIRST_MARGIN, ScheduledStep
    from dbml.scheduler.execute.spill import SpillFile
    from dbml.scheduler.graph.optim import OptimizerSpec
    from dbml.scheduler.multijob.registry import DEVICES
    budget = 40_000_000
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))

    def job(name):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 512), torch.nn.ReLU(), torch.nn.Linear(512, 2))
        step = ScheduledStep(model, torch.nn.functional.cross_entropy, OptimizerSpec("adam"), budget_bytes=budget,
                             device=CpuDevice(spill=SpillFile(str(tmp_path), name)), job=name,
                             share_graphs="margin-test")
        seen = []
        remeasure = step._remeasure_real

        def watched(g, watch):
            seen.append((step._probing, step.planner.budget_bytes))
            remeasure(g, watch)
        step._remeasure_real = watched
        for _ in range(3):
            step.step(x, y)
        step.close()
        return seen, step.real_reserve

    DEVICES.real_reserves.clear()
    first, bounce = job("first")
    assert first[0] == (True, budget - bounce - int(FIRST_MARGIN * budget)), first
    assert not first[1][0], first   # then planned for what it measured
    second, _ = job("second")
    assert not second[0][0] and second[0][1] == first[-1][1], (first, second)


def test_a_job_past_its_budget_in_real_memory_says_so_and_one_within_says_nothing():
    from dbml.core.runners import real_memory_warning
    over = real_memory_warning({"real_peak_bytes": 70_400_000, "budget_bytes": 67_300_000,
                                "planned_peak_bytes": 50_500_000})
    assert over.startswith("real memory: the process grew by 70.4 MB while the job ran, 3.1 MB more than its budget "
                           "of 67.3 MB; its tensors took 50.5 MB"), over
    assert "memory_budget" in over and "batch_size" in over
    assert real_memory_warning({"real_peak_bytes": 67_300_000, "budget_bytes": 67_300_000}) is None
    assert real_memory_warning({"real_peak_bytes": None, "budget_bytes": 67_300_000}) is None
    assert real_memory_warning({"real_peak_bytes": 5, "budget_bytes": None}) is None


def test_an_earlier_jobs_reserve_that_no_plan_fits_is_halved_not_dropped(tmp_path):
    """A second job of an architecture starts from the reserve the first measured; where no
    plan fits the budget less it, it tries half of it, a quarter..., before none (it went to
    none at once: the job then planned for its whole budget)."""
    import torch
    from dbml.scheduler.execute.devices import CpuDevice
    from dbml.scheduler.execute.runner import ScheduledStep
    from dbml.scheduler.execute.spill import SpillFile
    from dbml.scheduler.graph.optim import OptimizerSpec
    from dbml.scheduler.multijob.registry import DEVICES

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(128, 2, generator=g), torch.randint(0, 2, (128,), generator=g)

    def job(name):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(2, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                    torch.nn.ReLU(), torch.nn.Linear(512, 2))
        return ScheduledStep(model, torch.nn.functional.cross_entropy, OptimizerSpec("adam"), budget_bytes=6_000_000,
                             device=CpuDevice(spill=SpillFile(str(tmp_path), name)), job=name,
                             share_graphs="reserve-halving-mlp")

    first = job("first")
    first._graph(x, y)
    key = first._real_key
    first.close()
    assert key is not None
    DEVICES.real_reserves[key] = 4_000_000   # no plan fits 6 MB less it and the bounce buffer's 1 MB
    try:
        second = job("second")
        g2 = second._graph(x, y)
        assert 0 < second.device_reserve < 4_000_000, second.device_reserve
        assert g2.plan.peak_bytes <= 6_000_000 - second.real_reserve - second.device_reserve
        second.close()
    finally:
        DEVICES.real_reserves.pop(key, None)
