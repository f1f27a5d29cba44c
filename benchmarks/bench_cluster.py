"""Ray cluster benchmark (issue 26): Ray's overhead, the data path into a remote worker, and
20 injected worker kills.

    python -m benchmarks.bench_cluster [--rows 1000000] [--cols 32] [--kills 20] [--out FILE]

One local Ray cluster, as the tests start it (2 CPUs, a 200 MB object store, no
dashboard), on this machine. Sections:

- start: ``ray.init``; dbml's hub; a cold device worker (a process that imports torch and dbml).
- data: rows/s of the local data path (one epoch of the scratch table streamed as training
  streams it: ``BatchStream`` with the shuffle window, no training) against rows/s reaching a
  remote worker (the scratch table into the worker's own DuckDB, through the object store,
  and as Parquet past ``cluster_parquet_bytes``), on a table of ``rows`` x ``cols`` FLOATs.
- dispatch: warm device workers, 10 small jobs: from the driver's start of the fit to the
  worker's first report; and each job's wall time against the same job run locally.
- epochs: per-epoch time of the same job, local and remote (retries off and on: a
  checkpoint after each epoch).
- data-parallel: 2 workers against 1 local worker: wall time, start, equality.
- dpstart: start-up of a data-parallel job on started workers (issue 33, part 4): ``runs``
  small jobs each of ``workers := 1`` (a placed job) and ``workers := 2`` (the same two device
  workers, their process group formed by the first): medians of the whole train() and of the
  time from the train() call to the first step of the slowest worker.
- kills: ``kills`` jobs each killed mid-job (``ray.kill`` and SIGKILL alternating; retries
  off for odd ones, on for even ones): every job either stores the model an uninterrupted
  job stores (bit for bit) or fails naming the fix and stores nothing; the catalog is
  checked whole after each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import time

import duckdb
import torch


def _figures(con, name: str) -> dict:
    row = con.execute("SELECT metrics FROM dbml_models WHERE name = ? ORDER BY version DESC LIMIT 1", [name]).fetchall()
    return json.loads(row[0][0])


def _weights(con, name: str) -> dict:
    from dbml.core import catalog
    cur = con.duckdb.cursor()
    return catalog.load(cur, name, catalog.latest_version(cur, name, fn="bench")).module.state_dict()


def _moons(con, n: int, seed: int = 0) -> None:
    """Two interleaving half circles (as tests/helpers.py's moons), table ``moons``."""
    import numpy as np
    import pyarrow as pa
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, n)
    t = rng.uniform(0, np.pi, n)
    x1 = np.where(label == 0, np.cos(t), 1 - np.cos(t)) + rng.normal(0, 0.1, n)
    x2 = np.where(label == 0, np.sin(t), 0.5 - np.sin(t)) + rng.normal(0, 0.1, n)
    con.register("_moons", pa.table({"x1": x1, "x2": x2, "label": label.astype(np.int32)}))
    con.execute("CREATE TABLE moons AS SELECT * FROM _moons")
    con.unregister("_moons")


