"""Sequence and text architectures (input kinds ``tokens`` and ``series``): ``transformer``
and ``tcn``; and :class:`SelfAttention`, the attention every zoo transformer uses.

Attention is written out (q @ k^T, masked_fill, softmax, @ v) rather than through
``nn.MultiheadAttention``: the scheduler captures the step with ``make_fx`` and needs plain
aten ops with static shapes. Padding (token id 0, or a 0.0 in a series' mask channel) is
masked out of attention keys and out of the mean over time, without data-dependent control
flow: a padded row changes nothing but costs the same.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .inputs import Inputs


class SelfAttention(nn.Module):
    """Multi-head self-attention over (B, T, width); ``padding`` (B, T) is True at keys to ignore."""

    def __init__(self, width: int, heads: int, dropout: float = 0.0):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, padding=None):
        b, t, width = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(width // self.heads)        # (B, heads, T, T)
        if padding is not None:
            # the most negative finite float, not -inf: a row with every key padded gets a
            # uniform (harmless) distribution instead of NaN
            scores = scores.masked_fill(padding[:, None, None, :], torch.finfo(scores.dtype).min)
        weights = self.dropout(torch.softmax(scores, dim=-1))
        return self.out((weights @ v).transpose(1, 2).reshape(b, t, width))


class EncoderLayer(nn.Module):
    """Pre-norm: x + Dropout(Attention(LN(x))), then x + Dropout(FF(LN(x))), FF = Linear-GELU-Linear."""

    def __init__(self, width: int, heads: int, ff: int, dropout: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = SelfAttention(width, heads, dropout)
        self.ff = nn.Sequential(nn.Linear(width, ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(ff, width))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, padding):
        x = x + self.dropout(self.attention(self.norm1(x), padding))
        return x + self.dropout(self.ff(self.norm2(x)))


def present(inputs: Inputs, x: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: True where a token or value is present (not padding)."""
    return x != 0 if inputs.kind == "tokens" else x[..., 1] > 0.5


def masked_mean(h: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of (B, T, C) over the present steps; an all-padding row gives zeros."""
    w = valid.to(h.dtype).unsqueeze(-1)
    return (h * w).sum(1) / w.sum(1).clamp(min=1.0)


class Transformer(nn.Module):
    """Encoder classifier / regressor: embedding (tokens) or Linear([value, mask]) (series),
    learned positions, pre-norm layers, LayerNorm, masked mean over time, linear head."""

    def __init__(self, inputs: Inputs, outputs: int, width: int, depth: int, heads: int, ff: int,
                 dropout: float):
        super().__init__()
        self.inputs = inputs
        self.embed = nn.Embedding(inputs.vocab, width) if inputs.kind == "tokens" else nn.Linear(2, width)
        self.position = nn.Parameter(torch.randn(inputs.max_len, width) * 0.02)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(EncoderLayer(width, heads, ff, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, outputs)

    def forward(self, x):
        if x.shape[1] > self.inputs.max_len:   # a static shape, not a tensor value: capture-safe
            raise ValueError(f"transformer: a sequence of {x.shape[1]} steps is longer than max_len "
                             f"{self.inputs.max_len} the model was built for")
        valid = present(self.inputs, x)
        h = self.dropout(self.embed(x) + self.position[: x.shape[1]])
        padding = ~valid
        for layer in self.layers:
            h = layer(h, padding)
        return self.head(masked_mean(self.norm(h), valid))


class TemporalBlock(nn.Module):
    """Two dilated causal convolutions (ReLU, dropout after each) and a residual connection
    (a 1x1 convolution where the channel count changes)."""

    def __init__(self, channels_in: int, channels: int, kernel: int, dilation: int, dropout: float):
        super().__init__()
        self.pad = (kernel - 1) * dilation   # on the left only: step t sees steps <= t
        self.conv1 = nn.Conv1d(channels_in, channels, kernel, dilation=dilation)
        self.conv2 = nn.Conv1d(channels, channels, kernel, dilation=dilation)
        self.dropout = nn.Dropout(dropout)
        self.skip = nn.Conv1d(channels_in, channels, 1) if channels_in != channels else nn.Identity()

    def forward(self, x):
        h = self.dropout(torch.relu(self.conv1(F.pad(x, (self.pad, 0)))))
        h = self.dropout(torch.relu(self.conv2(F.pad(h, (self.pad, 0)))))
        return torch.relu(h + self.skip(x))


class TCN(nn.Module):
    """A temporal convolutional network: blocks with dilations 1, 2, 4, ..., masked mean over time, head."""

    def __init__(self, inputs: Inputs, outputs: int, width: int, depth: int, kernel: int, dropout: float):
        super().__init__()
        self.inputs = inputs
        self.embed = nn.Embedding(inputs.vocab, width) if inputs.kind == "tokens" else None
        first = width if self.embed is not None else 2
        self.blocks = nn.Sequential(*(TemporalBlock(first if i == 0 else width, width, kernel, 2 ** i, dropout)
                                      for i in range(depth)))
        self.head = nn.Linear(width, outputs)

    def forward(self, x):
        valid = present(self.inputs, x)
        h = self.embed(x) if self.embed is not None else x
        h = self.blocks(h.transpose(1, 2)).transpose(1, 2)    # (B, T, width)
        return self.head(masked_mean(h, valid))


class BagOfNgrams(nn.Module):
    """A linear model over a text's bag of words and hashed word pairs (fastText-style,
    Joulin et al. 2017, without its hidden layer): the mean of a learned weight vector per
    token present, plus, with ``ngrams`` 2, per pair of neighbouring tokens hashed into
    ``buckets``, plus a bias. The mean over the present tokens is a length-normalised count
    vector times a weight matrix: logistic (softmax) or linear regression on term
    frequencies. Weights start at zero, as a linear model's."""

    def __init__(self, inputs: Inputs, outputs: int, ngrams: int, buckets: int):
        super().__init__()
        self.inputs, self.ngrams, self.buckets = inputs, ngrams, buckets
        self.words = nn.Embedding(inputs.vocab, outputs)
        self.pairs = nn.Embedding(buckets + 1, outputs) if ngrams >= 2 else None
        self.bias = nn.Parameter(torch.zeros(outputs))
        nn.init.zeros_(self.words.weight)
        if self.pairs is not None:
            nn.init.zeros_(self.pairs.weight)

    def forward(self, x):
        valid = x != 0
        out = masked_mean(self.words(x), valid) + self.bias
        if self.pairs is not None and x.shape[1] > 1:
            both = valid[:, 1:] & valid[:, :-1]
            pair = (x[:, :-1] * 1000003 + x[:, 1:]) % self.buckets + 1    # 0: no pair (padding)
            out = out + masked_mean(self.pairs(pair * both), both)
        return out


