"""Captured graphs by batch signature, for one job and shared across jobs.

A job captures one graph per batch signature (the last, smaller batch gets its own).
Jobs whose models share an architecture name share captures process-wide: a capture
costs seconds, and the captured graph is functional, so it holds no job's tensors.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from typing import Hashable

import torch

from .capture import CapturedStep, batch_signature, capture
from .optim import OptimizerSpec

__all__ = ["GraphCache", "SHARED_GRAPHS"]

# Captures shared across jobs (GraphCache(share=...)), least recently used dropped first.
SHARED_GRAPHS = 32
_SHARED_GRAPHS: OrderedDict[Hashable, CapturedStep] = OrderedDict()
_SHARED_KEY_LOCKS: dict[Hashable, threading.Lock] = {}
_SHARED_LOCK = threading.Lock()


class GraphCache:
    """One captured graph per batch signature (the last, smaller batch gets its own).

    ``share``: a name for the model's architecture under which jobs share captures
    process-wide: a job whose model has the same name, parameter and buffer shapes,
    loss function (the same object), optimizer spec and batch signature reuses the graph
    another job captured instead of tracing again (seconds per graph; the graph is
    functional, so it does not hold the other job's tensors). Give it only where equal
    names mean equal ``forward`` code, as a model zoo's configuration does.
    """

    def __init__(self, model, loss_fn, spec: OptimizerSpec, *, job: str = "job", share: Hashable | None = None):
        self.model, self.loss_fn, self.spec, self.job, self.share = model, loss_fn, spec, job, share
        self._graphs: dict[tuple, CapturedStep] = {}
        self.shared_hits = 0

    def get(self, x: torch.Tensor, y: torch.Tensor) -> CapturedStep:
        sig = batch_signature(x, y)
        if sig not in self._graphs:
            self._graphs[sig] = self._capture(x, y) if self.share is None else self._shared(sig, x, y)
        return self._graphs[sig]

    def _capture(self, x, y) -> CapturedStep:
        return capture(self.model, self.loss_fn, self.spec, (x, y), job=self.job)

    def _shared(self, sig: tuple, x, y) -> CapturedStep:
        key = (self.share, type(self.model).__qualname__, self.loss_fn, self.spec, sig, self.model.training,
               tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in self.model.named_parameters()),
               tuple((n, tuple(b.shape), b.dtype) for n, b in self.model.named_buffers()))
        with _SHARED_LOCK:
            lock = _SHARED_KEY_LOCKS.setdefault(key, threading.Lock())
        with lock:   # one capture per key; the others wait for it
            with _SHARED_LOCK:
                hit = _SHARED_GRAPHS.get(key)
                if hit is not None:
                    _SHARED_GRAPHS.move_to_end(key)
            if hit is None:
                hit = self._capture(x, y)
                with _SHARED_LOCK:
                    _SHARED_GRAPHS[key] = hit
                    while len(_SHARED_GRAPHS) > SHARED_GRAPHS:
                        _SHARED_KEY_LOCKS.pop(_SHARED_GRAPHS.popitem(last=False)[0], None)
            else:
                self.shared_hits += 1
        return dataclasses.replace(hit, job=self.job)

    def __len__(self) -> int:
        return len(self._graphs)
