"""The tensor access sequence of a captured step (TENSILE Section III-A).

:func:`build_sequence` reads a :class:`~.capture.CapturedStep` and a
:class:`~.estimate.LatencyModel` and returns the :class:`~.sequence.AccessSequence` the
planner works on:

* a tensor is a storage (``node.meta["dbml_storage"]``): views and ``getitem`` share
  their base's id and allocate nothing;
* an op is every ``call_function`` node, in graph order (so op ``i`` is the executor's
  step ``i``, see :func:`op_nodes`); its inputs are the storages its arguments live in,
  its outputs the storages it allocates;
* op times are cumulative latency estimates, one op after another; a collective's
  (:mod:`.collective`) communication time, its buffer's bytes over the process group's
  measured bandwidth (``comm_bandwidth``), is its ``wait_tensor``'s, where compute blocks
  (the collective itself is issued asynchronously): swaps and recomputation overlap it
  as they overlap compute;
* initial tensors are the graph inputs; ``updates`` maps each updated value's storage
  to the input's; ``outputs`` holds the loss and the updated values.
"""

from __future__ import annotations

import operator

import torch.fx as fx

from .capture import CapturedStep, writes_statistics_only
from .collective import is_collective, is_wait
from ..latency.estimate import LatencyModel, measure_machine
from .sequence import AccessSequence, Op, TensorInfo, TensorKind

__all__ = ["build_sequence", "op_nodes", "node_inputs", "output_nodes"]


def op_nodes(captured: CapturedStep) -> list[fx.Node]:
    """The nodes that are ops of the access sequence, in execution order."""
    return [n for n in captured.graph.nodes if n.op == "call_function"]


def output_nodes(captured: CapturedStep) -> list:
    """The graph's outputs: ``(loss, *updated values)``."""
    return list(captured.output_node().args[0])


def node_inputs(node: fx.Node) -> tuple[int, ...]:
    """Storages an op reads, in argument order, without duplicates."""
    if node.target is operator.getitem:
        sid = node.meta.get("dbml_storage")
        return (sid,) if isinstance(sid, int) else ()
    seen: list[int] = []
    for arg in node.all_input_nodes:
        sid = arg.meta.get("dbml_storage")
        for s in (sid if isinstance(sid, tuple) else (sid,)):
            if isinstance(s, int) and s not in seen:
                seen.append(s)
    return tuple(seen)


def _tensor_infos(captured: CapturedStep) -> tuple[TensorInfo, ...]:
    owners: list[str] = captured.meta["storage_owners"]
    nodes = {n.name: n for n in captured.graph.nodes}
    names: dict[int, str] = {}
    nbytes = [0] * len(owners)
    for node in captured.graph.nodes:
        sid = node.meta.get("dbml_storage")
        if isinstance(sid, int):
            names.setdefault(sid, node.name)
            nbytes[sid] = max(nbytes[sid], _storage_bytes(node))
    infos = []
    for sid, owner in enumerate(owners):
        node = nodes[owner]
        kind = node.meta.get("dbml_kind", TensorKind.ACTIVATION)
        infos.append(TensorInfo(sid, names.get(sid, owner), nbytes[sid], kind,
                                not_replayable=not replayable(node)))
    return tuple(infos)


def replayable(node: fx.Node) -> bool:
    """Whether rerunning ``node`` reproduces its outputs and nothing else. Not for random
    ops (a new mask) nor ops writing into an input: their tensors carry
    ``not_replayable=True``, the contract's "never recompute"; nor collectives, which every
    worker runs once, in the same order. BatchNorm, whose only write
    is its running statistics, is replayed on copies of them (``writes_statistics_only``):
    norms are among the cheapest tensors to recompute."""
    if node.meta.get("dbml_random") or is_collective(node):   # a collective: every worker runs it once
        return False
    return not node.meta.get("dbml_mutates") or writes_statistics_only(node)


def _storage_bytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    return val.untyped_storage().nbytes() if val is not None else 0


def _op_outputs(captured: CapturedStep) -> dict[str, tuple[int, ...]]:
    outs: dict[str, list[int]] = {}
    for sid, owner in enumerate(captured.meta["storage_owners"]):
        outs.setdefault(owner, []).append(sid)
    return {k: tuple(v) for k, v in outs.items()}


def comm_seconds(node: fx.Node, comm_bandwidth: float | None) -> float:
    """A collective's communication time, ``node`` its wait: the bytes reduced over the
    group's bandwidth."""
    if comm_bandwidth is None:
        raise ValueError(f"build_sequence(): the graph holds a collective ({node.format_node()}); "
                         f"pass comm_bandwidth := the process group's bytes per second (collective.measure_bandwidth)")
    return _storage_bytes(node) / comm_bandwidth


def build_sequence(captured: CapturedStep, latency_model: LatencyModel, job: str | None = None,
                   *, copy_bandwidth: float | None = None, workspace: int = 0,
                   comm_bandwidth: float | None = None) -> AccessSequence:
    job = job or captured.job
    outputs_of = _op_outputs(captured)
    ops, t = [], 0.0
    for i, node in enumerate(op_nodes(captured)):
        latency = comm_seconds(node, comm_bandwidth) if is_wait(node) else float(latency_model.predict(node))
        ops.append(Op(i, node.name, node_inputs(node), outputs_of.get(node.name, ()), t, t + latency,
                      node.meta["dbml_phase"], not replayable(node), is_collective(node)))
        t += latency
    placeholders = captured.placeholders()
    initial = frozenset(p.meta["dbml_storage"] for p in placeholders)
    outs = output_nodes(captured)
    updates = {outs[o].meta["dbml_storage"]: placeholders[p].meta["dbml_storage"]
               for o, p in captured.updates.items()
               if outs[o].meta["dbml_storage"] not in initial}
    if copy_bandwidth is None:
        machine = getattr(latency_model, "machine", None) or measure_machine()
        copy_bandwidth = machine.copy_bandwidth
    return AccessSequence(job, _tensor_infos(captured), tuple(ops), initial, updates,
                          workspace=workspace, copy_bandwidth=copy_bandwidth,
                          outputs=frozenset(n.meta["dbml_storage"] for n in outs
                                            if isinstance(n, fx.Node)))
