"""A data-parallel job's real memory against its budget, beside a local job's (issue 33, part 1).

One Ray cluster of 2 CPUs (this process); ``hidden := [2048, 2048]`` on 4,000 moons rows,
batch 512, one epoch: first unscheduled (its peak is the vanilla peak), then ``--jobs`` times
under ``--fraction`` of it, as ``workers := 2`` on one worker set and as a local single job.
Prints each job's planned, measured (tracked) and real peak (``dbml_jobs.real_peak_bytes``:
the job's process RSS above its start) with the budget.

    python benchmarks/dp_real_memory.py [--fraction 0.8] [--jobs 2] [--fresh]
    python benchmarks/dp_real_memory.py --outside 3   # the worker processes' VmHWM, eager vs budgeted

``--fresh``: the vanilla peak comes from a local unscheduled job run first, so that the
worker set's (and the local process's) first job is a budgeted one: it pays the process's
one-off costs (imports, the process group, the first capture) under its budget.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import dbml  # noqa: E402
from helpers import load, moons  # noqa: E402

BASE = ("label := 'label', features := ['x1','x2'], arch := 'mlp', hidden := [2048, 2048], epochs := 1, "
        "batch_size := 512")
COLUMNS = "planned_peak_bytes, measured_peak_bytes, real_peak_bytes, budget_bytes, vanilla_peak_bytes"


PROBE = f"""
import sys; sys.path.insert(0, {os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")!r})
import dbml
from helpers import load, moons
con = dbml.connect(latency_model="roofline", progress="off")
load(con, "moons", moons(4000))
r = con.execute("SELECT train('v', 'moons', {BASE})").fetchall()[0][0]
print(con.execute("SELECT vanilla_peak_bytes FROM dbml_jobs WHERE job_id = ?", [r["job_id"]]).fetchall()[0][0])
"""


def vanilla_apart() -> int:
    """The job's unscheduled peak, measured in a process of its own."""
    import subprocess
    return int(subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                              check=True).stdout.split()[-1])


def run(con, name: str, extra: str) -> tuple:
    r = con.execute(f"SELECT train('{name}', 'moons', {BASE}{extra})").fetchall()[0][0]
    row = con.execute(f"SELECT {COLUMNS} FROM dbml_jobs WHERE job_id = ?", [r["job_id"]]).fetchall()[0]
    mb = [None if v is None else round(v / 1e6, 1) for v in row[:4]]
    print(f"{name:<12} {r['status']:<9} planned {mb[0]} MB, measured {mb[1]} MB, real {mb[2]} MB, "
          f"budget {mb[3]} MB", flush=True)
    return row


def worker_pids() -> list[int]:
    """The Ray device workers' processes (their title: ``ray::DeviceWorker``), found from outside."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if f.read().startswith(b"ray::DeviceWorker"):
                        pids.append(int(name))
            except OSError:
                continue
    return sorted(pids)


def status_of(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS of process ``pid`` in bytes, read from /proc by this (another) process."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def outside(fraction: float, rounds: int) -> None:
    """Each round, a fresh Ray cluster per mode: one ``workers := 2`` job, eager or under
    ``fraction`` of the vanilla peak, as its worker set's first; then each worker process's
    resident high-water mark (VmHWM) read from /proc by the driver: the whole process's, its
    imports and the job's alike, as /usr/bin/time reads a local one."""
    import ray
    vanilla = vanilla_apart()
    print(f"vanilla peak {vanilla / 1e6:.1f} MB (a process of its own); budget {fraction * vanilla / 1e6:.1f} MB")
    for r in range(rounds):
        for mode, extra in (("eager", ", policy := 'eager'"), ("budget", f", memory_budget := {int(fraction * vanilla)}")):
            ray.init(address="local", num_cpus=2, object_store_memory=200 * 1024**2, include_dashboard=False,
                     log_to_driver=False)
            try:
                con = dbml.connect(latency_model="roofline", progress="off", cluster="ray")
                load(con, "moons", moons(4000))
                row = run(con, f"{mode} {r + 1}", f", workers := 2{extra}")
                hwm = [status_of(p)["VmHWM"] for p in worker_pids()]
                print(f"   worker processes' VmHWM from outside: {', '.join(f'{h / 1e6:.1f}' for h in hwm)} MB; "
                      f"job's real {row[2] / 1e6:.1f} MB", flush=True)
                con.close()
            finally:
                ray.shutdown()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fraction", type=float, default=0.8)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--fresh", action="store_true", help="no unscheduled job on the worker set first")
    p.add_argument("--outside", type=int, default=0, metavar="ROUNDS",
                   help="instead: eager against budgeted first jobs in fresh worker sets, each worker "
                        "process's high-water mark read from /proc by the driver")
    args = p.parse_args(argv)
    if args.outside:
        outside(args.fraction, args.outside)
        return 0
    import ray
    ray.init(address="local", num_cpus=2, object_store_memory=200 * 1024**2, include_dashboard=False, log_to_driver=False)
    print(f"load average {os.getloadavg()[0]:.2f}")
    try:
        vanilla = None
        if args.fresh:   # the vanilla peak, measured in a process of its own (the jobs' processes stay fresh)
            vanilla = vanilla_apart()
            print(f"vanilla peak {vanilla / 1e6:.1f} MB (a process of its own)")
        for where, extra in (("ray, workers := 2", ", workers := 2"), ("local", "")):
            con = dbml.connect(latency_model="roofline", progress="off", cluster="ray" if extra else "local")
            load(con, "moons", moons(4000))
            print(f"-- {where}")
            if not args.fresh:
                vanilla = run(con, "unscheduled", extra)[4]
            for i in range(args.jobs):
                run(con, f"budget {i + 1}", f"{extra}, memory_budget := {int(args.fraction * vanilla)}")
            con.close()
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
