"""The step-runner boundary: one training iteration, however it is executed.

The dbml runtime drives training through a :class:`StepRunner` and never touches the
optimizer directly, so the scheduler can take a step over without the runtime knowing.
:class:`EagerStep` is plain PyTorch (``loss.backward(); optimizer.step()``): the
vanilla the scheduler's results must equal bit for bit.
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol

import torch

from .measure import live_tensors, measure_peak
from ..hostmem import keep_freed_host_memory
from ..graph.optim import OptimizerSpec, add_l1, make_optimizer

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class StepRunner(Protocol):
    latency_source: str | None   # where the latency model came from, for the caller's report (None: none used)

    def prepare(self, x: torch.Tensor, y: torch.Tensor, plan: bool = True) -> None:
        """Get ready for a batch shaped like ``x``, ``y`` before its first iteration (its
        values are not read), e.g. while the data is still being read; ``plan=False``: only
        what asks for no memory (capturing its graph, not planning it)."""

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Run one iteration (forward, backward, optimizer update); return the loss, detached."""

    def finish(self) -> None:
        """Leave the trained parameters and buffers in the model the runner was built for."""

    def values(self) -> list[torch.Tensor]:
        """Between iterations: the model's parameters, then its buffers, as they are now, to
        read (e.g. a validation pass); nothing the runner holds moves."""

    def kept_values(self) -> Iterable[torch.Tensor]:
        """Between iterations: a copy of :meth:`values` to keep while training goes on (early
        stopping's best epoch): in the job's slow tier where it has one (its spill file, outside
        the process's memory: ``spill.Parked``), else in memory. Iterating it gives the values."""

    def optimizer_state(self) -> list[dict[str, torch.Tensor]]:
        """Between iterations: per trainable parameter, its optimizer state as torch.optim holds it."""

    def load_optimizer_state(self, states: list[dict[str, torch.Tensor]]) -> None:
        """Before the first iteration: start from ``states`` (``optimizer_state``'s form), not
        fresh (a job resumed from a checkpoint)."""

    def close(self) -> None:
        """Give back what the runner holds besides the model (threads, accounts)."""

    def stats(self) -> dict:
        """Figures about the steps run so far (e.g. measured_peak_bytes)."""


class EagerStep:
    """Plain PyTorch. The peak memory of the first ``measured_steps`` iterations is
    measured (``memory.measure_peak``: exact storage accounting on CPU, the allocator's
    statistics on CUDA); the first covers the optimizer state's creation, the second a
    steady-state iteration."""

    def __init__(self, model: torch.nn.Module, loss_fn: LossFn, spec: OptimizerSpec, measured_steps: int = 2):
        self.model, self.loss_fn = model, loss_fn
        keep_freed_host_memory()   # as ScheduledStep: the same host allocator for both
        self.optimizer = make_optimizer(spec, model.parameters())
        self.spec = spec
        self.measured_steps = measured_steps
        self.steps = 0
        self.peak_bytes: int | None = None
        self.latency_source: str | None = None   # eager PyTorch needs no latency model

    def prepare(self, x: torch.Tensor, y: torch.Tensor, plan: bool = True) -> None:
        """Nothing to get ready: eager PyTorch plans nothing."""

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        if self.steps > self.measured_steps:
            return self._step(x, y)
        # the base list is a temporary: held here, it would keep last step's gradients
        # alive through zero_grad(set_to_none=True) and inflate the peak
        loss, peak = measure_peak(lambda: self._step(x, y), live_tensors(self.model, self.optimizer, x, y),
                                  device=x.device)
        self.peak_bytes = max(self.peak_bytes or 0, peak)
        return loss

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        if self.spec.l1:
            params = [p for p in self.model.parameters() if p.grad is not None]
            for p, g in zip(params, add_l1(self.spec, params, [p.grad for p in params])):
                p.grad = g
        self.optimizer.step()
        return loss.detach()

    def values(self) -> list[torch.Tensor]:
        """The model's own: plain PyTorch updates it in place."""
        return list(self.model.parameters()) + list(self.model.buffers())

    def kept_values(self) -> list[torch.Tensor]:
        return [v.detach().to("cpu", copy=True) for v in self.values()]

    def optimizer_state(self) -> list[dict[str, torch.Tensor]]:
        return [dict(self.optimizer.state[p]) for p in self._trained()]

    def load_optimizer_state(self, states: list[dict[str, torch.Tensor]]) -> None:
        for p, saved in zip(self._trained(), states, strict=True):
            # Adam keeps its step on the CPU (capturable=False); the rest lives with the parameter
            self.optimizer.state[p] = {k: v.clone() if k == "step" else v.to(p.device, copy=True)
                                       for k, v in saved.items()}

    def _trained(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"] if p.requires_grad]

    def finish(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        """Nothing held besides the model and its optimizer."""

    def stats(self) -> dict:
        return {"measured_peak_bytes": self.peak_bytes}
