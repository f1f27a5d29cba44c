"""Access sequences for planner tests, and the independent checker of their plans.

``make_seq`` and ``chain`` build small sequences by hand; ``random_sequences`` (a
hypothesis strategy) and ``seeded_sequence`` (a plain seeded RNG, for golden snapshots)
build random DAGs of the same shape. ``replay`` is an independent checker: it rebuilds
residency from a plan's events step by step and asserts that no op reads a tensor that
is not resident (or still in flight), that copies never overlap on the channel, that
swap-outs follow their TGA, and returns the ledger's peak to compare with
``analyse_peak``; ``check_plan`` runs it and compares.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

from dbml.scheduler.graph.sequence import (AccessSequence, EventKind, Op, Phase, Plan, TensorInfo,
                                           TensorKind)
from dbml.scheduler.plan.peak import analyse_peak, build_timeline

R, SO, SI, RC = EventKind.RELEASE, EventKind.SWAP_OUT, EventKind.SWAP_IN, EventKind.RECOMPUTE
TOL = 1e-9


# --- building sequences -------------------------------------------------------------

def make_seq(sizes, initial, ops, updates=None, outputs=(), workspace=0, bandwidth=1.0,
             random_tensors=(), job="j"):
    """ops: (inputs, outputs, latency[, random]) in order; times are laid end to end."""
    kinds = {t: TensorKind.PARAM for t in initial}
    tensors = tuple(TensorInfo(i, f"t{i}", n, kinds.get(i, TensorKind.ACTIVATION), i in random_tensors)
                    for i, n in enumerate(sizes))
    built, t = [], 0.0
    for i, (ins, outs, lat, *rnd) in enumerate(ops):
        built.append(Op(i, f"op{i}", tuple(ins), tuple(outs), t, t + lat, Phase.FORWARD, bool(rnd and rnd[0])))
        t += lat
    return AccessSequence(job, tensors, tuple(built), frozenset(initial), dict(updates or {}),
                          workspace, bandwidth, frozenset(outputs))


def chain(bandwidth=100.0, big=100):
    """t1 (big) is generated first and read again only at the end: a swap candidate."""
    ops = [([0], [1], 1), ([0], [2], 1)] + [([k], [k + 1], 1) for k in range(2, 7)] + [([1, 7], [8], 1)]
    return make_seq([1, big, 1, 10, 10, 10, 1, 1, 1], [0], ops, outputs={8}, bandwidth=bandwidth)


@st.composite
def random_sequences(draw, job="j"):
    """Random DAGs: initial params (some updated at the end), ops reading earlier tensors."""
    n_init = draw(st.integers(1, 4))
    sizes = [draw(st.integers(1, 60)) for _ in range(n_init)]
    available, ops, rand = list(range(n_init)), [], set()
    for _ in range(draw(st.integers(1, 18))):
        ins = draw(st.lists(st.sampled_from(available), min_size=1, max_size=3, unique=True))
        outs = []   # none: a pure view, which allocates nothing
        for _ in range(draw(st.integers(0, 2))):
            outs.append(len(sizes))
            sizes.append(draw(st.integers(0, 100)))
        is_random = draw(st.integers(0, 9)) == 0
        if is_random:
            rand.update(outs)
        lat = draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]))
        ops.append((ins, outs, lat, is_random))
        available += outs
    loss = {available[-1]} if len(available) > n_init else set()
    updates = {}
    for p in range(n_init):
        if draw(st.booleans()):
            n = len(sizes)
            sizes.append(sizes[p])
            src = draw(st.sampled_from(available))
            ops.append(([p, src] if src != p else [p], [n], draw(st.sampled_from([0.0, 1.0])), False))
            updates[n] = p
    return make_seq(sizes, range(n_init), ops, updates, loss, workspace=draw(st.integers(0, 5)),
                    bandwidth=draw(st.sampled_from([10.0, 40.0, 200.0])), random_tensors=rand, job=job)


def seeded_sequence(seed: int, job: str = "j") -> AccessSequence:
    """A random DAG like ``random_sequences`` draws, from a seeded RNG: reproducible
    without hypothesis (for golden snapshots)."""
    rng = random.Random(seed)
    n_init = rng.randint(1, 4)
    sizes = [rng.randint(1, 60) for _ in range(n_init)]
    available, ops, rand = list(range(n_init)), [], set()
    for _ in range(rng.randint(1, 18)):
        ins = rng.sample(available, rng.randint(1, min(3, len(available))))
        outs = []
        for _ in range(rng.randint(0, 2)):
            outs.append(len(sizes))
            sizes.append(rng.randint(0, 100))
        is_random = rng.randint(0, 9) == 0
        if is_random:
            rand.update(outs)
        ops.append((ins, outs, rng.choice([0.0, 0.5, 1.0, 2.0, 3.0]), is_random))
        available += outs
    loss = {available[-1]} if len(available) > n_init else set()
    updates = {}
    for p in range(n_init):
        if rng.random() < 0.5:
            n = len(sizes)
            sizes.append(sizes[p])
            src = rng.choice(available)
            ops.append(([p, src] if src != p else [p], [n], rng.choice([0.0, 1.0]), False))
            updates[n] = p
    return make_seq(sizes, range(n_init), ops, updates, loss, workspace=rng.randint(0, 5),
                    bandwidth=rng.choice([10.0, 40.0, 200.0]), random_tensors=rand, job=job)


# --- the independent replay checker ---------------------------------------------------

def replay(seq: AccessSequence, plan_: Plan, margin: float = 0.0) -> int:
    """Simulate the plan; assert every rule an executor relies on; return the ledger peak."""
    gen = {t: op.index for op in seq.ops for t in op.outputs}
    steps, step_of, end = _steps(seq, plan_, gen)
    actions = _actions(seq, plan_, gen, steps, step_of, end)
    on_host = set(plan_.host_at_start)
    assert on_host <= set(seq.updates.values())
    ledger = _Ledger(seq, gen, on_host, margin)
    peak = ledger.used
    # times equal up to float rounding (the planner's and this replay's sums differ in
    # their last bits) are equal: then the ranks order the changes
    for time_, _, _, _, (what, kind, x, t0) in sorted(actions, key=lambda a: (round(a[0], 9),) + a[1:4]):
        ledger.apply(time_, what, kind, x, t0)
        peak = max(peak, ledger.used)
    resident = ledger.resident
    for n, o in seq.updates.items():   # steady state: what starts on the host ends there
        assert (o in on_host) == (n not in resident), f"update {n}->{o}: host_at_start inconsistent"
    leaked = set(resident) - seq.outputs - seq.initial
    assert not leaked, f"tensors never freed: {leaked}"
    return peak


def _steps(seq, plan_, gen):
    """The compute channel: (kind, op or event, start, end) per op and recompute stall.
    Planned waits (peak.py's rule 7, written out again here): op b is entered after the
    copies of the SWAP_OUTs with ``before == b`` end, and starts after its SWAP_INs' end."""
    rec, outs, ins = {}, {}, {}
    for e in plan_.events:
        if e.kind is RC:
            assert e.trigger == e.before - 1 and e.delay == 0, e
            rec.setdefault(e.before, []).append(e)
        elif e.kind is SO and e.before >= 0:
            assert e.trigger < e.before, e
            outs.setdefault(e.before, []).append(e)
        elif e.kind is SI:
            ins.setdefault(e.before, []).append(e)
    steps, t, step_of, end = [], 0.0, {}, {-1: 0.0}
    copied = lambda e: end[e.trigger] + e.delay + seq.tensors[e.tensor].nbytes / seq.copy_bandwidth
    for op in seq.ops:
        t = _wait(t, [copied(e) for e in outs.get(op.index, [])])
        for e in rec.get(op.index, []):
            lat = sum(seq.ops[gen[u]].latency for u in (*e.via, e.tensor))   # a chain runs each op
            steps.append(("rec", e, t, t + lat)); t += lat
        t = _wait(t, [copied(e) for e in ins.get(op.index, [])])
        step_of[op.index] = len(steps)
        steps.append(("op", op, t, t + op.latency)); t += op.latency
        end[op.index] = t
    return steps, step_of, end


def _wait(t, ends):
    """Wait for the latest copy end, unless it is late by float rounding only."""
    latest = max(ends, default=t)
    return latest if latest > t + 1e-12 else t


def _actions(seq, plan_, gen, steps, step_of, end):
    """(time, rank, frees-first, order, action) for every step and event; checks that
    copies never overlap on the channel. Ranks are written out here, independently of
    peak.py: a delay-0 RELEASE before a delay-0 SWAP_IN after the same step."""
    copy = lambda t: seq.tensors[t].nbytes / seq.copy_bandwidth
    actions = []
    for s, (kind, x, t0, t1) in enumerate(steps):
        actions.append((t0, 2 * s + 1, 1, len(actions), ("start", kind, x, t0)))
        actions.append((t1, 2 * s + 2, 0, len(actions), ("end", kind, x, t1)))
    copies = []
    for e in plan_.events:
        if e.kind is RC:
            continue
        t0 = end[e.trigger] + e.delay
        base = 2 * (step_of[e.trigger] if e.trigger >= 0 else -1) + 2
        rank = (base + (0.1 if e.kind is R else 0.5)) if e.delay == 0 else (-1e18 if e.kind is R else 1e18)
        if e.kind is SO:
            assert e.trigger >= gen.get(e.tensor, -1), f"swap-out before its TGA: {e}"
            actions.append((t0 + copy(e.tensor), -1e18, 0, len(actions), ("out_done", None, e, t0)))
            copies.append((t0, t0 + copy(e.tensor)))
        elif e.kind is SI:
            actions.append((t0, rank, 1, len(actions), ("in", None, e, t0)))
            copies.append((t0, t0 + copy(e.tensor)))
        else:
            actions.append((t0, rank, 0, len(actions), ("release", None, e, t0)))
    copies.sort()
    for (a0, a1), (b0, b1) in zip(copies, copies[1:]):
        assert b0 >= a1 - TOL, f"copies overlap on the channel: [{a0}, {a1}) and [{b0}, {b1})"
    return actions


class _Ledger:
    """Residency and bytes on the device while replaying, asserting each rule."""

    def __init__(self, seq, gen, on_host, margin):
        self.seq, self.gen, self.margin = seq, gen, margin
        reads = {}
        for op in seq.ops:
            for t in op.inputs:
                reads.setdefault(t, []).append(op.index)
        self.in_place = {n: o for n, o in seq.updates.items() if all(r <= gen[n] for r in reads.get(o, []))}
        self.resident = {t: -1.0 for t in seq.initial - on_host}   # tensor -> swap-in arrival time
        self.host = {t: 0.0 for t in on_host}                       # tensor -> host copy ready
        self.used = seq.workspace + sum(self.size(t) for t in self.resident)
        self.read = set()   # tensors read since they last arrived: the margin binds the first read only

    def size(self, t):
        return self.seq.tensors[t].nbytes

    def apply(self, time_, what, kind, x, t0):
        seq, resident, size = self.seq, self.resident, self.size
        if what == "start" and kind == "op":
            self.op_start(x, t0)
        elif what == "start":   # recompute stall
            self.stall_start(x, t0)
        elif what == "end" and kind == "rec":
            outs = [o for u in (*x.via, x.tensor) for o in seq.ops[self.gen[u]].outputs]
            self.used -= sum(size(o) for o in outs if o != x.tensor)
            for u in x.via:
                assert u not in resident, f"a chain's tensor {u} became resident meanwhile: {x}"
        elif what == "out_done":
            assert x.tensor in resident, f"swap-out of a non-resident tensor: {x}"
            del resident[x.tensor]
            self.used -= size(x.tensor)
            self.host[x.tensor] = time_
        elif what == "in":
            assert x.tensor not in resident, f"swap-in of a resident tensor: {x}"
            assert self.host.get(x.tensor, float("inf")) <= t0 + TOL, f"swap-in without a host copy: {x}"
            resident[x.tensor] = t0 + size(x.tensor) / seq.copy_bandwidth
            self.read.discard(x.tensor)
            self.used += size(x.tensor)
        elif what == "release":
            assert x.tensor in resident, f"release of a non-resident tensor: {x}"
            assert x.tensor not in seq.outputs, f"graph output released: {x}"
            del resident[x.tensor]
            self.used -= size(x.tensor)

    def op_start(self, op, t0):
        resident = self.resident
        for t in op.inputs:
            assert t in resident, f"op {op.index} reads non-resident tensor {t}"
            waited = abs(resident[t] - t0) <= TOL   # a planned late swap-in: the op waited for it
            # a later read of an arrived tensor is on time whatever the margin: an op between
            # may have stalled for another swap-in (a planned stall), moving this one later
            on_time = t in self.read or resident[t] <= t0 - self.margin + TOL
            assert waited or on_time, f"op {op.index} waits for tensor {t}'s swap-in"
        self.read.update(op.inputs)
        for n in op.outputs:
            if n in self.in_place:
                assert self.in_place[n] in resident, f"in-place target {self.in_place[n]} not resident"
                self.used -= self.size(self.in_place[n])
                del resident[self.in_place[n]]
            resident[n] = -1.0
            self.used += self.size(n)

    def stall_start(self, e, t0):
        made = set()          # a chain's tensors, made by the stall's earlier ops
        for u in (*e.via, e.tensor):
            op = self.seq.ops[self.gen[u]]
            assert not op.not_replayable and not self.seq.tensors[u].not_replayable, \
                f"unreplayable tensor recomputed: {u} in {e}"
            assert u not in self.resident, f"recompute of a resident tensor: {u} in {e}"
            for t in op.inputs:
                assert t in made or (t in self.resident and self.resident[t] <= t0 + TOL), \
                    f"recompute input {t} absent: {e}"
            self.used += sum(self.size(o) for o in op.outputs)
            made.add(u)
        self.resident[e.tensor] = -1.0


def check_plan(seq, p: Plan, budget=None, margin=0.0):
    assert all((a.trigger, a.delay) <= (b.trigger, b.delay) for a, b in zip(p.events, p.events[1:]))
    measured = replay(seq, p, margin)
    analysed = analyse_peak(seq, p.events).bytes
    if build_timeline(seq, p.events).waited > 0:
        # planned stalls (rule 7) start copies where another copy ends, the two instants
        # summed along different paths: the planner may order such a float-rounding tie
        # pessimistically (a swap-in before the swap-out it follows), never optimistically
        assert analysed == p.peak_bytes >= measured
    else:
        assert analysed == measured == p.peak_bytes
    if budget is not None:
        assert p.peak_bytes <= budget
    return measured
