"""The executor: runs a captured step iteration after iteration, performing a frozen Plan.

Like fx's ``Interpreter`` it walks the graph's nodes in order; unlike it, every node is
compiled once (:class:`~.program.Program`) into a small closure over a flat value list,
and between ops it performs the plan's events and nothing else:

* RELEASE drops the executor's references to the storage;
* SWAP_OUT and SWAP_IN go through the copy channel (:class:`~.transfers.Transfers`);
* RECOMPUTE re-runs the generating node before the op named by ``before``;
* a SWAP_OUT with ``before >= 0`` is synchronous: op ``before`` waits until its copy
  has ended (a planned stall); a swap-in planned to end late is waited for like any;
* an updated parameter or state whose old value is not read afterwards is written in
  place (the op's ``out=`` variant), as liveness and the peak analysis assume;
* a pointwise op may write into a released buffer of its output's size
  (:class:`~.pool.BufferPool`; ledger + pool never exceeds the plan's peak).

In passive mode (``evict=True``, Capuchin's first iteration: no plan, only a budget) a
:class:`~.evictor.PassiveEvictor` swaps resident tensors out on demand before an
allocation that would pass the budget; they come back as passive swap-ins when next read.

If a tensor an op needs is not resident, the executor waits for its in-flight swap-in
(a *late* swap-in) or swaps it in itself (a *passive* swap), or recomputes it; all are
counted. It never runs an op on a tensor that is not resident; the event log records,
for every op, the tensors it read and whether each was resident.

The ledger (:class:`~.iteration.IterationLedger`) mirrors ``peak.py``'s rules (see its
module docstring): an op's outputs are added before it runs (an in-place update adds new
minus old); a recompute adds all the generating op's outputs and then removes the
others; a swap-in adds when it is issued (its planned start, to an op: see
:func:`_swap_in_slot`); a swap-out removes when its copy ends; a release removes at once.
The largest total is the measured peak. With a limit (the budget, or the plan's peak),
compute waits for in-flight swap-outs rather than go over it: copies slower than planned
cost time, not memory. Across iterations, parameters and optimizer state stay where the
iteration left them (on the device, or in the host store), and at the start of an
iteration they are brought where the plan expects them (``Plan.host_at_start``).
"""

from __future__ import annotations

import bisect
import time

import torch

from ..errors import ExecutionError
from ..graph.sequence import EVENT_RANK, AccessSequence, EventKind, Plan, event_order
from .devices import CopyChannel, Device, Zeros
from .jobstate import state_value
from .evictor import PassiveEvictor
from .iteration import COUNTS, Account, EventRecord, ExecState, IterationLedger, IterationState, OpRecord
from .pool import BufferPool
from .replay import Replay
from .program import PLAIN, SKIP, Program, Reuse
from .transfers import Transfers
from ..plan.peak import build_timeline

__all__ = ["Executor", "ExecState", "ExecutionError", "Program", "check_event_log"]


_UNCHANGED = object()