def section_data(con, rows: int, cols: int, tmp: str) -> dict:
    from dbml.core.data import BatchStream
    feats = ", ".join(f"(hash(range, {i}) % 1000) / 1000.0 AS f{i}" for i in range(cols))
    con.execute(f"CREATE OR REPLACE TABLE big AS SELECT *, (f0 > 0.5)::INT AS y FROM (SELECT {feats} FROM range({rows}))")
    # the local path: the scratch table a job makes, streamed as an epoch streams it
    xs = ", ".join(f"f{i}" for i in range(cols))
    con.execute(f"CREATE OR REPLACE TABLE scratch AS SELECT [{xs}]::FLOAT[{cols}] AS x, y::BIGINT AS y, false AS is_val "
                f"FROM big")
    local = []
    for _ in range(3):
        started = time.perf_counter()
        n = sum(len(y) for _, y in BatchStream(con.duckdb, "SELECT x, y FROM scratch", 1024, shuffle=1,
                                               window_rows=65536))
        local.append(n / (time.perf_counter() - started))
    con.execute("DROP TABLE scratch")
    out = {"rows": rows, "cols": cols, "local_rows_per_s": statistics.median(local)}
    args = f"label := 'y', arch := 'linear', epochs := 1, batch_size := 8192, validation := 0"
    for how in ("object store", "parquet"):
        if how == "parquet":
            con.execute(f"SET VARIABLE dbml_cluster_storage = '{tmp}'")
            con.execute("SET VARIABLE dbml_cluster_parquet_bytes = 1")
        rates, ends = [], []
        for i in range(3):
            out_row = con.execute(f"SELECT train('ship_{how[0]}{i}', 'big', {args})").fetchall()[0][0]
            fig = _figures(con, f"ship_{how[0]}{i}")["cluster"]
            rates.append(fig["received"]["rows_per_s"])
            ends.append(rows / fig["data"]["send_seconds"])
            assert out_row["status"] == "finished"
        out[how] = {"received_rows_per_s": statistics.median(rates), "sent_rows_per_s": statistics.median(ends),
                    "bytes": fig["data"]["bytes"], "chunks": fig["data"]["chunks"],
                    "most_in_flight": fig["data"].get("most_in_flight")}
    con.execute("SET VARIABLE dbml_cluster_storage = NULL")
    con.execute("SET VARIABLE dbml_cluster_parquet_bytes = NULL")
    out["remote_over_local"] = out["object store"]["received_rows_per_s"] / out["local_rows_per_s"]
    return out


def section_dispatch(con) -> dict:
    args = "label := 'label', features := ['x1', 'x2'], arch := 'mlp', hidden := [16, 8], epochs := 1"
    dispatch, remote, local = [], [], []
    for i in range(10):
        started = time.perf_counter()
        con.execute(f"SELECT train('d{i}', 'moons', {args})").fetchall()
        remote.append(time.perf_counter() - started)
        dispatch.append(_figures(con, f"d{i}")["cluster"]["dispatch_seconds"])
    con.execute("SET VARIABLE dbml_cluster = 'local'")
    for i in range(10):
        started = time.perf_counter()
        con.execute(f"SELECT train('l{i}', 'moons', {args})").fetchall()
        local.append(time.perf_counter() - started)
    con.execute("SET VARIABLE dbml_cluster = 'ray'")
    return {"dispatch_median_s": statistics.median(dispatch), "dispatch_max_s": max(dispatch),
            "job_remote_median_s": statistics.median(remote), "job_local_median_s": statistics.median(local)}


def section_epochs(con) -> dict:
    args = "label := 'label', features := ['x1', 'x2'], arch := 'mlp', hidden := [64, 64], epochs := 8"
    out = {}
    for where, retries in (("local", 0), ("ray", 0), ("ray", 1)):
        con.execute(f"SET VARIABLE dbml_cluster = '{where}'")
        con.execute(f"SET VARIABLE dbml_max_retries = {retries}")
        name = f"e_{where}_{retries}"
        con.execute(f"SELECT train('{name}', 'moons', {args})").fetchall()
        seconds = [e["seconds"] for e in _figures(con, name)["history"]][1:]   # the first captures the graph
        out[f"{where}{' checkpointed' if retries else ''}_epoch_s"] = statistics.median(seconds)
    con.execute("SET VARIABLE dbml_cluster = 'ray'")
    con.execute("SET VARIABLE dbml_max_retries = 0")
    return out


