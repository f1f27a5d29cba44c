"""Chunked optimizer updates: a large parameter and its optimizer state as separate pieces.

Below the tensor-granularity floor. The planner moves whole tensors (storages), so the
least peak any plan reaches is, at the busiest op, its inputs and outputs together
(:func:`~..plan.planner.tensor_granularity_floor`). In VGG-16 that op is the Adam update
of the 392 MiB ``fc1`` weight, which reads the weight, its gradient and both moments at
once. torch's single-tensor optimizers (SGD with momentum and weight decay, Adam, AdamW)
are elementwise, so updating a parameter piece by piece gives each element the very same
value (bit for bit: the kernels compute each element alone, whatever the range they run
over; ``tests/test_chunks.py`` checks it against eager).

So at capture a trainable parameter larger than ``OptimizerSpec.update_chunk_bytes`` is
held as *units*: flat pieces of about that size, each its own graph input (its own
storage, so swappable alone) with its own optimizer state (``step`` included: every
piece counts the same steps). The forward reads the parameter rebuilt from its pieces
(``torch.cat(pieces).view(shape)``, an activation the planner may free and recompute);
each piece's gradient is a slice of the rebuilt parameter's gradient, and the update runs
per piece. Every other parameter is one unit, itself, as before.

This module owns the layout (:class:`UnitLayout`: which unit is which parameter's piece)
and moving between the model's tensors and units (:func:`unit_tensors`, the executor's
initial state through ``capture.graph_state``) and back (:func:`join`: the trained
parameters and optimizer state, ``ScheduledStep.finish`` / ``optimizer_state``). It
never imports the capture, which imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["Span", "UnitLayout", "unit_layout", "chunk_spans", "split", "join", "unit_tensors", "CHUNK_ALIGN"]

Span = tuple[int, int]          # [start, stop) in the parameter's flat elements

# Pieces start at multiples of this many elements: a whole number of cache lines and of
# any vector width, so no piece starts mid-vector (the results do not depend on it; the
# kernels' speed may).
CHUNK_ALIGN = 1024


def chunk_spans(numel: int, itemsize: int, chunk_bytes: int | None) -> tuple[Span, ...] | None:
    """The pieces of a parameter of ``numel`` elements: about equal, each at most
    ``chunk_bytes`` (up to the alignment), or None when it fits one piece.

    >>> chunk_spans(10_000, 4, 16_384)
    ((0, 4096), (4096, 8192), (8192, 10000))
    >>> chunk_spans(10, 4, 1 << 20) is None
    True
    """
    if chunk_bytes is None or numel * itemsize <= chunk_bytes:
        return None
    pieces = math.ceil(numel * itemsize / chunk_bytes)
    size = CHUNK_ALIGN * math.ceil(math.ceil(numel / pieces) / CHUNK_ALIGN)
    if size >= numel:
        return None
    return tuple((a, min(a + size, numel)) for a in range(0, numel, size))


@dataclass(frozen=True)
class UnitLayout:
    """How a model's parameters map to graph input units.

    ``units``: per unit, in graph input order, (parameter index in ``model.parameters()``,
    span or None for a whole parameter); a parameter's pieces are consecutive.
    ``trained``: the positions in ``units`` the optimizer updates, in order (the state
    section holds one set of state per trained unit, in this order)."""

    units: tuple[tuple[int, Span | None], ...]
    trained: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def chunked(self) -> bool:
        return any(span is not None for _, span in self.units)

    def of_param(self, index: int) -> list[int]:
        """The unit positions holding parameter ``index``, in order."""
        return [u for u, (p, _) in enumerate(self.units) if p == index]

    def assemble(self, units: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Per parameter, its tensor: the unit itself, or its pieces rebuilt (traced:
        the forward reads this)."""
        return [join([units[u] for u in self.of_param(p)], shape) if len(self.of_param(p)) > 1
                else units[self.of_param(p)[0]] for p, shape in enumerate(self.shapes)]


def unit_layout(model: torch.nn.Module, chunk_bytes: int | None) -> UnitLayout:
    """The layout of ``model``'s parameters: a trainable parameter above ``chunk_bytes``
    in pieces (a frozen one never is: it has no update to split)."""
    units, trained, shapes = [], [], []
    for p_index, p in enumerate(model.parameters()):
        shapes.append(tuple(p.shape))
        spans = chunk_spans(p.numel(), p.element_size(), chunk_bytes) if p.requires_grad else None
        for span in spans or (None,):
            if p.requires_grad:
                trained.append(len(units))
            units.append((p_index, span))
    return UnitLayout(tuple(units), tuple(trained), tuple(shapes))


def split(t: torch.Tensor, spans: Sequence[Span]) -> list[torch.Tensor]:
    """``t``'s pieces as separate flat tensors (own storages, so each swaps alone)."""
    flat = t.detach().reshape(-1)
    return [flat[a:b].clone() for a, b in spans]


def join(pieces: Sequence[torch.Tensor], shape: Sequence[int]) -> torch.Tensor:
    """The parameter (or state) rebuilt from its pieces, in ``shape``."""
    return torch.cat([p.reshape(-1) for p in pieces]).view(tuple(shape))


def unit_tensors(layout: UnitLayout, params: Sequence[torch.Tensor], copy: bool = True) -> list[torch.Tensor]:
    """Per unit, its tensor cut from ``params`` (whole ones detached, not copied; pieces
    copied, or with ``copy=False`` views, e.g. to shape fresh state after)."""
    out = []
    for p_index, span in layout.units:
        p = params[p_index].detach()
        out.append(p if span is None else split(p, [span])[0] if copy else p.reshape(-1)[span[0]:span[1]])
    return out
