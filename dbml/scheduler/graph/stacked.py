"""The optimizer update of a stacked model: K models' parameters along a leading dimension.

A stacked model (HFTA's horizontal fusion; ``dbml.search.fusion`` builds them) holds K models of
one architecture as one: each parameter is the K models' parameters stacked on a new
dimension 0, and its forward is ``vmap`` over ``functional_call`` of the one architecture.
Each member keeps its own learning rate, weight decay and momentum. They are not constants
of the graph but the model's buffers (``BUFFERS``: float64, one value per member), so one
captured graph serves every fusion of the same architecture, size and batch whatever
values its members drew.

:func:`stacked_update` is torch's single-tensor SGD / Adam / AdamW update
(``_single_tensor_sgd``, ``_single_tensor_adam``, as ``capture._optimizer_update`` runs
them) written once for the whole stack, a member's scalar becoming a factor broadcast
over its slice. Each element gets the value the member's own update gives it, bit for
bit, on the CPU kernels this was checked on (``tests/test_fusion.py``):

* a scalar argument of a kernel is rounded to the tensor's dtype before use; here the
  member's factor is computed in float64 as Python computes the scalar (``lr / (1 -
  beta1 ** step)``, ``1 - lr * weight_decay``), then rounded to float32;
* ``add(p, alpha=a)`` is a fused multiply-add on CPU; ``addcmul(p, g, a)`` with a tensor
  ``a`` is the same fused multiply-add;
* ``addcdiv(p, e, d, value=v)`` computes ``p + (v * e) / d``; ``addcdiv(p, v * e, d)``
  rounds ``v * e`` once, as the kernel does.

Which operations run is the spec's: ``OptimizerSpec.stacked`` says the model is stacked,
and its ``weight_decay`` and ``momentum`` say only whether *every* member has a non-zero
one (a member with none skips the operation alone, so members with and without are not
stacked together); their values, and ``lr``'s, come from the buffers.
"""

from __future__ import annotations

import torch

from ..errors import CaptureError

__all__ = ["BUFFERS", "stacked_update", "per_member"]

# per-member hyper-parameter -> the name of the stacked model's (top-level) buffer holding it
BUFFERS = {"lr": "stacked_lr", "weight_decay": "stacked_weight_decay", "momentum": "stacked_momentum"}


def per_member(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-member ``values`` (one per member, float64) as ``like``'s dtype, shaped to
    broadcast over ``like``'s members: (K, 1, ..., 1)."""
    return values.to(like.dtype).view(-1, *([1] * (like.dim() - 1)))


def hyper_parameters(named_buffers: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The per-member hyper-parameters among a stacked model's buffers (graph inputs)."""
    missing = [name for name in BUFFERS.values() if name not in named_buffers]
    if missing:
        raise CaptureError(f"a stacked optimizer spec needs the model's buffers {sorted(BUFFERS.values())}; "
                           f"missing {missing}")
    return {key: named_buffers[name] for key, name in BUFFERS.items()}


def stacked_update(spec, group: dict, params, grads, states, hyper: dict[str, torch.Tensor]) -> None:
    """Every member's own update, in place, on the stacked ``params`` (``group``: the
    settings eager's optimizer uses; ``hyper``: :func:`hyper_parameters`)."""
    if group.get("maximize") or group.get("nesterov"):
        raise CaptureError("a stacked update supports neither maximize nor nesterov")
    if spec.kind not in ("sgd", "adam", "adamw"):
        raise CaptureError(f"a stacked update is written for sgd, adam and adamw, not {spec.kind!r}")
    if spec.kind == "sgd":
        _sgd(spec, group, params, grads, states, hyper)
    else:
        _adam(spec, group, params, grads, states, hyper)


def _sgd(spec, group, params, grads, states, hyper) -> None:
    factor = _Factors()
    for param, grad, state in zip(params, grads, states):
        if spec.weight_decay != 0:   # grad.add(param, alpha=weight_decay)
            grad = torch.addcmul(grad, param, factor("weight_decay", lambda: hyper["weight_decay"], param))
        if spec.momentum != 0:
            buf = state["momentum_buffer"]   # zeros at first: 0 * momentum + grad (capture.init_state)
            buf.mul_(factor("momentum", lambda: hyper["momentum"], param)).add_(grad, alpha=1 - group["dampening"])
            grad = buf
        param.addcmul_(grad, factor("lr", lambda: -hyper["lr"], param))   # param.add_(grad, alpha=-lr)


def _adam(spec, group, params, grads, states, hyper) -> None:
    beta1, beta2 = group["betas"]
    decoupled = group.get("decoupled_weight_decay", spec.kind == "adamw")
    for state in states:
        state["step"] += 1
    # every parameter has taken the same steps: the members' step sizes once for all of them
    step = states[0]["step"].item()
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = hyper["lr"] / bias_correction1
    bias_correction2_sqrt = bias_correction2 ** 0.5
    factor = _Factors()
    for param, grad, state in zip(params, grads, states):
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        if spec.weight_decay != 0:
            if decoupled:
                param.mul_(factor("decay", lambda: 1 - hyper["lr"] * hyper["weight_decay"], param))
            else:
                grad = torch.addcmul(grad, param, factor("weight_decay", lambda: hyper["weight_decay"], param))
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(group["eps"])
        param.addcdiv_(factor("step", lambda: -step_size, param) * exp_avg, denom)   # addcdiv_(exp_avg, denom, value=-step_size)


class _Factors:
    """Per-member factors, each computed once (float64) and rounded and shaped once per
    dtype and number of dimensions: one op per parameter would be one per parameter."""

    def __init__(self):
        self._values: dict[str, torch.Tensor] = {}
        self._shaped: dict[tuple, torch.Tensor] = {}

    def __call__(self, name: str, compute, like: torch.Tensor) -> torch.Tensor:
        key = (name, like.dtype, like.dim())
        if key not in self._shaped:
            if name not in self._values:
                self._values[name] = compute()
            self._shaped[key] = per_member(self._values[name], like)
        return self._shaped[key]