def section_data_parallel(con) -> dict:
    args = "label := 'label', features := ['x1', 'x2'], arch := 'mlp', hidden := [64, 64], epochs := 3, batch_size := 65"
    con.execute("SET VARIABLE dbml_cluster = 'local'")
    started = time.perf_counter()
    con.execute(f"SELECT train('dp1', 'moons', {args})").fetchall()
    local = time.perf_counter() - started
    con.execute("SET VARIABLE dbml_cluster = 'ray'")
    started = time.perf_counter()
    con.execute(f"SELECT train('dp2', 'moons', {args}, workers := 2)").fetchall()
    remote = time.perf_counter() - started
    a, b = _weights(con, "dp1"), _weights(con, "dp2")
    fig = _figures(con, "dp2")
    return {"local_1_worker_s": local, "ray_2_workers_s": remote, "start_s": fig["cluster"]["dispatch_seconds"],
            "epoch_s_2_workers": statistics.median(e["seconds"] for e in fig["history"]),
            "epoch_s_1_local": statistics.median(e["seconds"] for e in _figures(con, "dp1")["history"]),
            "max_abs_weight_diff": max((a[k] - b[k]).abs().max().item() for k in a)}


def section_dp_start(con, runs: int = 5) -> dict:
    args = "label := 'label', features := ['x1', 'x2'], arch := 'mlp', hidden := [16, 8], epochs := 1"
    out = {}
    for workers in (1, 2):
        wall, first = [], []
        for i in range(runs + 1):   # the first forms the set (and its group): not counted
            name = f"s{workers}_{i}"
            started = time.perf_counter()
            con.execute(f"SELECT train('{name}', 'moons', {args}, workers := {workers})").fetchall()
            if i:
                wall.append(time.perf_counter() - started)
                first.append(max(_figures(con, name)["cluster"]["first_step_seconds"].values()))
        out[f"train_{workers}_worker_s"] = statistics.median(wall)
        out[f"first_step_{workers}_worker_s"] = statistics.median(first)
    out["start_over_placed_s"] = out["first_step_2_worker_s"] - out["first_step_1_worker_s"]
    out["runs"] = runs
    return out


def section_kills(con, ray, kills: int) -> dict:
    from dbml.cluster import placement as cluster
    args = "label := 'label', features := ['x1', 'x2'], arch := 'mlp', hidden := [16, 8], epochs := 10, batch_size := 16"
    con.execute("SET VARIABLE dbml_cluster = 'local'")
    con.execute(f"SELECT train('ref', 'moons', {args})").fetchall()
    reference = _weights(con, "ref")
    con.execute("SET VARIABLE dbml_cluster = 'ray'")
    rng = random.Random(0)
    out = {"kills": 0, "resumed_equal": 0, "failed_clean": 0, "finished_before_kill": 0, "lost_or_half_written": 0,
           "by": {}, "errors": [], "resume_s": []}
    c = cluster.current()
    for i in range(kills):
        retries = i % 2 == 0
        con.execute(f"SET VARIABLE dbml_max_retries = {1 if retries else 0}")
        name = f"k{i}"
        job = con.execute(f"SELECT train('{name}', 'moons', {args}, wait := false)").fetchall()[0][0]["job_id"]
        key = f"{c.session}:{job}"
        target = rng.randint(1, 8)
        while True:   # until the job is at the chosen epoch (or has ended)
            epoch, status = con.execute("SELECT epoch, status FROM dbml_jobs WHERE job_id = ?", [job]).fetchall()[0]
            if (epoch or 0) >= target or status not in ("running", "queued"):
                break
            time.sleep(0.01)
        slot = c.slot_of(key)
        # a slot still starting has no pid yet (os.kill(0, ...) would kill this process group)
        if slot is not None and slot.ready and slot.pid > 0:
            how = "ray.kill" if i % 4 < 2 else "SIGKILL"
            if how == "ray.kill":
                ray.kill(slot.actor)
            else:
                os.kill(slot.pid, signal.SIGKILL)
            out["kills"] += 1
            out["by"][how] = out["by"].get(how, 0) + 1
        else:
            slot = None
        killed_at = time.perf_counter()
        try:
            con.execute("SELECT wait_job(?)", [job]).fetchall()
            if slot is not None:
                out["resume_s"].append(time.perf_counter() - killed_at)
            stored = _weights(con, name)
            if all(torch.equal(reference[k], stored[k]) for k in reference):
                out["resumed_equal" if slot is not None else "finished_before_kill"] += 1
            else:
                out["lost_or_half_written"] += 1
        except duckdb.Error as e:
            out["errors"].append(str(e).split("UDF: ", 1)[-1][:200])
            n = con.execute("SELECT count(*) FROM dbml.models WHERE name = ?", [name]).fetchall()[0][0]
            out["failed_clean" if n == 0 and not retries else "lost_or_half_written"] += 1
        models = set(con.execute("SELECT name, version FROM dbml.models").fetchall())
        if models != set(con.execute("SELECT name, version FROM dbml.weights").fetchall()):
            out["lost_or_half_written"] += 1
    con.execute("SET VARIABLE dbml_max_retries = 0")
    out["errors"] = sorted(set(out["errors"]))[:3]
    resumed = out.pop("resume_s")
    out["kill_to_stored_median_s"] = statistics.median(resumed) if resumed else None
    return out


