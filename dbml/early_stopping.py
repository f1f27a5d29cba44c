"""Early stopping (train()'s ``early_stop`` and ``patience``): the best epoch by validation
loss, with a copy of its weights, and the rule that ends training after ``patience``
epochs without a better one. ``training.TrainLoop`` asks it after every epoch and, once
training ends, puts the best epoch's weights back. Its ``state()`` travels in a checkpoint
(``dbml.checkpoints``), so a job resumed on another Ray worker stops where, and keeps
what, the uninterrupted job does.
"""

from __future__ import annotations

import math
from typing import Callable

import torch


class EarlyStopping:
    def __init__(self, enabled: bool, patience: int):
        self.enabled, self.patience = enabled, patience
        self.best_loss: float | None = None
        self.best_epoch: int | None = None
        self.best: list[torch.Tensor] | None = None   # the best epoch's weights and buffers, on the CPU

    def stop(self, record: dict, values: Callable[[], list[torch.Tensor]]) -> bool:
        """After the epoch of ``record`` (``values()``: the weights now): True to stop here."""
        loss = record.get("val_loss")
        if not self.enabled or loss is None or not math.isfinite(loss):
            return False
        if self.best_loss is None or loss < self.best_loss:
            # the weights of the best epoch, copied (the runner keeps training the others)
            self.best_loss, self.best_epoch = loss, record["epoch"]
            self.best = [v.detach().to("cpu", copy=True) for v in values()]
            return False
        return record["epoch"] - self.best_epoch >= self.patience

    def restore(self, module: torch.nn.Module) -> None:
        """After training: ``module`` holds the best epoch's weights, not the last one's."""
        if self.best is None or self.best_epoch is None:
            return
        tensors = list(module.parameters()) + list(module.buffers())
        with torch.no_grad():
            for t, v in zip(tensors, self.best, strict=True):
                t.copy_(v)

    def state(self) -> dict:
        return {"best_loss": self.best_loss, "best_epoch": self.best_epoch, "best": self.best}

    def load(self, state: dict) -> None:
        self.best_loss, self.best_epoch, self.best = state["best_loss"], state["best_epoch"], state["best"]
