"""``vgg16`` with batch norm (Simonyan and Zisserman 2015) and ``densenet121`` (Huang et al.
2017): the papers' layer configurations, global average pooling before the classifier (so
any image size works), a ``width`` multiplier on every channel count."""

from __future__ import annotations

import torch
from torch import nn

from .inputs import Inputs
from .vision import Head, conv_bn, scaled, stem

# VGG's configuration D: 3x3 conv layers by output channels, "M" a 2x2 max pool
VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG(nn.Module):
    def __init__(self, inputs: Inputs, outputs: int, width: float, hidden: int, dropout: float):
        super().__init__()
        layers, c = [], inputs.shape[0]
        for v in VGG16:
            if v == "M":
                layers.append(nn.MaxPool2d(2, ceil_mode=True))   # ceil: a 1x1 map stays 1x1
            else:
                layers.append(conv_bn(c, scaled(v, width)))
                c = scaled(v, width)
        self.features = nn.Sequential(*layers)
        h = scaled(hidden, width)
        self.classifier = nn.Sequential(nn.Linear(c, h), nn.ReLU(), nn.Dropout(dropout),
                                        nn.Linear(h, h), nn.ReLU(), nn.Dropout(dropout), nn.Linear(h, outputs))

    def forward(self, x):
        return self.classifier(self.features(x).mean(dim=(2, 3)))


def vgg16(inputs: Inputs, outputs: int, width: float = 1.0, hidden: int = 4096, dropout: float = 0.5) -> nn.Module:
    return VGG(inputs, outputs, width, hidden, dropout)


class DenseLayer(nn.Module):
    """BN-ReLU-1x1 conv (bottleneck to 4 x growth) - BN-ReLU-3x3 conv (growth channels), on the
    concatenation of every earlier feature map of the block."""

    def __init__(self, channels_in: int, growth: int):
        super().__init__()
        self.body = nn.Sequential(nn.BatchNorm2d(channels_in), nn.ReLU(),
                                  nn.Conv2d(channels_in, 4 * growth, 1, bias=False),
                                  nn.BatchNorm2d(4 * growth), nn.ReLU(),
                                  nn.Conv2d(4 * growth, growth, 3, 1, 1, bias=False))

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        return self.body(torch.cat(features, dim=1))


class DenseBlock(nn.Module):
    def __init__(self, channels_in: int, layers: int, growth: int):
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(channels_in + i * growth, growth) for i in range(layers))

    def forward(self, x):
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, dim=1)


def transition(channels_in: int, channels: int) -> nn.Sequential:
    """BN-ReLU-1x1 conv halving the channels, 2x2 average pooling."""
    return nn.Sequential(nn.BatchNorm2d(channels_in), nn.ReLU(), nn.Conv2d(channels_in, channels, 1, bias=False),
                         nn.AvgPool2d(2, ceil_mode=True))


class DenseNet(nn.Module):
    def __init__(self, inputs: Inputs, outputs: int, blocks: tuple[int, ...], width: float, dropout: float):
        super().__init__()
        growth, c = scaled(32, width), scaled(64, width)
        layers: list[nn.Module] = [stem(inputs, c)]
        for i, n in enumerate(blocks):
            layers.append(DenseBlock(c, n, growth))
            c += n * growth
            if i < len(blocks) - 1:
                layers.append(transition(c, c // 2))
                c //= 2
        layers += [nn.BatchNorm2d(c), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = Head(c, outputs, dropout)

    def forward(self, x):
        return self.head(self.features(x))


def densenet121(inputs: Inputs, outputs: int, width: float = 1.0, dropout: float = 0.0) -> nn.Module:
    return DenseNet(inputs, outputs, (6, 12, 24, 16), width, dropout)


ENTRIES = [
    ("vgg16", ("image",), vgg16, {"width": 1.0, "hidden": 4096, "dropout": 0.5},
     "VGG-16 with batch norm (Simonyan and Zisserman 2015, Very Deep Convolutional Networks for "
     "Large-Scale Image Recognition; configuration D): 13 3x3 conv-BN-ReLU layers in five stages, each "
     "ended by 2x2 max pooling, global average pooling, then Linear-ReLU-Dropout twice and a linear head. "
     "width: multiplies every channel count and the hidden size; hidden: the classifier's hidden size "
     "(4096 in the paper); dropout: in the classifier."),
    ("densenet121", ("image",), densenet121, {"width": 1.0, "dropout": 0.0},
     "DenseNet-121 (Huang et al. 2017, Densely Connected Convolutional Networks; DenseNet-BC): a stem, "
     "dense blocks of 6, 12, 24 and 16 layers (BN-ReLU-1x1 conv to 4 x growth, BN-ReLU-3x3 conv to "
     "growth 32, each on the concatenation of all earlier maps), transitions halving channels and "
     "resolution, BN-ReLU, global average pooling, a linear head. width: multiplies the growth rate and "
     "the stem's 64 channels; dropout: before the head. Images whose shorter side is under 64 pixels get "
     "a stride-1 3x3 stem."),
]
