"""The shell's goals of issue 25, timed as whole processes against DuckDB's Python client.

- start-up: ``python -m dbml shell -c "SELECT 1"`` vs ``python -c "import duckdb; duckdb.sql('select 1')"``
  (goal: 0.5 s median);
- a 10,000-line script through ``.read`` vs the client running the same script
  (``con.execute(script)``): single-row INSERTs, and the same with every tenth line a
  SELECT whose row the shell prints (goal: under 2x).

Runs alternate (A B A B ...) so that a drifting machine moves both; medians are printed.

    python benchmarks/bench_shell.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def scripts(folder: Path) -> dict[str, Path]:
    """The two 10,000-line scripts."""
    out = {}
    for name, every in (("inserts", 0), ("mixed", 10)):
        lines = ["CREATE TABLE t(i INTEGER, s VARCHAR, d DOUBLE);"]
        for i in range(1, 10_000):
            if every and i % every == 0:
                lines.append(f"SELECT i, s, d FROM t WHERE i = {i - 1};")
            else:
                lines.append(f"INSERT INTO t VALUES ({i}, 'row {i}', {i}.5);")
        path = folder / f"{name}10k.sql"
        path.write_text("\n".join(lines) + "\n")
        out[name] = path
    return out


def timed(command: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def compare(a: list[str], b: list[str], runs: int) -> tuple[float, float]:
    timed(a), timed(b)   # warm-up: the file cache, the bytecode
    ta, tb = [], []
    for _ in range(runs):
        ta.append(timed(a))
        tb.append(timed(b))
    return statistics.median(ta), statistics.median(tb)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args(argv)
    py = sys.executable
    rows = [("start-up, SELECT 1", [py, "-m", "dbml", "shell", "-c", "SELECT 1"],
             [py, "-c", "import duckdb; duckdb.sql('select 1')"])]
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in scripts(Path(tmp)).items():
            rows.append((f".read 10,000 lines ({name})", [py, "-m", "dbml", "shell", "-c", f".read {path}"],
                         [py, "-c", f"import duckdb; duckdb.connect().execute(open({str(path)!r}).read())"]))
        print(f"{'what':<34} {'dbml shell s':>13} {'duckdb client s':>16} {'ratio':>7}")
        for name, a, b in rows:
            ta, tb = compare(a, b, args.runs)
            print(f"{name:<34} {ta:>13.3f} {tb:>16.3f} {ta / tb:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
