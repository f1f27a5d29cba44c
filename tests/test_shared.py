"""The shared MemoryScheduler: joint planning of concurrent jobs, plan versions, admission
control (waiting, FIFO, rejection), thread safety, per-job swap rates, several graphs."""

from __future__ import annotations

import dataclasses
import random
import threading
import time

import pytest

from dbml.scheduler.errors import SchedulerError
from dbml.scheduler.multijob import registry, scheduler as shared, solve
from dbml.scheduler.plan.planner import PAPER, InfeasibleBudget, PlanSettings, plan, plan_jobs
from dbml.scheduler.graph.sequence import EventKind
from dbml.scheduler.multijob.registry import shared_scheduler
from dbml.scheduler.multijob.scheduler import MemoryScheduler, NotAdmitted, graph_key
from dbml.scheduler.multijob.solve import for_job

from helpers import Clock, Looks, start, wait_until
from sequences import chain, check_plan, make_seq

from dbml.scheduler.synthetic import training_sequence

SO = EventKind.SWAP_OUT


def fixed(nbytes: int, job: str = "j"):
    """A job whose peak is exactly ``nbytes`` whatever the budget: nothing can be moved."""
    return make_seq([nbytes // 2, nbytes - nbytes // 2], [0], [([0], [1], 1.0)], outputs={1}, job=job)


def training(job: str, seed: int, n_ops: int = 40):
    return training_sequence(job, n_ops, seed=seed)


def vanilla(seq) -> int:
    return plan(seq, 1 << 62, policy="none").peak_bytes


def assert_within_budget(ms: MemoryScheduler):
    snap = ms.snapshot()
    assert snap["planned_peak_bytes"] == sum(j["planned_peak_bytes"] for j in snap["jobs"].values())
    assert snap["planned_peak_bytes"] <= snap["budget_bytes"]
    return snap


# --- joint planning ---------------------------------------------------------------------

def test_joint_plan_of_three_jobs_fits_and_replans_the_others():
    seqs = [training(f"job{i}", seed=i) for i in range(3)]
    budget = int(0.8 * sum(vanilla(s) for s in seqs))
    ms = MemoryScheduler(budget)
    versions = []
    for s in seqs:
        ms.register(s.job, s)
        assert_within_budget(ms)
        versions.append({j: ms.version(j) for j in ms.jobs()})
    # the third job made room by more swapping in the others: their plans changed
    assert versions[2]["job0"] > versions[1]["job0"] and versions[2]["job1"] > versions[1]["job1"]
    expected = plan_jobs(seqs, budget)
    for s in seqs:
        assert ms.plan_for(s.job) == expected[s.job]   # exactly the joint plan
        check_plan(s, ms.plan_for(s.job))
    snap = ms.snapshot()
    assert snap["replans"] == 3 and snap["waiting"] == []
    assert snap["jobs"]["job2"]["share"] == pytest.approx(snap["jobs"]["job2"]["planned_peak_bytes"] / budget)

    before = snap["planned_peak_bytes"]
    swaps_before = ms.plan_for("job0").count(SO)
    assert ms.unregister("job2") and not ms.unregister("job2")
    assert ms.jobs() == ["job0", "job1"]
    assert ms.version("job0") > versions[2]["job0"]          # replanned with more room
    assert ms.plan_for("job0") == plan_jobs(seqs[:2], budget)["job0"]
    assert ms.plan_for("job0").count(SO) < swaps_before
    assert assert_within_budget(ms)["free_bytes"] > budget - before


def test_version_moves_only_when_the_plan_changes():
    ms = MemoryScheduler(1000)
    ms.register("a", chain())
    v = ms.version("a")
    ms.register("b", fixed(10, "b"))          # room enough: a's plan stays the same
    assert ms.version("a") == v and ms.plan_for("a").count(SO) == 0
    ms.update("a", chain())                   # the same sequence: nothing to do
    assert ms.version("a") == v and ms.snapshot()["replans"] == 2


def test_plans_are_named_after_the_registered_job():
    ms = MemoryScheduler(1000)
    ms.register("mine", chain())              # chain() says job "j"
    assert ms.plan_for("mine").job == "mine"
    with pytest.raises(KeyError, match="'other' is not registered"):
        ms.plan_for("other")
    with pytest.raises(ValueError, match="already registered"):
        ms.register("mine", chain())


# --- admission ------------------------------------------------------------------------

def test_third_job_waits_and_is_admitted_when_one_leaves():
    ms = MemoryScheduler(130)
    assert ms.request("a", fixed(60)) and ms.request("b", fixed(60))
    assert ms.request("c", fixed(60)) is False and ms.waiting() == []   # request never queues
    looks = Looks()
    t, out = start(ms.wait_admission, "c", fixed(60), timeout=10, cancelled=looks)
    wait_until(lambda: ms.waiting() == ["c"])
    looks.more()
    # c's wait loop ran again after it queued, and it still waits, not admitted
    assert t.is_alive() and ms.waiting() == ["c"] and "c" not in ms.jobs()
    ms.unregister("a")
    t.join(5)
    assert out == {"value": True}
    assert ms.jobs() == ["b", "c"] and ms.waiting() == []
    assert assert_within_budget(ms)["planned_peak_bytes"] == 120


def test_job_too_big_alone_is_rejected_at_once_with_the_budget_it_needs():
    ms = MemoryScheduler(100)
    ms.register("a", fixed(60))
    looks = Looks()
    with pytest.raises(InfeasibleBudget, match="smallest feasible budget is 120 bytes") as info:
        ms.wait_admission("big", fixed(120), timeout=10, cancelled=looks)
    # rejected at once: it never entered the wait loop (which looks at ``cancelled``)
    assert info.value.min_budget == 120 and looks.n == 0
    with pytest.raises(InfeasibleBudget):
        ms.request("big", fixed(120))
    # beside "a" it does not fit, alone it would: register() names the joint minimum
    with pytest.raises(InfeasibleBudget, match="smallest feasible budget is 110 bytes"):
        ms.register("b", fixed(50))
    assert ms.jobs() == ["a"] and ms.waiting() == []


def test_swapping_makes_room_for_a_job_that_vanilla_peaks_would_not():
    a, b = chain(), chain()
    ms = MemoryScheduler(121 + 110)           # vanilla 121 + 121 does not fit; 121 + 103 does
    assert ms.request("a", a) and ms.request("b", b)
    assert sorted(p["planned_peak_bytes"] for p in ms.snapshot()["jobs"].values()) == [103, 121]


def test_waiting_jobs_are_admitted_in_arrival_order():
    ms = MemoryScheduler(100)
    ms.register("a", fixed(60))
    tb, ob = start(ms.wait_admission, "b", fixed(60), timeout=10)
    wait_until(lambda: ms.waiting() == ["b"])
    tc, oc = start(ms.wait_admission, "c", fixed(60), timeout=10)
    wait_until(lambda: ms.waiting() == ["b", "c"])
    ms.unregister("a")
    tb.join(5)
    assert ob == {"value": True} and ms.jobs() == ["b"] and ms.waiting() == ["c"]
    assert tc.is_alive()
    ms.unregister("b")
    tc.join(5)
    assert oc == {"value": True} and ms.jobs() == ["c"]


def test_first_fit_lets_a_small_job_pass_and_strict_fifo_does_not():
    for strict in (False, True):
        ms = MemoryScheduler(100, strict_fifo=strict)
        ms.register("a", fixed(60))
        tb, ob = start(ms.wait_admission, "b", fixed(60), timeout=10)
        wait_until(lambda: ms.waiting() == ["b"])
        tc, oc = start(ms.wait_admission, "c", fixed(30), timeout=10)
        if not strict:
            tc.join(5)
            assert oc == {"value": True} and ms.jobs() == ["a", "c"]
            ms.unregister("c")
        else:
            wait_until(lambda: ms.waiting() == ["b", "c"])
            assert ms.request("d", fixed(10)) is False
        ms.unregister("a")
        tb.join(5)
        assert ob == {"value": True}
        if strict:
            tc.join(5)
            assert oc == {"value": True} and ms.jobs() == ["b", "c"]   # 60 + 30 fit together


def test_timeout_and_cancel_leave_the_queue():
    clock = Clock()
    ms = MemoryScheduler(100, clock=clock)
    ms.register("a", fixed(60))
    looks = Looks()
    t, out = start(ms.wait_admission, "b", fixed(60), timeout=0.2, cancelled=looks)
    wait_until(lambda: ms.waiting() == ["b"])
    clock.now = 0.19
    looks.more()
    assert t.is_alive() and ms.waiting() == ["b"]   # before its deadline on the clock: it waits
    clock.now = 0.2
    t.join(5)
    assert out == {"value": False} and ms.waiting() == []   # at the deadline: it left the queue
    stop = threading.Event()
    t, out = start(ms.wait_admission, "c", fixed(60), cancelled=stop.is_set)
    wait_until(lambda: ms.waiting() == ["c"])
    stop.set()
    t.join(5)
    assert out == {"value": False} and ms.waiting() == []
    t, out = start(ms.wait_admission, "d", fixed(60))
    wait_until(lambda: ms.waiting() == ["d"])
    assert ms.unregister("d")                  # a waiting job can be withdrawn by name
    t.join(5)
    assert out == {"value": False} and ms.jobs() == ["a"]


def test_smaller_budget_rejects_a_waiting_job_that_no_longer_fits_alone():
    ms = MemoryScheduler(130)
    ms.register("a", fixed(60))
    t, out = start(ms.wait_admission, "b", fixed(80), timeout=10)
    wait_until(lambda: ms.waiting() == ["b"])
    with pytest.raises(InfeasibleBudget):
        ms.set_budget(50)                      # "a" cannot fit: nothing changes
    assert ms.budget_bytes == 130 and t.is_alive()
    ms.set_budget(70)
    t.join(5)
    assert isinstance(out.get("error"), InfeasibleBudget) and out["error"].min_budget == 80
    assert ms.waiting() == [] and ms.jobs() == ["a"]


# --- thread safety --------------------------------------------------------------------

def test_concurrent_register_and_unregister_keep_the_budget():
    budget = 200
    ms = MemoryScheduler(budget)
    sizes = [40, 60, 70, 90, 110]
    errors, done = [], threading.Event()

    def worker(w):
        rng = random.Random(w)
        try:
            for k in range(15):
                name, size = f"w{w}-{k}", rng.choice(sizes)
                if rng.random() < 0.5:
                    admitted = ms.wait_admission(name, fixed(size, name), timeout=rng.uniform(0, 0.05))
                else:
                    admitted = ms.request(name, fixed(size, name))
                if admitted:
                    assert ms.plan_for(name).peak_bytes == size
                    time.sleep(rng.uniform(0, 0.005))
                    assert ms.unregister(name)
                else:
                    assert name not in ms.jobs()
        except BaseException as err:
            errors.append(err)

    def monitor():
        while not done.is_set():
            try:
                snap = assert_within_budget(ms)
                assert all(j["planned_peak_bytes"] in sizes for j in snap["jobs"].values())
                time.sleep(0.0005)
            except BaseException as err:
                errors.append(err)
                return

    workers = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    mon = threading.Thread(target=monitor)
    mon.start()
    for t in workers:
        t.start()
    for t in workers:
        t.join(30)
    done.set()
    mon.join(5)
    # what this asserts: under any interleaving, the plans never pass the budget, each
    # admitted job gets its own size, and all leave cleanly. (That a waiting job is admitted
    # when another leaves is asserted deterministically in the admission tests above.)
    assert not errors, errors[0]
    snap = ms.snapshot()
    assert snap["jobs"] == {} and snap["waiting"] == [] and snap["planned_peak_bytes"] == 0


# --- per-job swap rate ----------------------------------------------------------------

def test_swap_rate_zero_job_is_never_swapped():
    budget = 121 + 110   # one of the two chains must swap its big tensor
    control = MemoryScheduler(budget)
    control.register("first", chain())
    control.register("second", chain())
    assert control.plan_for("first").count(SO) == 1    # the tie goes to the first job
    ms = MemoryScheduler(budget)
    ms.register("first", chain(), swap_rate=0.0)
    ms.register("second", chain())
    assert ms.plan_for("first").count(SO) == 0 and ms.plan_for("second").count(SO) == 1
    assert ms.snapshot()["jobs"]["first"]["swap_rate"] == 0.0
    check_plan(chain(), dataclasses.replace(ms.plan_for("second"), job="j"), None)
    # rates from the settings count where register() gives none
    ms2 = MemoryScheduler(budget, PlanSettings(swap_rates={"first": 0.0}))
    ms2.register("first", chain())
    ms2.register("second", chain())
    assert ms2.plan_for("first").count(SO) == 0
    with pytest.raises(ValueError, match="swap_rate must be within"):
        ms.register("third", chain(), swap_rate=2.0)


# --- several graphs, updates, the planner hook ---------------------------------------

def test_second_graph_is_planned_within_the_jobs_share():
    big, small = training("a", seed=1), training("a", seed=1)
    small = dataclasses.replace(small, tensors=tuple(dataclasses.replace(t, nbytes=t.nbytes // 2)
                                                     for t in small.tensors))
    assert graph_key(big) != graph_key(small)
    other = training("b", seed=2)
    budget = int(0.85 * (vanilla(big) + vanilla(other)))
    ms = MemoryScheduler(budget)
    ms.register("a", small)
    ms.register("b", other)
    v = ms.version("a")
    ms.update("a", big)                       # a new batch shape, larger: it becomes primary
    jp = ms.plans("a")
    assert jp.version > v and len(jp.plans) == 2 and jp.primary == graph_key(big)
    assert ms.plan_for("a") == ms.plan_for("a", big) == plan_jobs([big, other], budget)["a"]
    share = ms.plan_for("a", big).peak_bytes
    assert ms.plan_for("a", small).peak_bytes <= share == jp.reserved_bytes
    check_plan(small, dataclasses.replace(ms.plan_for("a", small), job="j"), share)
    assert ms.snapshot()["jobs"]["a"]["graphs"] == 2
    assert_within_budget(ms)


def test_drifted_latencies_replan_and_an_unfitting_graph_is_refused():
    # the paper's planner: with planned stalls (the default) a slow copy still fits, waiting
    ms = MemoryScheduler(115, PlanSettings(**PAPER))
    ms.register("a", chain())                 # swaps t1 over op1..op6 at bandwidth 100
    assert ms.plan_for("a").count(SO) == 1
    # the ops now run 10x faster: the copies no longer fit under them, so recompute instead
    fast = dataclasses.replace(chain(), ops=tuple(dataclasses.replace(o, start=o.start / 10, end=o.end / 10)
                                                  for o in chain().ops))
    assert graph_key(fast) == graph_key(chain())
    v = ms.version("a")
    ms.update("a", fast)
    assert ms.version("a") > v and ms.plans("a").plans.keys() == {graph_key(chain())}
    assert ms.plan_for("a").count(SO) == 0 and ms.plan_for("a").count(EventKind.RECOMPUTE) == 1
    with pytest.raises(InfeasibleBudget):
        ms.update("a", fixed(200))            # a new graph that cannot fit: nothing changes
    assert len(ms.plans("a").plans) == 1 and ms.version("a") == v + 1
    # drift that no plan fits: the plan in effect stays (it fits), the failure is counted
    slow = dataclasses.replace(chain(bandwidth=1.0), ops=fast.ops)
    before = ms.plan_for("a")
    ms2 = MemoryScheduler(115, PlanSettings(**PAPER, recompute=False))
    ms2.register("a", chain())
    with pytest.raises(InfeasibleBudget):
        ms2.update("a", slow)
    assert ms2.plan_for("a").count(SO) == 1 and ms2.snapshot()["failed_replans"] == 1
    assert ms.plan_for("a") is before


def test_planner_hook_registers_then_updates_and_reports_versions():
    ms = MemoryScheduler(250)
    hook = ms.planner_for("job", swap_rate=0.5)
    assert hook.version() == 0                 # what a runner reads before its first plan
    p = hook(chain())
    assert p == ms.plan_for("job") and p.job == "job" and ms.jobs() == ["job"]
    assert hook.version() > 0 and hook.latest(chain()) is p
    q = hook(fixed(40))                        # a second graph
    assert q.peak_bytes == 40 and hook.latest(fixed(40)) is q and ms.plan_for("job", fixed(40)) == q
    v = hook.version()
    assert ms.snapshot()["jobs"]["job"]["swap_rate"] == 0.5
    ms.register("other", fixed(140))          # 121 + 140 > 250: the chain must swap now
    assert hook.version() > v and hook.latest(chain()).count(SO) == 1
    assert ms.plans("job").sequences[graph_key(chain())].job == "job"
    with pytest.raises(InfeasibleBudget):
        ms.planner_for("huge")(fixed(2000))
    assert ms.jobs() == ["job", "other"]


def test_planner_hook_can_wait_for_admission():
    ms = MemoryScheduler(100)
    ms.register("a", fixed(60))
    with pytest.raises(NotAdmitted, match="'b' timed out after 0.1 s while waiting for device memory"):
        ms.planner_for("b", wait=True, timeout=0.1)(fixed(60))
    t, out = start(ms.planner_for("b", wait=True), fixed(60))
    wait_until(lambda: ms.waiting() == ["b"])
    ms.unregister("a")
    t.join(5)
    assert out["value"].peak_bytes == 60 and ms.jobs() == ["b"]


def test_a_new_job_starts_only_once_the_others_took_their_smaller_plans():
    ms = MemoryScheduler(250)
    a = ms.planner_for("a")
    assert a(chain()).peak_bytes == 121         # a runs this plan now
    looks = Looks()
    t, out = start(ms.planner_for("b", cancelled=looks), fixed(140))
    wait_until(lambda: "b" in ms.jobs())       # admitted: a must swap to make room...
    assert ms.plan_for("a").peak_bytes == 103
    looks.more()                               # b's hand-over wait ran again...
    assert t.is_alive()                        # ...and b waits: a still runs its 121-byte plan
    assert ms.snapshot()["running_bytes"] == 121   # b does not run yet
    v = a.version()                            # a's boundary: the smaller plan is its to take
    assert v == ms.version("a") and a.latest(chain()).peak_bytes == 103
    looks.more()                               # b looked again after a took the smaller plan...
    assert t.is_alive()                        # ...but a has not moved its state yet: b still waits
    a.applied()                                # a holds no more than 103 now
    t.join(5)
    assert out["value"].peak_bytes == 140
    snap = ms.snapshot()
    assert snap["running_bytes"] == snap["planned_peak_bytes"] == 243
    ms2 = MemoryScheduler(250)
    ms2.planner_for("a")(chain())
    with pytest.raises(NotAdmitted, match="'c' timed out after 0.1 s while the other jobs took the smaller"):
        ms2.planner_for("c", timeout=0.1)(fixed(140))   # a never reaches a boundary
    assert ms2.jobs() == ["a"] and ms2.plan_for("a").peak_bytes == 121
    # settle=False hands the plan out at once (one thread stepping several runners)
    ms3 = MemoryScheduler(250)
    ms3.planner_for("a", settle=False)(chain())
    assert ms3.planner_for("b", settle=False)(fixed(140)).peak_bytes == 140


def test_a_growing_plan_waits_for_the_jobs_that_make_room():
    ms = MemoryScheduler(230, PlanSettings(**PAPER, recompute=False))   # a copy that no longer fits is refused
    a, b = ms.planner_for("a"), ms.planner_for("b")
    a(chain())
    t, out = start(b, chain())                 # the tie goes to a: a swaps (103), b does not (121)
    wait_until(lambda: a.version() == ms.version("a") > 1)
    a.latest(chain())                          # a's boundary...
    a.applied()                                # ...once it has shrunk, b may start
    t.join(5)
    assert out["value"].peak_bytes == 121
    assert a.latest(chain()).peak_bytes == 103 and b.latest(chain()).peak_bytes == 121
    va = a.version()
    # a's ops get 10x faster: its copies no longer fit under them, so b must swap instead
    fast = dataclasses.replace(chain(), ops=tuple(dataclasses.replace(o, start=o.start / 10, end=o.end / 10)
                                                  for o in chain().ops))
    assert a(fast).peak_bytes == 103           # b still runs 121: a keeps its plan for now
    assert ms.plan_for("a").peak_bytes == 121 and ms.plan_for("b").peak_bytes == 103
    assert a.version() == va and a.latest(fast).peak_bytes == 103
    assert b.latest(chain()).peak_bytes == 103   # b's boundary: it takes the smaller plan
    assert a.version() == va                     # ...and a grows only once b has applied it
    b.applied()
    assert a.version() > va and a.latest(fast).peak_bytes == 121
    assert ms.snapshot()["running_bytes"] == 224


def test_plans_over_the_budget_are_never_published():
    """The solve keeps the reservations within the budget; publishing checks it (a bug
    otherwise), with an error that survives ``python -O``, and publishes nothing."""
    ms = MemoryScheduler(100)
    ms.register("a", fixed(60))
    v = ms.version("a")
    jobs = {"a": solve.JobGraphs.of("a", fixed(80))}
    over = solve.solve(jobs, 100, PlanSettings())
    with pytest.raises(SchedulerError, match=r"plans for \['a'\] reserve 80 bytes, over the budget of 70"):
        ms.handover.publish(jobs, over, 70)
    assert ms.version("a") == v and ms.plan_for("a").peak_bytes == 60


def test_shared_scheduler_is_one_per_device(monkeypatch):
    monkeypatch.setattr(registry, "DEVICES", registry.Devices())
    with pytest.raises(ValueError, match="must give budget_bytes"):
        shared_scheduler("cpu")
    cpu = shared_scheduler("cpu", 1000)
    assert shared_scheduler("cpu") is cpu and shared_scheduler("cuda", 500) is shared_scheduler("cuda:0")
    assert shared_scheduler("cuda:1", 500) is not shared_scheduler("cuda:0")
    cpu.register("a", fixed(600))
    # a later caller's budget never re-budgets the running jobs (hold_budget does, when idle)
    assert shared_scheduler("cpu", 2000) is cpu and cpu.budget_bytes == 1000
    assert shared_scheduler("cpu", 100) is cpu and cpu.budget_bytes == 1000


def test_a_held_budget_changes_only_when_no_job_holds_it():
    ms = MemoryScheduler(1000)
    assert ms.hold_budget("a", None, lambda: 5000) == 5000          # idle: the default
    ms.register("a", fixed(600))
    assert ms.hold_budget("b", None, lambda: 9999) == 5000          # unset: joins what is in force
    asked, done = [], threading.Event()

    def other_connection():
        asked.append(ms.hold_budget("c", 800, lambda: 5000))
        done.set()
    threading.Thread(target=other_connection, daemon=True).start()
    time.sleep(0.2)
    assert not done.is_set() and "c" in ms.waiting() and ms.budget_bytes == 5000   # a waits, a runs on
    ms.unregister("a"), ms.release_budget("a"), ms.release_budget("b")
    assert done.wait(5) and asked == [800] and ms.budget_bytes == 800 and ms.waiting() == []
    cancelled = MemoryScheduler(100)
    cancelled.hold_budget("x", None, lambda: 100)
    with pytest.raises(NotAdmitted, match="cancelled while waiting for the device's budget"):
        cancelled.hold_budget("y", 50, lambda: 100, cancelled=lambda: True)
    assert cancelled.waiting() == []


@pytest.mark.parametrize("module", [shared, solve])
def test_module_doctest(module):
    import doctest
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_a_drift_is_replanned_within_the_jobs_share_first():
    slow = dataclasses.replace(chain(), ops=tuple(dataclasses.replace(o, start=o.start * 2, end=o.end * 2)
                                                  for o in chain().ops))
    for local in (True, False):
        ms = MemoryScheduler(250, local_drift=local)
        ms.register("a", chain())
        ms.register("b", fixed(140))
        vb, replans, seconds = ms.version("b"), ms.replans, ms.plan_seconds
        ms.update("a", slow)                       # slower ops hide the same copies: it fits its share
        assert ms.plans("a").sequences[graph_key(slow)] == for_job(slow, "a")
        assert ms.version("b") == vb and ms.local_replans == int(local) and ms.replans == replans + 1
        assert ms.plan_seconds > seconds
        assert_within_budget(ms)


def test_a_drift_replanned_within_the_share_rechecks_the_waiting_jobs():
    """Regression: a drift replanned within the job's own share (no joint replan) must
    re-check the queue too. Slower ops hide more copies, so after ``a`` drifts the joint
    plan has room for ``b``, which waited; before the fix ``b`` waited until another job
    left or the budget changed."""
    a = training("a", seed=1)
    slow = dataclasses.replace(a, ops=tuple(dataclasses.replace(o, start=o.start * 4, end=o.end * 4)
                                            for o in a.ops))
    budget, b = 400_000_000, fixed(150_000_000, "b")
    # the paper's planner: with planned stalls b would fit beside a's fast ops from the start
    ms = MemoryScheduler(budget, PlanSettings(**PAPER), local_drift=True)
    ms.register("a", a)
    looks = Looks()
    t, out = start(ms.wait_admission, "b", b, timeout=10, cancelled=looks)
    wait_until(lambda: ms.waiting() == ["b"])
    looks.more()
    assert ms.waiting() == ["b"]            # a's fast ops leave no room for b
    local = ms.local_replans
    ms.update("a", slow)
    assert ms.local_replans == local + 1    # replanned within a's share, not jointly
    t.join(5)
    assert out == {"value": True} and ms.jobs() == ["a", "b"]
    assert_within_budget(ms)
