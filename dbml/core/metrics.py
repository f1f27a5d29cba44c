"""Model quality metrics: what ``train()`` reports on its validation rows and ``evaluate()``
on any labelled source.

Classification: accuracy, macro F1 over the model's classes, log loss. Regression: RMSE,
MAE, R^2. Plain numpy over the model's outputs; nothing here trains or schedules.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def r2(y: np.ndarray, pred: np.ndarray) -> float | None:
    """Coefficient of determination; None when the targets do not vary."""
    ss_tot = float(((y - y.mean()) ** 2).sum())
    if ss_tot == 0:
        return None
    return 1.0 - float(((y - pred) ** 2).sum()) / ss_tot


def accuracy(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(pred == y))


def macro_f1(pred: np.ndarray, y: np.ndarray, n_classes: int) -> float | None:
    """The mean F1 over the classes that occur in ``y`` or ``pred``; None if none does."""
    f1s = []
    for c in range(n_classes):
        tp = np.sum((pred == c) & (y == c))
        fp, fn = np.sum((pred == c) & (y != c)), np.sum((pred != c) & (y == c))
        if tp + fp + fn:
            f1s.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(f1s)) if f1s else None


def log_loss(out: torch.Tensor, y: np.ndarray) -> float:
    """Mean negative log-probability of the true class; label -1 (a class the model never
    saw) counts as probability 0, clipped to 1e-15."""
    prob = torch.softmax(out.double(), 1).numpy()
    p_true = np.where(y >= 0, prob[np.arange(len(y)), np.clip(y, 0, None)], 0.0)
    return float(-np.mean(np.log(np.clip(p_true, 1e-15, 1.0))))


def rmse(y: np.ndarray, pred: np.ndarray) -> float:
    return math.sqrt(float(np.mean((pred - y) ** 2)))


def mae(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y)))


def classification(out: torch.Tensor, y: np.ndarray, n_classes: int) -> dict:
    """``evaluate()``'s figures for a classifier's raw outputs ``out`` and class indices ``y``."""
    pred = out.argmax(1).numpy()
    return {"accuracy": accuracy(pred, y), "macro_f1": macro_f1(pred, y, n_classes),
            "log_loss": log_loss(out, y), "rmse": None, "mae": None, "r2": None}


def regression(y: np.ndarray, pred: np.ndarray) -> dict:
    """``evaluate()``'s figures for a regressor's unscaled predictions."""
    return {"accuracy": None, "macro_f1": None, "log_loss": None,
            "rmse": rmse(y, pred), "mae": mae(y, pred), "r2": r2(y, pred)}
