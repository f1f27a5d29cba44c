"""A fresh process's first dbml statements that need no model run without torch (issue 32,
item 1: the first ``SELECT count(*) FROM dbml_jobs`` took 8-17 s, importing torch and the
scheduler's torch.fx to count zero rows).

``dbml.connect`` (which preloads the UDFs' module), the catalog and live views, and the
errors of train()'s arguments and of its source's columns import neither torch, the
scheduler's graph capture nor the zoo; a statement that trains does. Checked by what a
fresh interpreter has imported, not by timing (``benchmarks/bench_first_statement.py``
times it).
"""

import subprocess
import sys

import pytest

HEAVY = ("torch", "torch.fx", "sympy", "dbml.scheduler.graph.capture", "dbml.zoo", "dbml.core.training",
         "dbml.core.catalog", "dbml.core.inference", "dbml.core.latency")

SETUP = """
import sys
import dbml, duckdb
con = dbml.connect()
con.execute("CREATE TABLE t AS SELECT range::DOUBLE AS x, range % 2 AS y FROM range(400)")
def error(query):
    try:
        con.execute(query).fetchall()
    except duckdb.Error as e:
        return str(e)
    raise AssertionError(f"no error from {query}")
"""

NO_MODEL = SETUP + """
assert con.execute("SELECT count(*) FROM dbml_jobs").fetchall() == [(0,)]
assert con.execute("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]
assert con.execute("SELECT count(*) FROM dbml_trials").fetchall() == [(0,)]
assert "source has no column 'yy' (did you mean 'y'?); pass label := '<column>'" in error(
    "SELECT train('m', 't', label := 'yy')")
assert "unknown optimizer 'adamm'" in error("SELECT train('m', 't', label := 'y', optimizer := 'adamm')")
assert "epochs" in error("SELECT train('m', 't', label := 'y', epochs := 0)")
assert "source has no column 'nope'" in error("SELECT train('m', 't', label := 'y', text := ['nope'])")
assert con.execute("SELECT status FROM dbml_jobs ORDER BY job_id").fetchall() == [('failed',), ('failed',)]
"""


def imported_after(code: str) -> dict:
    """Which of HEAVY a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nprint({{m: m in sys.modules for m in {HEAVY!r}}})"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return eval(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow   # a fresh interpreter: ~1 s
def test_views_and_argument_and_column_errors_import_no_torch():
    loaded = imported_after(NO_MODEL)
    assert not any(loaded.values()), loaded


@pytest.mark.slow   # a fresh interpreter that trains: ~4 s
def test_a_statement_that_trains_imports_torch_then():
    loaded = imported_after(SETUP + "con.execute(\"SELECT train('m', 't', label := 'y', epochs := 1)\").fetchall()")
    assert loaded["torch"] and loaded["dbml.core.training"] and loaded["dbml.core.catalog"]


@pytest.mark.slow   # a fresh interpreter that trains: ~4 s
def test_a_jobs_symbolic_scalars_import_nothing_of_torchs_compiler():
    """Each unbacked symbol of a step (Adam's bias correction) made torch walk the stack past
    its own files, whose list imports torch.export, torch._inductor and networkx: 0.25 s of a
    fresh process's first train() (capture.shape_env)."""
    probe = SETUP + ("con.execute(\"SELECT train('m', 't', label := 'y', epochs := 1)\").fetchall()\n"
                     "print([m for m in ('torch.export._trace', 'torch._inductor.sizevars', 'networkx') "
                     "if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout


@pytest.mark.slow   # a fresh interpreter that imports torch: ~3 s
def test_the_modules_a_job_needs_are_out_of_the_collectors_reach():
    """What training imports (torch, fx, sympy, torch._dynamo through the graph store's
    ShapeEnv) is frozen (gc.freeze): the full collection after each job walked ~300,000
    objects of theirs, half of a warm 400-row train()."""
    probe = ("import gc, dbml.core.training, torch._dynamo\n"
             "print(len(gc.get_objects()), gc.get_freeze_count())")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    tracked, frozen = map(int, r.stdout.split())
    assert frozen > 100_000 and tracked < frozen / 20, (tracked, frozen)
