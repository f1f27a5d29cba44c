"""Where a job's real memory goes, phase by phase (issue 33): the process's resident set
sampled every millisecond while a job runs, each sample put to the phase the job is in
(checks, building the model, the runner, capture and planning, each iteration, finishing),
as the largest RSS above the job's start in that phase and the tracked (ledger) peak of
each iteration beside it.

    python benchmarks/realmem_phases.py [--fraction 0.8] [--jobs 2] [--where local,ray]

The same job as ``benchmarks/dp_real_memory.py`` (hidden [2048, 2048], 4,000 moons rows,
batch 512, one epoch). On a Ray worker set (``workers := 2``) each worker process installs
the probe at start (Ray's ``worker_process_setup_hook``) and writes its jobs' phases to
``--out``; the driver prints them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

_probe: dict = {}


def _file_pages() -> dict[str, int]:
    """Resident bytes of each mapped file (/proc/self/smaps): which code a job paged in."""
    import re
    pages, name = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                parts = line.split()
                name = parts[5] if len(parts) > 5 and parts[5].startswith("/") else None
            elif name is not None and line.startswith("Rss:"):
                pages[name] = pages.get(name, 0) + int(line.split()[1]) * 1024
    return pages


def _mallinfo() -> tuple[int, int, int]:
    """glibc's (bytes in use, free in the heaps, mmapped): mallinfo2."""
    import ctypes

    class M(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = M
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd, m.fordblks, m.hblkhd


class _Probe:
    def __init__(self, out: str):
        from dbml.scheduler import procmem
        self.rss, self.status = procmem.rss_bytes, procmem.status_bytes
        self.file0 = 0
        self.out, self.phase, self.start, self.rows, self.lock = out, None, None, [], threading.Lock()
        self.jobs = 0
        self.runner = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="realmem-probe")
        self.thread.start()

    def _run(self):
        while True:
            st = self.status("VmRSS", "RssFile", "RssShmem")
            rss = st.get("VmRSS", 0)
            ex = None if self.runner is None else self.runner._last
            held = 0 if ex is None else ex.mem.on_compute + ex.mem.on_copy + ex.pool.bytes
            with self.lock:
                if self.start is not None and self.rows:
                    row = self.rows[-1]
                    if rss - self.start > row["max"]:
                        row["max"] = rss - self.start
                        row["held_at_max"] = held
                        row["malloc_at_max"] = _mallinfo()
                        row["file_at_max"] = st.get("RssFile", 0) + st.get("RssShmem", 0) - self.file0
                    if ex is not None:
                        row["excess"] = max(row.get("excess", -1 << 40), rss - self.start - held)
            time.sleep(0.001)

    def enter(self, phase: str, **extra):
        rss = self.rss() or 0
        with self.lock:
            if self.start is None:
                return
            self.rows.append({"phase": phase, "at": rss - self.start, "max": rss - self.start, **extra})

    def note(self, **extra):
        with self.lock:
            if self.rows:
                self.rows[-1].update(extra)

    def begin(self):
        with self.lock:
            self.start, self.rows = self.rss() or 0, []
            st = self.status("RssFile", "RssShmem")
            self.file0 = st.get("RssFile", 0) + st.get("RssShmem", 0)
        self.files0 = _file_pages()
        self.enter("start")

    def end(self, real):
        self.runner = None
        self.enter("after watch")
        now = _file_pages()
        grown = sorted(((now[k] - self.files0.get(k, 0), k) for k in now), reverse=True)
        self.note(files=[(os.path.basename(k), v) for v, k in grown[:6] if v > 0])
        with self.lock:
            rows, self.start = self.rows, None
        self.jobs += 1
        path = os.path.join(self.out, f"{os.getpid()}-{self.jobs}.json")
        with open(path, "w") as f:
            json.dump({"pid": os.getpid(), "job": self.jobs, "real": None if real is None else real.added,
                       "rows": rows}, f)


def install(out: str | None = None) -> None:
    """Wrap the job's phases (in this process) with the probe's markers."""
    out = out or os.environ["REALMEM_PHASES_OUT"]
    if _probe:
        return
    import dbml.core.models as models
    import dbml.core.runners as runners
    import dbml.core.training as training
    import dbml.core.heldout as heldout
    from dbml.scheduler import procmem
    from dbml.scheduler.execute.runner import ScheduledStep
    p = _probe["p"] = _Probe(out)
    if os.environ.get("REALMEM_ARENA_MAX"):   # an experiment: malloc's arenas limited at run time
        import ctypes
        ctypes.CDLL("libc.so.6").mallopt(-8, int(os.environ["REALMEM_ARENA_MAX"]))
    if os.environ.get("REALMEM_BOUNDED_MMAP"):   # an experiment: another threshold for bounded malloc
        from dbml.scheduler import hostmem
        hostmem.BOUNDED_MMAP = int(os.environ["REALMEM_BOUNDED_MMAP"])

    def phase(owner, name, label):
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def wrapped(*a, **k):
            p.enter(label)
            try:
                return fn(*a, **k)
            finally:
                p.enter(f"after {label}")
        setattr(owner, name, wrapped)

    for owner, name in ((runners, "check_plan_fits"), (models, "build_seeded"), (runners, "spill_file"),
                        (runners, "make_runner"), (ScheduledStep, "prepare"), (ScheduledStep, "finish"),
                        (ScheduledStep, "close"), (heldout, "validate"),
                        (heldout.EarlyStopping, "update"), (training.TrainLoop, "end_epoch")):
        phase(owner, name, name)

    step = ScheduledStep.step

    def stepped(self, x, y):
        n = sum(e.totals["iterations"] for e in self.executors())
        p.enter(f"step {n + 1}")
        p.runner = self
        loss = step(self, x, y)
        ex = self._last
        p.note(tracked=ex.iteration_peak, budget=self.budget_bytes, reserve=self.real_reserve,
               measured_reserve=getattr(self, "device_reserve", None),
               planner_budget=getattr(self.planner, "budget_bytes", None))
        p.enter(f"after step {n + 1}")
        return loss
    ScheduledStep.step = stepped

    enter, stop = procmem.watch.__enter__, procmem.watch.stop

    def entered(self):   # the job's watch: the outermost (the runner watches its iterations too)
        r = enter(self)
        if p.start is None:
            p.owner = id(self)
            p.begin()
        return r

    def stopped(self):
        first = self.result is None
        r = stop(self)
        if first and getattr(p, "owner", None) == id(self):
            p.owner = None
            p.end(r)
        return r
    procmem.watch.__enter__, procmem.watch.stop = entered, stopped


