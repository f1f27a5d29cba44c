"""``resnet18`` and ``resnet50`` (He et al. 2016, "Deep Residual Learning for Image
Recognition"): the paper's stages and blocks, with the stem adapted to small images
(see ``vision.py``) and a ``width`` multiplier on every channel count."""

from __future__ import annotations

import torch
from torch import nn

from .inputs import Inputs
from .vision import Head, conv_bn, scaled, stem


def shortcut(channels_in: int, channels: int, stride: int) -> nn.Module:
    """Identity, or a strided 1x1 conv-BN where the shape changes (the paper's option B)."""
    if stride == 1 and channels_in == channels:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(channels_in, channels, 1, stride, bias=False), nn.BatchNorm2d(channels))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(self, channels_in: int, channels: int, stride: int):
        super().__init__()
        self.conv1 = conv_bn(channels_in, channels, 3, stride)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = shortcut(channels_in, channels, stride)

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(self.conv1(x))) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided here, as in ResNet v1.5), 1x1 expand by 4, and a shortcut (ResNet-50+)."""

    expansion = 4

    def __init__(self, channels_in: int, channels: int, stride: int):
        super().__init__()
        out = channels * self.expansion
        self.body = nn.Sequential(conv_bn(channels_in, channels, 1), conv_bn(channels, channels, 3, stride),
                                  nn.Conv2d(channels, out, 1, bias=False), nn.BatchNorm2d(out))
        self.shortcut = shortcut(channels_in, out, stride)

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, inputs: Inputs, outputs: int, block, blocks: tuple[int, ...], width: float,
                 dropout: float):
        super().__init__()
        c = scaled(64, width)
        self.stem = stem(inputs, c)
        stages = []
        for i, n in enumerate(blocks):
            channels = scaled(64 * 2 ** i, width)
            for j in range(n):
                stages.append(block(c, channels, 2 if i > 0 and j == 0 else 1))
                c = channels * block.expansion
        self.stages = nn.Sequential(*stages)
        self.head = Head(c, outputs, dropout)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)))


def resnet18(inputs: Inputs, outputs: int, width: float = 1.0, dropout: float = 0.0) -> nn.Module:
    return ResNet(inputs, outputs, BasicBlock, (2, 2, 2, 2), width, dropout)


def resnet50(inputs: Inputs, outputs: int, width: float = 1.0, dropout: float = 0.0) -> nn.Module:
    return ResNet(inputs, outputs, Bottleneck, (3, 4, 6, 3), width, dropout)


_OPTIONS_DOC = ("width: multiplies every channel count (1.0: the paper's 64-128-256-512); dropout: before "
                "the head. Images whose shorter side is under 64 pixels get a stride-1 3x3 stem instead of "
                "the 7x7 stride-2 convolution and max pool.")
ENTRIES = [
    ("resnet18", ("image",), resnet18, {"width": 1.0, "dropout": 0.0},
     "ResNet-18 (He et al. 2016, Deep Residual Learning for Image Recognition): a stem, four stages of "
     "two basic blocks (two 3x3 conv-BN, identity or 1x1 shortcut), global average pooling, a linear "
     "head. " + _OPTIONS_DOC),
    ("resnet50", ("image",), resnet50, {"width": 1.0, "dropout": 0.0},
     "ResNet-50 (He et al. 2016): a stem, stages of 3, 4, 6 and 3 bottleneck blocks (1x1, 3x3, 1x1 "
     "expanding 4x, with a shortcut), global average pooling, a linear head. " + _OPTIONS_DOC),
]
