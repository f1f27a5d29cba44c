"""The static program: a captured graph compiled once for the executor.

Every op node becomes a small closure over a flat value list (no per-op dict lookups or
argument mapping); beside it the program keeps what the executor needs per op and per
tensor: which storages each op reads and writes, the bytes it adds to the ledger, the
nodes viewing each storage (to rebuild them after a swap-in), the ``out=`` variants for
in-place updates, overwrites and the reuse pool. Liveness comes from
:func:`~..plan.liveness.analyse_liveness`; the program derives nothing of its own.
"""

from __future__ import annotations

import bisect
import operator
from typing import Any, Callable, NamedTuple

import torch
import torch.fx as fx

from ..errors import ExecutionError
from .rng import RandomOp
from ..graph.access import op_nodes, output_nodes
from ..graph.capture import HIDDEN_MUTATIONS, CapturedStep, writes_statistics_only
from ..graph.sequence import AccessSequence
from ..plan.liveness import analyse_liveness
from ..plan.rules import op_added_bytes

__all__ = ["Program", "Alias", "Reuse", "PLAIN", "MULTI", "SKIP", "SPECIAL", "call_source"]


class Alias(NamedTuple):
    """A node whose value views a storage, with the layout to rebuild it on top."""
    pos: int            # the node's place in the flat value list
    dtype: torch.dtype
    size: tuple
    stride: tuple
    offset: int
    ran: int            # the op computing the node (-1: a placeholder)


class Reuse(NamedTuple):
    """A pointwise op that may write into a pooled buffer of ``nbytes``."""
    nbytes: int
    dtype: torch.dtype
    size: tuple
    stride: tuple
    call: Callable      # (env, out) -> value: the op's ``out=`` variant
    target: Any = None  # that variant (the fast path renders the same call over locals)


def call_source(node: fx.Node, pos: dict, ref: Callable[[int], str], ns: dict, target=None,
                out_pos: int | None = None, copy_into: int | None = None, out_arg: bool = False) -> str:
    """The Python expression computing ``node``: the value of the node at position
    ``pos[n]`` is ``ref(pos[n])``; a constant other than None, a bool or an int is a name
    bound in ``ns``. Shared by the executor's per-node closures and the fast path's
    generated function (:mod:`.codegen`)."""
    def render(a) -> str:
        if isinstance(a, fx.Node):
            return ref(pos[a])
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
        parts.append(f"out={ref(out_pos)}")
    if out_arg:
        parts.append("out=o")
    call = f"{fn}({', '.join(parts)})"
    if copy_into is not None:
        call = f"{ref(copy_into)}.copy_({call})"
    return call


def _env_ref(p: int) -> str:   # the executor's closures: a value is ``e[p]`` of the flat value list
    return f"e[{p}]"


def _compile(node: fx.Node, pos: dict, ns: dict, target=None, out_pos: int | None = None,
             copy_into: int | None = None, out_arg: bool = False):
    """A closure ``env -> value`` computing ``node`` from the flat value list ``env``
    (``(env, out) -> value`` with ``out_arg``: an ``out=`` variant writing into ``out``)."""
    call = call_source(node, pos, _env_ref, ns, target, out_pos, copy_into, out_arg)
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
_HIDDEN_WRITES = HIDDEN_MUTATIONS   # op name -> argument positions; one owner: capture.py


class OnCopies:
    """An op whose only writes are hidden statistics (``HIDDEN_MUTATIONS``), re-run for a
    recompute on copies of those arguments: its outputs are the same bits (in training
    BatchNorm normalises by the batch's statistics, not the running ones) and the running
    statistics stay as the op's own run left them. The copies are a few floats per channel,
    freed on return, like any kernel's scratch."""

    def __init__(self, op: torch._ops.OpOverload):
        self.op, self.written = op, _HIDDEN_WRITES[op.overloadpacket.__name__]
        self.names = {op._schema.arguments[i].name for i in self.written}

    def __call__(self, *args, **kwargs):
        args = [_copy(a) if i in self.written else a for i, a in enumerate(args)]
        kwargs = {k: _copy(v) if k in self.names else v for k, v in kwargs.items()}
        return self.op(*args, **kwargs)

    def __repr__(self) -> str:
        return f"OnCopies({self.op!r})"


