"""``inception_v3`` (Szegedy et al. 2016, "Rethinking the Inception Architecture for Computer
Vision") and ``inception_v4`` (Szegedy et al. 2017, "Inception-v4, Inception-ResNet and the
Impact of Residual Connections on Learning"): the papers' stems, blocks, block counts and
channel counts (times ``width``).

Differences from the papers, all so any image of 8 pixels or more works: every convolution
and pooling is padded ('same'; the papers use unpadded ones in the stem and reductions), the
stem keeps stride 1 and drops its pooling for images under 64 pixels (``vision.SMALL_INPUT``),
and a global average pooling feeds the head. Inception-v3's auxiliary classifier (a training
aid the paper attaches at 17x17) is left out: a model returns one (B, outputs) tensor.

A block is a :class:`Concat` of branches, each a chain of conv-BN-ReLU layers written as
(channels, kernel[, stride]); kernel (1, 7) is 1 high and 7 wide.
"""

from __future__ import annotations

import torch
from torch import nn

from .inputs import Inputs
from .vision import Head, conv_bn, scaled, small


class Concat(nn.Module):
    """Branches applied to the same input, concatenated along the channels."""

    def __init__(self, *branches: nn.Module):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches], dim=1)


def chain(channels_in: int, *layers) -> nn.Sequential:
    """conv-BN-ReLU layers, each (channels, kernel[, stride]), one after another."""
    mods = []
    for spec in layers:
        channels, kernel, stride = (*spec, 1)[:3]
        mods.append(conv_bn(channels_in, channels, kernel, stride))
        channels_in = channels
    return nn.Sequential(*mods)


def pooled(channels_in: int, channels: int) -> nn.Sequential:
    """The pooling branch: 3x3 average pooling, then a 1x1 conv-BN-ReLU."""
    return nn.Sequential(nn.AvgPool2d(3, 1, 1), chain(channels_in, (channels, 1)))


def pair(channels_in: int, channels: int) -> Concat:
    """The split 1x3 and 3x1 convolutions of the widest blocks."""
    return Concat(chain(channels_in, (channels, (1, 3))), chain(channels_in, (channels, (3, 1))))


def max_pool(stride: int = 2) -> nn.MaxPool2d:
    return nn.MaxPool2d(3, stride, 1)


# -- Inception-v3 ----------------------------------------------------------------------------

def v3_blocks(c: int, s) -> tuple[list[nn.Module], int]:
    """3 x A (35x35 in the paper), reduction, 4 x C (17x17), reduction, 2 x E (8x8)."""
    blocks = []
    for pool in (32, 64, 64):
        blocks.append(Concat(chain(c, (s(64), 1)), chain(c, (s(48), 1), (s(64), 5)),
                             chain(c, (s(64), 1), (s(96), 3), (s(96), 3)), pooled(c, s(pool))))
        c = 2 * s(64) + s(96) + s(pool)
    blocks.append(Concat(chain(c, (s(384), 3, 2)), chain(c, (s(64), 1), (s(96), 3), (s(96), 3, 2)), max_pool()))
    c = s(384) + s(96) + c
    for c7 in (s(128), s(160), s(160), s(192)):
        blocks.append(Concat(chain(c, (s(192), 1)),
                             chain(c, (c7, 1), (c7, (1, 7)), (s(192), (7, 1))),
                             chain(c, (c7, 1), (c7, (7, 1)), (c7, (1, 7)), (c7, (7, 1)), (s(192), (1, 7))),
                             pooled(c, s(192))))
        c = 4 * s(192)
    blocks.append(Concat(chain(c, (s(192), 1), (s(320), 3, 2)),
                         chain(c, (s(192), 1), (s(192), (1, 7)), (s(192), (7, 1)), (s(192), 3, 2)), max_pool()))
    c = s(320) + s(192) + c
    for _ in range(2):
        blocks.append(Concat(chain(c, (s(320), 1)), nn.Sequential(chain(c, (s(384), 1)), pair(s(384), s(384))),
                             nn.Sequential(chain(c, (s(448), 1), (s(384), 3)), pair(s(384), s(384))),
                             pooled(c, s(192))))
        c = s(320) + 4 * s(384) + s(192)
    return blocks, c


def inception_v3(inputs: Inputs, outputs: int, width: float = 1.0, dropout: float = 0.5) -> nn.Module:
    s = lambda n: scaled(n, width)   # noqa: E731
    stride = 1 if small(inputs) else 2
    pools = [] if small(inputs) else [max_pool()]
    stem = [chain(inputs.shape[0], (s(32), 3, stride), (s(32), 3), (s(64), 3)), *pools,
            chain(s(64), (s(80), 1), (s(192), 3)), *pools]
    blocks, c = v3_blocks(s(192), s)
    return nn.Sequential(*stem, *blocks, Head(c, outputs, dropout))


