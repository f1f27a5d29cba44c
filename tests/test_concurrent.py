"""Concurrent jobs on one device: the device ledger measures what they hold together,
and under one shared scheduler that global peak stays within the budget."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from dbml.scheduler.multijob.ledger import DeviceLedger
from dbml.scheduler.graph.optim import OptimizerSpec
from dbml.scheduler.plan.planner import InfeasibleBudget
from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.multijob.scheduler import MemoryScheduler
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.execute.updating import UpdateSettings

from helpers import Looks, wait_until

loss_fn = torch.nn.functional.cross_entropy
SPEC = OptimizerSpec("adam", lr=0.01)

pytestmark = pytest.mark.usefixtures("one_thread")


class SlowOps:
    """Every op takes a millisecond, as far as the planner knows."""

    def predict(self, node) -> float:
        return 1e-3


SLOW_OPS = SlowOps()


def model(width: int, seed: int) -> torch.nn.Sequential:
    """No dropout: jobs running at once draw from one global generator."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 10))


def deep(seed: int) -> torch.nn.Sequential:
    """Many small layers: a budget below its parameters and optimizer state is feasible."""
    torch.manual_seed(seed)
    layers = [m for _ in range(8) for m in (torch.nn.Linear(64, 64), torch.nn.Tanh())]
    return torch.nn.Sequential(*layers, torch.nn.Linear(64, 10))


def batches(n: int, seed: int, batch: int = 16, features: int = 32):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, features, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(n)]


def eager_params(m, data):
    runner = EagerStep(copy.deepcopy(m), loss_fn, SPEC)
    for x, y in data:
        runner.step(x, y)
    return [p.detach().clone() for p in runner.model.parameters()]


def unscheduled_peak(m, x, y) -> int:
    runner = ScheduledStep(copy.deepcopy(m), loss_fn, SPEC, policy="none")
    runner.step(x, y)
    runner.step(x, y)
    return runner.stats()["measured_peak_bytes"]


def smallest_budget(m, x, y) -> int:
    with pytest.raises(InfeasibleBudget) as err:
        ScheduledStep(copy.deepcopy(m), loss_fn, SPEC, budget_bytes=1).step(x, y)
    return err.value.min_budget


@pytest.mark.slow   # ~0.8 s: out of the -m 'not slow' inner loop (under a minute)
def test_the_ledger_is_exact_for_interleaved_jobs():
    """Two jobs stepping in turn: the global peak is, exactly, the largest of one job's
    iteration peak plus what the other holds between its iterations."""
    ledger = DeviceLedger()
    jobs = {name: (ScheduledStep(model(w, 0), loss_fn, SPEC, policy="none", job=name, ledger=ledger),
                   batches(3, w)) for name, w in (("a", 96), ("b", 160))}
    expected = 0
    for i in range(3):
        for name, (runner, data) in jobs.items():
            other = sum(b for job, b in ledger.accounts().items() if job != name)
            runner.step(*data[i])
            expected = max(expected, other + runner.executors()[0].iteration_peak)
    a, b = (r for r, _ in jobs.values())
    assert ledger.peak_bytes == expected
    assert ledger.peak_bytes > max(a.stats()["measured_peak_bytes"], b.stats()["measured_peak_bytes"])
    held_b = ledger.accounts()["b"]
    assert held_b > 0 and ledger.current_bytes == ledger.accounts()["a"] + held_b
    a.close()
    assert ledger.current_bytes == held_b and list(ledger.accounts()) == ["b"]
    b.close()
    assert ledger.current_bytes == 0 and ledger.peak_bytes == expected   # readable after the jobs end
    ScheduledStep(model(32, 0), loss_fn, SPEC, policy="none", ledger=ledger)
    assert ledger.peak_bytes == 0     # a job on an idle device starts a new busy period


@pytest.mark.slow
def test_a_shrinking_job_frees_its_room_before_the_scheduler_gives_it_away():
    """Hand-over: a job whose plan shrinks moves the state its new plan keeps on the host
    there at its boundary, and only then tells the scheduler (``applied``), so a job
    waiting for that room never starts beside memory that is still held."""
    m, data = deep(1), batches(4, 1, batch=4, features=64)
    state = sum(p.numel() * 4 for p in m.parameters()) * 3    # parameters and Adam's two moments
    assert unscheduled_peak(m, *data[0]) < 1.8 * state
    ms = MemoryScheduler(int(1.8 * state))      # alone it swaps nothing; two must hold < state each
    hook = ms.planner_for("big", wait=True)
    held_when_applied = []
    applied = hook.applied
    hook.applied = lambda: (held_when_applied.append(ms.ledger.accounts()["big"]), applied())
    big = ScheduledStep(copy.deepcopy(m), loss_fn, SPEC, job="big", planner=hook)
    big.step(*data[0])                            # alone: no swaps, all state resident
    assert big.stats()["swaps"] == 0
    held_alone = ms.ledger.accounts()["big"]
    version = ms.version("big")
    looks = Looks()                               # counts the passes of next's wait loops
    second = threading.Thread(target=ms.planner_for("next", wait=True, cancelled=looks),
                              args=(next(iter(big.sequences.values())),))
    second.start()                                # a second job: "big" must shrink to make room
    wait_until(lambda: ms.version("big") != version, timeout=10.0)   # next is admitted: big's plan shrank
    smaller = ms.plans("big").reserved_bytes
    n = looks.n
    wait_until(lambda: looks.n >= n + 2, timeout=10.0)          # next's hand-over wait ran again since...
    assert second.is_alive()                      # ...and it waits for "big" to take its smaller plan
    big.step(*data[1])                            # big's boundary: settle, then applied
    second.join(5)
    assert not second.is_alive()
    assert held_when_applied and held_when_applied[-1] <= smaller < held_alone
    assert big.stats()["setup_swaps"] > 0
    big.step(*data[2]), big.step(*data[3])
    big.finish()
    assert all(torch.equal(p, q) for p, q in zip(big.model.parameters(), eager_params(m, data)))


