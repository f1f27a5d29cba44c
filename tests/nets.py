"""Small models the scheduler tests train: an MLP with dropout and a CNN with BatchNorm."""

import torch


def mlp(depth: int = 4) -> torch.nn.Sequential:
    layers = [torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Dropout(0.2)]
    for _ in range(depth):
        layers += [torch.nn.Linear(128, 128), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(128, 10))


def cnn() -> torch.nn.Sequential:
    layers, c = [], 3
    for _ in range(3):
        layers += [torch.nn.Conv2d(c, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()]
        c = 8
    return torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.Linear(8 * 12 * 12, 10))
