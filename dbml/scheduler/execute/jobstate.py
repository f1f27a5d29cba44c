"""A job's state between iterations and the model it belongs to, mapped both ways.

The executor holds parameters, buffers and optimizer state by graph input position
(:class:`~.iteration.ExecState`), a large parameter in pieces (:mod:`..graph.chunks`).
This module builds that state from a model (:func:`initial_state`) and reads it back as
the model's parameters and buffers (:func:`model_values`) and as torch.optim's
per-parameter state (:func:`optimizer_states`), pieces joined whole; and puts such a state
back (:func:`load_optimizer_states`: a job resumed from a checkpoint).
"""

from __future__ import annotations

from typing import Iterator

import torch

from ..graph.capture import graph_state, graph_state_without_optimizer, initial_states, state_keys, trainable
from ..graph.chunks import join, unit_layout
from ..graph.optim import OptimizerSpec
from .devices import Device, Zeros, as_view
from .iteration import ExecState

__all__ = ["initial_state", "state_value", "model_values", "optimizer_states", "load_optimizer_states"]


def initial_state(model: torch.nn.Module, spec: OptimizerSpec, optimizer_state: list[dict] | None = None
                  ) -> ExecState:
    """The job's state as the executor holds it: parameters (a large one in pieces:
    ``spec.update_chunk_bytes``), buffers, optimizer state (per piece; fresh, or
    ``optimizer_state`` resumed, as :func:`optimizer_states` reads it).

    Fresh optimizer state is not allocated here: each tensor of it is a :class:`~.devices.Zeros`
    host copy, brought onto the device (as zeros) where the plan wants it at the start of
    the first iteration. A plan that keeps it on the host (disk) until the optimizer
    phase never holds it all in memory at once; eager PyTorch creates it at the first step."""
    if optimizer_state is not None:
        return ExecState(graph_state(model, spec, optimizer_state))
    meta = [torch.empty_like(p, device="meta") for p in model.parameters()]
    state = ExecState(graph_state_without_optimizer(model, spec))
    for t in initial_states(spec, model, meta):
        if t.device.type == "meta":
            state.host[len(state.values)] = Zeros(t.untyped_storage().nbytes())
            state.values.append(None)
        else:   # Adam's step: a CPU scalar
            state.values.append(t)
    return state


def state_value(state: ExecState, device: Device, i: int, like: torch.Tensor, move: bool = True) -> torch.Tensor:
    """State ``i`` as a device tensor (brought back from the host store if there; with
    ``move=False`` read from there, and the state left as it is)."""
    v = state.values[i]
    if v is None and not move:
        return as_view(device.host_tensor(state.host[i]).to(device.torch_device), like.dtype, tuple(like.shape),
                       tuple(like.stride()), 0)
    if v is None:
        host = state.host.pop(i)
        flat = device.alloc(device.host_nbytes(host))
        device.use_on_compute(flat, device.copy_in(host, flat))
        device.free_host(host)
        v = as_view(flat, like.dtype, tuple(like.shape), tuple(like.stride()), 0)
        state.values[i] = v
    return v


def _joined(state: ExecState, device: Device, positions: list[int], spans: list, like: torch.Tensor,
            move: bool = True) -> torch.Tensor:
    """The state at ``positions`` as one tensor shaped like ``like``: one whole tensor,
    or the pieces (of ``spans``) of one, rebuilt."""
    if len(positions) == 1:
        return state_value(state, device, positions[0], like, move)
    pieces = [state_value(state, device, i, torch.empty(b - a, dtype=like.dtype, device="meta"), move)
              for i, (a, b) in zip(positions, spans)]
    return join(pieces, like.shape)


def model_values(state: ExecState, device: Device, model: torch.nn.Module, spec: OptimizerSpec,
                 move: bool = True) -> list[torch.Tensor]:
    """Per parameter then per buffer of ``model``, its value in ``state`` (``move=False``:
    values on the host read there, the state unchanged)."""
    return list(each_model_value(state, device, model, spec, move))


def each_model_value(state: ExecState, device: Device, model: torch.nn.Module, spec: OptimizerSpec,
                     move: bool = True) -> Iterator[torch.Tensor]:
    """:func:`model_values` one at a time: a value read from the host (a spill file) is
    made when it is asked for, not all of them at once."""
    layout = unit_layout(model, spec.update_chunk_bytes)
    for j, p in enumerate(model.parameters()):
        units = layout.of_param(j)
        yield _joined(state, device, units, [layout.units[u][1] for u in units], p, move)
    base = len(layout.units)
    for i, b in enumerate(model.buffers()):
        yield state_value(state, device, base + i, b, move)


def optimizer_states(state: ExecState, device: Device, model: torch.nn.Module,
                     spec: OptimizerSpec) -> list[dict[str, torch.Tensor]]:
    """Per trainable parameter, its optimizer state as torch.optim would hold it (a
    parameter's pieces' states joined whole, their equal ``step`` once)."""
    layout = unit_layout(model, spec.update_chunk_bytes)
    keys = state_keys(spec)
    base = len(layout.units) + len(list(model.buffers()))
    at = {u: base + j * len(keys) for j, u in enumerate(layout.trained)}   # unit -> its first state
    out = []
    for j, (p, train) in enumerate(zip(model.parameters(), trainable(model))):
        if not train:
            continue
        units = layout.of_param(j)
        spans = [layout.units[u][1] for u in units]
        out.append({k: _joined(state, device, [at[u] + m for u in units], spans, p) if k != "step"
                    else state_value(state, device, at[units[0]] + m, torch.zeros(()))
                    for m, k in enumerate(keys)})
    return out


def load_optimizer_states(state: ExecState, device: Device, model: torch.nn.Module, spec: OptimizerSpec,
                          states: list[dict[str, torch.Tensor]]) -> None:
    """Put ``states`` (per trainable parameter, as :func:`optimizer_states` returns them) into
    ``state`` in place of the fresh state: a parameter held in pieces gets each piece's
    part, and every piece the parameter's ``step``."""
    layout = unit_layout(model, spec.update_chunk_bytes)
    keys = state_keys(spec)
    base = len(layout.units) + len(list(model.buffers()))
    at = {u: base + j * len(keys) for j, u in enumerate(layout.trained)}
    trained = [(j, p) for j, (p, train) in enumerate(zip(model.parameters(), trainable(model))) if train]
    if len(trained) != len(states):
        raise ValueError(f"{len(states)} optimizer states for {len(trained)} trainable parameters")
    with torch.no_grad():
        for (j, p), saved in zip(trained, states):
            units = layout.of_param(j)
            for m, k in enumerate(keys):
                if k == "step" or len(units) == 1:
                    for u in units:
                        like = torch.zeros(()) if k == "step" else p
                        state_value(state, device, at[u] + m, like).copy_(saved[k])
                    continue
                flat = saved[k].reshape(-1)
                for u in units:
                    a, b = layout.units[u][1]
                    piece = torch.empty(b - a, dtype=p.dtype, device="meta")
                    state_value(state, device, at[u] + m, piece).copy_(flat[a:b])
