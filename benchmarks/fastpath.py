"""Per-step overhead of the scheduler when there is nothing to schedule.

For each workload, three runners train the same model on the same batch, interleaved
step by step in one process: eager PyTorch, ``ScheduledStep(policy="none")`` and
``ScheduledStep(policy="tensile")`` with a budget far above the model's peak (a plan
with no swap or recompute). The figure is the median step time of each, after warm-up,
and the ratio to eager's. Issue 13's goal: at most 1.05x eager, the small MLP included.

``python -m dbml.bench.fastpath`` prints a table; :func:`run` returns its rows (one dict
per workload and runner). ``--train`` (:func:`run_train`) measures ``train()`` end to end
from SQL on a small table instead: where a small job's time goes besides its steps.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import time
from dataclasses import dataclass

import torch

from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.execute.updating import UpdateSettings
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.latency.estimate import RooflineModel

__all__ = ["run", "CASES", "Case"]

SPEC = OptimizerSpec("adam", lr=1e-3)
loss_fn = torch.nn.functional.cross_entropy
LARGE_BUDGET = 1 << 40   # binds nothing


@dataclass(frozen=True)
class Case:
    name: str
    build: object         # () -> (model, x, y), seeded

    def make(self):
        torch.manual_seed(0)
        return self.build()


def _tabular(features: int, hidden: tuple[int, ...], classes: int, batch: int):
    def build():
        from dbml.zoo import Inputs, build as zoo_build
        model = zoo_build("mlp", Inputs("tabular", features=features), classes, {"hidden": hidden})
        g = torch.Generator().manual_seed(1)
        return model, torch.randn(batch, features, generator=g), torch.randint(0, classes, (batch,), generator=g)
    return build


def _workload(name: str):
    def build():
        from .workloads import workload
        w = workload(name)
        model = w.model()
        return (model, *w.batch_tensors())
    return build


CASES = {c.name: c for c in (
    Case("tabular-20x64x64-b256", _tabular(20, (64, 64), 2, 256)),
    Case("dbml-default-mlp-b64", _tabular(20, (64, 64), 2, 64)),   # train()'s defaults: arch auto, batch 64
    Case("mlp", _workload("mlp")),
    Case("transformer", _workload("transformer")),
)}


def _scheduled(model, policy: str) -> ScheduledStep:
    budget = LARGE_BUDGET if policy == "tensile" else None
    return ScheduledStep(copy.deepcopy(model), loss_fn, SPEC, policy=policy, budget_bytes=budget,
                         latency_model=RooflineModel(), update=UpdateSettings(max_plan_share=0.05))


def _runners(model, interpreted: bool = True) -> dict:
    """eager, none, tensile (fast path), and with ``interpreted`` the same two with the
    fast path off (``DBML_NO_FASTPATH``: every iteration through the executor's loop)."""
    out = {"eager": EagerStep(copy.deepcopy(model), loss_fn, SPEC, measured_steps=0),
           "none": _scheduled(model, "none"), "tensile": _scheduled(model, "tensile")}
    if interpreted:
        out.update({"none-interpreted": _scheduled(model, "none"), "tensile-interpreted": _scheduled(model, "tensile")})
    return out


@contextlib.contextmanager
def _interpreted(name: str):
    """The fast path off while an ``*-interpreted`` runner steps (the switch is read when
    a plan is taken: at the first step and at each new plan)."""
    if not name.endswith("-interpreted"):
        yield
        return
    old = os.environ.get("DBML_NO_FASTPATH")
    os.environ["DBML_NO_FASTPATH"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["DBML_NO_FASTPATH"]
        else:
            os.environ["DBML_NO_FASTPATH"] = old


def measure(case: Case, steps: int, warmup: int = 5, interpreted: bool = True) -> list[dict]:
    """Median step seconds of each runner over ``steps`` interleaved steps."""
    model, x, y = case.make()
    runners = _runners(model, interpreted)
    times: dict[str, list[float]] = {k: [] for k in runners}
    names = list(runners)
    for i in range(warmup + steps):
        order = names[i % len(names):] + names[:i % len(names)]   # rotate: nobody always runs first
        for name in order:
            with _interpreted(name):
                t0 = time.perf_counter()
                runners[name].step(x, y)
                dt = time.perf_counter() - t0
            if i >= warmup:
                times[name].append(dt)
    rows = []
    eager, eager_min = statistics.median(times["eager"]), min(times["eager"])
    for name, r in runners.items():
        med, low = statistics.median(times[name]), min(times[name])
        # the fastest step: on a shared machine, the closest to the cost without contention
        row = {"workload": case.name, "runner": name, "steps": steps, "median_ms": med * 1e3,
               "ratio_to_eager": med / eager, "min_ms": low * 1e3, "min_ratio_to_eager": low / eager_min,
               "threads": torch.get_num_threads(), "load_average": os.getloadavg()[0]}
        if isinstance(r, ScheduledStep):
            st = r.stats()
            row.update(fast_iterations=sum(e.totals.get("fast_iterations", 0) for e in r.executors()),
                       iterations=st["iterations"], swaps=st["swaps"], recomputes=st["recomputes"],
                       replans=st["replans"], measured_peak_bytes=st["measured_peak_bytes"])
            r.close()
        rows.append(row)
    return rows


def run(cases=None, steps: int = 200, threads: int | None = None) -> list[dict]:
    """Rows for each case (default: every case in :data:`CASES`) and runner."""
    if threads is not None:
        torch.set_num_threads(threads)
    out = []
    for name in cases or CASES:
        case = CASES[name]
        n = steps if "mlp" not in name or "tabular" in name or "default" in name else max(20, steps // 4)
        if name == "transformer":
            n = max(10, steps // 10)
        out.extend(measure(case, n))
    return out


def _timed(owner, name: str, into: dict, key: str, result=None) -> None:
    """Wrap ``owner.name`` to add its wall seconds to ``into[key]`` (``result(value)``: more figures)."""
    original = getattr(owner, name)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            value = original(*args, **kwargs)
        finally:
            into[key] = into.get(key, 0.0) + time.perf_counter() - t0
        if result is not None:
            result(value)
        return value
    setattr(owner, name, timed)


def run_train(rows: int = 20000, epochs: int = 3, batch: int = 64, repeats: int = 3,
              policies=("eager", "none", "tensile", "none-interpreted", "tensile-interpreted")) -> list[dict]:
    """``train()`` end to end from SQL on a 20-feature table (arch auto: 64-64 MLP), where a
    small job's time goes: setup and storing, the runner's steps, progress, waiting for
    data, and the rest of the training loop (batch iteration, the loss's finiteness check
    and sum). Policies run in turn, ``repeats`` times; medians. Patches dbml's training
    module for the measurement (run it in a process of its own)."""
    import numpy as np
    import pyarrow as pa
    import dbml
    from dbml.core import training
    acc: dict = {}
    for owner in (ScheduledStep, EagerStep):
        _timed(owner, "step", acc, "runner")
    _timed(training.TrainLoop, "step", acc, "loop")
    _timed(training, "_run_epochs", acc, "epochs",
           lambda out: acc.__setitem__("wait", acc.get("wait", 0.0) + sum(h["wait_seconds"] for h in out[0])))
    g = np.random.default_rng(0)
    x = g.standard_normal((rows, 20)).astype(np.float32)
    con = dbml.connect(latency_model="roofline")
    con.register("src", pa.table({**{f"f{i}": x[:, i] for i in range(20)}, "y": (x[:, 0] + x[:, 1] > 0).astype(np.int64)}))
    con.sql("CREATE TABLE t AS SELECT * FROM src")
    figures: dict = {p: [] for p in policies}
    for rep in range(repeats):
        for policy in policies:
            acc.clear()
            with _interpreted(policy):
                t0 = time.perf_counter()
                con.sql(f"SELECT train('m{rep}_{policy.replace('-', '_')}', 't', label := 'y', epochs := {epochs}, "
                        f"batch_size := {batch}, policy := '{policy.split('-')[0]}')").fetchall()
                acc["total"] = time.perf_counter() - t0
            figures[policy].append(dict(acc))
    steps = epochs * -(-int(rows * 0.9) // batch)
    out = []
    for policy, runs in figures.items():
        med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in ("total", "epochs", "runner", "loop", "wait")}
        out.append({"policy": policy, "steps": steps, "train_seconds": med["total"],
                    "setup_and_store_seconds": med["total"] - med["epochs"], "step_us": med["runner"] / steps * 1e6,
                    "progress_us": (med["loop"] - med["runner"]) / steps * 1e6, "data_wait_us": med["wait"] / steps * 1e6,
                    "loop_rest_us": (med["epochs"] - med["loop"] - med["wait"]) / steps * 1e6,
                    "load_average": os.getloadavg()[0]})
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="*", default=None, help=f"of {', '.join(CASES)}")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--train", action="store_true", help="train() end to end from SQL instead (run_train)")
    a = p.parse_args(argv)
    print(f"load average before: {os.getloadavg()}")
    if a.train:
        for r in run_train():
            print("  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))
        return
    for r in run(a.cases, a.steps, a.threads):
        print(f"{r['workload']:22} {r['runner']:20} median {r['median_ms']:9.3f} ms x{r['ratio_to_eager']:.3f}  "
              f"min {r['min_ms']:9.3f} ms x{r['min_ratio_to_eager']:.3f}  n={r['steps']} "
              f"load={r['load_average']:.2f} fast={r.get('fast_iterations')}")


if __name__ == "__main__":
    main()
