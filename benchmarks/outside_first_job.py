"""A fresh process's one train() of the MLP of dp_real_memory.py, eager or under a budget: run it under
/usr/bin/time -f %M for the max RSS from outside (results/2026-11-28-vm-2c-issue33-first-job.md).

    /usr/bin/time -f %M python benchmarks/outside_first_job.py ", memory_budget := 67300000"
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import dbml  # noqa: E402
from helpers import load, moons  # noqa: E402

extra = sys.argv[1]
con = dbml.connect(latency_model="roofline", progress="off")
load(con, "moons", moons(4000))
r = con.execute("SELECT train('m', 'moons', label := 'label', features := ['x1','x2'], arch := 'mlp', "
                f"hidden := [2048, 2048], epochs := 3, batch_size := 512{extra})").fetchall()[0][0]
print(r["status"], con.execute("SELECT real_peak_bytes FROM dbml_jobs").fetchall()[0][0])
