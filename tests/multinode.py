"""Several Ray nodes on one machine (issue 33, part 3): the scenarios that
tests/test_cluster_nodes.py checks, in a process of their own (a ``cluster_utils`` cluster
cannot share a process with the test session's ``ray.init``).

    python tests/multinode.py OUT.json

A head and two worker nodes (``benchmarks.bench_cluster.start_nodes``: one CPU and a 96 MB
object store each); this process is the driver, on the head. Each scenario writes what it
saw into OUT.json as soon as it ends (the test reads what there is, so a failure shows
which scenario it was in); the test, not this script, judges it:

- hub: where dbml's hub actor is placed, over three connections (the driver's node: the
  node a node kill never takes without the driver).
- spread: three jobs at once, one on each node (one CPU a node), each the model a local
  job stores.
- ship: the chunked (object store) path and the Parquet path into a worker on another node;
  and the benchmark's rows/s on its own node against another (small table).
- search: a tune() search with ``parallel := 3``, its trials' nodes.
- kill: three running jobs with ``max_retries = 1``; the worker node of one of them removed
  (``cluster.remove_node``); each job's outcome, the catalog, predictions.
- kill_unretried: the other worker node removed under a job with ``max_retries = 0`` (and
  one on the head): the error it fails with, the catalog.
- reconnect: ``ray.shutdown()`` and ``ray.init()`` again in this process (a notebook's
  restart), then a placed job on the same dbml connection: its outcome (the old connection's
  hub and workers are gone with it).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

ARGS = "label := 'label', features := ['x1', 'x2'], arch := 'mlp', hidden := [16, 8]"


def main(out_path: str) -> None:
    os.environ.setdefault("DBML_CACHE_DIR", tempfile.mkdtemp())
    import ray

    from benchmarks.bench_cluster import start_nodes
    report: dict = {}

    def done(name: str, value: dict) -> None:
        report[name] = value
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)

    started = time.perf_counter()
    cluster, workers = start_nodes()
    head = ray.get_runtime_context().get_node_id()
    done("start", {"seconds": time.perf_counter() - started, "head": head, "workers": [n.node_id for n in workers],
                   "load": os.getloadavg()[0]})
    try:
        for name, scenario in (("hub", hub), ("spread", spread), ("ship", ship), ("search", search), ("kill", kill),
                               ("kill_unretried", kill_unretried), ("reconnect", reconnect)):
            t = time.perf_counter()
            done(name, {**scenario(ray, cluster, head, workers), "seconds": time.perf_counter() - t})
    finally:
        from dbml.cluster import placement
        placement.disconnect()
        ray.shutdown()
        cluster.shutdown()


def actor_node(ray, actor) -> str:
    from ray._private import state
    return state.actors(actor_id=actor._actor_id.hex())["Address"]["NodeID"]


def hub(ray, cluster, head, workers) -> dict:
    from dbml.cluster import placement
    nodes = []
    for _ in range(3):
        c = placement.connect("ray")
        nodes.append(actor_node(ray, c.hub))
        placement.disconnect()
    return {"hub_nodes": nodes}


_con = None


def connection():
    """One dbml connection for the scenarios after ``hub``, its pool warm on all three nodes."""
    global _con
    if _con is None:
        import dbml
        from dbml.cluster import placement
        from helpers import load, moons
        _con = dbml.connect(latency_model="roofline", progress="off", cluster="ray")
        load(_con, "moons", moons(3000))
        placement.current().warm(3)   # one CPU a node: one device worker on each
    return _con


def cluster_figures(con, name: str) -> dict:
    row = con.execute("SELECT metrics FROM dbml_models WHERE name = ? ORDER BY version DESC LIMIT 1", [name]).fetchall()
    return json.loads(row[0][0])["cluster"]


def same_weights(con, a: str, b: str) -> bool:
    import torch
    from dbml.core import catalog
    cur = con.duckdb.cursor()
    wa, wb = (catalog.load(cur, n, catalog.latest_version(cur, n, fn="test")).module.state_dict() for n in (a, b))
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def local(con, name: str, extra: str) -> None:
    con.execute("SET VARIABLE dbml_cluster = 'local'")
    con.execute(f"SELECT train('{name}', 'moons', {ARGS}{extra})").fetchall()
    con.execute("SET VARIABLE dbml_cluster = 'ray'")


def start(con, name: str, extra: str) -> int:
    return con.execute(f"SELECT train('{name}', 'moons', {ARGS}{extra}, wait := false)").fetchall()[0][0]["job_id"]


def spread(ray, cluster, head, workers) -> dict:
    con = connection()
    extra = ", epochs := 3"
    ids = [start(con, f"s{i}", extra) for i in range(3)]
    status = [con.execute("SELECT wait_job(?)", [j]).fetchall()[0][0]["status"] for j in ids]
    local(con, "s_local", extra)
    figures = [cluster_figures(con, f"s{i}") for i in range(3)]
    return {"status": status, "nodes": [f["node_id"] for f in figures],
            "received_rows": [f["received"]["rows"] for f in figures],
            "same_as_local": [same_weights(con, f"s{i}", "s_local") for i in range(3)]}


def ship(ray, cluster, head, workers) -> dict:
    from benchmarks.bench_cluster import next_job_on, section_nodes
    from dbml.cluster import placement, shipping
    con, c = connection(), placement.current()
    extra = ", epochs := 2"
    out = {}
    chunk, window = shipping.CHUNK_BYTES, shipping.WINDOW
    shipping.CHUNK_BYTES, shipping.WINDOW = 4096, 2   # ~250 rows a chunk: 13 chunks, at most 2 in the store
    try:
        with next_job_on(c, workers[0].node_id):
            con.execute(f"SELECT train('chunked', 'moons', {ARGS}{extra})").fetchall()
    finally:
        shipping.CHUNK_BYTES, shipping.WINDOW = chunk, window
    with tempfile.TemporaryDirectory() as tmp:
        con.execute(f"SET VARIABLE dbml_cluster_storage = '{tmp}'")
        con.execute("SET VARIABLE dbml_cluster_parquet_bytes = '10KB'")
        with next_job_on(c, workers[1].node_id):
            con.execute(f"SELECT train('parquet', 'moons', {ARGS}{extra})").fetchall()
        con.execute("SET VARIABLE dbml_cluster_storage = NULL")
        con.execute("SET VARIABLE dbml_cluster_parquet_bytes = NULL")
        out["files_left"] = len(os.listdir(tmp))
        local(con, "ship_local", extra)
        for name in ("chunked", "parquet"):
            f = cluster_figures(con, name)
            out[name] = {"node": f["node_id"], "how": f["data"]["how"], "chunks": f["data"]["chunks"],
                         "most_in_flight": f["data"]["most_in_flight"], "received_rows": f["received"]["rows"],
                         "same_as_local": same_weights(con, name, "ship_local")}
        out["bench"] = section_nodes(con, c, {"same": head, "other": workers[0].node_id}, 20_000, 8, tmp)
    return out


def search(ray, cluster, head, workers) -> dict:
    from benchmarks.bench_cluster import node_of_slot
    from dbml.cluster import placement
    con, c = connection(), placement.current()
    space = {"lr": {"log_uniform": [1e-3, 0.1]}, "hidden": {"choice": [[8], [16, 8]]}}
    rows = con.execute("SELECT trial, status FROM tune('tuned', 'moons', label := 'label', features := ['x1', 'x2'], "
                       "arch := 'mlp', epochs := 2, space := ?, trials := 6, parallel := 3)",
                       [json.dumps(space)]).fetchall()
    node_by_device = {s.device: node_of_slot(c, s) for s in c.slots()}
    devices = [d for (d,) in con.execute("SELECT device FROM dbml_jobs WHERE model = 'tuned'").fetchall()]
    return {"statuses": sorted({s for _, s in rows}), "trials": len(rows),
            "trial_nodes": [node_by_device.get(d) for d in devices],
            "models": con.execute("SELECT count(*) FROM dbml.models WHERE name = 'tuned'").fetchall()[0][0]}


def kill(ray, cluster, head, workers) -> dict:
    from benchmarks.bench_cluster import node_of_slot
    from dbml.cluster import placement
    from helpers import wait_until
    con, c = connection(), placement.current()
    extra = ", epochs := 12, batch_size := 16, early_stop := false"
    con.execute("SET VARIABLE dbml_max_retries = 1")
    names = [f"k{i}" for i in range(3)]
    ids = [start(con, n, extra) for n in names]

    def epoch(j):
        return con.execute("SELECT epoch FROM dbml_jobs WHERE job_id = ?", [j]).fetchall()[0][0] or 0
    slots = [wait_until(lambda j=j: c.slot_of(f"{c.session}:{j}"), 60, "the job's device worker", poll=0.05)
             for j in ids]
    before = {n: node_of_slot(c, slot) for n, slot in zip(names, slots)}
    victim = next(n for n in names if before[n] != head)
    node = next(w for w in workers if w.node_id == before[victim])
    # the victim's third epoch, not every job's: on 2 shared cores one job can run far ahead
    # of the others, and a victim that had finished would test nothing
    wait_until(lambda: epoch(ids[names.index(victim)]) >= 3, 120, "the victim's third epoch", poll=0.05)
    killed_at = epoch(ids[names.index(victim)])
    t = time.perf_counter()
    cluster.remove_node(node, allow_graceful=False)
    outcome = {}
    for n, j in zip(names, ids):
        try:
            outcome[n] = con.execute("SELECT wait_job(?)", [j]).fetchall()[0][0]["status"]
        except Exception as e:  # noqa: BLE001 - the test says which job failed and how
            outcome[n] = f"error: {e}"
    recovered_s = time.perf_counter() - t
    local(con, "k_local", extra)
    figures = {n: cluster_figures(con, n) for n in names if outcome[n] == "finished"}
    predictions = {n: con.execute(f"SELECT predict('{n}', [x1, x2]) FROM moons LIMIT 5").fetchall()
                   for n in names + ["k_local"] if n in figures or n == "k_local"}
    return {
        "victim": victim, "killed_node": node.node_id, "killed_at_epoch": killed_at, "nodes_before": before,
        "outcome": outcome, "recovered_s": recovered_s,
        "retries": {n: f["retries"] for n, f in figures.items()},
        "resumed_from_epoch": {n: f["resumed_from_epoch"] for n, f in figures.items()},
        "nodes_after": {n: f["node_id"] for n, f in figures.items()},
        "same_as_local": {n: same_weights(con, n, "k_local") for n in figures},
        "predictions_equal_local": {n: predictions[n] == predictions["k_local"] for n in figures},
        "history": {n: [e["epoch"] for e in json.loads(con.execute(
            "SELECT metrics FROM dbml_models WHERE name = ?", [n]).fetchall()[0][0])["history"]] for n in figures},
        "jobs": con.execute("SELECT model, status FROM dbml_jobs WHERE model LIKE 'k%' ORDER BY job_id").fetchall(),
        "models": sorted(con.execute("SELECT name, version FROM dbml.models").fetchall()),
        "weights": sorted(con.execute("SELECT name, version FROM dbml.weights").fetchall()),
        "alive_nodes": alive_after(ray, node.node_id),
    }


def alive_after(ray, removed: str) -> int:
    """The nodes alive once Ray's control store has seen ``removed`` go: it learns a node's
    death from missed health checks, seconds after its jobs' workers were already lost (a
    job can fail and ``wait_job`` answer first: the count then still held the removed node)."""
    from helpers import wait_until
    wait_until(lambda: not any(n["Alive"] for n in ray.nodes() if n["NodeID"] == removed), 60,
               "the removed node marked dead", poll=0.2)
    return sum(n["Alive"] for n in ray.nodes())


def kill_unretried(ray, cluster, head, workers) -> dict:
    """The last worker node removed under a job with ``max_retries = 0`` and one on the head."""
    from benchmarks.bench_cluster import next_job_on
    from dbml.cluster import placement
    from helpers import wait_until
    con, c = connection(), placement.current()
    con.execute("SET VARIABLE dbml_max_retries = 0")
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    node = next(w for w in workers if w.node_id in alive)
    extra = ", epochs := 12, batch_size := 16, early_stop := false"
    with next_job_on(c, node.node_id):
        there = start(con, "u_there", extra)
        wait_until(lambda: c.slot_of(f"{c.session}:{there}"), 60, "the job's device worker", poll=0.05)
    here = start(con, "u_here", extra)

    def epoch(j):
        return con.execute("SELECT epoch FROM dbml_jobs WHERE job_id = ?", [j]).fetchall()[0][0] or 0
    wait_until(lambda: epoch(there) >= 2, 120, "the job's second epoch", poll=0.05)
    cluster.remove_node(node, allow_graceful=False)
    outcome = {}
    for name, j in (("u_there", there), ("u_here", here)):
        try:
            outcome[name] = con.execute("SELECT wait_job(?)", [j]).fetchall()[0][0]["status"]
        except Exception as e:  # noqa: BLE001 - the error the user sees, checked by the test
            outcome[name] = f"error: {e}"
    return {"outcome": outcome, "killed_node": node.node_id,
            "jobs": con.execute("SELECT model, status FROM dbml_jobs WHERE model LIKE 'u_%' ORDER BY job_id").fetchall(),
            "models": sorted(con.execute("SELECT name, version FROM dbml.models").fetchall()),
            "weights": sorted(con.execute("SELECT name, version FROM dbml.weights").fetchall()),
            "alive_nodes": alive_after(ray, node.node_id)}


def reconnect(ray, cluster, head, workers) -> dict:
    from dbml.cluster import placement
    con, before = connection(), placement.current()
    ray.shutdown()
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        outcome = con.execute(f"SELECT train('r_after', 'moons', {ARGS}, epochs := 2)").fetchall()[0][0]["status"]
    except Exception as e:  # noqa: BLE001 - checked by the test
        outcome = f"error: {e}"
    return {"outcome": outcome, "new_connection": placement.current() is not before,
            "models": sorted(con.execute("SELECT name FROM dbml.models WHERE name = 'r_after'").fetchall())}


if __name__ == "__main__":
    main(sys.argv[1])
