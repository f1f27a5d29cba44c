"""Op latency estimates for the access sequence, before anything has run.

A :class:`LatencyModel` predicts one captured node's latency in seconds. The latency
predictor (an MLP trained at install time) implements it; :class:`RooflineModel`, here,
is the fallback that needs no training: ``overhead + max(flops / peak_flops,
bytes / memory_bandwidth)`` with FLOPs from ``torch.utils.flop_counter``'s formulas
(matmul, convolution, attention) and bytes the op's inputs plus outputs.

:func:`measure_machine` times a matrix product and a large copy once per process and
device (cached): peak FLOP/s, memory bandwidth, and host<->device copy bandwidth, which
:mod:`.access` writes into ``AccessSequence.copy_bandwidth``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.fx as fx
from torch.utils.flop_counter import flop_registry

from .. import config

__all__ = ["LatencyModel", "RooflineModel", "Machine", "measure_machine", "node_bytes", "node_flops",
           "node_value", "synchronizer"]

# Python-level nodes (views, getitem, scalar arithmetic) cost about one interpreter step.
VIEW_LATENCY = 1e-6


class LatencyModel(Protocol):
    def predict(self, node: fx.Node) -> float:
        """Seconds ``node`` takes to run, from its ``meta["val"]`` and arguments."""


@dataclass(frozen=True)
class Machine:
    peak_flops: float        # FLOP/s of a large float32 matmul
    memory_bandwidth: float  # bytes/s of a large on-device copy (read + write)
    copy_bandwidth: float    # bytes/s of one host<->device copy direction
    op_overhead: float       # seconds of fixed cost per aten op


_MACHINES: dict[str, Machine] = {}


def _timed(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def synchronizer(device: torch.device):
    """A callable that waits for ``device``'s queued work (a no-op on CPU)."""
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def measure_machine(device: str | torch.device = "cpu") -> Machine:
    """Measure (once per process and device) the figures the roofline model needs.

    ``DBML_COPY_BANDWIDTH`` (bytes/s) overrides the measured copy bandwidth."""
    device = torch.device(device)
    key = str(device)
    if key in _MACHINES:
        return _MACHINES[key]
    sync = synchronizer(device)
    n = 256
    # constant inputs: timing must not draw from the global generator (dropout masks
    # would then differ from eager training seeded the same way)
    a, b = torch.full((n, n), 0.5, device=device), torch.full((n, n), 0.25, device=device)
    flops = 2 * n ** 3 / _timed(lambda: (torch.mm(a, b), sync()))
    src = torch.empty(4 << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    mem_bw = 2 * src.numel() / _timed(lambda: (dst.copy_(src), sync()))
    host = torch.empty(src.numel(), dtype=torch.uint8, pin_memory=device.type == "cuda")
    copy_bw = src.numel() / _timed(lambda: (host.copy_(src), sync()))
    override = config.copy_bandwidth_override()
    copy_bw = copy_bw if override is None else override
    small = torch.ones(4, device=device)
    overhead = _timed(lambda: (torch.ops.aten.add.Tensor(small, small), sync()), repeats=20)
    _MACHINES[key] = Machine(flops, mem_bw, copy_bw, overhead)
    return _MACHINES[key]


def node_value(x):
    """The fake value a captured node carries (``meta["val"]``); other arguments as they are."""
    return x.meta.get("val") if isinstance(x, fx.Node) else x


def _tensor_bytes(v) -> int:
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    if isinstance(v, (list, tuple)):
        return sum(_tensor_bytes(x) for x in v)
    return 0


def node_bytes(node: fx.Node) -> int:
    """Bytes an op reads and writes: its tensor arguments plus its outputs."""
    args = fx.node.map_arg((node.args, node.kwargs), node_value)
    return _tensor_bytes(args) + _tensor_bytes(node.meta.get("val"))


def node_flops(node: fx.Node) -> int:
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    if packet not in flop_registry:
        return 0
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), node_value)
    try:
        return int(flop_registry[packet](*args, **kwargs, out_val=node.meta.get("val")))
    except Exception:  # noqa: BLE001 - a formula that does not fit these arguments: no FLOPs
        return 0


class RooflineModel:
    """``overhead + max(flops / peak_flops, bytes / memory_bandwidth)`` per aten op."""

    def __init__(self, machine: Machine | None = None, device: str = "cpu"):
        self.machine = machine or measure_machine(device)

    def predict(self, node: fx.Node) -> float:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
                or node.meta.get("dbml_nbytes", 1) == 0 and _is_view(node):
            return VIEW_LATENCY
        m = self.machine
        return m.op_overhead + max(node_flops(node) / m.peak_flops, node_bytes(node) / m.memory_bandwidth)


def _is_view(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target.is_view
