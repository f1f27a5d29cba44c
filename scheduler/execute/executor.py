"""The executor: runs a captured step iteration after iteration, performing a frozen Plan.

Like fx's ``Interpreter`` it walks the graph's nodes in order; unlike it, every node is
compiled once into a small closure over a flat value list (no per-op dict lookups or
argument mapping), and between ops it performs the plan's events and nothing else:

* RELEASE drops the executor's references to the storage;
* SWAP_OUT hands the storage's bytes to the device's copy channel, which copies them to
  the host store and then frees them; SWAP_IN allocates device bytes on the channel and
  copies them back, and the values of the nodes that view that storage are rebuilt;
* RECOMPUTE re-runs the generating node before the op named by ``before``;
* an updated parameter or state whose old value is not read afterwards is written in
  place (the op's ``out=`` variant), as liveness and the peak analysis assume;
* a pointwise op may write into a released buffer of its output's size (a small reuse
  pool, like a caching allocator's; ledger + pool never exceeds the plan's peak), which
  saves CPU allocations and page faults and gives the same bits.

In passive mode (``evict=True``, Capuchin's first iteration: no plan, only a budget),
an allocation that would pass the budget first swaps resident tensors out on demand,
least recently used first, waiting for each copy (``_evict``); they come back as
passive swap-ins when next read. Both are counted.

If a tensor an op needs is not resident, the executor waits for its in-flight swap-in
(a *late* swap-in) or swaps it in itself (a *passive* swap), or recomputes it; both are
counted. It never runs an op on a tensor that is not resident; the event log records,
for every op, the tensors it read and whether each was resident.

The ledger mirrors ``peak.py``'s rules (see its module docstring): an op's outputs are
added before it runs (an in-place update adds new minus old); a recompute adds all the
generating op's outputs and then removes the others; a swap-in adds when it is issued
(its planned start, to an op: see ``_swap_in_slot``); a swap-out removes when its copy
ends; a release removes at once. The largest total is the measured peak. With a limit
(the budget, or the plan's peak), compute waits for in-flight swap-outs rather than go
over it: copies slower than planned cost time, not memory. Across iterations, parameters and optimizer state stay where
the iteration left them (on the device, or in the host store), and at the start of an
iteration they are brought where the plan expects them (``Plan.host_at_start``).
"""

from __future__ import annotations

import bisect
import operator
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from ..graph.access import op_nodes, output_nodes, replayable
from ..graph.capture import CapturedStep
from .devices import CopyChannel, Device, as_view, storage_bytes
from ..plan.liveness import analyse_liveness
from ..multijob.ledger import JobAccount
from ..graph.sequence import EVENT_RANK, AccessSequence, EventKind, Plan, event_order
from ..errors import ExecutionError

__all__ = ["Executor", "ExecState", "ExecutionError", "Program", "check_event_log"]


@dataclass
class ExecState:
    """Parameters, buffers and optimizer state between iterations, by placeholder
    position: a device tensor in ``values``, or ``None`` there and host bytes in ``host``."""

    values: list
    host: dict[int, torch.Tensor] = field(default_factory=dict)


# -- the static program -------------------------------------------------------------

def _compile(node: fx.Node, pos: dict, ns: dict, target=None, out_pos: int | None = None,
             copy_into: int | None = None, out_arg: bool = False):
    """A closure ``env -> value`` computing ``node`` from the flat value list ``env``
    (``(env, out) -> value`` with ``out_arg``: an ``out=`` variant writing into ``out``)."""
    def render(a) -> str:
        if isinstance(a, fx.Node):
            return f"e[{pos[a]}]"
        if isinstance(a, list):
            return "[" + ", ".join(render(x) for x in a) + "]"
        if isinstance(a, tuple):
            return "(" + "".join(render(x) + ", " for x in a) + ")"
        if a is None or isinstance(a, bool) or (isinstance(a, int) and not isinstance(a, bool)):
            return repr(a)
        name = f"c{len(ns)}"
        ns[name] = a
        return name

    fn = f"c{len(ns)}"
    target = target if target is not None else node.target
    # an OpOverload's __call__ only forwards to ``_op``: call that, one Python frame less
    ns[fn] = target._op if isinstance(target, torch._ops.OpOverload) else target
    parts = [render(a) for a in node.args] + [f"{k}={render(v)}" for k, v in node.kwargs.items()]
    if out_pos is not None:
        parts.append(f"out=e[{out_pos}]")
    if out_arg:
        parts.append("out=o")
    call = f"{fn}({', '.join(parts)})"
    if copy_into is not None:
        call = f"e[{copy_into}].copy_({call})"
    return eval(f"lambda e{', o' if out_arg else ''}: {call}", ns)  # noqa: S307 - built from the graph


def _out_variant(op: torch._ops.OpOverload):
    """The ``out=`` overload taking the same arguments as ``op``, or None."""
    want = [(a.name, str(a.type)) for a in op._schema.arguments]
    packet = op.overloadpacket
    for name in packet.overloads():
        cand = getattr(packet, name)
        args = cand._schema.arguments
        outs = [a for a in args if a.is_out]
        if len(outs) == 1 and outs[0].name == "out" and \
                [(a.name, str(a.type)) for a in args if not a.is_out] == want:
            return cand
    return None


