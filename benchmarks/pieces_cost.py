"""What pieces cost (issue 33, ninth round): 3 epochs of the MLP of hidden [2048, 2048] on
4,000 moons rows (``dp_real_memory.py``'s) under a budget, as a process's second job (a first
one of 1 epoch at 67.3 MB warms the process); prints the statement's seconds, the planned and
real peak and the swaps. Run it beside the old code for before/after (its weight is cut into
pieces at 67.3 MB, kept whole at 100 MB: ``runners.fit_pieces``).

    python benchmarks/pieces_cost.py 67.3MB
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import dbml  # noqa: E402
from helpers import load, moons  # noqa: E402

BASE = "label := 'label', features := ['x1','x2'], hidden := [2048, 2048], batch_size := 512"


def main(budget: str) -> None:
    con = dbml.connect(latency_model="roofline", progress="off")
    load(con, "moons", moons(4000))
    con.execute(f"SELECT train('w', 'moons', {BASE}, epochs := 1, memory_budget := '67.3MB')").fetchall()
    t = time.perf_counter()
    r = con.execute(f"SELECT train('v', 'moons', {BASE}, epochs := 3, memory_budget := ?)", [budget]).fetchall()[0][0]
    took = time.perf_counter() - t
    planned, real, swaps, recomputes = con.execute(
        "SELECT planned_peak_bytes, real_peak_bytes, swaps, recomputes FROM dbml_jobs WHERE job_id = ?",
        [r["job_id"]]).fetchall()[0]
    print(f"{budget} {took:.2f} s, planned {planned / 1e6:.1f} MB, real {real / 1e6:.1f} MB, {swaps} swaps, "
          f"{recomputes} recomputes (load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main(sys.argv[1])
