"""The step-runner boundary: one training iteration, however it is executed.

The dbml runtime drives training through a :class:`StepRunner` and never touches the
optimizer directly, so the scheduler can take a step over without the runtime knowing.
:class:`EagerStep` is plain PyTorch (``loss.backward(); optimizer.step()``): the
vanilla the scheduler's results must equal bit for bit.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from .optim import OptimizerSpec, make_optimizer

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class StepRunner(Protocol):
    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Run one iteration (forward, backward, optimizer update); return the loss, detached."""

    def finish(self) -> None:
        """Leave the trained parameters and buffers in the model the runner was built for."""

    def stats(self) -> dict:
        """Figures about the steps run so far (e.g. measured_peak_bytes)."""


class EagerStep:
    def __init__(self, model: torch.nn.Module, loss_fn: LossFn, spec: OptimizerSpec):
        self.model, self.loss_fn = model, loss_fn
        self.optimizer = make_optimizer(spec, model.parameters())

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def finish(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def stats(self) -> dict:
        return {}
