"""A captured step on disk: a safe JSON form of :class:`~.capture.CapturedStep`.

:func:`encode` turns a captured step into plain JSON data and :func:`decode` rebuilds an
equal one: the same nodes under the same names, targets, arguments, ``dbml_*``
annotations and ``val`` fake tensors (shape, stride, storage offset, dtype, device, and
one fake storage per ``dbml_storage`` id of the storage's size, so views share their
base's storage as in the traced graph). What later stages read of a graph is exactly
that: the executor's :class:`~..execute.program.Program` compiles targets and
arguments and reads layouts from ``val``; :func:`~.access.build_sequence` reads the
annotations and storage sizes; the latency models read ``val`` of nodes and arguments.
Other ``meta`` entries (``tensor_meta``, ``unbacked_bindings``) are not kept.

Nothing in a file is executed or unpickled. A target is either an ``OpOverload`` of a
known namespace (``aten``, ``prims``), looked up by name in torch's operator registry,
or one of the Python operators the optimizer's symbolic step arithmetic uses
(``operator.pow``, ...); an argument is a constant of a closed set of types (numbers,
strings, None, lists, tuples, dtypes, devices, layouts, memory formats) or a reference
to an earlier node. Anything else is refused with :class:`StoreError`, on writing
(the step is then not cached) as on reading (the file is then ignored). The symbolic
scalars of Adam's bias correction are rebuilt as unbacked symbols of a new ``ShapeEnv``
(one per ``_local_scalar_dense``; the float arithmetic on it carries its symbol).
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx._lazy_graph_module import _LazyGraphModule
# ShapeEnv() imports the translation validator, and torch._dynamo with it, at its first
# construction (every captured or loaded step makes one): imported here, with this module,
# it is among what dbml.core.training freezes out of the collector's reach (gc.freeze).
import torch.fx.experimental.validator  # noqa: E402,F401

from .capture import CapturedStep, shape_env
from .optim import OptimizerSpec
from .sequence import Phase, TensorKind

__all__ = ["FORMAT", "StoreError", "encode", "decode", "save", "load"]

FORMAT = 1   # bump when the encoding, or what capture writes into a graph, changes

OP_NAMESPACES = ("aten", "prims")
# The Python-level call targets tracing leaves in a graph: getitem of a multi-output op,
# and the float arithmetic of the optimizer's step-dependent scalars.
PY_OPERATORS = {f"operator.{f.__name__}": f for f in (
    operator.getitem, operator.add, operator.sub, operator.mul, operator.truediv,
    operator.floordiv, operator.mod, operator.pow, operator.neg, operator.pos, operator.abs,
    operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge)}
_PY_NAMES = {f: name for name, f in PY_OPERATORS.items()}

# CapturedStep fields the caller supplies on load (the spec and signature are part of the
# cache key; the job is the loader's), and the one rebuilt from the nodes
_CALLER_FIELDS = ("spec", "signature", "job")
_META_KEYS = ("dbml_storage", "dbml_owner", "dbml_nbytes", "dbml_phase", "dbml_random",
              "dbml_mutates", "dbml_kind", "dbml_key")


class StoreError(ValueError):
    """A step that cannot be written in this format, or a file that does not hold one."""


# -- values ---------------------------------------------------------------------------

def _enc(v: Any, index: dict[fx.Node, int]) -> Any:
    """A constant or node reference as JSON data; tagged one-key dicts for non-JSON types."""
    if isinstance(v, Phase):    # str enums: before str, or they come back as plain text
        return {"phase": v.value}
    if isinstance(v, TensorKind):
        return {"kind": v.value}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, fx.Node):
        return {"node": index[v]}
    if isinstance(v, list):
        return [_enc(x, index) for x in v]
    if isinstance(v, torch.Size):
        return {"size": [_enc(x, index) for x in v]}
    if isinstance(v, tuple):
        return {"tuple": [_enc(x, index) for x in v]}
    if isinstance(v, dict) and all(isinstance(k, (str, int)) for k in v):
        return {"dict": [[_enc(k, index), _enc(x, index)] for k, x in v.items()]}
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, torch.layout):
        return {"layout": str(v).removeprefix("torch.")}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v).removeprefix("torch.")}
    raise StoreError(f"cannot store a value of type {type(v).__qualname__}: {v!r:.80}")


# dtypes, layouts and memory formats by name, from torch's namespace as it is now: a name
# from a file is looked up here, never with getattr (which may import torch submodules)
_TORCH_CONSTANTS = {kind: {str(v).removeprefix("torch."): v for v in vars(torch).values() if isinstance(v, kind)}
                    for kind in (torch.dtype, torch.layout, torch.memory_format)}


def _torch_attr(name: Any, kind: type) -> Any:
    """``torch.<name>`` if it is a ``kind`` (a dtype, layout, memory format), else refused."""
    value = _TORCH_CONSTANTS[kind].get(name) if isinstance(name, str) else None
    if value is None:
        raise StoreError(f"not a torch {kind.__name__}: {name!r:.80}")
    return value


def _dec(v: Any, nodes: list[fx.Node]) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        return [_dec(x, nodes) for x in v]
    if not isinstance(v, dict) or len(v) != 1:
        raise StoreError(f"not an encoded value: {v!r:.80}")
    (tag, x), = v.items()
    if tag == "node":
        if not isinstance(x, int) or not 0 <= x < len(nodes):
            raise StoreError(f"reference to node {x!r:.20} before it exists")
        return nodes[x]
    if tag in ("tuple", "size", "dict") and not isinstance(x, list):
        raise StoreError(f"{tag} without a list: {x!r:.80}")
    if tag == "tuple":
        return tuple(_dec(e, nodes) for e in x)
    if tag == "size":
        return torch.Size(_dec(e, nodes) for e in x)
    if tag == "dict":
        return {_dec(k, nodes): _dec(e, nodes) for k, e in x}
    if tag == "phase":
        return Phase(x)
    if tag == "kind":
        return TensorKind(x)
    if tag == "dtype":
        return _torch_attr(x, torch.dtype)
    if tag == "layout":
        return _torch_attr(x, torch.layout)
    if tag == "memory_format":
        return _torch_attr(x, torch.memory_format)
    if tag == "device" and isinstance(x, str):
        return torch.device(x)
    raise StoreError(f"unknown value tag {tag!r:.40}")


# -- targets --------------------------------------------------------------------------

def _enc_target(node: fx.Node) -> Any:
    t = node.target
    if node.op in ("placeholder", "output"):
        return t
    if node.op != "call_function":
        raise StoreError(f"cannot store a {node.op} node: {node.format_node()}")
    if isinstance(t, torch._ops.OpOverload):
        if t.namespace not in OP_NAMESPACES:
            raise StoreError(f"operator of namespace {t.namespace!r} not stored: {node.format_node()}")
        return [t.namespace, t.overloadpacket.__name__.split(".")[-1], t._overloadname]
    if t in _PY_NAMES:
        return _PY_NAMES[t]
    raise StoreError(f"cannot store call target {t!r}: {node.format_node()}")


def _dec_target(op: str, t: Any) -> Any:
    if op in ("placeholder", "output"):
        if not isinstance(t, str):
            raise StoreError(f"{op} target is not a name: {t!r:.80}")
        return t
    if op != "call_function":
        raise StoreError(f"unknown node kind {op!r:.40}")
    if isinstance(t, str) and t in PY_OPERATORS:
        return PY_OPERATORS[t]
    if not (isinstance(t, list) and len(t) == 3 and all(isinstance(s, str) and s.isidentifier() for s in t)
            and t[0] in OP_NAMESPACES):
        raise StoreError(f"not a known operator: {t!r:.80}")
    namespace, name, overload = t
    packet = getattr(getattr(torch.ops, namespace), name, None)
    target = getattr(packet, overload, None) if isinstance(packet, torch._ops.OpOverloadPacket) else None
    if not isinstance(target, torch._ops.OpOverload):
        raise StoreError(f"no operator {namespace}::{name}.{overload} in this torch")
    return target


# -- fake values ----------------------------------------------------------------------

def _enc_val(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return {"tensor": [str(v.dtype).removeprefix("torch."), list(v.shape), list(v.stride()),
                           v.storage_offset(), str(v.device)]}
    if isinstance(v, (torch.SymFloat, torch.SymInt, torch.SymBool)):
        return {"symbol": type(v).__name__}
    if isinstance(v, (list, tuple)):
        return {"tuple" if isinstance(v, tuple) else "list": [_enc_val(x) for x in v]}
    if v is None or isinstance(v, (bool, int, float)):
        return {"const": v}
    raise StoreError(f"cannot store a value of type {type(v).__qualname__}")


class _Fakes:
    """Fake tensors on fake storages, one storage per ``dbml_storage`` id.

    Built directly as :class:`FakeTensor` over ``meta`` tensors, not through the fake
    mode's dispatch (ten times cheaper: DenseNet-121 has ~12,000 values)."""

    def __init__(self, storage_nbytes: list[int]):
        self.mode = FakeTensorMode(shape_env=shape_env(), static_shapes=True)
        self.nbytes = storage_nbytes
        self.bases: dict[int, torch.Tensor] = {}

    def tensor(self, spec: list, sid: Any) -> torch.Tensor:
        dtype_name, shape, stride, offset, device = spec
        dtype = _torch_attr(dtype_name, torch.dtype)
        if not isinstance(sid, int) or not 0 <= sid < len(self.nbytes):
            raise StoreError(f"tensor value without a storage id ({sid!r:.20})")
        base = self.bases.get(sid)
        if base is None:
            base = self.bases[sid] = torch.empty(self.nbytes[sid], dtype=torch.uint8, device="meta")
        typed = base if dtype == torch.uint8 else base.view(dtype)
        return FakeTensor(self.mode, typed.as_strided(shape, stride, offset), torch.device(device))

    def symbol(self, kind: str) -> Any:
        env = self.mode.shape_env
        if kind == "SymFloat":
            return env.create_unbacked_symfloat()
        if kind == "SymInt":
            return env.create_unbacked_symint()
        if kind == "SymBool":
            return env.create_unbacked_symbool()
        raise StoreError(f"unknown symbol kind {kind!r:.20}")


