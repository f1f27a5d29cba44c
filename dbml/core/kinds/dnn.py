"""``dnn``: an MLP whose activation is an option (BigQuery ML's ``activation_fn``); ``wide_deep``:
a linear part and such an MLP, their outputs summed (Cheng et al. 2016, "Wide & Deep Learning
for Recommender Systems": BigQuery ML's ``DNN_LINEAR_COMBINED_*`` models), trained jointly."""

from __future__ import annotations

import torch
from torch import nn

from ...errors import InvalidArgument


class CReLU(nn.Module):
    """Concatenated ReLU: [relu(x), relu(-x)], twice the width."""

    def forward(self, x):
        return torch.cat([torch.relu(x), torch.relu(-x)], dim=-1)


ACTIVATIONS = {"relu": nn.ReLU, "relu6": nn.ReLU6, "elu": nn.ELU, "selu": nn.SELU, "sigmoid": nn.Sigmoid,
               "tanh": nn.Tanh, "crelu": CReLU}


def dnn(inputs, outputs: int, hidden=(64, 64), dropout: float = 0.0, activation: str = "relu") -> nn.Module:
    if activation not in ACTIVATIONS:
        raise InvalidArgument(f"train(): option activation of arch 'dnn' is {activation!r}; "
                              f"use one of {', '.join(ACTIVATIONS)}")
    layers: list[nn.Module] = []
    width = inputs.features
    for h in hidden:
        layers += [nn.Linear(width, h), ACTIVATIONS[activation]()]
        width = 2 * h if activation == "crelu" else h
        if dropout:
            layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(width, outputs))
    return nn.Sequential(*layers)


ENTRY = (dnn, {"hidden": (64, 64), "dropout": 0.0, "activation": "relu"},
         "an MLP with a choice of activation: relu, relu6, elu, selu, sigmoid, tanh, crelu")


class WideDeep(nn.Module):
    """The wide part (one linear layer over the inputs) plus the deep part (``dnn``)."""

    def __init__(self, wide: nn.Module, deep: nn.Module):
        super().__init__()
        self.wide, self.deep = wide, deep

    def forward(self, x):
        return self.wide(x) + self.deep(x)


def wide_deep(inputs, outputs: int, hidden=(64, 64), dropout: float = 0.0, activation: str = "relu") -> nn.Module:
    deep = dnn(inputs, outputs, hidden, dropout, activation)   # first: its activation checked
    return WideDeep(nn.Linear(inputs.features, outputs), deep)


WIDE_DEEP = (wide_deep, {"hidden": (64, 64), "dropout": 0.0, "activation": "relu"},
             "wide and deep: a linear layer plus a dnn (same options), their outputs summed")
