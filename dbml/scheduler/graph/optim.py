"""Optimizer specifications shared by eager and scheduled training.

A training job names its optimizer by an :class:`OptimizerSpec`; :func:`make_optimizer`
builds the eager ``torch.optim`` optimizer for it. The optimizers are always the
single-tensor implementations (``foreach=False``): that is the code path the scheduler
captures op by op, so eager and scheduled training agree bit for bit on CPU.

``update_chunk_bytes`` is not eager's: it tells the capture to hold each trainable
parameter larger than that many bytes, and its optimizer state, as separate pieces of
about that size, updated one by one (:mod:`.chunks`), so that a plan need not hold a huge
parameter, its gradient and its state whole at once. None: every parameter whole. Being
part of the spec, it identifies a captured graph wherever the spec does.

``stacked`` is not eager's either: the model stacks several models along its
parameters' dimension 0, each with its own ``lr``, ``weight_decay`` and ``momentum`` held
in the model's buffers (:mod:`.stacked`); the spec's own values of those then say only
whether every member has a non-zero weight decay and momentum. Only the captured step
trains a stacked model (it needs ``update_chunk_bytes=None``: a piece of a stacked
parameter would cut across its members).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    import torch

# The spec is plain data (train()'s arguments are checked against OPTIMIZERS without torch);
# torch is imported by the two functions below that compute with it.
OPTIMIZERS = ("sgd", "adam", "adamw", "adagrad")

# Parameters above this many bytes are updated in pieces of about this size (None: off).
# On by default: with no budget binding it costs nothing measurable (VGG-16 at 64x64,
# one thread: 2.242 CPU s/step in pieces, 2.252 whole, eager 2.205; its unbudgeted peak
# unchanged), and it lowers VGG-16's floor from 29.4 % to 19.6 % of its peak and today's
# smallest feasible budget from 39.3 % to 32.0 % (benchmarks/chunk_floor.py). Smaller
# pieces (8 MiB) plan lower still (29.0 %) but raise the unbudgeted peak by 2.4 %.
DEFAULT_UPDATE_CHUNK_BYTES: int | None = 16 << 20
# Under a memory budget, pieces are at most this share of it (a power of two of bytes, not
# under MIN_UPDATE_CHUNK_BYTES): a parameter as large as the default piece is a large part of a small
# budget. An MLP of hidden [2048, 2048] has a 16 MiB weight, one piece at the default size:
# its Adam update holds the weight and both moments, 50.3 MB, the least any plan reaches;
# in 8 MiB pieces its least plan is 33.6 MB, the forward's rebuilt weight beside its pieces
# (benchmarks/chunk_floor.py). A budget of 128 MiB or more keeps the default. A job takes
# the smaller pieces only where its budget needs them (dbml.core.runners.fit_pieces).
BUDGET_PIECE_SHARE = 1 / 8
MIN_UPDATE_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class OptimizerSpec:
    kind: str = "adam"
    lr: float = 1e-3
    momentum: float = 0.9  # sgd only
    weight_decay: float = 0.0
    # an L1 penalty l1 * sum(|w|): its subgradient l1 * sign(w) is added to every trained
    # parameter's gradient before the update (:func:`add_l1`), as weight_decay adds the L2's
    l1: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    update_chunk_bytes: int | None = DEFAULT_UPDATE_CHUNK_BYTES  # capture only, see above
    stacked: bool = False   # capture only, see above

    def __post_init__(self):
        if self.kind not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.kind!r}; expected one of {', '.join(OPTIMIZERS)}")
        chunk = self.update_chunk_bytes
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0):
            raise ValueError(f"update_chunk_bytes must be a positive int or None, got {chunk!r}")
        if self.stacked and chunk is not None:
            raise ValueError("a stacked spec updates whole parameters: pass update_chunk_bytes=None")

    def within(self, budget: int | None) -> "OptimizerSpec":
        """This spec for a step planned within ``budget`` bytes (None: no budget): pieces of at
        most :data:`BUDGET_PIECE_SHARE` of it, where that is smaller than this spec's."""
        chunk = self.update_chunk_bytes
        if budget is None or chunk is None:
            return self
        share = max(MIN_UPDATE_CHUNK_BYTES, 1 << (max(1, int(budget * BUDGET_PIECE_SHARE)).bit_length() - 1))
        return self if share >= chunk else replace(self, update_chunk_bytes=share)


def add_l1(spec: OptimizerSpec, params, grads) -> list:
    """The gradients with the L1 penalty's subgradient added (out of place; ``grads`` as given
    when ``spec.l1`` is 0). Eager and captured steps both call it, so they agree bit for bit."""
    if not spec.l1:
        return list(grads)
    import torch
    return [g if g is None else torch.add(g, torch.sign(p.detach()), alpha=spec.l1) for p, g in zip(params, grads)]


def make_optimizer(spec: OptimizerSpec, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    import torch
    if spec.stacked:
        raise ValueError("a stacked model's members each have their own hyper-parameters: torch.optim cannot "
                         "train it; capture its step (ScheduledStep)")
    if spec.kind == "adagrad":
        return torch.optim.Adagrad(params, lr=spec.lr, weight_decay=spec.weight_decay, eps=1e-10, foreach=False)
    if spec.kind == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum,
                               weight_decay=spec.weight_decay, foreach=False)
    cls = torch.optim.Adam if spec.kind == "adam" else torch.optim.AdamW
    return cls(params, lr=spec.lr, betas=spec.betas, eps=spec.eps,
               weight_decay=spec.weight_decay, foreach=False)
