"""Data path benchmark: rows per second from DuckDB into torch tensors, and its memory.

    python benchmarks/bench_data.py [--rows 1000000] [--cols 32]

In one run, on the same table of `rows` x `cols` FLOAT columns:
  * dbml: DuckDB assembles one FLOAT[cols] column and stores the rows in a random order
    (once per job, reported apart); each epoch then streams it as Arrow record batches
    viewed as (rows, cols) tensors without copies — plainly, and as training does, from a
    random starting row through a shuffle buffer of 65536 rows;
  * DuckDB's own `.torch()` fetch (a dict of column tensors, stacked into one matrix);
  * `fetchdf()` -> `torch.tensor`.
Memory is the peak rise of the process's resident set during each method, sampled every
millisecond; dbml's should not grow with the table (it streams). Finally one training epoch
of an MLP at batch 1024 through train(), with the time the loop waited on data.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import threading
import time

import duckdb
import torch

import dbml
from dbml.core.data import BatchStream

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    """Peak resident-set rise over a block, sampled on a thread."""

    def __enter__(self):
        gc.collect()
        self.base = self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())
        self.rise = self.peak - self.base


def make_table(con, rows: int, cols: int) -> None:
    exprs = ", ".join(f"(hash(range, {c}) % 100000 / 100000.0)::FLOAT AS c{c}" for c in range(cols))
    con.execute(f"CREATE OR REPLACE TABLE wide AS SELECT {exprs}, (range % 2)::INTEGER AS label FROM range({rows})")
    con.execute(packed_sql("packed", cols))


def packed_sql(name: str, cols: int) -> str:
    """What train() builds once per job: the FLOAT[n] features, the label and a content hash."""
    columns = ", ".join(f"c{c}" for c in range(cols))
    return (f"CREATE OR REPLACE TABLE {name} AS SELECT x, y "
            f"FROM (SELECT [{columns}]::FLOAT[{cols}] AS x, label AS y FROM wide) ORDER BY hash(x, y, 0)")


def timed(fn, repeats: int = 3):
    """Best of ``repeats`` runs (the machine is shared), with the largest RSS rise seen."""
    best, rise = None, 0
    for _ in range(repeats):
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            rows = fn()
            seconds = time.perf_counter() - t0
        best, rise = min(best or seconds, seconds), max(rise, mem.rise)
    return {"rows": rows, "seconds": best, "rows_per_s": rows / best, "rss_rise_mb": rise / 2**20}


def dbml_stream(con, sql, batch_rows=1024, **shuffle):
    def run():
        n = 0
        for x, y in BatchStream(con, sql, batch_rows, **shuffle):
            n += x.shape[0]
        return n
    return run


def duckdb_torch(con, cols):
    def run():
        d = con.sql("SELECT * EXCLUDE (label) FROM wide").torch()
        x = torch.stack([d[f"c{c}"] for c in range(cols)], 1)
        return x.shape[0]
    return run


def fetchdf_tensor(con):
    def run():
        df = con.sql("SELECT * EXCLUDE (label) FROM wide").fetchdf()
        x = torch.tensor(df.values)
        return x.shape[0]
    return run


def measure(con, rows, cols):
    make_table(con, rows, cols)
    assemble = timed(lambda: con.execute(packed_sql("packed2", cols)).fetchall()[0][0], repeats=1)
    start = rows // 3
    epoch = [f"SELECT x, y FROM packed WHERE rowid >= {start}", f"SELECT x, y FROM packed WHERE rowid < {start}"]
    results = {
        "dbml stream, zero-copy (batch 1024)": timed(dbml_stream(con, "SELECT x, y FROM packed")),
        "dbml epoch stream, shuffled (batch 1024)": timed(dbml_stream(con, epoch, shuffle=1, window_rows=65536)),
        "duckdb .torch()": timed(duckdb_torch(con, cols)),
        "fetchdf -> torch.tensor": timed(fetchdf_tensor(con)),
    }
    results["dbml FLOAT[n] assembly + sort (once per job)"] = assemble
    return results


def training_wait(con, rows):
    r = con.sql("SELECT train('bench_mlp', 'SELECT * FROM wide', label := 'label', epochs := 1, "
                "batch_size := 1024, validation := 0.0) AS t").fetchall()[0][0]
    m = json.loads(con.sql("SELECT metrics FROM dbml_models WHERE name = 'bench_mlp' ORDER BY version DESC LIMIT 1")
                   .fetchall()[0][0])
    epoch = m["history"][0]
    return {"train_seconds": r["seconds"], "epoch_seconds": epoch["seconds"],
            "wait_seconds": epoch["wait_seconds"], "wait_share": epoch["wait_seconds"] / epoch["seconds"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=32)
    args = ap.parse_args()
    con = dbml.connect(latency_model="roofline")   # the data path only: no calibration here
    con.execute("SET enable_progress_bar = false")
    print(f"torch {torch.__version__}, duckdb {duckdb.__version__}, threads {torch.get_num_threads()}, "
          f"{args.rows} rows x {args.cols} FLOAT columns\n")
    for rows in (args.rows, args.rows * 2):
        print(f"-- {rows} rows")
        results = measure(con, rows, args.cols)
        for name, r in results.items():
            print(f"{name:44s} {r['seconds']:7.3f} s  {r['rows_per_s'] / 1e6:7.2f} M rows/s  "
                  f"RSS rise {r['rss_rise_mb']:7.1f} MB")
        baseline = max(results["duckdb .torch()"]["rows_per_s"], results["fetchdf -> torch.tensor"]["rows_per_s"])
        for name in list(results)[:2]:
            print(f"   {name} vs fastest baseline: {results[name]['rows_per_s'] / baseline:.1f}x")
        print()
    con.execute(f"CREATE OR REPLACE TABLE wide AS SELECT * FROM wide LIMIT {args.rows}")
    w = training_wait(con, args.rows)
    print(f"-- one MLP epoch at batch 1024 over {args.rows} rows: epoch {w['epoch_seconds']:.2f} s, "
          f"waiting on data {w['wait_seconds']:.3f} s = {100 * w['wait_share']:.1f}% of the epoch "
          f"(whole train() incl. statistics and assembly: {w['train_seconds']:.2f} s)")


if __name__ == "__main__":
    main()
