"""A stacked model: K models of one architecture trained as one (HFTA's horizontal fusion).

:class:`StackedModel` holds the members' parameters stacked along a new dimension 0
(``torch.func.stack_module_state``'s layout) and runs them with ``torch.func.vmap`` over
``torch.func.functional_call`` of the one architecture: each op of the model runs once
for all members (a batched matmul, one elementwise op over the stack) instead of once
per member, which is what small models lose their time to. Its per-member learning
rate, weight decay and momentum are buffers (``scheduler.graph.stacked.BUFFERS``) that
the captured optimizer update reads (``OptimizerSpec(stacked=True)``), and its forward
returns, beside the outputs, the ``member_loss`` buffer, into which :class:`StackedLoss`
writes each member's loss of the step: the captured step returns one loss, their sum.

Each member computes what its model alone computes, bit for bit on the CPU kernels
checked (``tests/test_fusion.py``): under vmap a ``Linear`` becomes one ``baddbmm``, as
the model alone runs ``addmm``, and its weight's gradient the single model's ``grad.T @
x`` (:func:`batched_linear`). vmap's own rule for ``linear`` (``bmm``, then the bias
added) rounds twice and differed in the last bit once a layer had more than a few dozen
inputs (256 -> 128: up to 1.5e-8 in a gradient); autograd's ``baddbmm`` backward
computes the weight's gradient transposed (``x.T @ grad``), which differed in the last
bit in about half of the small layers tried. ReLU is elementwise; the loss runs per
member (``torch.func.vmap`` of ``cross_entropy`` sums a batch in another order than
``nll_loss`` does, up to an ulp). Only architectures made of these are stacked
(``dbml.search.fusion.FUSED_ARCHS``). Whether the batched products round as the single
model's does is the BLAS's to say, shape by shape (a batch of 7 rows, one output or a
member's slice off a 64-byte boundary do not, on MKL): :func:`probe_linears` tries each
shape a fusion will run once, on random values, and a shape that differs runs one
``F.linear`` per member.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..scheduler.graph.stacked import BUFFERS

__all__ = ["StackedModel", "StackedLoss", "StackedLinear", "LOSS_BUFFER", "probe_linears", "batched_linear"]

LOSS_BUFFER = "member_loss"   # each member's loss of the last step, written by StackedLoss


class _Linear(torch.autograd.Function):
    """``F.linear`` whose vmap rule is :func:`batched_linear`: the members' Linear at once,
    each member computing what ``addmm`` and its backward compute for the single model.
    Only its vmap rule runs inside a stacked model (capture traces the ops it calls)."""

    @staticmethod
    def forward(x, weight, bias):
        return F.linear(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):   # outside vmap only (a 2-D input)
        x, weight, bias = ctx.saved_tensors
        return grad @ weight, grad.t() @ x, None if bias is None else grad.sum(0)

    @staticmethod
    def vmap(info, in_dims, x, weight, bias):
        x, weight, bias = (_members_first(t, d, info.batch_size) for t, d in zip((x, weight, bias), in_dims))
        if x.dim() != 3:
            raise NotImplementedError("a stacked Linear takes a 2-D input per member")
        return batched_linear(x, weight, bias), 0


def _members_first(t: torch.Tensor | None, dim: int | None, members: int) -> torch.Tensor | None:
    """``t`` with its members on dimension 0 (an unbatched one expanded, as vmap sees it)."""
    if t is None or dim == 0:
        return t
    return t.expand(members, *t.shape) if dim is None else t.movedim(dim, 0)


# (device type, members, rows, inputs, outputs, bias) -> whether the batched products of
# batched_linear give each member exactly what the single model's Linear gives it on this
# machine's kernels (probe_linears). Whether they do is the BLAS's business, not a rule
# one can write down: on this 2-core CPU (torch 2.13, MKL) a batch of 5-7 or 9-11 rows
# differs in the last bit (a small-matrix kernel of the single addmm), one output or one
# input differs (addmm runs a matrix-vector product), and a member's slice that does not
# start on a 64-byte boundary differs (17 inputs). A shape not probed runs per member.
_BMM_PROBE_CACHE: dict[tuple, bool] = {}   # a cache of pure facts: probe_linears fills it
# Switch: False runs every stacked Linear one member at a time (always the single model's bits).
BATCHED_MATMULS = True
_ALIGN = 64   # bytes: where the CPU allocator starts every tensor


def batched_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Every member's Linear, ``x`` (K, B, in), ``weight`` (K, out, in), ``bias`` (K, out),
    each member's output and gradients what the single model's ``F.linear`` (``addmm`` and
    its backward) computes: batched (:func:`_bmm_linear`) where a probe of the shape on
    this device found the two equal (:func:`probe_linears`), else one ``F.linear`` per
    member (:func:`_per_member_linear`)."""
    members, rows, inputs = x.shape
    key = (x.device.type, members, rows, inputs, weight.shape[1], bias is not None)
    if BATCHED_MATMULS and _BMM_PROBE_CACHE.get(key, False):
        return _bmm_linear(x, weight, bias)
    return _per_member_linear(x, weight, bias)