@pytest.mark.slow
def test_concurrent_jobs_stay_within_a_budget_below_their_unscheduled_peaks():
    """Three jobs on threads under one scheduler, at a budget that not even the two largest
    fit unscheduled: all finish, each with the weights it gets alone, and the measured
    global peak (what they held at one moment) stays within the budget. Each job steps
    until all three have run beside each other for a few iterations. (Fixed op times, long
    enough to hide the copies: which jobs fit together does not hang on the timing noise
    of this machine.)"""
    widths = {"j1": 192, "j2": 256, "j3": 320}
    models = {name: model(w, i) for i, (name, w) in enumerate(widths.items())}
    data = {name: batches(6, i) for i, name in enumerate(widths)}
    vanilla = {n: unscheduled_peak(models[n], *data[n][0]) for n in widths}
    need = {n: smallest_budget(models[n], *data[n][0]) for n in widths}
    two_largest = sum(sorted(vanilla.values())[-2:])
    budget = (sum(need.values()) + two_largest) // 2
    assert sum(need.values()) < budget < two_largest < sum(vanilla.values())
    ms = MemoryScheduler(budget)
    runners, fed, errors, together = {}, {}, [], threading.Event()

    def run(name):
        try:
            r = runners[name] = ScheduledStep(copy.deepcopy(models[name]), loss_fn, SPEC, job=name,
                                              planner=ms.planner_for(name, wait=True, timeout=60),
                                              latency_model=SLOW_OPS, update=UpdateSettings(enabled=False))
            fed[name], after = [], 0
            while after < 3 and len(fed[name]) < 400:
                x, y = data[name][len(fed[name]) % len(data[name])]
                r.step(x, y)
                fed[name].append((x, y))
                if len(ms.jobs()) == len(widths):
                    together.set()
                after += together.is_set()
            r.finish()
            r.close()
            ms.unregister(name)
        except Exception as e:   # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in widths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert together.is_set()
    for name in widths:
        got = list(runners[name].model.parameters())
        assert all(torch.equal(p, q) for p, q in zip(got, eager_params(models[name], fed[name])))
    peaks = {n: r.stats()["measured_peak_bytes"] for n, r in runners.items()}
    assert ms.ledger.peak_bytes <= budget
    assert ms.ledger.reserved_peak_bytes <= budget
    assert ms.ledger.peak_bytes >= max(peaks.values())
    assert sum(r.stats()["swaps"] for r in runners.values()) > 0   # room was made by swapping
    assert ms.ledger.current_bytes == 0 and ms.jobs() == []


@pytest.mark.slow
def test_jobs_with_the_same_architecture_share_one_capture():
    m, data = model(64, 0), batches(3, 0)
    first = ScheduledStep(copy.deepcopy(m), loss_fn, SPEC, job="first", share_graphs="mlp-64")
    other = ScheduledStep(model(64, 1), loss_fn, SPEC, job="other", share_graphs="mlp-64")
    wider = ScheduledStep(model(96, 0), loss_fn, SPEC, job="wider", share_graphs="mlp-64")
    unshared = ScheduledStep(copy.deepcopy(m), loss_fn, SPEC, job="unshared")
    graphs = [r.graphs.get(*data[0]) for r in (first, other, wider, unshared)]
    assert graphs[0].gm is graphs[1].gm and graphs[1].job == "other" and other.graphs.shared_hits == 1
    assert graphs[2].gm is not graphs[0].gm and graphs[3].gm is not graphs[0].gm   # other shapes; not shared
    for x, y in data:
        other.step(x, y)
    other.finish()
    assert all(torch.equal(p, q) for p, q in zip(other.model.parameters(), eager_params(model(64, 1), data)))


def test_an_account_left_open_holding_nothing_does_not_carry_an_old_peak():
    """The CI run of this session failed test_jobs' three-jobs budget check with a global peak
    above the budget: an account left open (holding nothing) by an earlier job kept the
    device 'busy', so the next jobs' peak included an older one. Idle is 'nothing held'."""
    from dbml.scheduler.multijob.ledger import DeviceLedger
    ledger = DeviceLedger()
    left_open, busy = ledger.account("left_open"), ledger.account("busy")
    busy.add(1000)
    busy.close()
    assert ledger.current_bytes == 0 and ledger.peak_bytes == 1000 and "left_open" in ledger.accounts()
    ledger.account("next").add(10)
    assert ledger.peak_bytes == 10
