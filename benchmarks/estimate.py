"""The estimate against the measured time (issue 32): train()'s ``estimated_seconds``, said
before the first iteration, against the wall time of the ``train()`` statement, start-up included.

One run trains, in a fresh process (``python -m dbml.bench.estimate``; the jobs run in a
child process so that its first job is a fresh process's first):

* ``cold mlp 400``: the process's first job (imports, the latency predictor, the first
  capture and plan, reading rows: all the statement's start-up);
* tabular jobs warm: ``mlp`` and ``linear`` on 400, 5,000 and 20,000 rows of a generated table;
* image: the zoo's small CNN (``cnn``) on scikit-learn's digits (8x8, ``shape := [1, 8, 8]``);
* text: the text model ``auto`` picks (``bow``) and a ``transformer`` on a generated corpus;
* ``cold linear 400`` in a second fresh process.

Every job runs its full ``epochs`` (``early_stop := false``: the estimate is for the epochs
asked; early stopping can only end sooner). Per job: the estimate (``dbml_jobs.estimated_seconds``:
the last said, from the job's first steps), measured, ``ratio`` (estimate / measured), and the
same for the prediction said before the first iteration (``predicted_seconds`` in the model's
metrics); then the median ratios and the jobs outside +-30 %. The load average is printed
before and after. ``--fresh`` runs on a cache directory holding only the installed predictor and
spill tiers (a new user's machine after ``install``: nothing learned from earlier jobs).

    python -m dbml.bench.estimate [--fresh] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import time

TOLERANCE = 0.30
TABULAR_ROWS = (400, 5000, 20000)
FEATURES = 10


def _tabular(con, rows: int) -> str:
    name = f"tab_{rows}"
    cols = ", ".join(f"(hash(range, {i}) % 1000 / 1000.0) AS f{i}" for i in range(FEATURES))
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT *, (f0 + f1 * f2 > 0.6)::INT AS y "
                f"FROM (SELECT {cols} FROM range({rows}))")
    return name


def _digits(con) -> str:
    from sklearn.datasets import load_digits

    import pyarrow as pa

    d = load_digits()
    table = pa.table({"image": pa.array(d.data.astype("float32").tolist(), type=pa.list_(pa.float32())),
                      "y": pa.array(d.target.astype("int64"))})
    con.register("digits_arrow", table)
    con.execute("CREATE OR REPLACE TABLE digits AS SELECT image::FLOAT[64] AS image, y FROM digits_arrow")
    return "digits"


WORDS = [f"w{i}" for i in range(400)]


def _corpus(con, rows: int = 2000) -> str:
    import random

    rng = random.Random(0)
    texts, labels = [], []
    for _ in range(rows):
        y = rng.randrange(3)
        words = [rng.choice(WORDS[y * 100:(y + 1) * 100] if rng.random() < 0.3 else WORDS)
                 for _ in range(rng.randrange(8, 40))]
        texts.append(" ".join(words))
        labels.append(y)
    import pyarrow as pa

    con.register("corpus_arrow", pa.table({"body": texts, "y": labels}))
    con.execute("CREATE OR REPLACE TABLE corpus AS SELECT * FROM corpus_arrow")
    return "corpus"


def _jobs(cold: str) -> list[tuple[str, str, dict]]:
    """(name, table, arguments) in the order trained; the first is the process's first job."""
    tab = {r: f"tab_{r}" for r in TABULAR_ROWS}
    first = [(f"cold {cold} 400", tab[400], dict(arch=cold))]
    if cold == "linear":
        return first
    warm = [(f"{arch} {rows}", tab[rows], dict(arch=arch)) for arch in ("mlp", "linear") for rows in TABULAR_ROWS]
    return first + warm + [("cnn digits", "digits", dict(arch="cnn", shape=[1, 8, 8], epochs=5)),
                           ("bow corpus", "corpus", dict(arch="auto", text=["body"])),
                           ("transformer corpus", "corpus", dict(arch="transformer", text=["body"], epochs=2,
                                                                   options=json.dumps({"width": 32, "depth": 1})))]


def child(cold: str) -> list[dict]:
    """The jobs of one fresh process, timed: each train() statement's wall time."""
    import dbml

    con = dbml.connect(progress="off")
    con.execute("SET enable_progress_bar = false")
    for rows in TABULAR_ROWS:
        _tabular(con, rows)
    if cold != "linear":
        _digits(con)
        _corpus(con)
    rows = []
    for i, (name, table, args) in enumerate(_jobs(cold)):
        started = time.perf_counter()
        r = dbml.train(con, f"m{i}", table, label="y", early_stop=False, **args)
        measured = time.perf_counter() - started
        est = con.execute("SELECT estimated_seconds FROM dbml_jobs WHERE job_id = ?", [r["job_id"]]).fetchall()[0][0]
        predicted = con.execute("SELECT (metrics->>'predicted_seconds')::DOUBLE FROM dbml_models WHERE name = ?",
                                [f"m{i}"]).fetchall()[0][0]
        rows.append({"job": name, "estimated": est, "predicted": predicted, "measured": measured,
                     "ratio": None if est is None else est / measured,
                     "predicted_ratio": None if predicted is None else predicted / measured, "job_seconds": r["seconds"],
                     "epochs": r["epochs"], "rows": r["rows"]})
    con.close()
    return rows


def run(log=print, env: dict | None = None) -> list[dict]:
    rows = []
    for cold in ("mlp", "linear"):
        out = subprocess.run([sys.executable, "-m", "dbml.bench.estimate", "--child", cold], capture_output=True,
                             text=True, check=False, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"the child process failed:\n{out.stderr[-4000:]}")
        rows += json.loads(out.stdout.strip().splitlines()[-1])
    for r in rows:
        log(f"{r['job']:<22} est {r['estimated'] or float('nan'):7.2f} s  measured {r['measured']:7.2f} s  "
            f"ratio {r['ratio'] or float('nan'):5.2f}  (predicted before training {r['predicted'] or float('nan'):7.2f} s, "
            f"ratio {r['predicted_ratio'] or float('nan'):5.2f}; job {r['job_seconds']:.2f} s)")
    for key, what in (("ratio", "estimate (from the first steps)"), ("predicted_ratio", "predicted before training")):
        ratios = [r[key] for r in rows if r[key] is not None]
        outside = [r["job"] for r in rows if r[key] is None or abs(r[key] - 1) > TOLERANCE]
        log(f"{what}: median ratio {statistics.median(ratios):.2f}; outside +-{TOLERANCE:.0%}: "
            f"{', '.join(outside) or 'none'}")
    return rows


def _fresh_cache(path: str) -> str:
    """``path`` holding copies of this machine's installed predictor and spill tiers, nothing else."""
    from dbml.scheduler.config import cache_dir

    for f in cache_dir().iterdir():
        if f.is_file() and (f.name.startswith("predictor-") or f.name == "spill-tiers.json"):
            shutil.copy(f, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=("mlp", "linear"), help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--fresh", action="store_true", help="a cache with only the installed predictor and spill tiers")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    if args.fresh:
        with tempfile.TemporaryDirectory() as fresh:
            rows = run(env={**os.environ, "DBML_CACHE_DIR": _fresh_cache(fresh)})
    else:
        rows = run()
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