def _dec_val(v: Any, node: fx.Node, sid: Any, fakes: _Fakes) -> Any:
    """``node``'s fake value: tensors on their storage (``sid``, a tuple for a multi-output
    node), symbols unbacked (see below), constants as they are."""
    if not isinstance(v, dict) or len(v) != 1:
        raise StoreError(f"not an encoded value: {v!r:.80}")
    (tag, x), = v.items()
    if tag == "tensor" and isinstance(x, list) and len(x) == 5:
        return fakes.tensor(x, sid)
    if tag == "symbol":
        # A Python operator's result carries the symbol of its symbolic argument (the
        # step's scalar), not the traced expression: no stage reads the expression, and
        # rebuilding it through sympy took 2.5 s on ResNet-50.
        derived = [a.meta.get("val") for a in node.all_input_nodes] if node.target in _PY_NAMES else []
        same_kind = [v for v in derived if type(v).__name__ == x]
        return same_kind[0] if same_kind else fakes.symbol(x)
    if tag in ("list", "tuple") and isinstance(x, list):
        sids = sid if isinstance(sid, tuple) and len(sid) == len(x) else (None,) * len(x)
        out = [_dec_val(e, node, s, fakes) for e, s in zip(x, sids)]
        return tuple(out) if tag == "tuple" else out
    if tag == "const" and (x is None or isinstance(x, (bool, int, float))):
        return x
    raise StoreError(f"not an encoded value: {v!r:.80}")


