"""Ray cluster benchmark (issue 26): Ray's overhead, the data path into a remote worker, and
20 injected worker kills.

    python -m benchmarks.bench_cluster [--rows 1000000] [--cols 32] [--kills 20] [--out FILE]
    python -m benchmarks.bench_cluster --nodes [--rows 500000] [--cols 32] [--out FILE]

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

``--nodes`` (issue 33, part 3): instead, a head and two worker nodes on this machine (Ray's
``cluster_utils``, one CPU and a 96 MB object store each; ``start_nodes``, which
tests/multinode.py uses too): rows/s into a device worker on the driver's node against one on
another node, through the object store and as Parquet (``section_nodes``).
"""

from __future__ import annotations

import argparse
import contextlib
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


# -- several nodes on one machine (issue 33, part 3) ------------------------------------------

NODE_STORE_BYTES = 96 * 2**20   # each node's object store: small, as on a machine shared with others
# A removed node is declared dead after its health checks fail: Ray's defaults take ~15 s
# (3 s x 5); these take ~1.5 s, so a node-loss scenario does not wait on the detector.
FAST_NODE_DEATH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                   "health_check_initial_delay_ms": 0}


def start_nodes(workers: int = 2, store: int = NODE_STORE_BYTES):
    """A head and ``workers`` worker nodes on this machine (Ray's ``cluster_utils``), one CPU and
    an object store of ``store`` bytes each, and this process connected to it as the driver
    (on the head): (the cluster, its worker nodes)."""
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, object_store_memory=store,
                                                                 include_dashboard=False, _system_config=FAST_NODE_DEATH))
    nodes = [cluster.add_node(num_cpus=1, object_store_memory=store) for _ in range(workers)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    return cluster, nodes


def node_of_slot(c, slot) -> str:
    """The Ray node id of a device worker of dbml's pool (``c``: ``dbml.cluster.placement.Cluster``)."""
    return c.ray.get(slot.actor.describe.remote())["node_id"]


@contextlib.contextmanager
def next_job_on(c, node_id: str):
    """While open, the next ``workers := 1`` job goes to the idle device worker on node
    ``node_id``: the pool gives a job its first idle worker, so the idle ones before it are
    held (acquired under keys of their own) and given back on exit."""
    held, target = [], None
    try:
        for i in range(len(c.slots())):
            slot = c.acquire(f"held-{i}", gpu=False)
            if node_of_slot(c, slot) == node_id:
                c.release(slot, f"held-{i}")
                target = slot
                break
            held.append((slot, f"held-{i}"))
        assert target is not None, f"no idle device worker on node {node_id}"
        yield target
    finally:
        for slot, key in held:
            c.release(slot, key)


def section_nodes(con, c, nodes: dict, rows: int, cols: int, tmp: str) -> dict:
    """Rows/s into a device worker on the driver's node against one on another node, through the
    object store and as Parquet. ``nodes``: {'same': node id, 'other': node id}, each with an
    idle device worker of ``c``'s pool."""
    feats = ", ".join(f"(hash(range, {i}) % 1000) / 1000.0 AS f{i}" for i in range(cols))
    con.execute(f"CREATE OR REPLACE TABLE wide AS SELECT *, (f0 > 0.5)::INT AS y FROM (SELECT {feats} FROM range({rows}))")
    args = "label := 'y', arch := 'linear', epochs := 1, batch_size := 8192, validation := 0"
    out = {"rows": rows, "cols": cols}
    for how in ("object store", "parquet"):
        if how == "parquet":
            con.execute(f"SET VARIABLE dbml_cluster_storage = '{tmp}'")
            con.execute("SET VARIABLE dbml_cluster_parquet_bytes = 1")
        for where, node_id in nodes.items():
            name = f"wide_{how[0]}_{where}"
            with next_job_on(c, node_id):
                assert con.execute(f"SELECT train('{name}', 'wide', {args})").fetchall()[0][0]["status"] == "finished"
            fig = _figures(con, name)["cluster"]
            out[f"{how}, {where} node"] = {"node_id": fig["node_id"], "how": fig["data"]["how"],
                                           "rows": fig["received"]["rows"], "bytes": fig["received"]["bytes"],
                                           "received_rows_per_s": fig["received"]["rows_per_s"]}
    con.execute("SET VARIABLE dbml_cluster_storage = NULL")
    con.execute("SET VARIABLE dbml_cluster_parquet_bytes = NULL")
    for how in ("object store", "parquet"):
        same, other = out[f"{how}, same node"], out[f"{how}, other node"]
        out[f"{how}: other node over same"] = other["received_rows_per_s"] / same["received_rows_per_s"]
    return out


def main_nodes(a) -> dict:
    """``--nodes``: a head and two worker nodes on this machine; the data path across nodes."""
    import tempfile

    import ray

    import dbml
    from dbml.cluster import placement as cluster
    report = {"load_average_before": os.getloadavg()[0]}
    started = time.perf_counter()
    ray_cluster, workers = start_nodes()
    report["start"] = {"three_nodes_s": time.perf_counter() - started, "store_bytes_per_node": NODE_STORE_BYTES}
    os.environ.setdefault("DBML_CACHE_DIR", tempfile.mkdtemp())
    con = dbml.connect(latency_model="roofline", progress="off", cluster="ray")
    c = cluster.current()
    c.warm(3)   # one CPU a node: one device worker on each
    head = ray.get_runtime_context().get_node_id()
    with tempfile.TemporaryDirectory() as tmp:
        report["nodes"] = section_nodes(con, c, {"same": head, "other": workers[0].node_id}, a.rows, a.cols, tmp)
    print("nodes", json.dumps(report["nodes"], indent=1), flush=True)
    report["load_average_after"] = os.getloadavg()[0]
    con.close()
    cluster.disconnect()
    ray.shutdown()
    ray_cluster.shutdown()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--cols", type=int, default=32)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--sections", default="start,data,dispatch,epochs,dp,dpstart,kills")
    p.add_argument("--runs", type=int, default=5, help="dpstart: jobs of each kind")
    p.add_argument("--out", default=None)
    p.add_argument("--nodes", action="store_true", help="a head and two worker nodes: rows/s across nodes")
    a = p.parse_args(argv)
    if a.nodes:
        return main_nodes(a)
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
