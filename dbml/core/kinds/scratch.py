"""What a fitted kind reads of its job: the scratch table's rows as arrays, and the summary's
metrics in the shape ``training`` stores them."""

from __future__ import annotations

import time

import numpy as np
from sqlglot import exp

from .. import metrics


def read(cur, table: str, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x rows x width float32, y, is_val) of a job's scratch table (``training._materialise``)."""
    query = exp.select("x", "y", "is_val").from_(exp.to_table(table)).sql("duckdb")
    t = cur.sql(query).to_arrow_table()
    x = t.column("x").combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    return (x.reshape(len(t), width), t.column("y").to_numpy(),
            t.column("is_val").to_numpy(zero_copy_only=False).astype(bool))


def validation_metric(prep, out: np.ndarray, y: np.ndarray) -> dict:
    """Accuracy (classification) or R^2 (regression), and the loss, of raw outputs on the
    held-out rows, as ``heldout.validate`` reports them (cross-entropy of the logits, or
    MSE on the standardised target)."""
    import torch
    import torch.nn.functional as F

    from ..data import shared_tensor
    name = "accuracy" if prep.task == "classification" else "r2"
    if len(y) == 0:
        return {"val_metric": None, "val_metric_name": name, "val_loss": None}
    if prep.task == "classification":
        value = metrics.accuracy(out.argmax(1), y)
        loss = F.cross_entropy(torch.as_tensor(out, dtype=torch.float32), shared_tensor(y.astype(np.int64, copy=False)))
    else:
        value = metrics.r2(y.astype(np.float64), out[:, 0].astype(np.float64))
        loss = F.mse_loss(torch.as_tensor(out[:, 0], dtype=torch.float32), shared_tensor(y.astype(np.float32, copy=False)))
    return {"val_metric": value, "val_metric_name": name, "val_loss": float(loss)}


class Clock:
    """Per-iteration history records as training writes them (epoch, loss, seconds, wait_seconds)."""

    def __init__(self):
        self.t = time.perf_counter()

    def record(self, epoch: int, loss: float, **more) -> dict:
        now = time.perf_counter()
        record = {"epoch": epoch, "loss": float(loss), "seconds": now - self.t, "wait_seconds": 0.0, **more}
        self.t = now
        return record