# -- the step -------------------------------------------------------------------------

def _storage_nbytes(captured: CapturedStep) -> list[int]:
    owners = captured.meta["storage_owners"]
    nbytes = [0] * len(owners)
    for node in captured.graph.nodes:
        sid, val = node.meta.get("dbml_storage"), node.meta.get("val")
        pairs = zip(sid, val) if isinstance(sid, tuple) else [(sid, val)]
        for s, v in pairs:
            if isinstance(s, int) and isinstance(v, torch.Tensor):
                nbytes[s] = v.untyped_storage().nbytes()
    return nbytes


def encode(captured: CapturedStep) -> dict:
    """``captured`` as JSON data; :class:`StoreError` if some part has no safe encoding."""
    index: dict[fx.Node, int] = {}
    nodes = []
    for i, node in enumerate(captured.graph.nodes):
        meta = {k: _enc(node.meta[k], index) for k in _META_KEYS if k in node.meta}
        nodes.append([node.op, node.name, _enc_target(node), _enc(list(node.args), index),
                      _enc(dict(node.kwargs), index), meta, _enc_val(node.meta.get("val"))])
        index[node] = i
    fields = {f.name: _enc(getattr(captured, f.name), index) for f in dataclasses.fields(captured)
              if f.name not in (*_CALLER_FIELDS, "gm")}
    return {"format": FORMAT, "nodes": nodes, "storage_nbytes": _storage_nbytes(captured),
            "fields": fields}


