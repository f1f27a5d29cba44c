"""Real memory: what one training job adds to the process, measured from outside (section "realmem").

Each method runs in a fresh Python process (``python -m dbml.bench.realmem METHOD WORKLOAD``)
that first makes its data, then resets the kernel's high-water mark (``/proc/self/clear_refs``)
and reads ``VmRSS``; once the job is over, ``VmHWM`` minus that RSS is the memory the job added
(``added_bytes``): tensors, captured graphs, plans, pools, batches, DuckDB's scratch table and
allocator, the stored model, whatever holds it. The methods:

* ``plain``: the loop a user writes by hand: the workload's zoo model, Adam (lr 1e-3, as every
  method of the bench), cross-entropy, batches sliced from one tensor;
* ``dbml-none``: ``train(..., policy := 'none')`` of the same model, batch, optimizer and steps
  over a DuckDB table holding the same numbers (one epoch, no validation), stored in the catalog.

Issue 29's goal: ``dbml-none`` adds at most 1.2x what ``plain`` adds (``ratio``). The figures
are Linux's (``/proc``); elsewhere the rows say so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

__all__ = ["METHODS", "measure", "rows_for", "added_memory"]

METHODS = ("plain", "dbml-none")
STEPS = 8   # iterations per job: the steady state is reached after two or three


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def added_memory(job) -> dict:
    """Run ``job()`` and return what it added to this process's real memory: the RSS
    high-water mark during it (reset before it starts) minus the RSS before it."""
    import gc
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:   # "5": reset VmHWM to the current RSS
        f.write("5")
    before = _status()["VmRSS"]
    started = time.perf_counter()
    job()
    seconds = time.perf_counter() - started
    after = _status()
    return {"rss_before_bytes": before, "added_bytes": after["VmHWM"] - before,
            "kept_bytes": after["VmRSS"] - before, "seconds": seconds}


def _data(w, rows: int):
    """(x, y) as numpy arrays: the workload's input kind, every class present."""
    import numpy as np
    from .workloads import CLASSES
    rng, i = np.random.default_rng(0), w.inputs
    if i.kind == "image":
        x = rng.standard_normal((rows, *i.shape), dtype=np.float32)
    elif i.kind == "tokens":
        x = rng.integers(2, i.vocab, (rows, i.max_len))
    else:
        x = rng.standard_normal((rows, i.features), dtype=np.float32)
    y = np.arange(rows) % CLASSES
    return x, y


def _plain(w, x, y, batch: int):
    import torch
    import torch.nn.functional as F
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def job():
        model = w.model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for s in range(0, len(yt), batch):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xt[s:s + batch]), yt[s:s + batch])
            loss.backward()
            opt.step()
            loss.item()
    return job


def _dbml(w, x, y, batch: int, threads: int):
    import numpy as np
    import pyarrow as pa

    import dbml
    con = dbml.connect(latency_model="roofline", torch_threads=threads)
    con.execute("SET enable_progress_bar = false")
    i, rows = w.inputs, len(y)
    if i.kind == "tokens":   # INTEGER[] token ids
        offsets = pa.array(np.arange(0, rows * i.max_len + 1, i.max_len, dtype=np.int32))
        col, extra = pa.ListArray.from_arrays(offsets, pa.array(x.ravel().astype(np.int32))), ""
    else:                    # FLOAT[n]: features, or an image through shape := [c, h, w]
        flat = x.reshape(rows, -1)
        col = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), flat.shape[1])
        extra = f", shape := {list(i.shape)}" if i.kind == "image" else ""
    table = pa.table({"x": col, "y": pa.array(y)})
    con.from_arrow(table).create("data")
    del table, col
    options = f", options := '{json.dumps(dict(w.options))}'" if w.options else ""
    sql = (f"SELECT train('m', 'SELECT x, y FROM data', label := 'y', arch := '{w.arch}', batch_size := {batch}, "
           f"epochs := 1, early_stop := false, validation := 0, policy := 'none', optimizer := 'adam', "
           f"lr := 0.001{extra}{options})")
    return lambda: con.sql(sql).fetchall()


def measure(method: str, workload: str, batch: int | None = None, steps: int = STEPS, threads: int = 1) -> dict:
    """In this process (a fresh one: see :func:`rows_for`): ``method``'s job on ``workload``,
    its added memory."""
    import torch

    from .workloads import workload as find
    torch.set_num_threads(threads)
    w = find(workload)
    batch = batch or w.batch
    x, y = _data(w, batch * steps)
    job = _plain(w, x, y, batch) if method == "plain" else _dbml(w, x, y, batch, threads)
    return {"method": method, "workload": workload, "batch": batch, "steps": steps, "threads": threads,
            **added_memory(job)}


def rows_for(w, batch: int | None = None, steps: int = STEPS, threads: int = 1, methods=METHODS) -> list[dict]:
    """Bench rows of section "realmem": each method in a fresh process; dbml's ``ratio`` is
    its added memory over the plain loop's."""
    rows = []
    for method in methods:
        row = {"section": "realmem", "workload": w.name, "method": method,
               "family": "eager" if method == "plain" else "dbml", "mode": "cpu", "batch": batch or w.batch,
               "jobs": 1, "threads": threads, "error": None, "note": f"{steps} steps, fresh process"}
        if not sys.platform.startswith("linux"):
            rows.append({**row, "error": "needs Linux's /proc/self (VmHWM, clear_refs)"})
            continue
        cmd = [sys.executable, "-m", "dbml.bench.realmem", method, w.name, "--steps", str(steps),
               "--threads", str(threads)] + (["--batch", str(batch)] if batch else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
        if proc.returncode != 0:
            rows.append({**row, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else
                         f"exit status {proc.returncode}"})
            continue
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append({**row, **{k: got[k] for k in ("added_bytes", "kept_bytes", "rss_before_bytes", "seconds")}})
    plain = next((r.get("added_bytes") for r in rows if r["method"] == "plain"), None)
    for r in rows:
        r["ratio"] = r["added_bytes"] / plain if plain and r.get("added_bytes") is not None else None
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dbml.bench.realmem",
                                description="one job's added real memory, in this (fresh) process, as JSON")
    p.add_argument("method", choices=METHODS)
    p.add_argument("workload")
    p.add_argument("--batch", type=int)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    print(json.dumps(measure(args.method, args.workload, args.batch, args.steps, args.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