class Executor:
    """Performs ``plan`` on ``program`` each :meth:`run`; one per job and graph. A
    coordinator: the ledger ``mem``, the values ``it``, ``transfers``, ``pool``,
    ``replay`` and, in passive mode only, ``evictor`` each own their fields."""

    fast = None   # a codegen.FastStep: the runner's generated iteration for a plan binding nothing

    def __init__(self, program: Program, plan: Plan, device: Device, *, log: bool = False,
                 budget_bytes: int | None = None, evict: bool = False, account: Account | None = None):
        self.prog, self.device, self.log_enabled = program, device, log
        self.budget = budget_bytes
        self.channel = CopyChannel(f"dbml-copy-{program.job}")
        self.n_ops = len(program.op_nodes)
        self.latency = [0.0] * self.n_ops
        self.totals = dict.fromkeys(COUNTS, 0)
        self.peak_bytes = 0          # largest ledger total over all iterations
        self.iteration_peak = 0      # ... during the last iteration
        self.event_log: list[tuple] = []
        # the job's part of the device's global ledger (all jobs' memory together) is told
        # of every change of the ledger and the pool; a NullAccount where there is none
        self.mem = IterationLedger(account)
        self.it = IterationState(program)
        self.pool = BufferPool(program.reuse_demand, self.mem.account)
        # swap-ins and recomputations grow the ledger outside the hot loop: shrink the pool there too
        self.mem.on_grow = lambda total: self.pool.bytes and self.pool.hold_within(total, self._pool_limit())
        self.transfers = Transfers(program, device, self.channel, self.mem, self.it)
        self.replay = Replay(program, self.it, self.mem)
        # Passive mode (Capuchin's first iteration): over the budget, swap resident
        # tensors out on demand, least recently used first (see evictor.py).
        self.evictor = PassiveEvictor(program, self.it, self.mem, self.transfers, self.pool,
                                      self.event_log if log else None) \
            if evict and budget_bytes is not None else None
        self.set_plan(plan)

    def set_plan(self, plan: Plan, seq: AccessSequence | None = None, *,
                 budget_bytes: int | None | object = _UNCHANGED) -> None:
        """Take a new plan; it applies from the next iteration (call it between runs).
        ``seq``: the sequence the plan was made from, where its op times differ from the
        program's (plan updating retimes it); ``budget_bytes``: a new limit."""
        after = event_table(plan, seq if seq is not None else self.prog.seq, self.prog)
        if budget_bytes is not _UNCHANGED:
            self.budget = budget_bytes
            if budget_bytes is None:
                self.evictor = None
        self.plan, self.after = plan, after
        # chains of recomputation (Event.via), by the recomputed tensor and the op it serves
        self.chains = {(e.tensor, e.before): e.via for e in plan.events
                       if e.kind is EventKind.RECOMPUTE and e.via}
        self.host_at_start = frozenset(plan.host_at_start)

    def close(self) -> None:
        self.channel.close()

    def __del__(self):   # the copy thread ends; nothing waits for it (no channel: __init__ failed first)
        if getattr(self, "channel", None) is not None:
            self.channel.close(wait=False)

    def release_pool(self) -> None:
        """Give back the buffers kept for reuse (another executor is about to run)."""
        self.pool.clear()

    def op_latencies(self) -> list[float]:
        """Measured wall seconds of each op in the last iteration, for plan updating
        (host clock; on CUDA the launch time unless the op synchronises)."""
        return list(self.latency)

    def copy_bandwidth(self) -> float | None:
        """Bytes/s the copy channel achieved in the last iteration (None: no copies)."""
        return self.transfers.copy_bandwidth()

    counts = property(lambda self: self.it.counts)   # what the last (or current) iteration counted
    reserved_peak = property(lambda self: self.pool.reserved_peak)   # largest ledger + pool (CUDA's reserved)

    # -- one iteration ---------------------------------------------------------------
    def run(self, state: ExecState, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.fast is not None and state.host and not self.host_at_start:
            self._zeros_in(state)   # fresh optimizer state, all resident under this plan
        if self.fast is not None and self.fast.accepts(self, state):
            return self.fast.run(self, state, x, y)
        self._begin(state, x, y)
        if self.after[0]:
            self._perform(self.after[0], -1)
        with torch.no_grad():
            self._run_ops()
            self.channel.drain()
            self._service(self.n_ops)
        loss = self.it.env[self.prog.out_pos[0]]
        self._end(state)
        return loss

    def _zeros_in(self, state: ExecState) -> None:
        """Allocate, as zeros, the state still held as :class:`~.devices.Zeros` (fresh
        optimizer state): a plan that keeps nothing on the host at its start holds it
        resident, as the interpreter's first iteration would make it."""
        for i, host in list(state.host.items()):
            if isinstance(host, Zeros):   # brought in as any host copy is (jobstate's one rule)
                state_value(state, self.device, i, self.prog.nodes[self.prog.placeholders[i]].meta["val"])

    def _run_ops(self) -> None:
        """The hot loop: the ledger's ``alloc`` inlined, everything it reads bound to
        locals (a call per op costs more than many small ops take); Reuse entries indexed
        (``r[0]``: nbytes, ``r[4]``: call; twice as fast as the attribute); the account
        always called (a NullAccount's ``add`` is a no-op, cheaper than a None check)."""
        prog, mem, pool = self.prog, self.mem, self.pool
        env, res, calls, kind, req = self.it.env, self.it.res, prog.calls, prog.kind, prog.req
        add_bytes, latency, after, log = prog.add_bytes, self.latency, self.after, self.log_enabled
        budget = self.budget if self.budget is not None else 1 << 62
        pool_limit, account_add, perf = self._pool_limit(), mem.account.add, time.perf_counter
        op_pos, outs, reuse, free, done, deferred, store, mutated = prog.op_pos, prog.outputs, \
            prog.reuse, pool.free, self.transfers.done, self.it.deferred, self.it.store, prog.mutated
        waiting = self.transfers.waiting
        k = -1
        try:
            for k in range(self.n_ops):
                if done or deferred or waiting:
                    self._service(k)
                for s in req[k]:
                    if not res[s]:
                        self._fetch(s, k)
                if log:
                    self.event_log.append(OpRecord("op", k, req[k], tuple(res[s] for s in req[k])))
                kk = kind[k]
                if kk != SKIP:  # a getitem of a multi-output op: its value is in place already
                    need = add_bytes[k]
                    if need:
                        if mem.on_compute + mem.on_copy + need > budget:
                            self._make_room(need, k)
                        mem.on_compute += need      # mem.alloc(need), inlined
                        account_add(need)
                        total = mem.on_compute + mem.on_copy
                        if total > mem.peak:
                            mem.peak = total
                        if pool.bytes:
                            pool.hold_within(total, pool_limit)
                    t0 = perf()
                    r = reuse[k]
                    if r is not None and free.get(r[0]):
                        value = r[4](env, self._from_pool(r))
                    else:
                        value = calls[k](env)
                    latency[k] = perf() - t0
                    if kk == PLAIN:
                        env[op_pos[k]] = value
                        for s in outs[k]:
                            res[s] = True
                    else:
                        store(k, kk, value)
                        if k in mutated:   # BatchNorm's running statistics: host copies are stale now
                            self.transfers.written(mutated[k])
                    value = None   # else the local holds it into op k + 1, though after[k + 1] freed it
                if after[k + 1]:
                    self._perform(after[k + 1], k)
        except (ExecutionError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with the graph context
            node = prog.op_nodes[k].format_node() if k >= 0 else "(iteration start)"
            raise ExecutionError(f"job {prog.job!r}: op {k} failed: {node}: "
                                 f"{type(e).__name__}: {e}") from e

    def _from_pool(self, r: Reuse) -> torch.Tensor:
        self.it.counts["reused_buffers"] += 1
        return self.pool.take(r)

    def _pool_limit(self) -> int:
        return self.budget if self.budget is not None else self.plan.peak_bytes

    def _make_room(self, nbytes: int, k: int, keep: tuple = ()) -> None:
        """Adding ``nbytes`` before op ``k`` would pass the limit: wait for swap-outs, then evict."""
        mem, inflight_out = self.mem, self.transfers.inflight_out
        if inflight_out:
            mem.wait_for_room(nbytes, self.budget, inflight_out)
            self.it.counts["budget_waits"] += 1
        if self.it.deferred and mem.total + nbytes > self.budget:
            self._release_deferred(k)
        if self.evictor is not None and mem.total + nbytes > self.budget:
            self.evictor.make_room(nbytes, k, self.budget, keep)

    def _release_deferred(self, k: int) -> None:
        """Compute ran ahead of the plan, and a release it planned with a delay has not come
        due while op ``k`` needs the room: release now every such tensor that no op from ``k``
        on reads this iteration (the plan frees it before its next use anyway; waiting for
        the clock would hold bytes the plan counted as free)."""
        last = self.prog.live.last_access
        early = [d for d in self.it.deferred if last(d[1]) < k]
        for d in early:
            self.it.deferred.remove(d)
            self._release(d[1], k - 1)

    # -- iteration boundaries ----------------------------------------------------------
    def _begin(self, state: ExecState, x, y) -> None:
        self.it.reset()
        self.transfers.reset()
        self.mem.hold(self.transfers.load_state(state, x, y) + self.prog.seq.workspace)
        self.transfers.place_initial(self.host_at_start, self._room)
        self._room(0, 0)   # passive mode: start the iteration within the budget
        self.mem.peak = self.mem.on_compute

    def _end(self, state: ExecState) -> None:
        held = self.transfers.store_state(state)
        self.iteration_peak = self.mem.peak
        self.peak_bytes = max(self.peak_bytes, self.iteration_peak)
        for key, v in self.it.counts.items():
            self.totals[key] += v
        self.totals["iterations"] += 1
        self.it.env = []
        self.transfers.forget_all()
        self.mem.hold(held)   # between iterations the job holds its resident state (and the pool) only

    def settle(self, state: ExecState) -> int:
        """Between iterations, after :meth:`set_plan`: move the state the new plan keeps
        on the host at its start there now, and give back pooled buffers past its limit.
        A job whose plan shrank calls this before it tells the scheduler it runs the new
        plan (which lets another job take the room). Returns the bytes it now holds."""
        moved, held = self.transfers.settle_state(state, self.host_at_start)
        self.totals["setup_swaps"] += moved
        self.mem.hold(held)
        self.pool.hold_within(held, self._pool_limit())
        return held

    def _perform(self, events, k: int) -> None:
        now = time.perf_counter()
        for kind, sid, delay, before in events:
            if kind is EventKind.RELEASE:
                if delay > 0:
                    self.it.deferred.append((now + delay, sid))
                else:
                    self._release(sid, k)
            elif kind is EventKind.SWAP_OUT:
                self.transfers.swap_out(sid, now + delay)
            elif kind is EventKind.SWAP_IN:
                if self.budget is not None and self.it.deferred and \
                        self.mem.total + self.prog.nbytes[sid] > self.budget:
                    self._release_deferred(k + 1)
                self.transfers.swap_in(sid, now + delay, self.budget, self._next_need(k + 1))
            elif kind is WAIT:
                self.transfers.wait_out(sid)
            else:
                self._recompute(sid, before)
            if self.log_enabled:
                self.event_log.append(EventRecord(WAIT if kind is WAIT else kind.value, k, sid))
        if self.transfers.waiting:
            self.transfers.issue_waiting(self.budget, self._next_need(k + 1))

    def _next_need(self, k: int) -> int:
        """The bytes op ``k`` adds when it starts (0 past the last op): room a swap-in
        issued just before it must leave."""
        return self.prog.add_bytes[k] if 0 <= k < self.n_ops else 0

    def _service(self, k: int) -> None:
        """Install finished swap-ins; perform deferred releases that are due."""
        self.transfers.install_done(k)
        if self.it.deferred:
            for sid in self.it.due():
                self._release(sid, k - 1)
        if self.transfers.waiting:
            self.transfers.issue_waiting(self.budget, self._next_need(k))

    def _release(self, sid: int, k: int) -> None:
        it, prog, transfers = self.it, self.prog, self.transfers
        if it.res[sid]:
            nbytes = prog.nbytes[sid]
            if sid in transfers.stale and prog.live.last_access(sid) > k:
                # "release, swap in again later" needs a host copy; the op that made the
                # last one stale wrote into the tensor (BatchNorm's running statistics)
                transfers.copy_out_now(sid)
                it.counts["refresh_swaps"] += 1
            # whether the pool wants a buffer of this size (inline: nearly every op releases one)
            value = it.value_of(sid) if len(self.pool.free.get(nbytes, ())) < \
                self.pool.demand.get(nbytes, 0) else None
            it.drop(sid)
            self.mem.free(nbytes)
            it.counts["releases"] += 1
            if value is not None:
                self.pool.recycle(value, nbytes, self.mem.total, self._pool_limit())
        # the host copy (if any) stays valid: the plan may swap the tensor in again

    def _fetch(self, sid: int, k: int) -> None:
        """Op ``k`` needs ``sid`` and it is not resident: wait, swap in, or recompute."""
        if not self.transfers.fetch(sid, k, self._service, self._room):
            self._recompute(sid, k, passive=True)

    def _recompute(self, sid: int, before: int, passive: bool = False) -> None:
        via = () if passive else self.chains.get((sid, before), ())
        self.replay.recompute(sid, before, self._fetch, self._room, passive, via)

    def _room(self, nbytes: int, k: int, keep: tuple = ()) -> None:
        """Before a swap-in or a recompute on the compute thread takes ``nbytes``, planned or
        passive (a tensor needed before its planned return): as before an op's outputs, a
        copy slower than planned makes compute wait for the swap-outs in flight rather than
        pass the limit, and then a passive evictor (where the mode has one) evicts. (A
        recompute stall that did not wait held 0.2 % over its plan's peak; a passive swap-in
        that did not, in TENSILE's mode, was a rare ``BudgetExceeded`` under load.)"""
        if self.budget is not None and self.mem.total + nbytes > self.budget:
            self._make_room(nbytes, k, keep)


def event_table(plan: Plan, timing: AccessSequence, prog: Program) -> list[tuple]:
    """The plan's events by the op they follow: ``table[k + 1]`` holds what to perform
    after op ``k`` (``table[0]``: at the iteration's start), each entry
    ``(kind, tensor, delay, before)``, in the one order of simultaneous events.
    ``timing``: the sequence the plan was made from (its op times)."""
    n_ops, job = len(prog.op_nodes), prog.job
    if len(timing.ops) != n_ops or len(timing.tensors) != len(prog.nbytes):
        raise ExecutionError(f"job {job!r}: the plan's sequence has {len(timing.ops)} ops, "
                             f"the program {n_ops}")
    after: list[list] = [[] for _ in range(n_ops + 1)]
    starts, ends = _planned_times(plan, timing)
    for e in sorted(plan.events, key=event_order):
        if not -1 <= e.trigger < n_ops:
            raise ExecutionError(f"job {job!r}: event {e} has no trigger op")
        slot, delay = e.trigger + 1, e.delay
        if e.kind is EventKind.SWAP_IN and delay > 0:
            slot, delay = _swap_in_slot(e, starts, ends)
        after[slot].append((e.kind, e.tensor, delay, e.before))
        if e.kind is EventKind.SWAP_OUT and e.before >= 0:   # synchronous: op `before` waits for it
            after[e.before].append((WAIT, e.tensor, 0.0, e.before))
    return [tuple(sorted(a, key=_slot_rank)) for a in after]


# A planned wait for a synchronous swap-out (peak.py's rule 7): performed where op
# ``before`` is entered, after that slot's swap-ins are issued and before its recomputes.
WAIT = "wait"
_RANK = {**EVENT_RANK, WAIT: EVENT_RANK[EventKind.SWAP_IN] + 0.5}
# A swap-in with a delay starts after its slot's recompute stall (the stall starts where
# its trigger op ends; the delay ends later), and counts its bytes when it is issued: so
# it is issued after the stall (its due time is still the slot's start plus the delay).
# Issued before, it held its bytes beside the stall's, which the plan never does (a
# ResNet-18 on the disk tier ran 0.9 MB over its plan's peak).
_DELAYED_IN = EVENT_RANK[EventKind.RECOMPUTE] + 0.5


def _slot_rank(ev: tuple) -> float:
    kind, _, delay, _ = ev
    return _DELAYED_IN if kind is EventKind.SWAP_IN and delay > 0 else _RANK[kind]


def _planned_times(plan: Plan, timing: AccessSequence) -> tuple[list[float], list[float]]:
    """Op start and end times as planned: the sequence's, moved by the plan's recompute
    stalls and waits (a plan that has neither keeps the sequence's times)."""
    if not plan.extra_time:
        return [op.start for op in timing.ops], [op.end for op in timing.ops]
    tl = build_timeline(timing, plan.events)
    return tl.op_start.tolist(), tl.op_end.tolist()


def _swap_in_slot(e, starts, ends) -> tuple[int, float]:
    """A swap-in planned to start inside op ``j`` is issued when op ``j`` starts, with the
    rest of its delay: its memory is then taken no earlier, relative to the ops, than
    planned, however much slower than estimated the ops run (a wall-clock delay from the
    trigger would take it early and could break the budget)."""
    t = (ends[e.trigger] if e.trigger >= 0 else 0.0) + e.delay
    j = bisect.bisect_right(starts, t) - 1        # the op running at time t
    j = min(max(j, e.trigger + 1), e.before)      # not before the trigger, not after the use
    return j, max(0.0, t - starts[j]) if j < len(starts) and j > e.trigger + 1 else e.delay


def check_event_log(log) -> list[str]:
    """Invariant checker: every op's reads were of resident tensors. Returns violations."""
    bad = []
    for entry in log:
        if entry[0] == "op":
            rec = OpRecord(*entry)
            for t, r in zip(rec.reads, rec.resident):
                if not r:
                    bad.append(f"op {rec.op} read tensor {t} while it was not resident")
    return bad
