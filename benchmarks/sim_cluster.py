"""Issue 26 part 7, on paper: dbml's placement and admission for a cluster of ``nodes`` x
``devices`` and ``trials`` tune() trials, simulated with the real code.

    python -m benchmarks.sim_cluster [--nodes 64] [--devices 8] [--trials 10000] [--sections schedule,catalog,hub]
                                     [--out FILE]

What is real and what is simulated:

- **Placement** is ``dbml.cluster.placement.Cluster.acquire``/``release`` (the driver's pool of device
  workers, under its lock), run against ``SimRay``: the few calls of the ray module it makes
  (``remote``, ``get``, ``kill``, ``available_resources``), answered at once by this process,
  for ``nodes * devices`` GPUs. Ray's own latency is not in these figures (bench_cluster
  measures it on one machine).
- **Admission and planning** is ``dbml.scheduler.MemoryScheduler``, one per device, as each
  ``DeviceWorker`` holds one: every trial's training graph (a synthetic training-shaped access
  sequence, ``scheduler.synthetic.training_sequence``, one of ``ARCHS`` sizes a search draws
  from) is planned jointly with the trials already on its device; a trial that does not fit
  waits there and is re-checked, in arrival order, when a trial on its device ends.
- **Time** is simulated: each trial runs a drawn duration (lognormal, median ``--median-s``)
  once admitted; ``--parallel`` trials are in flight at once (tune()'s ``parallel``), a new one
  starting as one ends. Each scheduling call is timed, in wall time and in this thread's CPU
  time (on a shared machine the wall time includes waiting for a core; the CPU time is what
  the call costs).
- **The catalog** is a real dbml database on disk: each trial's row in ``dbml.trials`` (written
  when it starts and when it ends, as tune() writes it) and a model per stored trial through
  ``dbml.core.catalog.write`` (one transaction: model row and weights), timed for a small and a
  large model.
- **The hub** (``--hub-seconds``): the real ``dbml.cluster.hub.Hub`` actor on a local Ray cluster
  (2 CPUs), called by many threads as drivers poll and workers report: the calls per second
  one hub serves bounds the jobs one driver can follow at once.
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import itertools
import json
import math
import os
import random
import statistics
import tempfile
import threading
import time

ARCHS = 24   # distinct architectures a search draws its trials from


# -- SimRay: the ray module, as far as dbml.cluster.placement uses it ---------------------------------

class _Call:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args, **kwargs):
        return self.fn(*args, **kwargs)   # the "ref" is the value: SimRay.get returns it


class _Actor:
    def __init__(self, obj):
        self.obj = obj

    def __getattr__(self, name):
        return _Call(getattr(self.obj, name))


class SimDevice:
    """A device worker: where it is, and its device's memory scheduler."""

    def __init__(self, index: int, per_node: int, budget: int):
        from dbml.scheduler.multijob.scheduler import MemoryScheduler
        self.index, self.node, self.device = index, f"node{index // per_node}", f"cuda:{index % per_node}"
        self.scheduler = MemoryScheduler(budget)

    def describe(self) -> dict:
        return {"node": self.node, "device": self.device, "pid": 100_000 + self.index}


class SimRay:
    def __init__(self, nodes: int, per_node: int, budget: int):
        self.per_node, self.budget = per_node, budget
        self.free = list(range(nodes * per_node))[::-1]
        self.total = nodes * per_node
        self.calls = {"available_resources": 0, "remote": 0, "kill": 0}

    def is_initialized(self) -> bool:
        return True

    def cluster_resources(self) -> dict:
        return {"GPU": float(self.total), "CPU": float(self.total * 2)}

    def get_runtime_context(self):   # the driver's node, where the hub is pinned
        return type("Context", (), {"get_node_id": staticmethod(lambda: "00" * 28)})()

    def available_resources(self) -> dict:
        self.calls["available_resources"] += 1
        return {"GPU": float(len(self.free)), "CPU": float(self.total)}

    def remote(self, *args, **options):
        from dbml.cluster.worker import DeviceWorker

        def wrap(cls):
            def start():
                self.calls["remote"] += 1
                if cls is DeviceWorker:
                    return _Actor(SimDevice(self.free.pop(), self.per_node, self.budget))
                return _Actor(cls())
            return _Call(start)
        return wrap

    def get(self, value):
        return value

    def kill(self, actor) -> None:
        self.calls["kill"] += 1
        if isinstance(actor.obj, SimDevice):
            self.free.append(actor.obj.index)


# -- the trials -----------------------------------------------------------------------------

def architectures(seed: int) -> list:
    """``ARCHS`` training graphs, small to large (ops 30..90, activations 32..320 MB a layer: a
    release-only peak of about 1 to 8 GiB, so a few share a 16 GiB device only as planned)."""
    from dbml.scheduler.synthetic import training_sequence
    rng = random.Random(seed)
    return [training_sequence(f"arch{k}", rng.randint(30, 90), seed=k, act_mb=rng.uniform(32, 320))
            for k in range(ARCHS)]


def percentiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    if not xs:
        return {}
    at = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]   # noqa: E731
    return {"n": len(xs), "median_ms": 1e3 * statistics.median(xs), "p99_ms": 1e3 * at(0.99),
            "max_ms": 1e3 * xs[-1], "mean_ms": 1e3 * statistics.fmean(xs)}


def simulate(nodes: int, per_node: int, trials: int, parallel: int, budget: int, median_s: float,
             seed: int) -> dict:
    """Every trial through the real placement and admission; simulated time, measured wall time."""
    from dbml.cluster import placement as cluster_mod
    from dbml.scheduler.plan.planner import InfeasibleBudget
    ray = SimRay(nodes, per_node, budget)
    c = cluster_mod.Cluster(ray, "ray")
    archs = architectures(seed)
    rng = random.Random(seed)
    now, events, order = 0.0, [], itertools.count()   # (time, n, trial) of the running trials' ends
    waiting: dict[int, list] = {}   # device index -> trials admitted nowhere yet, in arrival order
    place_s, admit_s, end_s, queued_s = [], [], [], []
    place_cpu, admit_cpu, end_cpu = [], [], []   # the same, in this thread's CPU time
    by_beside: dict[int, list] = {}   # trials already running on the device -> admission times
    started_at, slots = {}, {}
    admitted = rejected = 0
    most_per_device = 0
    submitted = 0

    def duration() -> float:
        return median_s * math.exp(rng.gauss(0, 0.5))

    def admit(trial: int, slot, key: str, arch) -> bool:
        scheduler = slot.actor.obj.scheduler
        beside = len(scheduler.jobs())
        t, cpu = time.perf_counter(), time.thread_time()
        try:
            ok = scheduler.request(key, arch)
        finally:
            admit_s.append(time.perf_counter() - t)
            admit_cpu.append(time.thread_time() - cpu)
            by_beside.setdefault(beside, []).append(admit_cpu[-1])
        return ok

    def run(trial: int, key: str) -> None:
        nonlocal admitted
        admitted += 1
        queued_s.append(now - started_at[trial])
        heapq.heappush(events, (now + duration(), next(order), trial))

    def submit() -> None:
        nonlocal submitted, rejected, most_per_device
        trial, submitted = submitted, submitted + 1
        key, arch = f"{c.session}:{trial}", archs[rng.randrange(ARCHS)]
        started_at[trial] = now
        t, cpu = time.perf_counter(), time.thread_time()
        slot = c.acquire(key, gpu=True)
        place_s.append(time.perf_counter() - t)
        place_cpu.append(time.thread_time() - cpu)
        slots[trial] = (slot, key, arch)
        most_per_device = max(most_per_device, len(slot.jobs))
        try:
            if admit(trial, slot, key, arch):
                run(trial, key)
            else:
                waiting.setdefault(slot.actor.obj.index, []).append(trial)
        except InfeasibleBudget:
            rejected += 1
            c.release(slot, key)

    wall_started = time.perf_counter()
    while submitted < min(parallel, trials):
        submit()
    while events:
        now, _, trial = heapq.heappop(events)
        slot, key, _ = slots.pop(trial)
        t, cpu = time.perf_counter(), time.thread_time()
        slot.actor.obj.scheduler.unregister(key)
        c.release(slot, key)
        device = slot.actor.obj.index
        still = []
        for w in waiting.get(device, []):   # re-checked in arrival order, as the admission queue does
            w_slot, w_key, w_arch = slots[w]
            if not still and admit(w, w_slot, w_key, w_arch):
                run(w, w_key)
            else:
                still.append(w)
        waiting[device] = still
        end_s.append(time.perf_counter() - t)
        end_cpu.append(time.thread_time() - cpu)
        if submitted < trials:
            submit()
        if len(end_s) % 1000 == 0:
            print(f"  {len(end_s)} trials ended, {time.perf_counter() - wall_started:.0f} s", flush=True)
    plan_s = sum(s.actor.obj.scheduler.plan_seconds for s in c.slots())
    return {"devices": nodes * per_node, "trials": trials, "parallel": parallel, "budget_gib": budget / 2**30,
            "finished": admitted, "rejected": rejected, "simulated_hours": now / 3600,
            "most_trials_on_one_device": most_per_device,
            "wall": {"placement_driver": percentiles(place_s), "admission_on_device": percentiles(admit_s),
                     "end_and_recheck_on_device": percentiles(end_s)},
            "cpu": {"placement_driver": percentiles(place_cpu), "admission_on_device": percentiles(admit_cpu),
                    "end_and_recheck_on_device": percentiles(end_cpu)},
            "admission_cpu_median_ms_by_trials_on_device": {k: 1e3 * statistics.median(v)
                                                            for k, v in sorted(by_beside.items())},
            "queued_simulated_s": {"median": statistics.median(queued_s), "max": max(queued_s)},
            "plan_seconds_all_devices": plan_s, "ray_calls": ray.calls,
            "driver_placements_per_s_cpu": 1 / statistics.fmean(place_cpu)}


