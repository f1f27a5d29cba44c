"""The interactive shell's first train() as a user meets it (issue 32, item 1).

A user starts ``python -m dbml shell`` at a terminal, takes ``--think`` seconds to type
(default 4), creates a 400-row table and trains on it with the defaults; then trains again
(warm). Timed from the moment each statement is sent to the next prompt, through a
pseudo-terminal (pexpect), with the shell's preload (``dbml.core.preload``: torch and the
scheduler imported while the shell waits at its prompt) and without it
(``DBML_NO_PRELOAD=1``), alternating, medians of ``--runs``. The load average is printed.

    python benchmarks/bench_interactive.py [--runs 5] [--think 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import pexpect

TABLE = ("CREATE TABLE t AS SELECT " + ", ".join(f"sin(range * {i + 1}) AS x{i}" for i in range(10))
         + ", (sin(range) + cos(range * 3) > 0)::INT AS y FROM range(400);")


def session(preload: bool, think: float) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "DBML_NO_PRELOAD"}
    if not preload:
        env["DBML_NO_PRELOAD"] = "1"
    with tempfile.TemporaryDirectory() as d:
        env["DBML_HISTORY"] = os.path.join(d, "history")
        sh = pexpect.spawn(sys.executable, ["-m", "dbml", "shell", os.path.join(d, "db.duckdb")], env=env,
                           encoding="utf-8", timeout=300)
        sh.expect_exact("dbml> ")
        time.sleep(think)
        out = {}
        for name, line in (("create table", TABLE), ("first train()", "SELECT (train('m1', 't', label := 'y')).status;"),
                           ("warm train()", "SELECT (train('m2', 't', label := 'y')).status;")):
            t0 = time.perf_counter()
            sh.sendline(line)
            sh.expect_exact("dbml> ")
            out[name] = time.perf_counter() - t0
            if "train" in name:
                assert "finished" in sh.before, sh.before
        sh.sendline(".quit")
        sh.expect(pexpect.EOF)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--think", type=float, default=4.0, help="seconds between the prompt and the first statement")
    args = p.parse_args(argv)
    load = os.getloadavg()
    rows: dict[str, list[float]] = {}
    session(True, 0)   # warm-up: the file cache
    for _ in range(args.runs):
        for preload in (True, False):
            for k, v in session(preload, args.think).items():
                rows.setdefault(f"{k} ({'preload' if preload else 'DBML_NO_PRELOAD=1'})", []).append(v)
    after = os.getloadavg()
    print(f"load average before {load[0]:.2f}, after {after[0]:.2f}; think {args.think} s; "
          f"{args.runs} runs each, medians")
    for k, v in rows.items():
        print(f"{k:<40} {statistics.median(v):>8.3f} s  (min {min(v):.3f}, max {max(v):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
