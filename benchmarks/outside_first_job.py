"""A fresh process's one train() of the MLP of dp_real_memory.py, eager or under a budget: run it under
/usr/bin/time -f %M for the max RSS from outside (results/2026-11-28-vm-2c-issue33-first-job.md).

    /usr/bin/time -f %M python benchmarks/outside_first_job.py ", memory_budget := 67300000"
    /usr/bin/time -f %M python benchmarks/outside_first_job.py plain   # the loop a user writes by hand
    /usr/bin/time -f %M python benchmarks/outside_first_job.py base    # imports and the table, no training

``plain``: DuckDB and torch, the same table read into tensors, the same MLP (torch.nn layers),
Adam, 3 epochs of batches of 512 over the rows ``train()`` trains on (its 90 %), no dbml.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from helpers import load, moons  # noqa: E402

ARGS = "label := 'label', features := ['x1','x2'], arch := 'mlp', hidden := [2048, 2048], epochs := 3, batch_size := 512"


def plain() -> None:
    import duckdb
    import torch
    con = duckdb.connect()
    load(con, "moons", moons(4000))
    t = con.execute("SELECT x1, x2, label FROM moons").to_arrow_table()
    x = torch.tensor([t["x1"].to_pylist(), t["x2"].to_pylist()], dtype=torch.float32).T.contiguous()
    y = torch.tensor(t["label"].to_pylist(), dtype=torch.long)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        for i in range(0, 3600, 512):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[i:i + 512]), y[i:i + 512])
            loss.backward()
            opt.step()
    print("finished", float(loss))


def main(extra: str) -> None:
    if extra == "plain":
        return plain()
    import dbml
    con = dbml.connect(latency_model="roofline", progress="off")
    load(con, "moons", moons(4000))
    if extra == "base":
        import dbml.core.training  # noqa: F401 - what a train() imports, without one
        return print("base")
    r = con.execute(f"SELECT train('m', 'moons', {ARGS}{extra})").fetchall()[0][0]
    print(r["status"], con.execute("SELECT real_peak_bytes FROM dbml_jobs").fetchall()[0][0])


if __name__ == "__main__":
    main(sys.argv[1])
