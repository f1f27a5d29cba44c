"""Tabular architectures: ``linear``, ``mlp``, ``resnet_tabular`` and ``ft_transformer``.

``linear`` and ``mlp`` build exactly the modules dbml built before the zoo (same layers in
the same order), so a seeded model draws the same initial weights as it always did.
``resnet_tabular`` and ``ft_transformer`` follow Gorishniy et al. 2021, "Revisiting Deep
Learning Models for Tabular Data" (NeurIPS).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .inputs import Inputs
from .sequence import SelfAttention


def linear(inputs: Inputs, outputs: int) -> nn.Module:
    return nn.Linear(inputs.features, outputs)


def mlp(inputs: Inputs, outputs: int, hidden=(64, 64), dropout: float = 0.0) -> nn.Module:
    layers: list[nn.Module] = []
    width = inputs.features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        width = h
    layers.append(nn.Linear(width, outputs))
    return nn.Sequential(*layers)


class ResidualBlock(nn.Module):
    """x + Dropout(Linear(Dropout(ReLU(Linear(BatchNorm(x))))))."""

    def __init__(self, width: int, hidden: int, dropout: float, residual_dropout: float):
        super().__init__()
        self.body = nn.Sequential(nn.BatchNorm1d(width), nn.Linear(width, hidden), nn.ReLU(),
                                  nn.Dropout(dropout), nn.Linear(hidden, width), nn.Dropout(residual_dropout))

    def forward(self, x):
        return x + self.body(x)


def resnet_tabular(inputs: Inputs, outputs: int, width: int = 64, depth: int = 2, hidden_factor: float = 2.0,
                   dropout: float = 0.1, residual_dropout: float = 0.0) -> nn.Module:
    hidden = max(1, int(width * hidden_factor))
    return nn.Sequential(nn.Linear(inputs.features, width),
                         *(ResidualBlock(width, hidden, dropout, residual_dropout) for _ in range(depth)),
                         nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, outputs))


class ReGLU(nn.Module):
    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return a * torch.relu(b)


class FTLayer(nn.Module):
    """A pre-norm transformer layer; the first layer has no attention norm (the paper's choice:
    the tokenizer's output goes straight into attention)."""

    def __init__(self, width: int, heads: int, ff: int, attention_dropout: float, ff_dropout: float,
                 residual_dropout: float, first: bool):
        super().__init__()
        self.norm1 = nn.Identity() if first else nn.LayerNorm(width)
        self.attention = SelfAttention(width, heads, attention_dropout)
        self.norm2 = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 2 * ff), ReGLU(), nn.Dropout(ff_dropout), nn.Linear(ff, width))
        self.residual_dropout = nn.Dropout(residual_dropout)

    def forward(self, x):
        x = x + self.residual_dropout(self.attention(self.norm1(x)))
        return x + self.residual_dropout(self.ff(self.norm2(x)))


class FTTransformer(nn.Module):
    """Feature tokenizer (token j = x_j * W_j + b_j), a learned [CLS] token appended last,
    pre-norm layers, then LayerNorm-ReLU-Linear on the [CLS] token."""

    def __init__(self, features: int, outputs: int, width: int, depth: int, heads: int, ff_factor: float,
                 attention_dropout: float, ff_dropout: float, residual_dropout: float):
        super().__init__()
        bound = 1 / math.sqrt(width)   # the paper's tokenizer initialisation
        self.weight = nn.Parameter(torch.empty(features, width).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(features, width).uniform_(-bound, bound))
        self.cls = nn.Parameter(torch.empty(1, 1, width).uniform_(-bound, bound))
        ff = max(1, int(width * ff_factor))
        self.layers = nn.ModuleList(
            FTLayer(width, heads, ff, attention_dropout, ff_dropout, residual_dropout, first=i == 0)
            for i in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.ReLU(), nn.Linear(width, outputs))

    def forward(self, x):
        tokens = x.unsqueeze(-1) * self.weight + self.bias                       # (B, F, width)
        tokens = torch.cat([tokens, self.cls.expand(x.shape[0], 1, -1)], dim=1)   # (B, F + 1, width)
        for layer in self.layers:
            tokens = layer(tokens)
        return self.head(tokens[:, -1])


def ft_transformer(inputs: Inputs, outputs: int, width: int = 64, depth: int = 3, heads: int = 8,
                   ff_factor: float = 4 / 3, attention_dropout: float = 0.2, ff_dropout: float = 0.1,
                   residual_dropout: float = 0.0) -> nn.Module:
    return FTTransformer(inputs.features, outputs, width, depth, heads, ff_factor, attention_dropout,
                         ff_dropout, residual_dropout)


# (name, kinds, factory, options with defaults, doc): registry.py turns these into Archs
ENTRIES = [
    ("linear", ("tabular",), linear, {},
     "A single linear layer, nn.Linear(features, outputs): linear or logistic regression. No options."),
    ("mlp", ("tabular",), mlp, {"hidden": (64, 64), "dropout": 0.0},
     "A multilayer perceptron: Linear-ReLU(-Dropout) per hidden layer, then a linear head. "
     "hidden: the hidden layer sizes; dropout: the dropout after each hidden ReLU (0: none)."),
    ("resnet_tabular", ("tabular",), resnet_tabular,
     {"width": 64, "depth": 2, "hidden_factor": 2.0, "dropout": 0.1, "residual_dropout": 0.0},
     "The tabular ResNet of Gorishniy et al. 2021 (Revisiting Deep Learning Models for Tabular Data): "
     "a linear layer to `width`, `depth` residual blocks x + Dropout(Linear(Dropout(ReLU(Linear(BN(x)))))), "
     "then BN-ReLU-Linear. width: the block width; depth: the number of blocks; hidden_factor: a block's "
     "inner width over width; dropout: inside a block; residual_dropout: on a block's output."),
    ("ft_transformer", ("tabular",), ft_transformer,
     {"width": 64, "depth": 3, "heads": 8, "ff_factor": 4 / 3, "attention_dropout": 0.2, "ff_dropout": 0.1,
      "residual_dropout": 0.0},
     "The FT-Transformer of Gorishniy et al. 2021: every feature becomes a token x_j * W_j + b_j, a "
     "[CLS] token is appended, pre-norm transformer layers (ReGLU feed-forward) mix them, and "
     "LayerNorm-ReLU-Linear reads the [CLS] token. width: the token size (a multiple of heads); depth: "
     "layers; heads: attention heads; ff_factor: the feed-forward width over width; attention_dropout, "
     "ff_dropout, residual_dropout: the dropout rates."),
]