def decode(doc: Any, spec: OptimizerSpec, signature: tuple, job: str) -> CapturedStep:
    """The captured step ``doc`` holds (see :func:`encode`); :class:`StoreError` if it is
    not one. ``spec``, ``signature`` and ``job`` are the caller's (the key covers them)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise StoreError("not a captured step of this format")
    nbytes = doc.get("storage_nbytes")
    if not (isinstance(nbytes, list) and all(isinstance(n, int) and n >= 0 for n in nbytes)):
        raise StoreError("storage sizes missing")
    graph = fx.Graph()
    graph.set_codegen(fx.graph.CodeGen())   # as capture leaves it: flat inputs, a flat output
    fakes, nodes = _Fakes(nbytes), []
    for rec in doc.get("nodes", ()):
        nodes.append(_dec_node(graph, rec, nodes, fakes))
    fields = doc.get("fields")
    if not isinstance(fields, dict):
        raise StoreError("step fields missing")
    values = {name: _dec(v, nodes) for name, v in fields.items()}
    values["updates"] = {int(o): int(p) for o, p in values.get("updates", {}).items()}
    known = {f.name for f in dataclasses.fields(CapturedStep)} - {*_CALLER_FIELDS, "gm"}
    if set(values) != known:
        raise StoreError(f"step fields {sorted(values)}, expected {sorted(known)}")
    graph.lint()
    # generates the module's Python code on its first call only: no stage calls it, and
    # the code of DenseNet-121's graph takes a second to generate and compile
    gm = _LazyGraphModule(torch.nn.Module(), graph)
    return CapturedStep(gm=gm, spec=spec, signature=signature, job=job, **values)


def _dec_node(graph: fx.Graph, rec: Any, nodes: list[fx.Node], fakes: _Fakes) -> fx.Node:
    if not (isinstance(rec, list) and len(rec) == 7 and isinstance(rec[0], str) and isinstance(rec[1], str)
            and isinstance(rec[3], list) and isinstance(rec[5], dict)):
        raise StoreError(f"not a node record: {rec!r:.80}")
    op, name, target, args, kwargs, meta, val = rec
    kwargs = _dec(kwargs, nodes)
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise StoreError(f"node {name!r:.40}: keyword arguments are not a dict")
    node = graph.create_node(op, _dec_target(op, target), tuple(_dec(args, nodes)), kwargs, name=name)
    if node.name != name:
        raise StoreError(f"node {name!r:.40} came back as {node.name!r}")
    for key, v in meta.items():
        if key not in _META_KEYS:
            raise StoreError(f"node {name!r:.40}: unknown annotation {key!r:.40}")
        node.meta[key] = _dec(v, nodes)
    if op != "output":
        node.meta["val"] = _dec_val(val, node, node.meta.get("dbml_storage"), fakes)
    return node


# -- files ----------------------------------------------------------------------------

def save(path: Path, key: str, captured: CapturedStep) -> None:
    """Write ``captured`` under ``path`` atomically (a temporary file renamed over it), so
    a concurrent reader sees the old file, the new one or none. StoreError (nothing
    written) if the step has no safe encoding; OSError if the folder is not writable."""
    doc = encode(captured)
    doc["key"] = key
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path, key: str, spec: OptimizerSpec, signature: tuple, job: str) -> CapturedStep:
    """The step saved under ``path`` for ``key``; StoreError if the file holds something
    else (another key, another format, a damaged or hand-edited file), OSError if unreadable."""
    try:
        doc = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise StoreError(f"{path.name}: not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("key") != key:
        raise StoreError(f"{path.name}: saved for another key")
    try:
        return decode(doc, spec, signature, job)
    except StoreError:
        raise
    except Exception as e:  # noqa: BLE001 - any malformed content is a refused file
        raise StoreError(f"{path.name}: {type(e).__name__}: {e}") from None
