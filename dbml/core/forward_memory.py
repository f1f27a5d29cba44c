"""Inference within the memory budget: how many rows one forward pass may take (issue 22).

``predict``, ``predictions`` and ``evaluate`` run a model's forward pass without autograd,
as eager PyTorch does under ``torch.no_grad()``: every intermediate is freed after its last
use. What can still break a budget is the batch: DuckDB hands a UDF 2,048 rows at a time,
and 2,048 images through a ResNet need gigabytes. So the forward pass is planned like a
training step is, on the meta device, before any memory is allocated:
:func:`forward_bytes` runs the model's forward on meta tensors (no compute) under the
scheduler's storage meter (``PeakMeter``, which counts what eager holds, views once,
every storage freed when its last reference goes), and :func:`rows_within` fits
``peak(rows) = base + per_row * rows`` from two such runs and takes as many rows as the
budget holds. ``dbml.core.inference.forward`` then runs the rows in chunks of that size,
instead of failing (or swapping the machine) on a large batch. A model whose weights and one
row do not fit is an error naming the budget.

Checked against the storage meter on real tensors (tests/test_forward_memory.py): the
meta run's peak is the real forward's, or a few bytes more (scalars), never less.
"""

from __future__ import annotations

import functools

import torch

from ..errors import InvalidArgument, _size, budget_fix
from .models import ModelConfig, build

__all__ = ["forward_bytes", "rows_within", "PROBE_ROWS"]

PROBE_ROWS = 64          # the second meta run's rows (the first has one)
MAX_ROWS = 1 << 20       # no chunk larger than this, whatever the budget


@functools.lru_cache(maxsize=64)
def forward_bytes(cfg: ModelConfig, rows: int, *, grad: bool = False) -> int:
    """The peak bytes of a no-grad forward of ``rows`` rows, weights included, counted on
    the meta device (nothing computed, nothing allocated). ``grad``: a forward that keeps
    what autograd saves, then the gradient of the outputs with respect to the inputs (what
    ``explain``'s integrated gradients run per row and step; the weights get no gradient)."""
    from ..scheduler.execute.measure import PeakMeter, live_tensors  # the scheduler's meter, loaded when used
    with torch.device("meta"):
        module = build(cfg)
    module.eval()
    x = cfg.inputs.sample(rows, "meta")
    if grad:
        x.requires_grad_(True)
    with PeakMeter(live_tensors(module, None, x), device="meta") as meter, torch.set_grad_enabled(grad):
        out = module(x)
        if grad:
            torch.autograd.grad(out.sum(), x)
    return meter.peak_bytes


@functools.lru_cache(maxsize=256)
def rows_within(cfg: ModelConfig, budget: int, *, held: int = 0, fn: str = "predict", grad: bool = False) -> int:
    """The most rows one forward pass of ``cfg`` (``grad``: with the inputs' gradient,
    ``forward_bytes``) may take within ``budget`` bytes while ``held`` bytes are held beside
    it (the whole input, the outputs: the caller's); at least 1, InvalidArgument naming the
    budget if even one row does not fit."""
    one = forward_bytes(cfg, 1, grad=grad)
    if one + held > budget:
        raise InvalidArgument(f"{fn}(): the model needs {_size(one + held)} for its weights, one row and the "
                              f"outputs of the rows DuckDB passed at once, over the memory budget of {_size(budget)}; "
                              f"{budget_fix(one + held, own=False)} or more")
    budget -= held
    per_row = max(0.0, (forward_bytes(cfg, PROBE_ROWS, grad=grad) - one) / (PROBE_ROWS - 1))
    if per_row == 0:
        return MAX_ROWS
    return int(max(1, min(MAX_ROWS, 1 + (budget - one) // per_row)))
