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
* ``log2(1 + FLOPs)`` and ``log2(1 + bytes)`` from :mod:`.estimate`'s formulas;
* for a convolution or its backward, its geometry spelled out (:func:`conv_features`):
  batch, channels in and out per group, output and input pixels, kernel pixels, stride,
  groups, which gradients a backward computes (its ``output_mask``), the GEMM depth
  ``channels x kernel``, and whether a vendor library (oneDNN, cuDNN) runs it. The generic
  slots above hold all but the last only implicitly (dimensions of three tensors,
  parameters in schema order), and a few hundred training shapes cannot teach the MLP
  to decode them; zeros for every other op.

Device utilisation is not part of this vector: it is a property of the moment of
prediction, appended by the predictor. Every feature comes from ``node.meta["val"]`` of
the node and its arguments, so a node captured on fake tensors is featurised exactly as
one the calibration ran for real.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from .estimate import node_bytes, node_flops, node_value

__all__ = ["op_kind", "op_features", "conv_features", "FEATURE_NAMES", "N_FEATURES", "LOG_FLOPS",
           "LOG_BYTES"]

MAX_TENSORS = 3
MAX_DIMS = 4
MAX_PARAMS = 14  # convolution_backward has 14 (bias sizes .. groups, output_mask)

CONV_FEATURES = ["conv_batch", "conv_in_channels", "conv_out_channels", "conv_out_pixels", "conv_in_pixels",
                 "conv_kernel", "conv_stride", "conv_groups", "conv_grad_input", "conv_grad_weight",
                 "conv_grad_bias", "conv_gemm_depth", "conv_library"]
FEATURE_NAMES = ([f"t{t}_d{d}" for t in range(MAX_TENSORS) for d in range(MAX_DIMS)]
                 + [f"t{t}_contiguous" for t in range(MAX_TENSORS)]
                 + ["out_numel", "elem_size"]
                 + [f"param{p}" for p in range(MAX_PARAMS)]
                 + ["log_flops", "log_bytes"]
                 + CONV_FEATURES)
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
    args = _flatten(fx.node.map_arg((list(node.args), list(node.kwargs.values())), node_value))
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
            + [math.log2(1 + node_flops(node)), math.log2(1 + node_bytes(node))] + conv_features(node))


CONVOLUTIONS = (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)
# Kernels of vendor libraries among torch's convolution backends (the rest are its own
# im2col + GEMM and depthwise kernels).
LIBRARY_BACKENDS = ("Mkldnn", "Cudnn", "Miopen")


def conv_features(node: fx.Node) -> list[float]:
    """The :data:`CONV_FEATURES` of ``node`` (zeros unless it is a convolution or its
    backward): log2(1 + x) of sizes, flags as 0/1."""
    backward = node.target is CONVOLUTIONS[1]
    if node.target not in CONVOLUTIONS or len(node.args) < (11 if backward else 9):   # all positional in aten graphs
        return [0.0] * len(CONV_FEATURES)
    args = [node_value(a) for a in node.args]
    x, w = args[1:3] if backward else args[0:2]
    stride, padding, dilation, transposed, output_padding, groups = args[4:10] if backward else args[3:9]
    out = args[0] if backward else node_value(node)
    mask = args[10] if backward else (False, False, False)
    batch, pixels_in, pixels_out = x.shape[0], math.prod(x.shape[2:]), math.prod(out.shape[2:])
    kernel = math.prod(w.shape[2:])
    sizes = [batch, w.shape[1], w.shape[0] // groups, pixels_out, pixels_in, kernel, math.prod(stride), groups]
    return ([math.log2(1 + v) for v in sizes] + [float(m) for m in mask]
            + [math.log2(1 + w.shape[1] * kernel), _library(x, w, stride, padding, dilation, transposed,
                                                             output_padding, groups)])


def _library(x, w, *params) -> float:
    """1.0 where torch would run this convolution with a vendor library (oneDNN on CPU:
    not for a 1x1 kernel at batch < 16, nor a small batch-1 input, on one thread)."""
    select = getattr(torch._C, "_select_conv_backend", None)
    try:
        backend = str(select(x, w, None, *[list(p) if isinstance(p, (list, tuple)) else p for p in params]))
    except Exception:  # noqa: BLE001 - a private torch function: absent or changed, no feature
        return 0.0
    return float(any(name in backend for name in LIBRARY_BACKENDS))