def show(path: str) -> None:
    for name in sorted(os.listdir(path), key=lambda n: os.path.getmtime(os.path.join(path, n))):
        with open(os.path.join(path, name)) as f:
            job = json.load(f)
        print(f"pid {job['pid']} job {job['job']}: real {job['real'] / 1e6:.1f} MB")
        rows, merged = job["rows"], []
        for r in rows:   # steps 3.. in one row
            if merged and r["phase"].startswith(("step ", "after step ")) and merged[-1]["phase"].startswith("steps") \
                    and not r["phase"] in ("step 1", "step 2", "after step 1", "after step 2"):
                m = merged[-1]
                tracked = max(m.get("tracked", 0), r.get("tracked", 0))
                excess = max(m.get("excess", 0), r.get("excess", 0))
                if r["max"] > m["max"]:
                    m.update({k: v for k, v in r.items() if k not in ("phase", "at")})
                m["tracked"], m["excess"] = tracked, excess
                continue
            if r["phase"] == "step 3":
                r = {**r, "phase": "steps 3.."}
            merged.append(dict(r))
        for r in merged:
            if r["phase"].startswith("after ") and r["max"] - r["at"] < 1e6 and not r.get("files"):
                continue
            extra = ""
            if "held_at_max" in r and "excess" in r:
                mi = r["malloc_at_max"]
                extra += (f"  [at max: held {r['held_at_max'] / 1e6:.1f}, malloc used {mi[0] / 1e6:.1f} "
                          f"free {mi[1] / 1e6:.1f} mmapped {mi[2] / 1e6:.1f}, file +{r['file_at_max'] / 1e6:.1f}; "
                          f"max rss-held {r['excess'] / 1e6:.1f}]")
            if "tracked" in r:
                extra += (f"  tracked {r['tracked'] / 1e6:.1f}, planner budget "
                         f"{(r['planner_budget'] or 0) / 1e6:.1f}, reserve {(r['reserve'] or 0) / 1e6:.1f}"
                          f" + {(r.get('measured_reserve') or 0) / 1e6:.1f}")
            print(f"  {r['phase']:<22} at {r['at'] / 1e6:7.1f} MB  max {r['max'] / 1e6:7.1f} MB{extra}")
            if r.get("files"):
                print("    files paged in: " + ", ".join(f"{k} +{v / 1e6:.1f}" for k, v in r["files"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fraction", type=float, default=0.8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--where", default="local,ray")
    ap.add_argument("--out", default=None)
    ap.add_argument("--fresh", action="store_true", help="the vanilla peak from a process of its own: the first job "
                                                         "is a budgeted one (dp_real_memory.py --fresh)")
    args = ap.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="realmem-phases-")
    os.environ["REALMEM_PHASES_OUT"] = out
    os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
    install(out)
    import dp_real_memory as bench
    import dbml
    from helpers import load, moons
    print(f"load average {os.getloadavg()[0]:.2f}")
    for where in args.where.split(","):
        extra = ", workers := 2" if where == "ray" else ""
        if where == "ray":
            import ray
            ray.init(address="local", num_cpus=2, object_store_memory=200 * 1024**2, include_dashboard=False,
                     log_to_driver=False,
                     runtime_env={"worker_process_setup_hook": "realmem_phases.install",
                                  "env_vars": {"REALMEM_PHASES_OUT": out,
                                               "REALMEM_BOUNDED_MMAP": os.environ.get("REALMEM_BOUNDED_MMAP", ""),
                                               "REALMEM_ARENA_MAX": os.environ.get("REALMEM_ARENA_MAX", ""),
                                               "PYTHONPATH": os.environ["PYTHONPATH"]}})
        con = dbml.connect(latency_model="roofline", progress="off", cluster="ray" if where == "ray" else "local")
        load(con, "moons", moons(4000))
        print(f"-- {where}")
        vanilla = bench.vanilla_apart() if args.fresh else bench.run(con, "unscheduled", extra)[4]
        for i in range(args.jobs):
            bench.run(con, f"budget {i + 1}", f"{extra}, memory_budget := {int(args.fraction * vanilla)}")
        con.close()
        if where == "ray":
            ray.shutdown()
    show(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
