"""tune() of 32 small trials against the same 32 trainings one train() at a time (issue 32).

The search: a tabular MLP on a generated table of ``ROWS`` rows, a grid of 32 trials over
``lr`` (8 values) and ``hidden`` (4 shapes), ``EPOCHS`` epochs each, no pruning, objective
``val_loss``: every trial trains. The baseline: 32 ``train()`` calls with the same arguments,
one after the other (each stores its model, as a user running them would). Both in one
warm process (a train() first pays the process's start-up), interleaved ``--repeats``
times; the figures are medians, with the load average before and after. ``--unfused``: every
trial its own job (``search.FUSE_TRIALS`` off), so that the per-trial fixed costs show.

    python -m dbml.bench.tune_vs_train [--repeats 3] [--rows 400] [--unfused]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time

import dbml
import dbml.tuning

ROWS = 400
EPOCHS = 5
LRS = [1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2e-2, 3e-2, 5e-2]
HIDDEN = [[16], [32], [32, 16], [64, 32]]
FIXED = dict(label="y", arch="mlp", epochs=EPOCHS, seed=0, early_stop=False)


def table(con, rows: int) -> None:
    cols = ", ".join(f"(hash(range, {i}) % 1000 / 1000.0) AS f{i}" for i in range(8))
    con.execute(f"CREATE OR REPLACE TABLE tv AS SELECT *, (f0 + f1 * f2 > 0.6)::INT AS y "
                f"FROM (SELECT {cols} FROM range({rows}))")


def points() -> list[dict]:
    return [{"lr": lr, "hidden": hidden} for hidden, lr in itertools.product(HIDDEN, LRS)]


def sequential(con) -> float:
    started = time.perf_counter()
    for p in points():
        dbml.train(con, "tv_one", "tv", **FIXED, **p)
    return time.perf_counter() - started


def tuned(con, repeat: int) -> float:
    space = {"lr": {"choice": LRS}, "hidden": {"choice": HIDDEN}}
    started = time.perf_counter()
    rows = dbml.tuning.tune(con, f"tv_tuned_{repeat}", "tv", space, trials=len(points()), algorithm="grid",
                            pruner="none", **FIXED)
    seconds = time.perf_counter() - started
    assert len(rows) == len(points()) and all(r["status"] == "finished" for r in rows), rows
    return seconds


def run(repeats: int = 3, rows: int = ROWS, log=print, fused: bool = True) -> dict:
    import warnings

    from dbml.search import engine

    engine.FUSE_TRIALS = fused
    warnings.simplefilter("ignore")   # the best trial's "stored as version" notice, once per search
    con = dbml.connect(progress="off")
    con.execute("SET enable_progress_bar = false")
    table(con, rows)
    dbml.train(con, "tv_warm", "tv", **FIXED)   # the process's start-up, paid before either is timed
    seq, tune = [], []
    for repeat in range(repeats):
        seq.append(sequential(con))
        tune.append(tuned(con, repeat))
        log(f"repeat {repeat}: 32 x train() {seq[-1]:.2f} s, tune() {tune[-1]:.2f} s, "
            f"ratio {seq[-1] / tune[-1]:.2f}")
    out = {"sequential_s": statistics.median(seq), "tune_s": statistics.median(tune)}
    out["speedup"] = out["sequential_s"] / out["tune_s"]
    log(f"median: 32 x train() {out['sequential_s']:.2f} s, tune() {out['tune_s']:.2f} s, "
        f"tune() {out['speedup']:.2f}x faster")
    con.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--unfused", action="store_true", help="every trial its own job")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    out = run(args.repeats, args.rows, fused=not args.unfused)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
