"""Measuring the peak device memory of a call: the vanilla side of MSR.

On CUDA the allocator's statistics are the truth (``torch.cuda.max_memory_allocated``).
On CPU there is no allocator to ask, so :class:`PeakMeter` counts storages instead: a
``TorchDispatchMode`` that sees every aten op run on the calling thread (forward,
autograd's backward and the optimizer alike) and keeps, per live storage, its bytes.

* A storage is counted once, however many views of it exist (``StorageWeakRef`` keys).
* A storage stops counting as soon as it is freed: before each op's outputs are
  counted, expired weak references are dropped. Peaks happen only when outputs are
  allocated, so sampling there is exact for everything that passes the dispatcher.
* Tensors alive before the call (parameters, optimizer state, gradients, the batch) are
  either given up front (``base``) or discovered on first use as an op input. A tensor
  discovered that way existed before the call, so it is counted as alive from the start:
  its bytes are added to the peak so far as well (exact, since it was alive throughout).
  Pass ``discover=False`` where inputs may appear mid-call from elsewhere (another
  thread's copies) and use :meth:`PeakMeter.track` for them instead.
* Not seen: scratch memory a kernel allocates and frees inside one op, and ops run on
  other threads (a TorchDispatchMode is thread-local).

Usage::

    with PeakMeter(live_tensors(model, optimizer, x, y)) as meter:
        step.step(x, y)
    meter.peak_bytes          # the largest total of live storages during the step
    meter.base_bytes          # what was alive when it started

or ``loss, peak = measure_peak(lambda: step.step(x, y), live_tensors(model, opt, x, y))``
which uses the CUDA allocator's statistics when ``device`` is a CUDA device.

Do not keep your own reference to the list of base tensors while measuring (pass it as
a temporary): the meter holds weak references only, but a list you hold keeps its
tensors alive, e.g. last step's gradients through ``zero_grad(set_to_none=True)``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["PeakMeter", "measure_peak", "live_tensors"]


def _tensors(obj: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(obj)
    out = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        elif isinstance(leaf, (list, tuple, set, frozenset, dict)):
            # containers only: a storage (an op's argument in set_/storage views) is
            # iterable too, byte by byte
            out.extend(t for t in (leaf.values() if isinstance(leaf, dict) else leaf) if isinstance(t, torch.Tensor))
    return out


def live_tensors(model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, *extra: Any) -> list[torch.Tensor]:
    """The tensors a training step touches that exist before it: parameters, their
    gradients, buffers, optimizer state, and whatever else is given (the batch)."""
    found: list[torch.Tensor] = []
    if model is not None:
        for p in model.parameters():
            found.append(p)
            if p.grad is not None:
                found.append(p.grad)
        found.extend(model.buffers())
    if optimizer is not None:
        for state in optimizer.state.values():
            found.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    for e in extra:
        found.extend(_tensors(e))
    return found


class PeakMeter(TorchDispatchMode):
    """Exact peak of live tensor storages on ``device`` (a device type, default cpu)
    while the context is active on this thread."""

    def __init__(self, base: Iterable[torch.Tensor] = (), *, device: str = "cpu",
                 discover: bool = True):
        super().__init__()
        self.device = torch.device(device).type
        self.discover = discover
        self._live: dict[StorageWeakRef, int] = {}
        self.current_bytes = 0
        self.peak_bytes = 0
        self.base_bytes = 0
        self.ops = 0
        for t in _tensors(list(base)):
            self._add(t)
        self.base_bytes = self.current_bytes

    # -- bookkeeping -------------------------------------------------------------
    def _key(self, t: torch.Tensor) -> tuple[StorageWeakRef, int] | None:
        if (type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter)) \
                or t.layout is not torch.strided or t.device.type != self.device:
            return None
        storage = t.untyped_storage()
        return StorageWeakRef(storage), storage.nbytes()

    def _add(self, t: torch.Tensor) -> int:
        """Count ``t``'s storage if new (or grown); return the bytes added."""
        key = self._key(t)
        if key is None:
            return 0
        ref, nbytes = key
        old = self._live.get(ref, 0)
        added = nbytes - old if (ref not in self._live or nbytes > old) else 0
        if added:
            self._live[ref] = nbytes
            self.current_bytes += added
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        return added

    def _prune(self) -> None:
        dead = [ref for ref in self._live if ref.expired()]
        for ref in dead:
            self.current_bytes -= self._live.pop(ref)

    def track(self, t: torch.Tensor) -> None:
        """Count a tensor that became live now without passing this thread's dispatcher
        (e.g. a copy made on another thread)."""
        self._prune()
        self._add(t)

    # -- dispatch ----------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._prune()
        inputs = set()
        for t in _tensors((args, kwargs)):
            key = self._key(t)
            if key is None:
                continue
            inputs.add(key[0])
            if self.discover and key[0] not in self._live:
                # alive before the call and untouched so far: alive throughout
                self._live[key[0]] = key[1]
                self.current_bytes += key[1]
                self.peak_bytes += key[1]
        out = func(*args, **kwargs)
        self.ops += 1
        for t in _tensors(out):
            key = self._key(t)
            if key is not None and key[0] in inputs and key[0] not in self._live:
                continue  # a view of (or write into) an input that is not counted
            self._add(t)
        return out


def measure_peak(fn: Callable[[], Any], base: Iterable[torch.Tensor] = (), *,
                 device: str | torch.device = "cpu") -> tuple[Any, int]:
    """Run ``fn()`` and return ``(its result, peak bytes)`` on ``device``.

    CUDA: the allocator's peak during the call (``max_memory_allocated`` after a reset),
    which already includes everything alive before it. CPU: :class:`PeakMeter`."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        return result, torch.cuda.max_memory_allocated(device)
    meter = PeakMeter(base, device=device.type)
    del base  # the meter keeps weak references only: holding the list would keep e.g.
    # last step's gradients alive through zero_grad(set_to_none=True) and inflate the peak
    with meter:
        result = fn()
    return result, meter.peak_bytes