# -- the catalog ------------------------------------------------------------------------------

def catalog_rates(trials: int, models: int, big_models: int, seed: int) -> dict:
    """Real DuckDB writes into dbml's catalog: trial rows (start and end of each), and models."""
    import dataclasses

    import dbml
    from dbml.core import catalog
    from dbml.search import trials as trials_mod
    from dbml.core.models import build
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "catalog.duckdb")
        con = dbml.connect(path, latency_model="roofline", progress="off")
        con.execute("CREATE TABLE t AS SELECT (i % 97) / 97.0 AS x1, (i % 13) / 13.0 AS x2, (i % 2)::INT AS y "
                    "FROM range(200) r(i)")
        con.execute("SELECT train('seed_model', 't', label := 'y', arch := 'mlp', hidden := [16, 8], epochs := 1)"
                    ).fetchall()
        cur = con.duckdb.cursor()
        small = catalog.load(cur, "seed_model", 1)
        record = dict(model="sim", trial=0, status="running", objective_name="val_loss", direction="minimize",
                      objective=None, objectives=[], params={"lr": 0.01, "hidden": [16, 8]},
                      search={"lr": {"log": [1e-4, 1e-1]}}, epochs=0, error=None, seconds=None,
                      peak_bytes=None, job_id=None, version=None, started_at=datetime.datetime.now())
        t = time.perf_counter()
        for i in range(trials):
            trials_mod.save(cur, {**record, "trial": i})
            trials_mod.save(cur, {**record, "trial": i, "status": "finished", "objective": 0.5, "epochs": 5,
                                  "objectives": [0.9, 0.7, 0.6, 0.55, 0.5], "seconds": 60.0, "job_id": i})
        seconds = time.perf_counter() - t
        out["trial_rows"] = {"trials": trials, "writes": 2 * trials, "seconds": seconds,
                             "trials_per_s": trials / seconds}
        # the large one: the same inputs, hidden [2048, 2048] (about 4M parameters, 16 MB of weights)
        options = {**small.config.options_dict(), "hidden": [2048, 2048]}
        large = dataclasses.replace(small.config, options=tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                                                      for k, v in options.items())))
        for label, n, config in (("small", models, small.config), ("large", big_models, large)):
            module = small.module if config is small.config else build(config)
            blob = len(catalog.weights_blob(module))
            t = time.perf_counter()
            for i in range(n):
                catalog.write(cur, name=f"{label}_{i}", config=config, prep=small.preprocessing, params={},
                              metrics={"final_loss": 0.5}, rows=200, module=module)
            seconds = time.perf_counter() - t
            out[f"{label}_models"] = {"models": n, "weights_bytes": blob, "seconds": seconds,
                                      "models_per_s": n / seconds, "mb_per_s": n * blob / seconds / 1e6}
        out["database_mb"] = os.path.getsize(path) / 1e6
        cur.close()
        con.close()
    return out


# -- the hub ----------------------------------------------------------------------------------

