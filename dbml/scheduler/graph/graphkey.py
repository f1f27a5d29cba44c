"""The key of a captured step in the on-disk graph cache: what determines the traced graph.

:func:`graph_key` hashes a canonical description of everything capture depends on:

* the model: per module (shared modules under each of their paths) its class, the
  source of every non-torch class in its MRO (the whole source file it is defined in,
  so a helper function beside the class counts too), and its attributes (``stride``,
  ``eps``, ``p``, ``training``, ...; nested plain objects by class and attributes);
  per parameter and buffer its name, shape, stride, storage offset, dtype, device,
  ``requires_grad`` and which tensor it is (ties);
* the loss function: a function by its qualified name, its code and its file's source,
  a module as the model is;
* the optimizer spec, the batch (shape, stride, dtype, device of ``x`` and ``y``), the
  capture options, torch's default dtype, the torch and Python versions, the file
  format's version and the source of the capture itself (``capture.py``, ``optim.py``,
  ``stacked.py``, ``store.py``: a change to how graphs are traced or annotated invalidates
  every file).

Torch's own classes are described by name and attributes: the torch version covers
their code. A model that cannot be described reliably is not cached
(:class:`Undescribable`, with the reason): a class without source (defined in a REPL or
by ``exec``), a forward or backward hook (code outside the class), an attribute of a
type the description does not know. Code a module's ``forward`` calls in another file
is not covered: edit such a helper and the cache must be cleared (or the format bumped).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import json
import marshal
import sys
import types
from typing import Any

import torch

from . import capture as capture_module, optim as optim_module, stacked as stacked_module, store as store_module
from .optim import OptimizerSpec
from .store import FORMAT

__all__ = ["graph_key", "Undescribable", "describe"]

MAX_DEPTH = 8   # nested plain objects followed this deep, no further

# Module attributes that are not configuration: its tensors and children are described
# apart, hooks are checked apart, and the rest only matter to state_dict or bookkeeping.
_SKIPPED_ATTRS = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
                  "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                  "_load_state_dict_post_hooks", "_is_full_backward_hook", "_compiled_call_impl"}
_CODE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


class Undescribable(Exception):
    """The model or loss cannot be described reliably enough to key a cached graph."""


@functools.lru_cache(maxsize=None)
def _file_hash(module_name: str) -> str:
    module = sys.modules.get(module_name)
    try:
        source = inspect.getsource(module) if module is not None else None
    except (OSError, TypeError):
        source = None
    if source is None:
        raise Undescribable(f"no source for module {module_name!r}")
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _is_torch(module_name: str) -> bool:
    return module_name == "torch" or module_name.startswith("torch.")


def _class_id(cls: type) -> list:
    """The class by name, and the source of each non-torch class in its MRO."""
    own = [[c.__module__, c.__qualname__, _file_hash(c.__module__)]
           for c in cls.__mro__ if c is not object and not _is_torch(c.__module__)]
    return [f"{cls.__module__}.{cls.__qualname__}", own]


def _function(fn: Any, depth: int) -> list:
    if isinstance(fn, functools.partial):
        return ["partial", _value(fn.func, depth), _value(list(fn.args), depth), _value(fn.keywords, depth)]
    if isinstance(fn, types.MethodType):
        return ["method", _value(fn.__self__, depth), _function(fn.__func__, depth)]
    module = getattr(fn, "__module__", None) or ""
    name = f"{module}.{getattr(fn, '__qualname__', repr(fn))}"
    if not isinstance(fn, types.FunctionType):
        return ["builtin", name]   # a C function (torch's, operator's): the versions cover it
    cells = [c.cell_contents for c in fn.__closure__ or ()]
    code = hashlib.sha256(marshal.dumps(fn.__code__)).hexdigest()[:16]
    source = "" if _is_torch(module) else _file_hash(module)
    return ["function", name, code, source, _value(cells, depth), _value(fn.__defaults__, depth)]


def _value(v: Any, depth: int = 0) -> Any:
    """A JSON description of a configuration value (Undescribable if unknown)."""
    if depth > MAX_DEPTH:
        raise Undescribable("attributes nested too deep")
    depth += 1
    if isinstance(v, enum.Enum):   # before str and int: str and int enums are both
        return ["enum", _class_id(type(v)), repr(v.value)]
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return ["float", repr(v)]   # repr: exact, and NaN/inf as text
    if isinstance(v, (list, tuple)):
        return [type(v).__name__, [_value(x, depth) for x in v]]
    if isinstance(v, (set, frozenset)):
        return ["set", sorted(json.dumps(_value(x, depth)) for x in v)]
    if isinstance(v, dict):
        return ["dict", sorted([json.dumps(_value(k, depth)), _value(x, depth)] for k, x in v.items())]
    if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return ["torch", str(v)]
    if isinstance(v, torch.Tensor):
        if v.device.type == "meta":
            raise Undescribable("a tensor attribute on the meta device (no data to describe)")
        return ["tensor", _tensor(v), hashlib.sha256(v.detach().cpu().contiguous().view(-1)
                                                    .view(torch.uint8).numpy().tobytes()).hexdigest()[:16]]
    if isinstance(v, torch.nn.Module):
        return ["module", _modules(v)]
    if isinstance(v, type):
        return ["class", _class_id(v)]
    if callable(v) and not hasattr(v, "__dict__") or isinstance(v, (types.FunctionType, types.MethodType,
                                                                     functools.partial, types.BuiltinFunctionType)):
        return _function(v, depth)
    if dataclasses.is_dataclass(v) or hasattr(v, "__dict__"):
        return ["object", _class_id(type(v)), _value(dict(vars(v)), depth)]
    raise Undescribable(f"cannot describe a {type(v).__qualname__}")


def _tensor(t: torch.Tensor) -> list:
    return [list(t.shape), list(t.stride()), t.storage_offset(), str(t.dtype), str(t.device), t.requires_grad]


def _attributes(module: torch.nn.Module) -> Any:
    for hooks in _CODE_HOOKS:
        if getattr(module, hooks, None):
            raise Undescribable(f"{type(module).__qualname__} has {hooks.strip('_').replace('_', ' ')}")
    attrs = {k: v for k, v in vars(module).items() if k not in _SKIPPED_ATTRS and not k.endswith("hooks")
             and not k.startswith("_forward_hooks") and not k.startswith("_forward_pre_hooks")}
    attrs["_buffer_slots"] = sorted(module._buffers)   # None-valued ones included
    attrs["_parameter_slots"] = sorted(module._parameters)
    attrs["_non_persistent"] = sorted(module._non_persistent_buffers_set)
    return _value(attrs)


def _modules(model: torch.nn.Module) -> dict:
    """Per module path its class and attributes; per tensor its layout and identity."""
    modules = [[path, _class_id(type(m)), _attributes(m)]
               for path, m in model.named_modules(remove_duplicate=False)]
    first: dict[int, str] = {}
    tensors = []
    for kind, named in (("param", model.named_parameters(remove_duplicate=False)),
                        ("buffer", model.named_buffers(remove_duplicate=False))):
        for name, t in named:
            tensors.append([kind, name, _tensor(t), first.setdefault(id(t), name)])
    return {"modules": modules, "tensors": tensors}


def _global_hooks() -> bool:
    from torch.nn.modules import module as nn_module
    return any(getattr(nn_module, name, None) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks"))


def describe(model: torch.nn.Module, loss_fn: Any, spec: OptimizerSpec, x: torch.Tensor,
             y: torch.Tensor, options: dict | None = None) -> dict:
    """Everything the traced graph depends on, as JSON data (see the module docstring)."""
    if _global_hooks():
        raise Undescribable("global module hooks are registered")
    return {"format": FORMAT, "torch": torch.__version__, "python": list(sys.version_info[:2]),
            "capture": [_file_hash(m.__name__) for m in (capture_module, optim_module, stacked_module, store_module)],
            "default_dtype": str(torch.get_default_dtype()), "model": _modules(model),
            "loss": _value(loss_fn), "optimizer": _value(dataclasses.asdict(spec)),
            "batch": [_tensor(x), _tensor(y)], "options": _value(options or {})}


def graph_key(model: torch.nn.Module, loss_fn: Any, spec: OptimizerSpec, x: torch.Tensor,
              y: torch.Tensor, options: dict | None = None) -> str:
    """A hex digest naming the captured step of these inputs (raises Undescribable)."""
    text = json.dumps(describe(model, loss_fn, spec, x, y, options), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
