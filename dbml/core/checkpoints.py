"""A training job's state after a finished epoch, and a job resumed from it.

A job on a Ray worker that dies is restarted from its last finished epoch when the
``max_retries`` setting allows (``dbml.cluster.remote``): after every epoch its worker sends
this state home (``dbml.cluster.hub``), and the restarted job starts from it. The state is
what the epochs that follow depend on: the weights and buffers, the optimizer's state
(Adam's moments and step), the job's random generators (dropout), the history so far,
the vanilla measured on the first batch, and early stopping's best epoch (its loss and
weights: a resumed job stops where, and stores what, the uninterrupted one would).
Epochs draw their order from (seed, epoch) (``training._run_epochs``), so a resumed job
trains exactly as one that never stopped.

Serialised with ``torch.save`` and read back with ``weights_only=True``: plain tensors,
numbers, strings and lists, never arbitrary pickles.
"""

from __future__ import annotations

import io

import torch


def capture(runner, random, history: list[dict], vanilla: int | None, early_stopping: dict) -> dict:
    """The job's state now, between iterations (``runner``: its StepRunner; ``random``: its
    JobRandom), after ``len(history)`` epochs; ``early_stopping``: the best epoch so far
    (``TrainLoop.early_stopping``: its validation loss, number and weights)."""
    best = early_stopping["best"]
    return {
        "epoch": len(history),
        "history": [dict(r) for r in history],
        "values": [t.detach().cpu().clone() for t in runner.values()],
        "optimizer": [{k: v.detach().cpu().clone() for k, v in s.items()} for s in runner.optimizer_state()],
        "random_cpu": random.cpu.get_state(),
        "random_cuda": random.cuda.get_state() if random.cuda is not None else None,
        "vanilla": vanilla,
        "best_loss": early_stopping["best_loss"],
        "best_epoch": early_stopping["best_epoch"],
        "best": None if best is None else [t.detach().cpu().clone() for t in best],
    }


def restore_model(module: torch.nn.Module, state: dict) -> None:
    """Before the runner is made: the saved weights and buffers into ``module``."""
    tensors = list(module.parameters()) + list(module.buffers())
    with torch.no_grad():
        for t, saved in zip(tensors, state["values"], strict=True):
            t.copy_(saved)


def restore_run(runner, random, state: dict) -> None:
    """Before the first iteration: the optimizer's state and the random generators."""
    runner.load_optimizer_state(state["optimizer"])
    random.cpu.set_state(state["random_cpu"])
    if random.cuda is not None and state["random_cuda"] is not None:
        random.cuda.set_state(state["random_cuda"])


def to_bytes(state: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def from_bytes(data: bytes) -> dict:
    return torch.load(io.BytesIO(data), weights_only=True)
