"""The model zoo: architectures ``train()`` can build, by name.

A model is rebuilt from its ``ModelConfig`` (stored in the catalog as JSON) and its
weights, so loading never runs pickled code.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass

import torch
from torch import nn

from .errors import InvalidArgument

ARCHS = ("auto", "linear", "mlp")
DEFAULT_HIDDEN = (64, 64)


@dataclass(frozen=True)
class ModelConfig:
    arch: str                  # "linear" | "mlp"
    inputs: int
    outputs: int
    hidden: tuple[int, ...] = ()
    dropout: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        d = json.loads(text)
        return cls(**{**d, "hidden": tuple(d["hidden"])})


def config(arch: str, inputs: int, outputs: int, hidden=None, dropout: float = 0.0, *, fn="train") -> ModelConfig:
    """Validate the SQL arguments that choose the architecture."""
    if arch not in ARCHS:
        raise InvalidArgument(f"{fn}(): unknown arch {arch!r}; pass arch := one of {', '.join(map(repr, ARCHS))}")
    if arch == "linear":
        if hidden:
            raise InvalidArgument(f"{fn}(): arch 'linear' has no hidden layers; drop hidden := or pass arch := 'mlp'")
        return ModelConfig("linear", inputs, outputs)
    hidden = tuple(DEFAULT_HIDDEN if hidden is None else hidden)
    if not hidden or any(h is None or h <= 0 for h in hidden):
        raise InvalidArgument(f"{fn}(): hidden must list positive layer sizes, e.g. hidden := [64, 64]")
    if not 0.0 <= dropout < 1.0:
        raise InvalidArgument(f"{fn}(): dropout must be in [0, 1), e.g. dropout := 0.1")
    return ModelConfig("mlp", inputs, outputs, hidden, dropout)


def build(cfg: ModelConfig) -> nn.Module:
    if cfg.arch == "linear":
        return nn.Linear(cfg.inputs, cfg.outputs)
    layers: list[nn.Module] = []
    width = cfg.inputs
    for h in cfg.hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        if cfg.dropout:
            layers.append(nn.Dropout(cfg.dropout))
        width = h
    layers.append(nn.Linear(width, cfg.outputs))
    return nn.Sequential(*layers)


def parameter_bytes(cfg: ModelConfig) -> int:
    """The bytes of the parameters of the model ``cfg`` builds, counted on the meta device:
    shapes only, no memory, whatever the size."""
    with torch.device("meta"):
        return sum(p.numel() * p.element_size() for p in build(cfg).parameters())


# Layers draw their initial weights from the global generator: concurrent jobs build
# their models one at a time so each sees only its own seed.
_BUILD_LOCK = threading.Lock()


def build_seeded(cfg: ModelConfig, seed: int) -> nn.Module:
    """The model with its initial weights drawn from ``seed``, leaving the global RNG as it was."""
    with _BUILD_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build(cfg)