# -- Inception-v4 ----------------------------------------------------------------------------

def v4_stem(channels_in: int, s, stride: int) -> tuple[list[nn.Module], int]:
    """The v4 stem: three convolutions, then three concatenating steps (the paper's Figure 3)."""
    stem = [chain(channels_in, (s(32), 3, stride), (s(32), 3), (s(64), 3)),
            Concat(max_pool(stride), chain(s(64), (s(96), 3, stride)))]
    c = s(64) + s(96)
    stem.append(Concat(chain(c, (s(64), 1), (s(96), 3)),
                       chain(c, (s(64), 1), (s(64), (1, 7)), (s(64), (7, 1)), (s(96), 3))))
    c = 2 * s(96)
    stem.append(Concat(chain(c, (s(192), 3, stride)), max_pool(stride)))
    return stem, s(192) + c


def v4_blocks(c: int, s) -> tuple[list[nn.Module], int]:
    """4 x A, reduction A, 7 x B, reduction B, 3 x C."""
    blocks = []
    for _ in range(4):
        blocks.append(Concat(chain(c, (s(96), 1)), chain(c, (s(64), 1), (s(96), 3)),
                             chain(c, (s(64), 1), (s(96), 3), (s(96), 3)), pooled(c, s(96))))
        c = 4 * s(96)
    blocks.append(Concat(chain(c, (s(384), 3, 2)), chain(c, (s(192), 1), (s(224), 3), (s(256), 3, 2)), max_pool()))
    c = s(384) + s(256) + c
    for _ in range(7):
        blocks.append(Concat(chain(c, (s(384), 1)), chain(c, (s(192), 1), (s(224), (1, 7)), (s(256), (7, 1))),
                             chain(c, (s(192), 1), (s(192), (7, 1)), (s(224), (1, 7)), (s(224), (7, 1)),
                                   (s(256), (1, 7))),
                             pooled(c, s(128))))
        c = s(384) + 2 * s(256) + s(128)
    blocks.append(Concat(chain(c, (s(192), 1), (s(192), 3, 2)),
                         chain(c, (s(256), 1), (s(256), (1, 7)), (s(320), (7, 1)), (s(320), 3, 2)), max_pool()))
    c = s(192) + s(320) + c
    for _ in range(3):
        blocks.append(Concat(chain(c, (s(256), 1)), nn.Sequential(chain(c, (s(384), 1)), pair(s(384), s(256))),
                             nn.Sequential(chain(c, (s(384), 1), (s(448), (3, 1)), (s(512), (1, 3))),
                                           pair(s(512), s(256))),
                             pooled(c, s(256))))
        c = 6 * s(256)
    return blocks, c


def inception_v4(inputs: Inputs, outputs: int, width: float = 1.0, dropout: float = 0.2) -> nn.Module:
    s = lambda n: scaled(n, width)   # noqa: E731
    stem, c = v4_stem(inputs.shape[0], s, 1 if small(inputs) else 2)
    blocks, c = v4_blocks(c, s)
    return nn.Sequential(*stem, *blocks, Head(c, outputs, dropout))


_NOTE = ("Convolutions are padded so any image of 8 pixels or more works; images whose shorter side is "
         "under 64 pixels get the stem with stride 1 and no pooling. width: multiplies every channel "
         "count; dropout: before the head.")
ENTRIES = [
    ("inception_v3", ("image",), inception_v3, {"width": 1.0, "dropout": 0.5},
     "Inception-v3 (Szegedy et al. 2016, Rethinking the Inception Architecture for Computer Vision): "
     "the five-convolution stem, 3 Inception-A blocks, a reduction, 4 Inception-C blocks with factorised "
     "1x7 / 7x1 convolutions, a reduction, 2 Inception-E blocks with split 1x3 / 3x1 branches, global "
     "average pooling, a linear head (no auxiliary classifier). " + _NOTE),
    ("inception_v4", ("image",), inception_v4, {"width": 1.0, "dropout": 0.2},
     "Inception-v4 (Szegedy et al. 2017, Inception-v4, Inception-ResNet and the Impact of Residual "
     "Connections on Learning): the concatenating stem, 4 Inception-A, reduction A, 7 Inception-B, "
     "reduction B, 3 Inception-C blocks, global average pooling, a linear head. " + _NOTE),
]
