"""The zoo's registry: the built-in architectures (:data:`ARCHS`), custom ones registered from
Python (:func:`register_model`), option checking and building by name.

A model is named by its arch and options in the catalog and rebuilt by :func:`build`; nothing
from SQL imports or runs code: a custom arch exists only once Python registered it in this
process. Built-ins, in this order (:func:`describe` lists them so, then the custom ones):
tabular ``linear``, ``mlp``, ``resnet_tabular``, ``ft_transformer``; image ``cnn``,
``resnet18``, ``resnet50``, ``vgg16``, ``densenet121``, ``inception_v3``, ``inception_v4``;
tokens ``bow``; tokens and series ``transformer``, ``tcn``.

dbml's own model kinds (``dbml/kinds/``: ``dnn``, ``boosted_tree``, ``random_forest``, ``kmeans``)
are registered here too, listed by entry (:data:`KINDS_ENTRY`) and loaded on the registry's
first use, before any custom arch: :func:`fitter` says which of them are fitted, not stepped.
"""

from __future__ import annotations

import difflib
import importlib
import json
import math
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from ..errors import InvalidArgument
from . import sequence, tabular, vision, vision_inception, vision_resnet, vision_vgg_densenet
from .inputs import KINDS, Inputs

MIN_IMAGE_SIDE = 8   # the built-in image models' smallest height / width
# The built-ins' largest option values: a model is built (on the meta device) before its size
# is checked against memory, and building a million layers alone takes minutes.
MAX_LAYERS = 256                 # depth, and the number of hidden layers
MAX_UNITS = 1 << 20              # a width, a hidden layer's size, heads, ff, kernel
MAX_FACTOR = 64.0                # a multiplier option (width of the CNNs, hidden_factor, ff_factor)
LAYER_OPTIONS = ("depth",)


@dataclass(frozen=True)
class Arch:
    name: str
    kinds: tuple[str, ...]          # input kinds it accepts
    factory: Callable               # factory(inputs: Inputs, outputs: int, **options) -> nn.Module
    options: dict = field(default_factory=dict)   # every option with its default
    doc: str = ""
    builtin: bool = True
    # a fitted kind (trees, k-means): fit(cur, table, prep, spec, n_train, n_val, progress), which
    # training calls on the job's scratch table instead of stepping a runner; None: stepped
    fit: Callable | None = None


ARCHS: dict[str, Arch] = {
    name: Arch(name, kinds, factory, options, doc)
    for module in (tabular, vision, vision_resnet, vision_vgg_densenet, vision_inception, sequence)
    for name, kinds, factory, options, doc in module.ENTRIES}

_CUSTOM: dict[str, Arch] = {}
_LOCK = threading.Lock()

# dbml's own kinds, by entry as a plugin's entry point names them: the module whose ``ARCHS``
# maps each kind's arch to (factory, options, doc, fit). A name, not an import: the kinds
# build on dbml's models, which build on this registry. They take tabular inputs and their
# options are checked as a custom arch's (by type, not the built-ins' ranges).
KINDS_ENTRY = "dbml.core.kinds:ARCHS"
_KINDS_LOADED = threading.Event()
_KINDS_LOCK = threading.Lock()


def _load_kinds() -> None:
    """Register dbml's kinds (:data:`KINDS_ENTRY`) once, before any other use of the registry,
    so that a custom arch registered from Python may replace one, as it may any custom arch."""
    if _KINDS_LOADED.is_set():
        return
    with _KINDS_LOCK:
        if _KINDS_LOADED.is_set():
            return
        module, _, attribute = KINDS_ENTRY.partition(":")
        entries = getattr(importlib.import_module(module), attribute)
        with _LOCK:
            for name, (factory, options, doc, fit) in entries.items():
                _CUSTOM[name] = Arch(name, ("tabular",), factory, dict(options), doc, builtin=False, fit=fit)
        _KINDS_LOADED.set()

AUTO = {"tabular": "mlp", "tokens": "transformer", "series": "tcn"}
WHAT = {"tabular": "tabular columns", "image": "images", "tokens": "token sequences (text or integer lists)",
        "series": "numeric series"}


def register_model(name: str, factory: Callable, *, kinds=KINDS, options: dict | None = None,
                   doc: str = "") -> None:
    """Make ``factory(inputs, outputs, **options) -> nn.Module`` trainable as ``arch := name``.
    ``options``: every option the factory takes, with its default (none by default).
    Re-registering a custom name replaces it; a built-in name is refused."""
    fn = "register_model"
    if not isinstance(name, str) or not name.isidentifier():
        raise InvalidArgument(f"{fn}(): name must be a plain identifier such as 'my_tcn', got {name!r}")
    if name in ARCHS or name == "auto":
        raise InvalidArgument(f"{fn}(): {name!r} is a built-in arch; pick another name, e.g. 'my_{name}'")
    if not callable(factory):
        raise InvalidArgument(f"{fn}(): factory must be callable as factory(inputs, outputs, **options)")
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    if not kinds or set(kinds) - set(KINDS):
        raise InvalidArgument(f"{fn}(): kinds must be a non-empty subset of {', '.join(KINDS)}, got {kinds!r}")
    if options is not None and not isinstance(options, dict):
        raise InvalidArgument(f"{fn}(): options must be a dict of option name -> default")
    _load_kinds()
    with _LOCK:
        _CUSTOM[name] = Arch(name, kinds, factory, dict(options or {}), doc or f"registered from Python: {factory!r}",
                             builtin=False)


