"""The memory budget is a promise kept before anything is allocated (issue 10, item 7).

A model whose parameters and optimizer state alone exceed the budget is refused before
its parameters exist; a budget no plan meets fails from the captured graph (fake
tensors) before any activation is allocated; the eager "vanilla" run on a copy of the
model, unbudgeted memory, happens only with ``measure_vanilla := true``.
"""

import re
import subprocess
import sys
import textwrap
import time

import duckdb
import pytest

from dbml.core import models, runners
from helpers import job_of

# issue 10 reliability tests: whole databases and subprocesses; in the full suite, not the fast loop
pytestmark = pytest.mark.slow

SMALL = "CREATE TABLE t AS SELECT i::DOUBLE AS a, (i * 7 % 13)::DOUBLE AS b, i % 2 AS y FROM range(300) r(i)"

# Run in a subprocess so the test process's own peak is not the one measured. The address
# space is capped 3 GB above what the process maps before train(), so a dbml that builds
# the model anyway fails fast with an allocation error instead of taking the machine's RAM.
HUGE = textwrap.dedent(f"""
    import resource, time
    import dbml

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

    def vm_size():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

    con = dbml.connect(latency_model="roofline")
    con.execute("{SMALL}")
    con.execute("SET memory_limit = '4GiB'")   # the CPU's default budget: half of it, 2 GiB
    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + 3 * 2**30, resource.RLIM_INFINITY))
    before, started = hwm(), time.perf_counter()
    try:
        con.sql("SELECT train('huge', 't', label := 'y', epochs := 1, hidden := [20000, 20000])").fetchall()
        print("TRAINED")
    except Exception as e:
        print("ERROR", str(e).replace("\\n", " "))
    print("SECONDS", time.perf_counter() - started)
    print("GROWTH", hwm() - before)
    print("MODELS", con.sql("SELECT count(*) FROM dbml_models").fetchall()[0][0])
""")


@pytest.mark.slow   # a subprocess that imports torch
def test_a_model_whose_parameters_exceed_the_budget_is_refused_before_it_is_built():
    r = subprocess.run([sys.executable, "-c", HUGE], capture_output=True, text=True, timeout=120)
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ERROR" in out, r.stdout
    assert re.search(r"memory_budget 2147\.5 MB \(2147483648 bytes\) is below the smallest budget this model "
                     r"and batch can be trained in, [0-9.]+ MB", out["ERROR"]), out["ERROR"]
    # refused before it is built: the memory did not grow (below); the time only rules out a build
    # (minutes), not a measure: a fresh process with torch's tracing warm-up (~3 s quiet, 10 at load 7)
    assert float(out["SECONDS"]) < 60
    assert int(out["GROWTH"]) < 500e6
    assert out["MODELS"] == "0"


def test_a_model_whose_parameters_exceed_the_device_memory_names_hidden_and_arch(con, monkeypatch):
    con.execute(SMALL)
    monkeypatch.setattr(runners, "device_memory", lambda device: 10**9)
    monkeypatch.setattr(models, "build_seeded", _refuse("the real model's construction"))
    with pytest.raises(duckdb.Error, match=re.escape(
            "train(): the model's parameters and adam state alone need 4.80 GB (1.60 GB of parameters: "
            "hidden := [20000, 20000] on 2 features), more than the device's memory (1.00 GB, cpu); nothing "
            "was stored; pass smaller hidden := layer sizes or arch := 'linear'")):
        con.sql("SELECT train('huge', 't', label := 'y', hidden := [20000, 20000])").fetchall()
    assert con.sql("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} ran")
    return refuse


BUDGET_ERROR = (r"train\(\): memory_budget [0-9.]+ MB \([0-9]+ bytes\) is below the smallest budget this model "
                r"and batch can be trained in, [0-9.]+ MB \([0-9]+ bytes\); pass memory_budget := '[0-9.]+[KM]B' or more")


def test_a_budget_below_the_smallest_feasible_fails_before_any_activation(con, monkeypatch):
    con.execute(SMALL)
    monkeypatch.setattr(runners, "eager_peak", _refuse("the eager vanilla"))
    for limit in (10, 5):   # the first in a process includes torch's one-time tracing warm-up (~3 s)
        started = time.perf_counter()
        with pytest.raises(duckdb.Error, match=BUDGET_ERROR):
            con.sql("SELECT train('tiny', 't', label := 'y', hidden := [256, 256], memory_budget := 10000)").fetchall()
        assert time.perf_counter() - started < limit
    assert con.sql("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]


def test_a_large_model_over_its_budget_fails_from_a_plan_on_the_meta_device(con, monkeypatch):
    # a 36 MB weight: its update runs in 16 MiB pieces (chunked), but its forward rebuilds it
    # beside the pieces (72 MB), so 50 MB is infeasible, which the plan of a model on the meta
    # device finds before the real one is built
    con.execute(SMALL)
    monkeypatch.setattr(models, "build_seeded", _refuse("the real model's construction"))
    monkeypatch.setattr(runners, "eager_peak", _refuse("the eager vanilla"))
    started = time.perf_counter()
    with pytest.raises(duckdb.Error, match=BUDGET_ERROR):
        con.sql("SELECT train('big', 't', label := 'y', hidden := [3000, 3000], memory_budget := '50MB')").fetchall()
    assert time.perf_counter() - started < 5
    assert con.sql("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]


def test_the_vanilla_is_analysed_by_default_and_measured_only_when_asked(con, monkeypatch):
    con.execute(SMALL)
    calls = []
    eager_peak = runners.eager_peak
    monkeypatch.setattr(runners, "eager_peak", lambda *a: calls.append(1) or eager_peak(*a))
    args = "label := 'y', epochs := 1, hidden := [32]"
    default = job_of(con, con.sql(f"SELECT train('a', 't', {args})").fetchall()[0][0])
    assert calls == [] and default["vanilla_source"] == "analysed"
    stored = con.sql("SELECT (metrics->'memory'->>'planned_vanilla_peak_bytes')::BIGINT FROM dbml_models").fetchall()
    assert default["vanilla_peak_bytes"] == stored[0][0] > 0     # the plan's unscheduled peak
    measured = job_of(con, con.sql(f"SELECT train('m', 't', {args}, measure_vanilla := true)").fetchall()[0][0])
    assert calls == [1] and measured["vanilla_source"] == "measured"
    eager = job_of(con, con.sql(f"SELECT train('e', 't', {args}, policy := 'eager')").fetchall()[0][0])
    assert calls == [1] and eager["vanilla_source"] == "measured"   # an eager job is its own vanilla
    assert eager["vanilla_peak_bytes"] == eager["measured_peak_bytes"] and eager["msr"] == 0
