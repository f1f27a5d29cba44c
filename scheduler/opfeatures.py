"""Features of one captured op for the latency predictor (TENSILE's
``<dim0_x1, ..., dimk_xn, para1, ..., paras, gpu_usage>``, made learnable).

:func:`op_kind` names the kernel a node runs (its aten overload, e.g.
``aten.convolution_backward.default``), or None for nodes that are not timed ops (views,
``getitem``, Python scalar arithmetic). :func:`op_features` is a fixed-length vector:

* the dimensions of the first :data:`MAX_TENSORS` tensor arguments, :data:`MAX_DIMS` each
  (leading dimensions of a higher-rank tensor folded into its first), as ``log2(1 + d)``;
* whether each of those tensors is contiguous (a transposed ``mm`` operand is slower);
* ``log2(1 + numel)`` of the output(s), ``log2`` of the element size;
* the op's non-tensor arguments (stride, padding, kernel size, dims, flags, scalars)
  flattened in schema order into :data:`MAX_PARAMS` slots as ``sign(x) log2(1 + |x|)``;
* ``log2(1 + FLOPs)`` and ``log2(1 + bytes)`` from :mod:`.estimate`'s formulas.

Device utilisation is not part of this vector: it is a property of the moment of
prediction, appended by the predictor. Every feature comes from ``node.meta["val"]`` of
the node and its arguments, so a node captured on fake tensors is featurised exactly as
one the calibration ran for real.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from .estimate import node_bytes, node_flops

__all__ = ["op_kind", "op_features", "FEATURE_NAMES", "N_FEATURES", "LOG_FLOPS", "LOG_BYTES"]

MAX_TENSORS = 3
MAX_DIMS = 4
MAX_PARAMS = 14  # convolution_backward has 14 (bias sizes .. groups, output_mask)

FEATURE_NAMES = ([f"t{t}_d{d}" for t in range(MAX_TENSORS) for d in range(MAX_DIMS)]
                 + [f"t{t}_contiguous" for t in range(MAX_TENSORS)]
                 + ["out_numel", "elem_size"]
                 + [f"param{p}" for p in range(MAX_PARAMS)]
                 + ["log_flops", "log_bytes"])
N_FEATURES = len(FEATURE_NAMES)
LOG_FLOPS = FEATURE_NAMES.index("log_flops")
LOG_BYTES = FEATURE_NAMES.index("log_bytes")


def op_kind(node: fx.Node) -> str | None:
    """The aten overload ``node`` runs, or None where it is not a kernel worth timing."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    if target.is_view:
        return None
    return str(target)


def _val(x):
    return x.meta.get("val") if isinstance(x, fx.Node) else x


def _flatten(values) -> list:
    out = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(_flatten(v))
        else:
            out.append(v)
    return out


def _dims(t: torch.Tensor) -> list[float]:
    shape = list(t.shape)
    if len(shape) > MAX_DIMS:
        shape = [math.prod(shape[:len(shape) - MAX_DIMS + 1])] + shape[len(shape) - MAX_DIMS + 1:]
    shape += [0] * (MAX_DIMS - len(shape))
    return [math.log2(1 + int(d)) for d in shape]


def _param(v) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return math.copysign(math.log2(1 + abs(float(v))), float(v)) if math.isfinite(v) else 0.0
    if v is None:
        return 0.0
    if isinstance(v, torch.dtype):
        return float(v.itemsize)
    return None  # strings, devices, layouts, memory formats: not a cost parameter


def op_features(node: fx.Node) -> list[float]:
    """The fixed-length feature vector of ``node`` (see the module docstring)."""
    args = _flatten(fx.node.map_arg((list(node.args), list(node.kwargs.values())), _val))
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    dims, contiguous = [], []
    for i in range(MAX_TENSORS):
        t = tensors[i] if i < len(tensors) else None
        dims += _dims(t) if t is not None else [0.0] * MAX_DIMS
        contiguous.append(float(t.is_contiguous()) if t is not None else 0.0)
    outs = [v for v in _flatten([node.meta.get("val")]) if isinstance(v, torch.Tensor)]
    out_numel = sum(v.numel() for v in outs)
    elem = tensors[0].element_size() if tensors else (outs[0].element_size() if outs else 4)
    params = [p for p in (_param(a) for a in args if not isinstance(a, torch.Tensor)) if p is not None]
    params = (params + [0.0] * MAX_PARAMS)[:MAX_PARAMS]
    return (dims + contiguous + [math.log2(1 + out_numel), math.log2(elem)] + params
            + [math.log2(1 + node_flops(node)), math.log2(1 + node_bytes(node))])
