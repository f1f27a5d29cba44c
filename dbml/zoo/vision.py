"""Vision building blocks shared by the image architectures, and the small ``cnn``.

Every image model takes float32 (B, C, H, W) for any H, W >= 8 and ends in global average
pooling and a linear head, so the input size changes no parameter shape. Small inputs:
when the shorter side is below :data:`SMALL_INPUT` pixels, a model replaces its ImageNet
stem (a strided 7x7 convolution and pooling, or Inception's strided stem) by a stride-1
3x3 stem that keeps the resolution, as the CIFAR variants of these networks do; the blocks
after the stem are unchanged. Downsampling layers pad (and pool with ``ceil_mode``), so a
feature map that has shrunk to 1x1 stays 1x1 instead of vanishing.

The larger networks live in ``vision_resnet.py``, ``vision_vgg_densenet.py`` and
``vision_inception.py``; a ``width`` option scales every channel count (1.0: the paper's).
"""

from __future__ import annotations

from torch import nn

from .inputs import Inputs

SMALL_INPUT = 64    # shorter image side (pixels) below which models use the stride-1 stem


def small(inputs: Inputs) -> bool:
    """Whether ``inputs``' images are small enough for the stride-1 stem."""
    return min(inputs.shape[1:]) < SMALL_INPUT


def scaled(channels: int, width: float) -> int:
    """``channels`` times the width multiplier, at least 1."""
    return max(1, round(channels * width))


def conv_bn(channels_in: int, channels: int, kernel=3, stride: int = 1, padding=None) -> nn.Sequential:
    """Conv (no bias) - BatchNorm - ReLU; 'same' padding unless given."""
    if padding is None:
        padding = tuple(k // 2 for k in kernel) if isinstance(kernel, tuple) else kernel // 2
    return nn.Sequential(nn.Conv2d(channels_in, channels, kernel, stride, padding, bias=False),
                         nn.BatchNorm2d(channels), nn.ReLU())


class Head(nn.Module):
    """Global average pooling, dropout, a linear layer: (B, C, H, W) -> (B, outputs)."""

    def __init__(self, channels: int, outputs: int, dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(channels, outputs)

    def forward(self, x):
        return self.fc(self.dropout(x.mean(dim=(2, 3))))


def imagenet_stem(channels_in: int, channels: int) -> nn.Sequential:
    """The ResNet / DenseNet ImageNet stem: 7x7 stride-2 conv-BN-ReLU, 3x3 stride-2 max pool."""
    return nn.Sequential(conv_bn(channels_in, channels, 7, 2), nn.MaxPool2d(3, 2, 1))


def stem(inputs: Inputs, channels: int) -> nn.Sequential:
    """The stem for ``inputs``: ImageNet's, or a stride-1 3x3 conv-BN-ReLU for small images."""
    c = inputs.shape[0]
    return conv_bn(c, channels, 3) if small(inputs) else imagenet_stem(c, channels)


def cnn(inputs: Inputs, outputs: int, width: int = 32, depth: int = 3, dropout: float = 0.0) -> nn.Module:
    layers, c = [], inputs.shape[0]
    for i in range(depth):
        layers += [conv_bn(c, width * 2 ** i), nn.MaxPool2d(2, ceil_mode=True)]
        c = width * 2 ** i
    return nn.Sequential(*layers, Head(c, outputs, dropout))


ENTRIES = [
    ("cnn", ("image",), cnn, {"width": 32, "depth": 3, "dropout": 0.0},
     "A small convolutional network: `depth` stages of 3x3 conv-BatchNorm-ReLU and 2x2 max pooling "
     "(channels width, 2 width, 4 width, ...), global average pooling, a linear head; suits 8x8 to "
     "64x64 images. width: the first stage's channels; depth: stages; dropout: before the head."),
]