def bow(inputs: Inputs, outputs: int, ngrams: int = 2, buckets: int = 1 << 16) -> nn.Module:
    return BagOfNgrams(inputs, outputs, ngrams, buckets)


def transformer(inputs: Inputs, outputs: int, width: int = 64, depth: int = 2, heads: int = 4, ff: int = 256,
                dropout: float = 0.1) -> nn.Module:
    return Transformer(inputs, outputs, width, depth, heads, ff, dropout)


def tcn(inputs: Inputs, outputs: int, width: int = 64, depth: int = 4, kernel: int = 3,
        dropout: float = 0.0) -> nn.Module:
    return TCN(inputs, outputs, width, depth, kernel, dropout)


ENTRIES = [
    ("bow", ("tokens",), bow, {"ngrams": 2, "buckets": 1 << 16},
     "A bag of words and word pairs (fastText without its hidden layer): the mean over a text's tokens of "
     "a learned weight vector per token and, with ngrams 2, per pair of neighbouring tokens hashed into "
     "`buckets`, plus a bias: logistic or linear regression on length-normalised term counts. Cheap and "
     "strong on short texts; `auto` picks it below AUTO_BOW_ROWS texts. ngrams: 1 (words) or 2 (and "
     "pairs); buckets: the hashed pairs' table size."),
    ("transformer", ("tokens", "series"), transformer,
     {"width": 64, "depth": 2, "heads": 4, "ff": 256, "dropout": 0.1},
     "A transformer encoder (Vaswani et al. 2017, pre-norm as in Xiong et al. 2020) for classification "
     "or regression: token embedding (tokens) or a linear projection of [value, mask] (series), learned "
     "positions up to max_len, `depth` pre-norm layers with padding masked out of attention, LayerNorm, "
     "mean over the present steps, a linear head. width: the model width (a multiple of heads); depth: "
     "layers; heads: attention heads; ff: the feed-forward width; dropout: on embeddings, attention "
     "weights, feed-forward and residual branches."),
    ("tcn", ("tokens", "series"), tcn,
     {"width": 64, "depth": 4, "kernel": 3, "dropout": 0.0},
     "A temporal convolutional network (Bai, Kolter and Koltun 2018, An Empirical Evaluation of Generic "
     "Convolutional and Recurrent Networks for Sequence Modeling): token embedding (tokens) or the "
     "[value, mask] channels (series), `depth` residual blocks of two dilated causal convolutions "
     "(dilation 1, 2, 4, ...), mean over the present steps, a linear head. width: channels; depth: "
     "blocks (receptive field 1 + 2 (kernel - 1) (2^depth - 1) steps); kernel: the convolution size; "
     "dropout: after each convolution."),
]