def _copy(a):
    return a.clone() if isinstance(a, torch.Tensor) else a


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
        self._aliases(nodes, op_index)
        self.last_use = self._node_last_use(nodes, n_ops)
        self.gen = list(self.live.gen)
        self.inputs = [seq.ops[k].inputs for k in range(n_ops)]
        self.outputs = [seq.ops[k].outputs for k in range(n_ops)]
        self.loss_sid = self.nodes[self.out_pos[0]].meta["dbml_storage"]
        self._compile_all(pos)

    def last_access_before(self, sid: int, k: int) -> int:
        """The last op before ``k`` that read or generated ``sid`` (-1: none this iteration)."""
        acc = self.live.accesses[sid]
        i = bisect.bisect_left(acc, k)
        if i:
            return acc[i - 1]
        g = self.live.gen[sid]
        return g if g < k else -1

    def _node_last_use(self, nodes, n_ops: int) -> list[int]:
        """Per node: the last op that needs its storage (``Liveness.last_access``; for
        the graph's outputs, read when the iteration ends, ``n_ops``). A swap-in or a
        recompute rebuilds the values of the nodes viewing the storage that ran before."""
        last = [-1] * len(nodes)
        outputs = self.seq.outputs
        for sid, aliases in enumerate(self.alias):
            until = n_ops if sid in outputs else self.live.last_access(sid)
            for a in aliases:
                last[a.pos] = until
        return last

    def _aliases(self, nodes, op_index) -> None:
        """Per storage: the nodes whose value views it, with the layout to rebuild it."""
        self.alias: list[list[Alias]] = [[] for _ in self.nbytes]
        for i, node in enumerate(nodes):
            sid = node.meta.get("dbml_storage")
            val = node.meta.get("val")
            if isinstance(sid, int) and isinstance(val, torch.Tensor):
                self.alias[sid].append(Alias(i, val.dtype, tuple(val.shape), tuple(val.stride()),
                                             val.storage_offset(), op_index.get(node, -1)))

    def _compile_all(self, pos) -> None:
        ns: dict[str, Any] = {}
        self.kind, self.calls, self.distribute = [], [], []
        # per op, how its call is made: (target, out_pos, copy_into) as _compile takes them
        # (None: a SKIP); the fast path renders the same call over locals (codegen.py)
        self.call_spec: list[tuple | None] = []
        self.in_place: dict[int, tuple[int, int]] = {}   # op -> (new sid, old sid)
        for k, node in enumerate(self.op_nodes):
            val = node.meta.get("val")
            if node.target is operator.getitem and isinstance(node.args[0].meta.get("val"), (list, tuple)):
                self.kind.append(SKIP)
                self.calls.append(None)
                self.call_spec.append(None)
                self.distribute.append(())
                continue
            multi = isinstance(val, (list, tuple))
            self.kind.append(MULTI if multi else PLAIN)
            self.distribute.append(tuple((u.args[1], pos[u]) for u in node.users
                                         if u.target is operator.getitem) if multi else ())
            # a random op draws from the running job's own generator (rng.py)
            target = RandomOp(node.target) if node.meta.get("dbml_random") else None
            self.calls.append(_compile(node, pos, ns, target=target))
            self.call_spec.append((target, None, None))
        self.replay_calls = list(self.calls)
        for k, node in enumerate(self.op_nodes):   # BatchNorm re-run on copies of its statistics
            if self.calls[k] is not None and node.meta.get("dbml_mutates") and writes_statistics_only(node):
                self.replay_calls[k] = _compile(node, pos, ns, target=OnCopies(node.target))
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
        self.add_bytes = op_added_bytes(self.seq)   # rule 2, owned by plan/rules.py

    def _compile_reuse(self, pos, ns) -> None:
        """Pointwise ops may write into a released buffer of the same size (the executor's
        reuse pool, an allocator cache): per op, ``(nbytes, dtype, size, stride)`` and an
        ``out=`` closure, or None. Pointwise kernels give the same bits into any buffer."""
        self.reuse: list[Reuse | None] = [None] * len(self.op_nodes)
        for k, node in enumerate(self.op_nodes):
            val, target = node.meta.get("val"), node.target
            if self.kind[k] != PLAIN or not isinstance(target, torch._ops.OpOverload) or node.meta.get("dbml_random") \
                    or torch.Tag.pointwise not in target.tags or not isinstance(val, torch.Tensor) \
                    or val.storage_offset() != 0 or len(self.outputs[k]) != 1:
                continue
            out_op = _out_variant(target)
            nbytes = self.nbytes[self.outputs[k][0]]
            if out_op is None or nbytes != val.numel() * val.element_size() or nbytes < MIN_REUSE_BYTES:
                continue
            self.reuse[k] = Reuse(nbytes, val.dtype, tuple(val.shape), tuple(val.stride()),
                                  _compile(node, pos, ns, target=out_op, out_arg=True), out_op)
        # how many buffers of each size are worth keeping: as many as ops that take one
        self.reuse_demand: dict[int, int] = {}
        for r in self.reuse:
            if r is not None:
                self.reuse_demand[r.nbytes] = min(self.reuse_demand.get(r.nbytes, 0) + 1, MAX_POOLED_PER_SIZE)

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
            if self.kind[k] != PLAIN or not isinstance(target, torch._ops.OpOverload) or node.meta.get("dbml_random") \
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
                    self.call_spec[k] = (out_op, pos[arg], None)
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
                self.call_spec[k] = (out_op, old_pos, None)
            else:
                self.calls[k] = _compile(node, pos, ns, copy_into=old_pos)
                self.call_spec[k] = (None, None, old_pos)
            self.in_place[k] = (new, old)   # Liveness counts op k as an access of old
