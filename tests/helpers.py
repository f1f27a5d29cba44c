"""What the tests share: small models and batches, eager reference runs, bit-identity
checks, generated tables, and deadlines for waiting.

Import with ``from helpers import ...`` (``tests/`` is on ``sys.path``, as for
``conftest``). Fixtures live in ``conftest.py``; this module has plain functions only,
so a test file never imports another test file for them.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Callable

import numpy as np
import pyarrow as pa
import torch

loss_fn = torch.nn.functional.cross_entropy


# -- models ----------------------------------------------------------------------------------

def mlp(depth: int = 4) -> torch.nn.Sequential:
    """32 features -> 10 classes through ``depth`` 128-wide layers, with dropout."""
    layers = [torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Dropout(0.2)]
    for _ in range(depth):
        layers += [torch.nn.Linear(128, 128), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(128, 10))


def cnn() -> torch.nn.Sequential:
    """3x12x12 images -> 10 classes: three conv layers with BatchNorm (hidden writes)."""
    layers, c = [], 3
    for _ in range(3):
        layers += [torch.nn.Conv2d(c, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()]
        c = 8
    return torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.Linear(8 * 12 * 12, 10))


def deep_narrow() -> torch.nn.Sequential:
    """Many small layers (64 features): a budget below parameters plus optimizer state is feasible."""
    layers = [m for _ in range(8) for m in (torch.nn.Linear(64, 64), torch.nn.Tanh())]
    return torch.nn.Sequential(*layers, torch.nn.Linear(64, 10))


def batches(n: int = 3, b: int = 32, shape: tuple[int, ...] = (32,), *, seed: int = 7,
            classes: int = 10) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` seeded batches of ``b`` examples of ``shape`` with labels in ``range(classes)``."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, *shape, generator=g), torch.randint(0, classes, (b,), generator=g))
            for _ in range(n)]


# -- results -----------------------------------------------------------------------------------

def job_of(con, result: dict) -> dict:
    """A train() (or wait_job()) result with its job's whole row of ``dbml_jobs``: the figures
    train() leaves out (best_epoch, skipped_rows, msr, swaps, budget_bytes...)."""
    cur = con.execute("SELECT * FROM dbml_jobs WHERE job_id = ?", [result["job_id"]])
    names = [d[0] for d in cur.description]
    return {**dict(zip(names, cur.fetchall()[0])), **result}


def state_of(model: torch.nn.Module) -> list[torch.Tensor]:
    """Parameters then buffers: everything training changes."""
    return list(model.parameters()) + list(model.buffers())


def assert_same(a, b) -> None:
    """Bit for bit: as many tensors, each ``torch.equal`` to its partner. Returns None:
    call it once per pair, never inside ``and``."""
    assert len(a) == len(b), f"{len(a)} tensors against {len(b)}"
    for i, (u, v) in enumerate(zip(a, b)):
        assert torch.equal(u, v), f"tensor {i} differs"


assert_identical = assert_same


def eager_state(model: torch.nn.Module, spec, data, seed: int = 1):
    """Train a copy of ``model`` eagerly on ``data`` (``torch.manual_seed(seed)`` first):
    (its parameters and buffers, the losses). ``model`` itself is untouched."""
    from dbml.scheduler.execute.step import EagerStep

    m = copy.deepcopy(model)
    runner = EagerStep(m, loss_fn, spec)
    torch.manual_seed(seed)
    losses = [runner.step(x, y) for x, y in data]
    runner.finish()
    return state_of(m), losses


def trained_under(policy: str, **runner_args):
    """A 4-layer MLP trained 3 Adam steps eagerly and under ``policy`` at half its peak:
    ``((eager model, losses), (scheduled model, losses, runner), budget)``."""
    from dbml.scheduler.execute.runner import ScheduledStep
    from dbml.scheduler.execute.step import EagerStep
    from dbml.scheduler.graph.optim import OptimizerSpec

    spec = OptimizerSpec("adam", lr=1e-3)
    data = batches(3, b=32, shape=(32,))
    torch.manual_seed(0)
    model = mlp()
    budget = vanilla_peak(copy.deepcopy(model), spec, *data[0]) // 2
    eager, scheduled = copy.deepcopy(model), copy.deepcopy(model)

    def train(runner):
        torch.manual_seed(1)
        losses = [runner.step(x, y) for x, y in data]
        runner.finish()
        return losses
    want = train(EagerStep(eager, loss_fn, spec))
    runner = ScheduledStep(scheduled, loss_fn, spec, policy=policy, budget_bytes=budget, log=True, **runner_args)
    got = train(runner)
    return (eager, want), (scheduled, got, runner), budget


def vanilla_peak(model, spec, x, y) -> int:
    """The release-only planned peak of one step. ``model``: a module (a copy is used) or
    a factory (called after ``torch.manual_seed(0)``)."""
    from dbml.scheduler.execute.runner import ScheduledStep

    if isinstance(model, torch.nn.Module):
        model = copy.deepcopy(model)
    else:
        torch.manual_seed(0)
        model = model()
    runner = ScheduledStep(model, loss_fn, spec, policy="none")
    runner.step(x, y)
    return runner.stats()["vanilla_peak_bytes"]


# -- tables ------------------------------------------------------------------------------------

def moons(n: int, seed: int = 0, noise: float = 0.1) -> pa.Table:
    """Two interleaving half circles (scikit-learn's make_moons), with a train/test split column."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, n)
    t = rng.uniform(0, np.pi, n)
    x1 = np.where(label == 0, np.cos(t), 1 - np.cos(t)) + rng.normal(0, noise, n)
    x2 = np.where(label == 0, np.sin(t), 0.5 - np.sin(t)) + rng.normal(0, noise, n)
    split = np.where(rng.uniform(size=n) < 0.8, "train", "test")
    return pa.table({"x1": x1, "x2": x2, "label": label.astype(np.int32), "split": split})


def linear(n: int, seed: int = 0, noise: float = 0.05) -> pa.Table:
    """y = 3 a - 2 b + 0.5 c + 1 + noise: a linear model's R^2 must approach 1."""
    rng = np.random.default_rng(seed)
    a, b, c = rng.normal(size=(3, n))
    y = 3 * a - 2 * b + 0.5 * c + 1 + rng.normal(0, noise, n)
    split = np.where(rng.uniform(size=n) < 0.8, "train", "test")
    return pa.table({"a": a, "b": b, "c": c, "y": y, "split": split})


def load(con, name: str, table: pa.Table) -> None:
    """CREATE TABLE ``name`` from an Arrow table."""
    con.register("_dbml_test_src", table)
    con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM _dbml_test_src')
    con.unregister("_dbml_test_src")


# -- waiting -----------------------------------------------------------------------------------

def wait_until(cond: Callable[[], object], timeout: float = 5.0, what: str = "condition",
               poll: float = 0.005):
    """Poll ``cond`` until it is truthy and return its value; fail naming ``what`` after
    ``timeout`` seconds. Every polling loop in the tests goes through here: none may hang."""
    end = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < end, f"{what}: not reached within {timeout} s"
        time.sleep(poll)


def start(fn, *args, **kwargs):
    """Run ``fn`` on a daemon thread; returns (thread, dict with 'value' or 'error')."""
    out = {}

    def body():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as err:   # handed to the test thread
            out["error"] = err
    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, out


class Looks:
    """A ``cancelled`` callable that is never true and counts how often a waiting job
    looked at it: each look is one pass of its wait loop (it wakes at least every
    POLL_SECONDS). Waiting for a few more looks is how a test knows, without sleeping,
    that the job went on waiting after something happened."""

    def __init__(self):
        self.n = 0

    def __call__(self) -> bool:
        self.n += 1
        return False

    def more(self, k: int = 2) -> None:
        """Return once the job has looked ``k`` more times: its wait loop ran again, with
        the state as it is now (the k-th look is after all that happened before this call)."""
        n = self.n
        wait_until(lambda: self.n >= n + k)


class Clock:
    """A clock the test moves by hand, for MemoryScheduler(clock=...)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