def unregister_model(name: str) -> None:
    """Forget the custom arch ``name`` (no error if it is not registered)."""
    _load_kinds()
    with _LOCK:
        _CUSTOM.pop(name, None)


def _names() -> list[str]:
    _load_kinds()
    with _LOCK:
        return list(ARCHS) + list(_CUSTOM)


def arch(name: str, *, fn: str = "train") -> Arch:
    """The arch called ``name`` (resolve 'auto' with :func:`auto` first)."""
    found = _find(name)
    if found is not None:
        return found
    names = ["auto", *_names()]
    close = difflib.get_close_matches(str(name), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise InvalidArgument(f"{fn}(): unknown arch {name!r}{hint}; pass arch := one of "
                          f"{', '.join(map(repr, names))}, or register your own with "
                          f"dbml.register_model(name, factory)")


def _find(name: str) -> Arch | None:
    _load_kinds()
    with _LOCK:
        return ARCHS.get(name) or _CUSTOM.get(name)


def fitter(name: str) -> Callable | None:
    """The fit of arch ``name`` if it is a fitted kind (``Arch.fit``); None for a stepped arch,
    'auto' or a name not registered."""
    found = _find(name)
    return found.fit if found is not None else None


# arch := 'auto' by input size and row count (issue 24): a ResNet-18 on small images or few
# rows cost several times a small CNN's time for no better accuracy (48-pixel patches: 6x the
# time of 64-pixel ones through its stride-1 stem, ~1.5 h at the default epochs), and a
# transformer on a few thousand texts fell below a bag of words (0.70 against TF-IDF + LR's
# 0.79, in 50x the time).
AUTO_RESNET_SIDE = 64          # images at least this many pixels on their shorter side ...
AUTO_RESNET_ROWS = 20_000      # ... and at least this many training rows get a ResNet-18
AUTO_BOW_ROWS = 100_000        # texts / token lists: a bag of words below this many rows


def auto(inputs: Inputs, rows: int | None = None) -> str:
    """The arch ``arch := 'auto'`` picks for ``inputs`` and ``rows`` training rows."""
    many = rows is None or rows >= AUTO_RESNET_ROWS
    if inputs.kind == "image":
        return "resnet18" if min(inputs.shape[1:]) >= AUTO_RESNET_SIDE and many else "cnn"
    if inputs.kind == "tokens" and (rows is not None and rows < AUTO_BOW_ROWS):
        return "bow"
    return AUTO[inputs.kind]


def archs_for(kind: str) -> list[str]:
    """Names of the archs (built-in, then custom) that take ``kind`` inputs."""
    _load_kinds()
    with _LOCK:
        return [a.name for a in (*ARCHS.values(), *_CUSTOM.values()) if kind in a.kinds]


def resolve_options(a: Arch, options: dict | None, inputs: Inputs, *, fn: str = "train") -> dict:
    """``a``'s defaults merged with ``options``, each checked against its default's type (and, for
    the built-ins, its range); InvalidArgument naming the option, the arch and the fix."""
    if inputs.kind not in a.kinds:
        others = ", ".join(map(repr, archs_for(inputs.kind)))
        raise InvalidArgument(f"{fn}(): arch {a.name!r} takes {' or '.join(a.kinds)} inputs; the source gives "
                              f"{WHAT[inputs.kind]}; pass arch := 'auto' or one of {others}")
    if a.builtin and inputs.kind == "image" and min(inputs.shape[1:]) < MIN_IMAGE_SIDE:
        raise InvalidArgument(f"{fn}(): arch {a.name!r} needs images of at least {MIN_IMAGE_SIDE}x{MIN_IMAGE_SIDE} "
                              f"pixels, got {inputs.shape[1]}x{inputs.shape[2]}; pass a larger image_size")
    resolved = {**a.options, **checked_options(a, options, fn=fn)}
    if a.builtin and "heads" in resolved and resolved["width"] % resolved["heads"]:
        raise InvalidArgument(f"{fn}(): option width ({resolved['width']}) of arch {a.name!r} must be a "
                              f"multiple of heads ({resolved['heads']}); e.g. width := {8 * resolved['heads']}")
    return resolved


def checked_options(a: Arch, options: dict | None, *, fn: str = "train") -> dict:
    """``options`` each checked against ``a``'s default's type (and, for the built-ins, its
    range), converted to it: the checks that need no data, so that train() and each value of
    a tune() space are refused before anything runs; InvalidArgument naming the option."""
    given = dict(options or {})
    unknown = [k for k in given if k not in a.options]
    if unknown:
        allowed = ", ".join(f"{k} (default {_show(v)})" for k, v in a.options.items()) or "none"
        close = difflib.get_close_matches(str(unknown[0]), list(a.options), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InvalidArgument(f"{fn}(): unknown option {unknown[0]!r}{hint} for arch {a.name!r}; "
                              f"its options are: {allowed}")
    return {key: _checked(a, key, value, fn) for key, value in given.items()}


def _show(v) -> str:
    return json.dumps(list(v) if isinstance(v, tuple) else v)


def _checked(a: Arch, key: str, value, fn: str):
    """``value`` for option ``key`` converted to its default's type, or InvalidArgument."""
    default = a.options[key]
    where = f"{fn}(): option {key!r} of arch {a.name!r}"
    if isinstance(value, float) and value.is_integer() and isinstance(default, int) and not isinstance(default, bool):
        value = int(value)   # SQL may hand 32 as 32.0
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, bool):
        ok, value, expect = isinstance(value, bool), value, "true or false"
    elif isinstance(default, int):
        ok, expect = is_int and (value >= 1 or not a.builtin), "a positive integer"
    elif isinstance(default, float):
        ok = (is_int or isinstance(value, float)) and math.isfinite(value)
        value = float(value) if ok else value
        dropout = "dropout" in key
        expect = "a number in [0, 1)" if dropout else "a positive number"
        if ok and a.builtin:
            ok = 0.0 <= value < 1.0 if dropout else value > 0.0
    elif isinstance(default, tuple):
        ok = isinstance(value, (list, tuple)) and len(value) > 0 and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
        value, expect = tuple(value) if ok else value, "a non-empty list of positive integers"
    elif isinstance(default, str):
        ok, expect = isinstance(value, str), "a string"
    else:
        ok, expect = True, ""
    if not ok:
        raise InvalidArgument(f"{where} must be {expect} (default {_show(default)}), got {value!r}")
    if a.builtin:
        _within_limits(key, value, where)
    return value


def _within_limits(key: str, value, where: str) -> None:
    """A built-in's option within MAX_LAYERS / MAX_UNITS / MAX_FACTOR, or InvalidArgument."""
    if isinstance(value, bool) or isinstance(value, str):
        return
    if isinstance(value, tuple):
        if len(value) > MAX_LAYERS or max(value) > MAX_UNITS:
            raise InvalidArgument(f"{where} may list at most {MAX_LAYERS} layers of at most {MAX_UNITS} units, "
                                  f"got {len(value)} layers up to {max(value)}")
        return
    limit = MAX_LAYERS if key in LAYER_OPTIONS else MAX_UNITS if isinstance(value, int) else MAX_FACTOR
    if "dropout" not in key and value > limit:
        raise InvalidArgument(f"{where} must be at most {limit:g}, got {value!r}")


def build(name: str, inputs: Inputs, outputs: int, options: dict | None = None, *, fn: str = "train") -> nn.Module:
    """The model ``name`` (or 'auto') for ``inputs`` with ``outputs`` outputs; its initial weights
    come from torch's global generator (seed around the call)."""
    if not isinstance(outputs, int) or outputs < 1:
        raise InvalidArgument(f"{fn}(): a model needs at least one output, got {outputs!r}")
    a = arch(auto(inputs) if name == "auto" else name, fn=fn)
    model = a.factory(inputs, outputs, **resolve_options(a, options, inputs, fn=fn))
    if not isinstance(model, nn.Module):
        raise InvalidArgument(f"{fn}(): the factory registered for arch {a.name!r} returned "
                              f"{type(model).__name__}, not a torch.nn.Module")
    _materialise(model, inputs, a.name, fn)
    return model


def _materialise(model: nn.Module, inputs: Inputs, name: str, fn: str) -> None:
    """Lazy modules (``nn.LazyLinear``, ...) get their shapes from a first batch, as in
    PyTorch: here, one sample batch in eval mode and without gradients, before the model
    is counted, captured or loaded (on the meta device too: nothing is computed there)."""
    from torch.nn.modules.lazy import LazyModuleMixin
    lazy = [m for m in model.modules() if isinstance(m, LazyModuleMixin) and m.has_uninitialized_params()]
    if not lazy:
        return
    training = model.training
    param = next((p for p in model.parameters() if not isinstance(p, nn.parameter.UninitializedParameter)), None)
    device = param.device if param is not None else None
    try:
        with torch.no_grad():
            model.eval()
            model(inputs.sample(1, device))
    except Exception as e:   # noqa: BLE001 - the user's module: say which and why
        raise InvalidArgument(f"{fn}(): arch {name!r} has lazy modules ({type(lazy[0]).__name__}) and failed on a "
                              f"sample batch sizing them: {type(e).__name__}: {e}") from None
    finally:
        model.train(training)


def describe() -> list[dict]:
    """One row per arch (built-ins in order, then custom): name, kinds, options (JSON), doc, builtin."""
    _load_kinds()
    with _LOCK:
        archs = [*ARCHS.values(), *_CUSTOM.values()]
    return [{"name": a.name, "kinds": list(a.kinds), "options": json.dumps({k: _plain(v) for k, v in a.options.items()}),
             "doc": a.doc, "builtin": a.builtin} for a in archs]


def _plain(v):
    return list(v) if isinstance(v, tuple) else v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)