DP_TOLERANCE = 1e-5   # tests/test_cluster.py's bound on 2 data-parallel workers against 1


def goals(report: dict) -> dict:
    """Issue 26's goals, each as measured here: (figure, goal, met)."""
    out = {}
    if "dispatch" in report:
        d = report["dispatch"]["dispatch_median_s"]
        out["per-job dispatch (median)"] = (round(d, 3), "<= 0.5 s", d <= 0.5)
    if "data" in report:
        r = report["data"]["remote_over_local"]
        out["rows/s into a remote worker / local path"] = (round(r, 3), ">= 0.5", r >= 0.5)
    if "dp" in report:
        diff = report["dp"]["max_abs_weight_diff"]
        out["2 DDP workers vs 1: max |weight difference|"] = (diff, f"<= {DP_TOLERANCE}", diff <= DP_TOLERANCE)
    if "dpstart" in report:
        d = report["dpstart"]["start_over_placed_s"]
        out["data-parallel start over a placed job's (median)"] = (round(d, 3), "<= 5 s", d <= 5.0)
    if "kills" in report:
        k = report["kills"]
        out["lost or half-written models"] = (k["lost_or_half_written"], f"0 in {k['kills']} kills",
                                              k["lost_or_half_written"] == 0)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--cols", type=int, default=32)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--sections", default="start,data,dispatch,epochs,dp,dpstart,kills")
    p.add_argument("--runs", type=int, default=5, help="dpstart: jobs of each kind")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import tempfile

    import ray

    import dbml
    from dbml.cluster import placement as cluster
    sections = a.sections.split(",")
    report = {"load_average_before": os.getloadavg()[0]}
    started = time.perf_counter()
    ray.init(num_cpus=2, object_store_memory=200 * 1024**2, include_dashboard=False, log_to_driver=False)
    report["start"] = {"ray_init_s": time.perf_counter() - started}
    os.environ.setdefault("DBML_CACHE_DIR", tempfile.mkdtemp())
    con = dbml.connect(latency_model="roofline", progress="off", cluster="ray")
    c = cluster.current()
    report["start"]["hub_s"] = c.start_seconds
    started = time.perf_counter()
    c.warm(2)
    report["start"]["two_cold_device_workers_s"] = time.perf_counter() - started
    print("start", json.dumps(report["start"], indent=1), flush=True)
    _moons(con, 3000)
    with tempfile.TemporaryDirectory() as tmp:
        for name, run in (("data", lambda: section_data(con, a.rows, a.cols, tmp)),
                          ("dispatch", lambda: section_dispatch(con)), ("epochs", lambda: section_epochs(con)),
                          ("dp", lambda: section_data_parallel(con)), ("dpstart", lambda: section_dp_start(con, a.runs)),
                          ("kills", lambda: section_kills(con, ray, a.kills))):
            if name in sections:
                t = time.perf_counter()
                report[name] = run()
                report[name]["section_s"] = time.perf_counter() - t
                print(name, json.dumps(report[name], indent=1), flush=True)
    report["load_average_after"] = os.getloadavg()[0]
    report["goals"] = goals(report)
    print("goals", json.dumps(report["goals"], indent=1), flush=True)
    con.close()
    cluster.disconnect()
    ray.shutdown()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
