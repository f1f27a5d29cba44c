"""Captured graphs by batch signature, for one job, shared across jobs and across processes.

A job captures one graph per batch signature (the last, smaller batch gets its own).
Jobs whose models share an architecture name share captures process-wide: a capture
costs seconds, and the captured graph is functional, so it holds no job's tensors.

Across processes, captures are cached on disk (``<cache>/graphs/<key>.json``, see
:func:`~..config.graph_cache_dir`; ``DBML_GRAPH_CACHE=0`` switches it off): the key
hashes a description of the model, the loss, the optimizer, the batch and the torch
version (:mod:`.graphkey`), the file is plain JSON (:mod:`.store`), written atomically.
A file that does not load (damaged, another format, an operator this torch lacks) is
ignored and the step captured afresh; a model that cannot be described reliably (a class
without source, a forward hook) is captured every time (``GraphCache.uncached`` says why).
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections import OrderedDict
from typing import Hashable

import torch

from .. import config
from . import store
from .capture import CapturedStep, batch_signature, capture
from .graphkey import Undescribable, graph_key
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

    ``options``: keyword arguments of :func:`~.capture.capture`, part of the disk key.
    ``disk_hits`` counts graphs loaded from the disk cache; ``uncached`` says why the
    last graph was not read from or written to it (None: it was, or the cache is off).
    """

    def __init__(self, model, loss_fn, spec: OptimizerSpec, *, job: str = "job", share: Hashable | None = None,
                 options: dict | None = None):
        self.model, self.loss_fn, self.spec, self.job, self.share = model, loss_fn, spec, job, share
        self.options = dict(options or {})
        self._graphs: dict[tuple, CapturedStep] = {}
        self.shared_hits = 0
        self.disk_hits = 0
        self.uncached: str | None = None

    def get(self, x: torch.Tensor, y: torch.Tensor) -> CapturedStep:
        sig = batch_signature(x, y)
        if sig not in self._graphs:
            self._graphs[sig] = self._capture(x, y) if self.share is None else self._shared(sig, x, y)
        return self._graphs[sig]

    def _capture(self, x, y) -> CapturedStep:
        """The step from the disk cache, else captured (and saved there)."""
        directory, self.uncached = config.graph_cache_dir(), None
        path = key = None
        if directory is not None:
            try:
                key = graph_key(self.model, self.loss_fn, self.spec, x, y, self.options)
                path = directory / f"{key}.json"
            except Undescribable as e:
                self.uncached = f"not cached: {e}"
            except Exception as e:  # noqa: BLE001 - a description that fails costs the cache, not the job
                self.uncached = f"not cached: describing the model failed: {type(e).__name__}: {e}"
        if path is not None and path.exists():
            t0 = time.perf_counter()
            try:
                loaded = store.load(path, key, self.spec, batch_signature(x, y), self.job)
            except (store.StoreError, OSError) as e:
                self.uncached = f"ignored {path}: {e}"
            else:
                self.disk_hits += 1
                self._say(f"loaded {path.name[:12]} ({len(loaded.graph.nodes)} nodes) in "
                          f"{time.perf_counter() - t0:.2f} s")
                return loaded
        captured = capture(self.model, self.loss_fn, self.spec, (x, y), job=self.job, **self.options)
        if path is not None:
            try:
                store.save(path, key, captured)
            except (store.StoreError, OSError) as e:
                self.uncached = f"not saved: {e}"
        return captured

    def _say(self, what: str) -> None:
        if config.debug():
            print(f"dbml: job {self.job!r}: graph cache: {what}", file=sys.stderr)

    def _shared(self, sig: tuple, x, y) -> CapturedStep:
        key = (self.share, type(self.model).__qualname__, self.loss_fn, self.spec, sig, self.model.training,
               tuple(sorted(self.options.items())),   # e.g. a data-parallel worker's collective: its own graph
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
