"""A fresh process's first statement (issue 32, items 1 and 11), timed in fresh interpreters.

- ``import duckdb`` and a DuckDB client's first ``SELECT 1``: the floor;
- ``dbml.connect(':memory:')`` then ``SELECT count(*) FROM dbml_jobs`` (goal ≤ 1.5 s), and then
  a train() whose label is misspelt (its error, goal ≤ 1.5 s): the time from the interpreter's
  start (``time.perf_counter`` against the process's start, so the interpreter is counted)
  to the answer;
- the shell: ``python -m dbml shell -c "SELECT 1"`` and ``SELECT 1`` piped into it, whole
  processes (goal ≤ 0.5 s median);
- train() of a 400-row table with the defaults (10 numeric features, a binary label): the
  first in a fresh process (from the process's start, and the statement alone), then the
  same call again in that process (warm); goal: first ≤ 3 s from the start and ≤ 2× warm.

Each figure is the median of ``--runs`` fresh processes, after one warm-up round; runs of
the rows alternate, so a drifting machine moves them all. The children keep Python's bytecode
(in a temporary ``PYTHONPYCACHEPREFIX``, even under ``PYTHONDONTWRITEBYTECODE``) as an
installed package does: compiling dbml's sources anew took 0.25 s of every shell start-up. The load average (``os.getloadavg``) is printed before and
after: these machines are shared, and quiet figures need a quiet machine.

    python benchmarks/bench_first_statement.py [--runs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# Child programs: each prints one JSON line of its in-process seconds. ``since_start`` is the
# time since the process started (psutil-free: /proc/self/stat's start time in clock ticks).
SINCE_START = """
import os, time
def since_start():
    ticks = os.sysconf("SC_CLK_TCK")
    start = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]) / ticks
    boot = float(open("/proc/uptime").read().split()[0])
    return boot - start
"""

FIRST_STATEMENT = SINCE_START + """
import json
import dbml, duckdb
con = dbml.connect(":memory:")
con.execute("SELECT count(*) FROM dbml_jobs").fetchall()
jobs = since_start()
con.execute("CREATE TABLE t AS SELECT range::DOUBLE AS x, range % 2 AS y FROM range(400)")
t0 = time.perf_counter()
try:
    con.execute("SELECT train('m', 't', label := 'yy')").fetchall()
except duckdb.Error as e:
    assert "no column 'yy'" in str(e), e
error = since_start()
print(json.dumps({"dbml_jobs": jobs, "wrong_label": error, "wrong_label_statement": time.perf_counter() - t0}))
"""

TRAIN = SINCE_START + """
import json
import dbml
con = dbml.connect(":memory:")
con.execute("CREATE TABLE t AS SELECT " + ", ".join(f"sin(range * {i + 1}) AS x{i}" for i in range(10))
            + ", (sin(range) + cos(range * 3) > 0)::INT AS y FROM range(400)")
out = {}
for run in ("first", "warm"):
    t0 = time.perf_counter()
    con.execute(f"SELECT train('m{run}', 't', label := 'y')").fetchall()
    out[run] = time.perf_counter() - t0
    if run == "first":
        out["first_from_start"] = since_start()
print(json.dumps(out))
"""


SHELL = "shell -c 'SELECT 1'"


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def whole(command: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=ENV)
    return time.perf_counter() - t0


def piped(command: list[str], text: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(command, input=text, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True, env=ENV)
    return time.perf_counter() - t0


def inside(code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=ENV)
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure(runs: int) -> dict[str, list[float]]:
    py = sys.executable
    rows: dict[str, list[float]] = {}

    def add(values: dict) -> None:
        for k, v in values.items():
            rows.setdefault(k, []).append(v)

    probes = [
        lambda: {"import duckdb": whole([py, "-c", "import duckdb"])},
        lambda: {"duckdb client SELECT 1": whole([py, "-c", "import duckdb; duckdb.sql('select 1').fetchall()"])},
        lambda: {SHELL: whole([py, "-m", "dbml", "shell", "-c", "SELECT 1"])},
        lambda: {"shell, SELECT 1 piped": piped([py, "-m", "dbml", "shell"], "SELECT 1;\n")},
        lambda: inside(FIRST_STATEMENT),
        lambda: inside(TRAIN),
    ]
    for probe in probes:   # warm-up: the file cache, the bytecode
        probe()
    for _ in range(runs):
        for probe in probes:
            add(probe())
    return rows


LABELS = {
    "dbml_jobs": "connect + SELECT count(*) FROM dbml_jobs, from process start",
    "wrong_label": "... then train() with a misspelt label: its error, from process start",
    "wrong_label_statement": "... the misspelt label's statement alone",
    "first": "first train() of 400 rows, defaults: the statement",
    "first_from_start": "first train(), from process start",
    "warm": "the same train() again, warm",
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", help="write the medians and every run here")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as pycache:
        ENV["PYTHONPYCACHEPREFIX"] = pycache
        rows = measure(args.runs)
    load_after = os.getloadavg()
    medians = {k: statistics.median(v) for k, v in rows.items()}
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; {args.runs} runs each, medians")
    print(f"{'what':<66} {'median s':>9} {'min s':>7} {'max s':>7}")
    for k, v in rows.items():
        print(f"{LABELS.get(k, k):<66} {medians[k]:>9.3f} {min(v):>7.3f} {max(v):>7.3f}")
    print(f"{'first train() / warm':<66} {medians['first'] / medians['warm']:>9.2f}")
    print(f"{'shell -c SELECT 1, over import duckdb':<66} {medians[SHELL] - medians['import duckdb']:>9.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_before": load_before, "load_after": load_after, "medians": medians, "runs": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