def _bmm_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The members' Linear as batched matrix products.

    The value, and the input's gradient (``grad @ weight``), come from one ``baddbmm``
    (``bias + x @ weight.T``; CPU bmm runs it as one addmm per member). The weight's
    gradient does not: autograd's ``bmm`` rule would compute it as ``x.T @ grad``,
    transposed, and MKL rounds that differently from the single model's ``grad.T @ x`` in
    about half of the small layer shapes tried (1-33 units, batches of 32 and 64). So the
    weight reaches the output a second way, ``weight @ x.T``, whose rule computes ``grad.T
    @ x``, added as ``t - t.detach()``: exactly zero, with gradient ``grad``. A custom
    backward cannot do it: ``autograd.Function`` (custom ops' autograd too) is not
    supported under ``functionalize``, which capture traces with. The cost: one more
    ``bmm`` and two elementwise ops per layer, in the forward."""
    if bias is None:
        out = torch.bmm(x, weight.detach().transpose(1, 2))
    else:
        out = torch.baddbmm(bias.unsqueeze(1), x, weight.detach().transpose(1, 2))
    through = torch.bmm(weight, (x.detach() if x.requires_grad else x).transpose(1, 2))
    return out + (through - through.detach()).transpose(1, 2)


def _per_member_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """One ``F.linear`` per member, the single model's ops; a member's slice that does not
    start where the allocator starts a tensor is copied first (MKL's result depends on it)."""
    return torch.stack([F.linear(_aligned(x[k]), _aligned(weight[k]), None if bias is None else _aligned(bias[k]))
                        for k in range(x.shape[0])])


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a copy of it if it does not start on an ``_ALIGN`` boundary of its storage."""
    return t if t.storage_offset() * t.element_size() % _ALIGN == 0 else t.clone()


def probe_linears(model: nn.Module, members: int, rows: Iterable[int], device) -> None:
    """Decide, once per shape, whether ``model``'s Linear layers stacked ``members`` times
    run batched for batches of ``rows``: batched where every member's output and gradients
    (weight, bias, input; the input stacked or shared, as a first layer's is) equal
    ``F.linear``'s on an aligned copy of its own, on random values (``_BMM_PROBE_CACHE``)."""
    device = torch.device(device)
    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            for r in sorted(set(rows)):
                key = (device.type, members, r, layer.in_features, layer.out_features, layer.bias is not None)
                if key not in _BMM_PROBE_CACHE:
                    _BMM_PROBE_CACHE[key] = _bmm_agrees(device, members, r, layer.in_features, layer.out_features,
                                                   layer.bias is not None)


def _bmm_agrees(device: torch.device, members: int, rows: int, inputs: int, outputs: int, bias: bool) -> bool:
    gen = torch.Generator().manual_seed(rows * 7919 + inputs * 31 + outputs)
    x = torch.randn(rows, inputs, generator=gen).to(device)
    weight = torch.randn(members, outputs, inputs, generator=gen).to(device).requires_grad_()
    b = torch.randn(members, outputs, generator=gen).to(device).requires_grad_() if bias else None
    grad = torch.randn(members, rows, outputs, generator=gen).to(device)
    with torch.enable_grad():
        for xs in (x.expand(members, rows, inputs), x.repeat(members, 1, 1).requires_grad_()):
            inputs_ = [t for t in (weight, b, xs) if t is not None and t.requires_grad]
            out = _bmm_linear(xs, weight, b)
            grads = torch.autograd.grad(out, inputs_, grad)
            for k in range(members):
                own = [t[k].detach().clone().requires_grad_() for t in (weight, b) if t is not None]
                xk = x.clone().requires_grad_(xs.requires_grad)
                single = F.linear(xk, own[0], own[1] if bias else None)
                mine = [*own, xk] if xs.requires_grad else own
                if not torch.equal(single, out[k]) or not all(
                        torch.equal(a, g[k]) for a, g in zip(torch.autograd.grad(single, mine, grad[k]), grads)):
                    return False
    return True


class StackedLinear(nn.Linear):
    """A member's Linear inside a stacked model (``_Linear``: one baddbmm under vmap)."""

    def forward(self, x):
        return _Linear.apply(x, self.weight, self.bias)


class StackedModel(nn.Module):
    """Members of ``base``'s architecture: ``params`` (name -> the members' values stacked
    on dimension 0) and ``hyper`` (lr, weight_decay, momentum -> one value per member)."""

    def __init__(self, base: nn.Module, params: dict[str, torch.Tensor], hyper: dict[str, Sequence[float]]):
        super().__init__()
        members = copy.deepcopy(base)
        for module in members.modules():
            if type(module) is nn.Linear:
                module.__class__ = StackedLinear
        for name, value in params.items():
            owner, _, attr = name.rpartition(".")
            setattr(members.get_submodule(owner), attr, nn.Parameter(value))
        self.members = members
        device = next(iter(params.values())).device
        for key, buffer in BUFFERS.items():
            self.register_buffer(buffer, torch.tensor(list(hyper[key]), dtype=torch.float64, device=device))
        self.register_buffer(LOSS_BUFFER, torch.zeros(len(hyper["lr"]), device=device))

    @property
    def size(self) -> int:
        """How many members."""
        return len(self.get_buffer(LOSS_BUFFER))

    def forward(self, x):
        """Every member's outputs (members first) and the ``member_loss`` buffer."""
        params = dict(self.members.named_parameters())
        out = torch.func.vmap(lambda p: torch.func.functional_call(self.members, p, (x,)))(params)
        return out, self.get_buffer(LOSS_BUFFER)


def stacked_forward(members: nn.Module, values: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Every member's outputs for ``x`` (members first), from ``values`` (a stacked model's
    parameters by name, ``members.`` dropped), with the ops vmap traces for a stacked
    model (:func:`batched_linear`, ``relu`` over the stack) called directly: vmap's
    dispatch and ``_Linear``'s cost milliseconds per call in eager (the per-epoch
    validation). For Linear and ReLU layers, alone or in a Sequential (``stackable``)."""
    k = len(next(iter(values.values())))
    out = x.expand(k, *x.shape)
    for name, layer in _layers(members):
        if isinstance(layer, nn.Linear):
            prefix = f"{name}." if name else ""
            out = batched_linear(out, values[prefix + "weight"], values.get(prefix + "bias"))
        else:
            out = torch.relu(out)
    return out


def stackable(model: nn.Module) -> bool:
    """Whether ``model`` is Linear and ReLU layers only (alone or in one Sequential): what
    :func:`stacked_forward` and :func:`batched_linear` reproduce bit for bit."""
    return all(isinstance(layer, (nn.Linear, nn.ReLU)) for _, layer in _layers(model))


def _layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return list(model.named_children()) if isinstance(model, nn.Sequential) else [("", model)]


def stack(base: nn.Module, members: int) -> dict[str, torch.Tensor]:
    """``base``'s parameters, the same for ``members`` members, stacked (new storages)."""
    return {name: p.detach().unsqueeze(0).repeat(members, *([1] * p.dim())) for name, p in base.named_parameters()}


def member(base: nn.Module, values: dict[str, torch.Tensor], k: int) -> nn.Module:
    """Member ``k`` as a model of ``base``'s architecture (``values``: a stacked model's
    parameters by name, ``members.`` prefix dropped), in storages of its own."""
    module = copy.deepcopy(base)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.data = values[name][k].clone()
    return module


@dataclass(frozen=True)
class StackedLoss:
    """The loss of a stacked model's step: each member's ``loss_fn`` on its outputs, written
    into the ``member_loss`` buffer, and their sum returned (its gradient is each
    member's own: d sum / d loss_k = 1, as a backward from a single loss starts).
    ``log_softmax``: the outputs go through one ``log_softmax`` over the stack first
    (``loss_fn`` then ``nll_loss``: ``cross_entropy`` is exactly the two, and one
    ``log_softmax`` over the stack computes each row as the member's own does)."""
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    log_softmax: bool = False

    def __call__(self, out, y: torch.Tensor) -> torch.Tensor:
        outputs, member_loss = out
        if self.log_softmax:
            outputs = torch.log_softmax(outputs, -1)
        losses = torch.stack([self.loss_fn(o, y) for o in outputs.unbind(0)])
        member_loss.copy_(losses.detach())
        return losses.sum()
