"""Several Ray nodes on one machine (issue 33, part 3): a head and two worker nodes, each with
its own object store (Ray's ``cluster_utils``).

A ``cluster_utils`` cluster cannot share a process with the session's ``ray.init``
(tests/test_cluster.py), so the scenarios run once, in one subprocess (``tests/multinode.py``,
about 75 s on this machine), and write what they saw as JSON; each test here checks one
scenario's part of it: the hub on the driver's node, a job on each node, the chunked and the
Parquet paths into another node, a search spread over the nodes, and a node removed under
three running jobs (its job resumed from its checkpoint; every model complete, predicting as
an uninterrupted one; no half-written row), then the other under a job without retries (it
fails naming the setting; nothing stored).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

# its own three-node cluster: never beside the session's one (pytest-xdist runs a group on one worker)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]
HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 300


@pytest.fixture(scope="session")
def seen(tmp_path_factory):
    """What tests/multinode.py saw, by scenario (those it reached). Once per session: pytest-xdist
    may run test_cluster.py's tests of the same group between these, and a module fixture would
    then run the scenarios again (CI ran them twice, 49 s and 59 s)."""
    pytest.importorskip("ray", reason="Ray is an extra: pip install 'dbml[ray]'")
    pytest.importorskip("ray.cluster_utils")
    out = tmp_path_factory.mktemp("nodes") / "seen.json"
    proc = subprocess.run([sys.executable, os.path.join(HERE, "multinode.py"), str(out)], capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    report = json.loads(out.read_text()) if out.exists() else {}
    report["_failed"] = None if proc.returncode == 0 else f"rc {proc.returncode}: {proc.stderr[-3000:]}"
    return report


def scenario(seen: dict, name: str) -> dict:
    assert name in seen, f"tests/multinode.py stopped before scenario {name!r}: {seen['_failed']}"
    return seen[name]


def test_three_nodes_start(seen):
    start = scenario(seen, "start")
    assert len({start["head"], *start["workers"]}) == 3


def test_the_hub_lives_on_the_drivers_node(seen):
    """A zero-CPU actor goes to any node; the hub must not (its node's loss is every job's)."""
    start = scenario(seen, "start")
    assert scenario(seen, "hub")["hub_nodes"] == [start["head"]] * 3


def test_three_jobs_at_once_run_one_on_each_node_and_store_the_local_model(seen):
    start, spread = scenario(seen, "start"), scenario(seen, "spread")
    assert spread["status"] == ["finished"] * 3
    assert sorted(spread["nodes"]) == sorted([start["head"], *start["workers"]])
    assert spread["received_rows"] == [3000] * 3
    assert spread["same_as_local"] == [True] * 3


def test_rows_reach_another_node_in_bounded_chunks_and_as_parquet(seen):
    start, ship = scenario(seen, "start"), scenario(seen, "ship")
    chunked, parquet = ship["chunked"], ship["parquet"]
    assert chunked["node"] == start["workers"][0] and parquet["node"] == start["workers"][1]
    assert chunked["how"] == "object store" and chunked["chunks"] >= 10 and 1 <= chunked["most_in_flight"] <= 2
    assert parquet["how"] == "parquet" and ship["files_left"] == 0
    assert chunked["received_rows"] == parquet["received_rows"] == 3000
    assert chunked["same_as_local"] and parquet["same_as_local"]
    bench = ship["bench"]   # the benchmark's section, on a small table: both paths, both nodes
    for how in ("object store", "parquet"):
        same, other = bench[f"{how}, same node"], bench[f"{how}, other node"]
        assert same["node_id"] == start["head"] and other["node_id"] == start["workers"][0]
        assert same["how"] == other["how"] == how and same["rows"] == other["rows"] == bench["rows"]
        assert bench[f"{how}: other node over same"] > 0


def test_a_search_spreads_its_trials_over_the_nodes(seen):
    """Each trial a job of its own on the cluster's workers (not fused on the driver)."""
    start, search = scenario(seen, "start"), scenario(seen, "search")
    assert search["trials"] == 6 and search["statuses"] == ["finished"] and search["models"] == 1
    assert len(search["trial_nodes"]) == 6 and None not in search["trial_nodes"]   # every trial placed
    assert set(search["trial_nodes"]) == {start["head"], *start["workers"]}


def test_a_removed_node_loses_no_model_and_no_row(seen):
    start, kill = scenario(seen, "start"), scenario(seen, "kill")
    victim = kill["victim"]
    assert kill["killed_node"] in start["workers"] and kill["nodes_before"][victim] == kill["killed_node"]
    assert kill["outcome"] == {"k0": "finished", "k1": "finished", "k2": "finished"}
    assert kill["retries"][victim] == 1 and kill["nodes_after"][victim] != kill["killed_node"]
    assert 2 <= kill["resumed_from_epoch"][victim] < 12   # from its checkpoint, not from the start
    assert all(kill["retries"][n] == 0 for n in kill["retries"] if n != victim)
    assert all(kill["same_as_local"].values()) and all(kill["predictions_equal_local"].values())
    assert all(h == list(range(1, 13)) for h in kill["history"].values())
    assert [s for _, s in kill["jobs"]] == ["finished"] * 4
    assert kill["models"] == kill["weights"]   # every model row has its weights, and every weights row its model
    assert [n for n, _ in kill["models"] if n.startswith("k")] == ["k0", "k1", "k2", "k_local"]
    assert kill["alive_nodes"] == 2


def test_a_removed_node_fails_its_unretried_job_naming_the_fix_and_stores_nothing(seen):
    start, kill = scenario(seen, "start"), scenario(seen, "kill_unretried")
    assert kill["killed_node"] in start["workers"] and kill["alive_nodes"] == 1
    assert kill["outcome"]["u_here"] == "finished"
    assert re.search(r"job \d+ \('u_there'\) lost its Ray worker on [\d.]+ \(cpu \(worker \d+\)\) \(\w+: .*\); "
                     r"nothing was stored; SET VARIABLE dbml_max_retries = 1 \(or more\)", kill["outcome"]["u_there"])
    assert kill["jobs"] == [["u_there", "failed"], ["u_here", "finished"]]
    assert kill["models"] == kill["weights"] and ["u_there", 1] not in kill["models"] and ["u_here", 1] in kill["models"]


def test_a_driver_that_reconnects_to_ray_gets_new_workers(seen):
    """ray.shutdown() and ray.init() in the driver (a notebook's restart): the next job starts a
    new hub and workers, not "Can't find actor" from the old connection's."""
    r = scenario(seen, "reconnect")
    assert r["outcome"] == "finished", r["outcome"]
    assert r["new_connection"] and r["models"] == [["r_after"]]


def test_the_scenarios_ran_to_the_end(seen):
    assert seen["_failed"] is None, seen["_failed"]