def hub_capacity(seconds: float, threads: int, in_flight: int = 3072, workers: int = 512) -> dict:
    """Calls per second one real Hub actor serves, on a local Ray cluster of 2 CPUs, as drivers
    and workers call it: ``per_job``, a call per job (the design before the batched hub: every
    job polled by the driver and reporting from its worker on its own), and ``batched``, one
    ``report_many`` per worker process for its jobs (``in_flight / workers`` of them) and one
    ``poll_all`` per driver tick, taking the updates of all ``in_flight`` jobs. The running jobs one hub follows
    is what its measured rate pays for at the callers' intervals."""
    import ray

    from dbml.cluster import placement as cluster, worker
    from dbml.cluster.hub import REPORTS_PER_S, Hub
    ray.init(num_cpus=2, object_store_memory=200 * 1024**2, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    per_worker = max(1, in_flight // workers)

    def measure(call) -> tuple[float, float]:
        """(report-side calls/s, poll-side calls/s) of ``threads`` callers for ``seconds``."""
        counts = [0] * threads
        stop = time.perf_counter() + seconds

        def caller(i: int) -> None:
            while time.perf_counter() < stop:
                call(i)
                counts[i] += 1
        pool = [threading.Thread(target=caller, args=(i,)) for i in range(threads)]
        started = time.perf_counter()
        for p in pool:
            p.start()
        for p in pool:
            p.join()
        wall = time.perf_counter() - started
        return sum(counts[1:]) / wall, counts[0] / wall

    try:
        hub = ray.remote(num_cpus=0, max_concurrency=cluster.WORKER_CONCURRENCY)(Hub).remote()
        ray.get(hub.pid.remote())
        reports, polls = measure(lambda i: ray.get(hub.report.remote(f"s:{i}", {"steps": [32]}) if i % 2
                                                   else hub.poll.remote(f"s:{i}")))
        per_job_rate = reports + polls
        keys = [f"b:{j}" for j in range(in_flight)]
        batches = [{k: {"steps": [32]} for k in keys[i * per_worker:(i + 1) * per_worker]} for i in range(threads)]
        batched_reports, batched_polls = measure(lambda i: ray.get(
            hub.report_many.remote(batches[i], f"w{i}", worker.REPORT_S) if i else hub.poll_all.remote()))
        t = time.perf_counter()
        for _ in range(200):
            ray.available_resources()
        available_s = (time.perf_counter() - t) / 200
    finally:
        ray.shutdown()
    per_job = 1 / cluster.POLL_S + 1 / worker.REPORT_S   # a job's calls per second on its hub, unbatched
    # batched: the hub's calls, all kinds together (both are short), pay first for the driver's polls
    # (1 / POLL_S) and then for reports, one per worker process every REPORT_S, each of per_worker jobs
    batched_rate = batched_reports + batched_polls
    reports_left = max(0.0, batched_rate - 1 / cluster.POLL_S)
    interval = max(worker.REPORT_S, workers / REPORTS_PER_S)
    needed = 1 / cluster.POLL_S + workers / interval
    return {"threads": threads, "per_job": {"calls_per_s": per_job_rate, "calls_per_running_job_per_s": per_job,
                                            "running_jobs_one_hub_follows": per_job_rate / per_job},
            "batched": {"in_flight": in_flight, "worker_processes": workers, "jobs_per_report": per_worker,
                        "calls_per_s": batched_rate, "report_many_per_s": batched_reports,
                        "poll_all_per_s": batched_polls,
                        "worker_processes_one_hub_follows": reports_left * worker.REPORT_S,
                        "running_jobs_one_hub_follows": reports_left * worker.REPORT_S * per_worker,
                        "calls_per_s_the_simulation_needs": 1 / cluster.POLL_S + workers / worker.REPORT_S},
            # the hub's answer spreads the reports (hub.REPORTS_PER_S): what the simulation's
            # worker processes then cost it, and how late a cancel or a step reaches them
            "adaptive": {"reports_per_s_one_hub_takes": REPORTS_PER_S,
                         "report_interval_s": interval,
                         "calls_per_s_the_simulation_needs": needed,
                         "share_of_the_measured_rate": needed / batched_rate,
                         "running_jobs_one_hub_follows": reports_left * interval * per_worker,
                         "cancel_and_progress_reach_a_worker_within_s": interval + cluster.POLL_S},
            "available_resources_ms": 1e3 * available_s}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--devices", type=int, default=8, help="devices per node")
    p.add_argument("--trials", type=int, default=10_000)
    p.add_argument("--parallel", type=int, default=None, help="trials in flight (default: 6 per device)")
    p.add_argument("--budget-gib", type=float, default=16.0, help="each device's memory budget")
    p.add_argument("--median-s", type=float, default=120.0, help="a trial's simulated median duration")
    p.add_argument("--models", type=int, default=2000, help="small models written to the catalog")
    p.add_argument("--big-models", type=int, default=100, help="16 MB models written to the catalog")
    p.add_argument("--hub-seconds", type=float, default=5.0, help="0: skip the hub's measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sections", default="schedule,catalog,hub")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    os.environ.setdefault("DBML_CACHE_DIR", tempfile.mkdtemp())
    devices = a.nodes * a.devices
    report = {"load_average_before": os.getloadavg()}
    sections = a.sections.split(",")
    t = time.perf_counter()
    if "schedule" in sections:
        report["schedule"] = simulate(a.nodes, a.devices, a.trials, a.parallel or 6 * devices,
                                      int(a.budget_gib * 2**30), a.median_s, a.seed)
        report["schedule"]["wall_s"] = time.perf_counter() - t
        print("schedule", json.dumps(report["schedule"], indent=1), flush=True)
    t = time.perf_counter()
    if "catalog" in sections:
        report["catalog"] = catalog_rates(a.trials, a.models, a.big_models, a.seed)
        report["catalog"]["wall_s"] = time.perf_counter() - t
        print("catalog", json.dumps(report["catalog"], indent=1), flush=True)
    if "hub" in sections and a.hub_seconds > 0:
        report["hub"] = hub_capacity(a.hub_seconds, 16, a.parallel or 6 * devices, devices)
        print("hub", json.dumps(report["hub"], indent=1), flush=True)
    report["load_average_after"] = os.getloadavg()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