def _same_layout(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
        and a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == 0 == b.storage_offset()


PLAIN, MULTI, SKIP, SPECIAL = 0, 1, 2, 3   # SPECIAL: plain, but written in place or mutating
MIN_REUSE_BYTES = 64 * 1024   # below this, allocation is cheap: not worth a pool lookup
MAX_POOLED_PER_SIZE = 4
_HIDDEN_WRITES = {"native_batch_norm": (3, 4), "cudnn_batch_norm": (3, 4), "miopen_batch_norm": (3, 4)}


def _written_storages(node: fx.Node) -> tuple[int, ...]:
    """Storages an op writes into (its schema's ``(a!)`` arguments, or BatchNorm's
    running statistics, which the kernel updates without saying so)."""
    target = node.target
    schema_args = target._schema.arguments
    idx = _HIDDEN_WRITES.get(target.overloadpacket.__name__,
                             tuple(i for i, a in enumerate(schema_args)
                                   if a.alias_info is not None and a.alias_info.is_write))
    out = []
    for i in idx:
        arg = node.args[i] if i < len(node.args) else node.kwargs.get(schema_args[i].name)
        if isinstance(arg, fx.Node) and isinstance(arg.meta.get("dbml_storage"), int):
            out.append(arg.meta["dbml_storage"])
    return tuple(out)


class Program:
    """Everything about a captured graph the executor needs, computed once."""

    def __init__(self, captured: CapturedStep, seq: AccessSequence):
        self.captured, self.seq = captured, seq
        self.job = seq.job
        nodes = list(captured.graph.nodes)
        pos = {n: i for i, n in enumerate(nodes)}
        self.nodes, self.pos = nodes, pos
        self.op_nodes = op_nodes(captured)
        n_ops = len(self.op_nodes)
        if n_ops != len(seq.ops):
            raise ExecutionError(f"job {self.job!r}: sequence has {len(seq.ops)} ops, graph {n_ops}")
        self.op_pos = [pos[n] for n in self.op_nodes]
        op_index = {n: k for k, n in enumerate(self.op_nodes)}
        self.nbytes = [t.nbytes for t in seq.tensors]
        self.live = analyse_liveness(seq)
        self.placeholders = [pos[n] for n in captured.placeholders()]
        self.ph_sid = [n.meta["dbml_storage"] for n in captured.placeholders()]
        outs = output_nodes(captured)
        self.out_pos = [pos[n] if isinstance(n, fx.Node) else None for n in outs]
        self.updates = captured.updates  # output position -> placeholder position
        self._last_use(nodes, op_index, n_ops)
        self._aliases(nodes, op_index)
        self.gen = list(self.live.gen)
        self.inputs = [seq.ops[k].inputs for k in range(n_ops)]
        self.outputs = [seq.ops[k].outputs for k in range(n_ops)]
        self.accesses: list[list[int]] = [[] for _ in self.nbytes]   # per tensor: ops touching it
        for op in seq.ops:
            for s in dict.fromkeys(op.inputs + op.outputs):
                self.accesses[s].append(op.index)
        self.loss_sid = self.nodes[self.out_pos[0]].meta["dbml_storage"]
        self._compile_all(pos)

    def last_access_before(self, sid: int, k: int) -> int:
        """The last op before ``k`` that read or generated ``sid`` (-1: none this iteration)."""
        acc = self.accesses[sid]
        i = bisect.bisect_left(acc, k)
        return acc[i - 1] if i else -1

    def _last_use(self, nodes, op_index, n_ops) -> None:
        last = [-1] * len(nodes)
        for i, node in enumerate(nodes):
            for user in node.users:
                k = n_ops if user.op == "output" else op_index[user]
                last[i] = max(last[i], k)
        self.last_use = last

    def _aliases(self, nodes, op_index) -> None:
        """Per storage: the nodes whose value views it, with the layout to rebuild it."""
        self.alias: list[list[tuple]] = [[] for _ in self.nbytes]
        for i, node in enumerate(nodes):
            sid = node.meta.get("dbml_storage")
            val = node.meta.get("val")
            if isinstance(sid, int) and isinstance(val, torch.Tensor):
                self.alias[sid].append((i, val.dtype, tuple(val.shape), tuple(val.stride()),
                                        val.storage_offset(), op_index.get(node, -1)))

    def _compile_all(self, pos) -> None:
        ns: dict[str, Any] = {}
        self.kind, self.calls, self.distribute = [], [], []
        self.in_place: dict[int, tuple[int, int]] = {}   # op -> (new sid, old sid)
        for k, node in enumerate(self.op_nodes):
            val = node.meta.get("val")
            if node.target is operator.getitem and isinstance(node.args[0].meta.get("val"), (list, tuple)):
                self.kind.append(SKIP)
                self.calls.append(None)
                self.distribute.append(())
                continue
            multi = isinstance(val, (list, tuple))
            self.kind.append(MULTI if multi else PLAIN)
            self.distribute.append(tuple((u.args[1], pos[u]) for u in node.users
                                         if u.target is operator.getitem) if multi else ())
            self.calls.append(_compile(node, pos, ns))
        self.replay_calls = list(self.calls)
        self.mutated = {k: _written_storages(node) for k, node in enumerate(self.op_nodes)
                        if node.meta.get("dbml_mutates")}
        self._compile_in_place(pos, ns)
        self._compile_reuse(pos, ns)
        self._compile_overwrite(pos, ns)
        for k in set(self.mutated) | set(self.in_place):
            if self.kind[k] == PLAIN:
                self.kind[k] = SPECIAL
        self.req = [tuple(self.inputs[k]) + tuple(o for _, o in [self.in_place[k]] if o not in self.inputs[k])
                    if k in self.in_place else tuple(self.inputs[k]) for k in range(len(self.op_nodes))]
        self.add_bytes = [sum(self.nbytes[s] for s in self.outputs[k])
                          - (self.nbytes[self.in_place[k][1]] if k in self.in_place else 0)
                          for k in range(len(self.op_nodes))]

    def _compile_reuse(self, pos, ns) -> None:
        """Pointwise ops may write into a released buffer of the same size (the executor's
        reuse pool, an allocator cache): per op, ``(nbytes, dtype, size, stride)`` and an
        ``out=`` closure, or None. Pointwise kernels give the same bits into any buffer."""
        self.reuse: list = [None] * len(self.op_nodes)
        for k, node in enumerate(self.op_nodes):
            val, target = node.meta.get("val"), node.target
            if self.kind[k] != PLAIN or not isinstance(target, torch._ops.OpOverload) \
                    or torch.Tag.pointwise not in target.tags or not isinstance(val, torch.Tensor) \
                    or val.storage_offset() != 0 or len(self.outputs[k]) != 1:
                continue
            out_op = _out_variant(target)
            nbytes = self.nbytes[self.outputs[k][0]]
            if out_op is None or nbytes != val.numel() * val.element_size() or nbytes < MIN_REUSE_BYTES:
                continue
            self.reuse[k] = (nbytes, val.dtype, tuple(val.shape), tuple(val.stride()),
                             _compile(node, pos, ns, target=out_op, out_arg=True))
        # how many buffers of each size are worth keeping: as many as ops that take one
        self.reuse_demand: dict[int, int] = {}
        for r in self.reuse:
            if r is not None:
                self.reuse_demand[r[0]] = min(self.reuse_demand.get(r[0], 0) + 1, MAX_POOLED_PER_SIZE)

    def _compile_overwrite(self, pos, ns) -> None:
        """A pointwise op whose input activation dies at this op and has the output's
        layout writes its result over that input, as eager's ``add_``/``mul_`` would
        (same kernel, same bits, no new memory and a third less memory traffic). The
        ledger still counts the output from the op's start and the input until its
        release right after, as the planner does: for the op's duration it counts one
        tensor more than the memory in use, never less."""
        seq, live = self.seq, self.live
        self.overwrites = 0
        for k, node in enumerate(self.op_nodes):
            val, target = node.meta.get("val"), node.target
            if self.kind[k] != PLAIN or not isinstance(target, torch._ops.OpOverload) \
                    or torch.Tag.pointwise not in target.tags or len(self.outputs[k]) != 1:
                continue
            for arg in node.args:
                sid = arg.meta.get("dbml_storage") if isinstance(arg, fx.Node) else None
                if not isinstance(sid, int) or sid in seq.initial or sid in seq.outputs \
                        or live.last_access(sid) != k or live.gen[sid] < 0 \
                        or not _same_layout(arg.meta.get("val"), val) \
                        or self.nbytes[sid] != self.nbytes[self.outputs[k][0]]:
                    continue
                out_op = _out_variant(target)
                if out_op is not None:
                    self.calls[k] = _compile(node, pos, ns, target=out_op, out_pos=pos[arg])
                    self.reuse[k] = None
                    self.overwrites += 1
                break

    def _compile_in_place(self, pos, ns) -> None:
        """Updates liveness writes in place: call the op's ``out=`` variant on the old
        storage (a pointwise op may also read it), else compute and copy into it."""
        ph_of_sid = dict(zip(self.ph_sid, self.placeholders))
        for new, old in self.live.in_place.items():
            k = self.gen[new]
            node = self.op_nodes[k]
            old_pos = ph_of_sid[old]
            if self.kind[k] != PLAIN or not _same_layout(node.meta.get("val"), self.nodes[old_pos].meta.get("val")):
                raise ExecutionError(f"job {self.job!r}: cannot update {self.nodes[old_pos].name} in place "
                                     f"from {node.format_node()}")
            target = node.target
            out_op = _out_variant(target) if isinstance(target, torch._ops.OpOverload) else None
            reads_old = old in self.inputs[k]
            if out_op is not None and (not reads_old or torch.Tag.pointwise in target.tags):
                self.calls[k] = _compile(node, pos, ns, target=out_op, out_pos=old_pos)
            else:
                self.calls[k] = _compile(node, pos, ns, copy_into=old_pos)
            self.in_place[k] = (new, old)
            self.last_use[old_pos] = max(self.last_use[old_pos], k)


# -- the executor -------------------------------------------------------------------

_UNCHANGED = object()

class Executor:
    """Performs ``plan`` on ``program`` each :meth:`run`; one per job and graph."""

    def __init__(self, program: Program, plan: Plan, device: Device, *, log: bool = False,
                 budget_bytes: int | None = None, evict: bool = False, account: JobAccount | None = None):
        self.prog, self.device, self.log_enabled = program, device, log
        # the job's part of the device's global ledger (all jobs' memory together), told
        # of every change of this executor's ledger and pool; None: no global ledger
        self.account = account
        self.budget = budget_bytes
        # Passive mode (Capuchin's first iteration): over the budget, swap resident
        # tensors out on demand, least recently used first (see ``_evict``).
        self.evict = evict and budget_bytes is not None
        self.channel = CopyChannel(f"dbml-copy-{program.job}")
        self._cv = threading.Condition()
        self.n_ops = len(program.op_nodes)
        self.latency = [0.0] * self.n_ops
        self.copied = [0, 0.0]   # bytes and seconds the copy channel copied in the last iteration
        self.totals = dict(swap_outs=0, swap_ins=0, releases=0, recomputes=0, passive_swaps=0,
                           late_swap_ins=0, passive_recomputes=0, setup_swaps=0, budget_waits=0,
                           passive_swap_outs=0,
                           reused_buffers=0, refresh_swaps=0, iterations=0)
        self.peak_bytes = 0          # largest ledger total over all iterations
        self.iteration_peak = 0      # ... during the last iteration
        # The ledger is two counters, each written by one thread only (no lost updates
        # without a lock on the hot path): compute's (every increase, and the frees it
        # makes) and the copy channel's (swap-outs completing).
        self._m = self._c = 0
        self._peak_main = 0
        self._pool: dict[int, list[torch.Tensor]] = {}   # released buffers by size
        self.pool_bytes = 0
        self.reserved_peak = 0     # largest ledger + pool
        self.event_log: list[tuple] = []
        self.set_plan(plan)

    # -- plan ------------------------------------------------------------------------
    def set_plan(self, plan: Plan, seq: AccessSequence | None = None, *,
                 budget_bytes: int | None | object = _UNCHANGED) -> None:
        """Take a new plan; it applies from the next iteration (call it between runs).
        ``seq``: the sequence the plan was made from, where its op times differ from the
        program's (plan updating retimes it); ``budget_bytes``: a new limit."""
        timing = seq if seq is not None else self.prog.seq
        if len(timing.ops) != self.n_ops or len(timing.tensors) != len(self.prog.nbytes):
            raise ExecutionError(f"job {self.prog.job!r}: the plan's sequence has {len(timing.ops)} ops, "
                                 f"the program {self.n_ops}")
        if budget_bytes is not _UNCHANGED:
            self.budget = budget_bytes
            self.evict = self.evict and budget_bytes is not None
        self.plan = plan
        after: list[list] = [[] for _ in range(self.n_ops + 1)]  # after[k + 1]: after op k
        starts = [op.start for op in timing.ops]
        ends = [op.end for op in timing.ops]
        for e in sorted(plan.events, key=event_order):
            if not -1 <= e.trigger < self.n_ops:
                raise ExecutionError(f"job {self.prog.job!r}: event {e} has no trigger op")
            slot, delay = e.trigger + 1, e.delay
            if e.kind is EventKind.SWAP_IN and delay > 0:
                slot, delay = _swap_in_slot(e, starts, ends)
            after[slot].append((e.kind, e.tensor, delay, e.before))
        self.after = [tuple(sorted(a, key=lambda ev: EVENT_RANK[ev[0]])) for a in after]
        self.host_at_start = frozenset(plan.host_at_start)

    def close(self) -> None:
        self.channel.close()

    def __del__(self):
        channel = getattr(self, "channel", None)
        if channel is not None:
            channel.close(wait=False)   # its thread ends; nothing waits for it here

    def release_pool(self) -> None:
        """Give back the buffers kept for reuse (another executor is about to run)."""
        self._pool.clear()
        if self.account is not None and self.pool_bytes:
            self.account.add_pool(-self.pool_bytes)
        self.pool_bytes = 0

    def op_latencies(self) -> list[float]:
        """Measured wall seconds of each op in the last iteration (host clock; on CUDA
        the launch time unless the op synchronises), for plan updating."""
        return list(self.latency)

    def copy_bandwidth(self) -> float | None:
        """Bytes per second the copy channel achieved in the last iteration (planned
        swaps, each direction; None if it copied nothing), for plan updating."""
        nbytes, seconds = self.copied
        return nbytes / seconds if nbytes and seconds > 0 else None

    # -- one iteration ---------------------------------------------------------------
    def run(self, state: ExecState, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        prog = self.prog
        self._begin(state, x, y)
        env, res, calls, kind, req = self.env, self.res, prog.calls, prog.kind, prog.req
        add_bytes, latency, after, log = prog.add_bytes, self.latency, self.after, self.log_enabled
        budget = self.budget if self.budget is not None else 1 << 62
        pool_limit = self._pool_limit()
        account = self.account
        perf = time.perf_counter
        if after[0]:
            self._perform(after[0], -1)
        op_pos, outs, reuse, pool = prog.op_pos, prog.outputs, prog.reuse, self._pool
        k = -1
        with torch.no_grad():
            try:
                for k in range(self.n_ops):
                    if self._done or self._deferred:
                        self._service(k)
                    for s in req[k]:
                        if not res[s]:
                            self._fetch(s, k)
                    if log:
                        self.event_log.append(("op", k, req[k], tuple(res[s] for s in req[k])))
                    kk = kind[k]
                    if kk != SKIP:  # a getitem of a multi-output op: its value is in place already
                        need = add_bytes[k]
                        if need:
                            if self._m + self._c + need > budget:
                                self._make_room(need, k)
                            self._m += need
                            if account is not None:
                                account.add(need)
                            total = self._m + self._c
                            if total > self._peak_main:
                                self._peak_main = total
                            if self.pool_bytes:
                                self._hold_pool_within(total, pool_limit)
                        t0 = perf()
                        r = reuse[k]
                        if r is not None and pool.get(r[0]):
                            value = r[4](env, self._from_pool(r))
                        else:
                            value = calls[k](env)
                        latency[k] = perf() - t0
                        if kk == PLAIN:
                            env[op_pos[k]] = value
                            for s in outs[k]:
                                res[s] = True
                        else:
                            self._store(k, kk, value)
                    if after[k + 1]:
                        self._perform(after[k + 1], k)
            except (ExecutionError, KeyboardInterrupt):
                raise
            except Exception as e:  # noqa: BLE001 - re-raised with the graph context
                node = prog.op_nodes[k].format_node() if k >= 0 else "(iteration start)"
                raise ExecutionError(f"job {prog.job!r}: op {k} failed: {node}: "
                                     f"{type(e).__name__}: {e}") from e
            self.channel.drain()
            self._service(self.n_ops)
        loss = env[prog.out_pos[0]]
        self._end(state)
        return loss

    def _store(self, k: int, kk: int, value) -> None:
        prog, env, res = self.prog, self.env, self.res
        if kk != MULTI:
            env[prog.op_pos[k]] = value
        else:
            for idx, p in prog.distribute[k]:
                env[p] = value[idx]
        for s in prog.outputs[k]:
            res[s] = True
        if k in prog.mutated:   # BatchNorm's running statistics: host copies are stale now
            for s in prog.mutated[k]:
                if s in self.host_store:
                    self._forget_host(s)
                    self._stale.add(s)
        if k in prog.in_place:
            _, old = prog.in_place[k]
            res[old] = False
            for a in prog.alias[old]:
                env[a[0]] = None

    # -- ledger ----------------------------------------------------------------------
    @property
    def ledger(self) -> int:
        return self._m + self._c

    def _alloc(self, nbytes: int) -> None:
        self._m += nbytes
        if self.account is not None:
            self.account.add(nbytes)
        total = self._m + self._c
        if total > self._peak_main:
            self._peak_main = total

    def _free(self, nbytes: int) -> None:
        self._m -= nbytes
        if self.account is not None:
            self.account.add(-nbytes)

    def _make_room(self, nbytes: int, k: int, keep: tuple = ()) -> None:
        """Adding ``nbytes`` before op ``k`` would pass the limit: wait for swap-outs in
        flight, then, in passive mode, swap tensors out on demand."""
        if self.inflight_out:
            self._wait_for_room(nbytes)
        if self.evict and self._m + self._c + nbytes > self.budget:
            self._evict(nbytes, k, keep)

    def _evict(self, nbytes: int, k: int, keep: tuple = ()) -> None:
        """Passive swap-outs (Capuchin's passive mode): until ``nbytes`` more fit the
        budget, copy the least recently used resident tensor to the host, wait for the
        copy, and free it; the op that next needs it swaps it back in (``_fetch``).

        Least recently used, as Capuchin evicts, rather than largest: without a plan the
        executor knows the past, not the future, and the tensor touched longest ago
        (usually an early activation waiting for the backward pass, or a parameter used
        once in the forward pass) is the one least likely to be read next. Never evicted:
        what op ``k`` reads or updates (and ``keep``), the loss, and tensors in flight."""
        prog = self.prog
        protected = set(prog.req[k] if k < self.n_ops else ()) | set(keep) | {prog.loss_sid}
        order = sorted((prog.last_access_before(s, k), -prog.nbytes[s], s)
                       for s in range(len(prog.nbytes))
                       if self.res[s] and s not in protected and s not in self.inflight_in
                       and prog.nbytes[s] > 0 and self._value_of(s) is not None)
        for _, _, sid in order:
            if self._m + self._c + nbytes <= self.budget:
                return
            if sid not in self.host_store:   # else its host copy is still valid: just drop it
                self._keep_host(sid, self.device.copy_out(self._bytes_of(sid), self.device.compute_marker()))
            self._drop(sid)
            self._free(prog.nbytes[sid])
            self.counts["passive_swap_outs"] += 1
            if self.log_enabled:
                self.event_log.append(("passive_swap_out", k, sid))
        if self.pool_bytes:
            self._hold_pool_within(self._m + self._c + nbytes, self.budget)

    def _wait_for_room(self, nbytes: int) -> None:
        """The budget is a hard limit: a copy slower than planned makes compute wait
        for the swap-outs in flight rather than exceed it."""
        with self._cv:
            while self._m + self._c + nbytes > self.budget and self.inflight_out:
                self._cv.wait()
        self.counts["budget_waits"] += 1

    # -- iteration boundaries ----------------------------------------------------------
    def _begin(self, state: ExecState, x, y) -> None:
        prog = self.prog
        self.env = [None] * len(prog.nodes)
        self.res = [False] * len(prog.nbytes)
        self.host_store: dict[int, torch.Tensor] = {}
        self.inflight_in: set[int] = set()
        self.inflight_out: set[int] = set()
        self._done: deque = deque()
        self._deferred: list = []
        self._stale: set[int] = set()   # written in place since their host copy was made
        self.counts = dict.fromkeys(self.totals, 0)
        self.copied = [0, 0.0]
        values = list(state.values) + [x, y]
        for i, (p, sid) in enumerate(zip(prog.placeholders, prog.ph_sid)):
            if values[i] is not None:
                self.env[p], self.res[sid] = values[i], True
                if i < len(state.values):
                    state.values[i] = None  # the executor holds it now
            else:
                self.host_store[sid] = state.host.pop(i)
        self._m = sum(prog.nbytes[s] for s in prog.ph_sid if self.res[s]) + prog.seq.workspace
        self._c = 0
        if self.account is not None:
            self.account.set(self._m)
        self._setup_residency()
        self._peak_main = self._m

    def _setup_residency(self) -> None:
        """Bring initial tensors where the plan expects them when the iteration starts."""
        prog = self.prog
        for sid in prog.ph_sid:
            if sid in self.host_at_start and self.res[sid]:
                self._keep_host(sid, self.device.copy_out(self._bytes_of(sid), self.device.compute_marker()))
                self._drop(sid)
                self._free(prog.nbytes[sid])
                self.counts["setup_swaps"] += 1
            elif sid not in self.host_at_start and not self.res[sid]:
                self._swap_in_now(sid, 0)
                self.counts["setup_swaps"] += 1
        if self.evict and self._m + self._c > self.budget:
            self._evict(0, 0)   # passive mode: start the iteration within the budget

    def _end(self, state: ExecState) -> None:
        prog = self.prog
        source = {ph: o for o, ph in prog.updates.items()}
        n_state = len(state.values)
        held = 0
        for i in range(n_state):
            o = source.get(i)
            p = prog.out_pos[o] if o is not None else prog.placeholders[i]
            sid = prog.nodes[p].meta["dbml_storage"]
            if self.res[sid] and self.env[p] is not None:
                state.values[i] = self.env[p]
                self._forget_host(sid)
                held += prog.nbytes[sid]
            elif sid in self.host_store:
                state.values[i] = None
                state.host[i] = self.host_store.pop(sid)
            else:
                raise ExecutionError(f"job {self.prog.job!r}: {prog.nodes[p].format_node()} is "
                                     f"neither resident nor on the host at the end of the iteration")
        self.iteration_peak = self._peak_main
        self.peak_bytes = max(self.peak_bytes, self.iteration_peak)
        for key, v in self.counts.items():
            self.totals[key] += v
        self.totals["iterations"] += 1
        self.env = []
        for sid in list(self.host_store):
            self._forget_host(sid)
        # between iterations the job holds its resident state (and the pool) only
        self._m, self._c = held, 0
        if self.account is not None:
            self.account.set(held)

    def settle(self, state: ExecState) -> int:
        """Between iterations, after :meth:`set_plan`: move the state the new plan keeps
        on the host at its start there now, and give back pooled buffers past its limit.
        A job whose plan shrank calls this before it tells the scheduler it runs the new
        plan (which lets another job take the room). Returns the bytes it now holds."""
        prog, device = self.prog, self.device
        for i, sid in enumerate(prog.ph_sid[:len(state.values)]):
            v = state.values[i]
            if sid in self.host_at_start and v is not None:
                state.host[i] = device.copy_out(storage_bytes(v), device.compute_marker())
                state.values[i] = None
                self.totals["setup_swaps"] += 1
        held = sum(prog.nbytes[sid] for i, sid in enumerate(prog.ph_sid[:len(state.values)])
                   if state.values[i] is not None)
        self._m, self._c = held, 0
        if self.account is not None:
            self.account.set(held)
        self._hold_pool_within(held, self._pool_limit())
        return held

    # -- events ----------------------------------------------------------------------
    def _perform(self, events, k: int) -> None:
        now = time.perf_counter()
        for kind, sid, delay, before in events:
            if kind is EventKind.RELEASE:
                if delay > 0:
                    self._deferred.append((now + delay, sid))
                else:
                    self._release(sid, k)
            elif kind is EventKind.SWAP_OUT:
                self._swap_out(sid, now + delay)
            elif kind is EventKind.SWAP_IN:
                self._swap_in(sid, now + delay)
            else:
                self._recompute(sid, before)
            if self.log_enabled:
                self.event_log.append((kind.value, k, sid))

    def _service(self, k: int) -> None:
        """Install finished swap-ins; perform deferred releases that are due."""
        while self._done:
            self._install(*self._done.popleft(), k)
        if self._deferred:
            now = time.perf_counter()
            due = [d for d in self._deferred if d[0] <= now]
            for d in due:
                self._deferred.remove(d)
                self._release(d[1], k - 1)

    def _drop(self, sid: int) -> None:
        env = self.env
        for a in self.prog.alias[sid]:
            env[a[0]] = None
        self.res[sid] = False

    def _value_of(self, sid: int):
        for a in self.prog.alias[sid]:
            v = self.env[a[0]]
            if v is not None:
                return v
        return None

    def _pool_limit(self) -> int:
        return self.budget if self.budget is not None else self.plan.peak_bytes

    def _hold_pool_within(self, total: int, limit: int) -> None:
        """Ledger + pool may not exceed the limit: give pooled buffers back when an
        allocation outside the pool would make it."""
        while self.pool_bytes and total + self.pool_bytes > limit:
            size = max(n for n, bufs in self._pool.items() if bufs)
            self._pool[size].pop()
            self.pool_bytes -= size
            if self.account is not None:
                self.account.add_pool(-size)
        self.reserved_peak = max(self.reserved_peak, total + self.pool_bytes)

    def _recycle(self, value: torch.Tensor, nbytes: int) -> None:
        """Keep a released buffer for a later output of the same size when nothing else
        holds it, and only while ledger + pool stays within the limit (the plan's peak or
        the budget): the pool never makes the device hold more than planned."""
        if self._m + self._c + self.pool_bytes + nbytes > self._pool_limit():
            return
        if sys.getrefcount(value) > 3 or torch._C._storage_Use_Count(value.untyped_storage()._cdata) != 2:
            return  # shared with someone else (a caller's tensor, a view we do not own)
        self._pool.setdefault(nbytes, []).append(storage_bytes(value))
        self.pool_bytes += nbytes
        if self.account is not None:
            self.account.add_pool(nbytes)
        self.reserved_peak = max(self.reserved_peak, self._m + self._c + self.pool_bytes)

    def _from_pool(self, r) -> torch.Tensor:
        nbytes, dtype, size, stride, _ = r
        self.pool_bytes -= nbytes
        if self.account is not None:
            self.account.add_pool(-nbytes)
        self.counts["reused_buffers"] += 1
        return as_view(self._pool[nbytes].pop(), dtype, size, stride, 0)

    def _keep_host(self, sid: int, host: torch.Tensor) -> None:
        """The host store keeps a tensor's copy until the iteration ends: tensors of a
        functional graph never change, so a released tensor may be swapped in again."""
        self._stale.discard(sid)
        old = self.host_store.get(sid)
        self.host_store[sid] = host
        if old is not None:
            self.device.free_host(old)

    def _forget_host(self, sid: int) -> None:
        host = self.host_store.pop(sid, None)
        if host is not None:
            self.device.free_host(host)

    def _bytes_of(self, sid: int) -> torch.Tensor:
        for a in self.prog.alias[sid]:
            v = self.env[a[0]]
            if v is not None:
                return storage_bytes(v)
        raise ExecutionError(f"job {self.prog.job!r}: no value holds tensor {sid} "
                             f"({self.prog.seq.tensors[sid].name})")

    def _rebuild(self, sid: int, flat: torch.Tensor, k: int) -> None:
        """Values of the nodes viewing ``sid`` that ran before op ``k`` and are read later."""
        env, last = self.env, self.prog.last_use
        for p, dtype, size, stride, offset, ran in self.prog.alias[sid]:
            if ran < k and last[p] >= k:
                env[p] = as_view(flat, dtype, size, stride, offset)
        self.res[sid] = True

    def _release(self, sid: int, k: int) -> None:
        if self.res[sid]:
            nbytes = self.prog.nbytes[sid]
            if sid in self._stale and self.prog.live.last_access(sid) > k:
                # "release, swap in again later" needs a host copy; the op that made the
                # last one stale wrote into the tensor (BatchNorm's running statistics)
                self._keep_host(sid, self.device.copy_out(self._bytes_of(sid), self.device.compute_marker()))
                self.counts["refresh_swaps"] += 1
            value = self._value_of(sid) if len(self._pool.get(nbytes, ())) < \
                self.prog.reuse_demand.get(nbytes, 0) else None
            self._drop(sid)
            self._free(nbytes)
            self.counts["releases"] += 1
            if value is not None:
                self._recycle(value, nbytes)
        # the host copy (if any) stays valid: the plan may swap the tensor in again

    def _swap_out(self, sid: int, at: float) -> None:
        if not self.res[sid]:
            return
        holder = [self._bytes_of(sid)]
        self._drop(sid)
        self.inflight_out.add(sid)
        marker = self.device.compute_marker()
        nbytes = self.prog.nbytes[sid]

        def job():
            t0 = time.perf_counter()
            host = self.device.copy_out(holder[0], marker)
            holder.clear()  # the device bytes are freed here
            self._copied(nbytes, t0)
            with self._cv:
                self._c -= nbytes
                if self.account is not None:
                    self.account.add(-nbytes)
                self._keep_host(sid, host)
                self.inflight_out.discard(sid)
                self._cv.notify_all()

        self.counts["swap_outs"] += 1
        self.channel.submit(at, job)

    def _copied(self, nbytes: int, t0: float) -> None:
        """On the copy thread (the only writer while an iteration runs)."""
        self.copied[0] += nbytes
        self.copied[1] += time.perf_counter() - t0

    def _swap_in(self, sid: int, at: float) -> None:
        """Issue a swap-in. Its destination is counted here, on the compute thread, when
        it is issued (the planned start, to an op): every increase of the ledger happens
        on this thread, where the limit is enforced, so a copy channel running late can
        only make compute wait, never make the device hold more than planned."""
        if self.res[sid] or sid in self.inflight_in:
            return
        if sid not in self.host_store and sid not in self.inflight_out:
            return   # nothing to copy (a plan mismatch): the op that needs it will fetch
        nbytes = self.prog.nbytes[sid]
        if self.budget is not None and self._m + self._c + nbytes > self.budget and self.inflight_out:
            self._wait_for_room(nbytes)
        self._alloc(nbytes)
        self.inflight_in.add(sid)

        def job():
            t0 = time.perf_counter()
            host = self.host_store[sid]   # a swap-out of it, issued earlier, has completed
            dst = self.device.alloc(nbytes)
            marker = self.device.copy_in(host, dst)
            self._copied(nbytes, t0)
            with self._cv:
                self._done.append((sid, dst, marker))
                self._cv.notify_all()

        self.counts["swap_ins"] += 1
        self.channel.submit(at, job)

    def _install(self, sid: int, dst: torch.Tensor, marker, k: int) -> None:
        self.device.use_on_compute(dst, marker)
        self._rebuild(sid, dst, k)
        self.inflight_in.discard(sid)

    def _swap_in_now(self, sid: int, k: int) -> None:
        """A swap-in on the compute thread (passive, or setting up the iteration)."""
        host = self.host_store[sid]
        nbytes = self.prog.nbytes[sid]
        if self.evict and self._m + self._c + nbytes > self.budget:
            self._make_room(nbytes, k, (sid,))
        self._alloc(nbytes)
        dst = self.device.alloc(nbytes)
        marker = self.device.copy_in(host, dst)
        self._install(sid, dst, marker, k)

    def _fetch(self, sid: int, k: int) -> None:
        """Op ``k`` needs ``sid`` and it is not resident: wait, swap in, or recompute."""
        waited = False
        while True:
            with self._cv:
                while sid in self.inflight_out or (sid in self.inflight_in and not self._done):
                    waited = True
                    self._cv.wait()
            self._service(k)
            if self.res[sid]:
                if waited:
                    self.counts["late_swap_ins"] += 1
                return
            if sid in self.inflight_in:
                continue
            if sid in self.host_store:
                self._swap_in_now(sid, k)
                self.counts["passive_swaps"] += 1
                return
            self._recompute(sid, k, passive=True)
            return

    def _recompute(self, sid: int, before: int, passive: bool = False) -> None:
        prog = self.prog
        g = prog.gen[sid]
        if self.res[sid]:
            return
        if g < 0 or not replayable(prog.op_nodes[g]):
            node = prog.op_nodes[g].format_node() if g >= 0 else prog.seq.tensors[sid].name
            raise ExecutionError(f"job {prog.job!r}: op {before} ({prog.op_nodes[min(before, self.n_ops - 1)].name}) "
                                 f"needs tensor {sid}, which is gone and cannot be recomputed: {node}")
        for s in prog.inputs[g]:
            if not self.res[s]:
                self._fetch(s, before)
        outs = prog.outputs[g]
        need = sum(prog.nbytes[s] for s in outs)
        if self.evict and self._m + self._c + need > self.budget:
            self._make_room(need, before, prog.inputs[g])
        self._alloc(need)
        with torch.no_grad():
            value = prog.replay_calls[g](self.env)
        if prog.kind[g] == MULTI:
            sids = prog.op_nodes[g].meta["dbml_storage"]
            value = value[sids.index(sid)]
        self._rebuild(sid, storage_bytes(value), before)
        self._free(sum(prog.nbytes[s] for s in outs if s != sid))
        self.counts["passive_recomputes" if passive else "recomputes"] += 1


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
            _, k, reads, resident = entry
            for t, r in zip(reads, resident):
                if not r:
                    bad.append(f"op {k} read tensor {t} while it was not resident")
    return bad
