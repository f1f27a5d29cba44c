"""A trained model's architecture: its ``ModelConfig``, and building it from the zoo.

The zoo (``dbml.zoo``) holds the architectures, built-in and registered from Python. A
model is rebuilt from its ``ModelConfig`` (stored in the catalog as JSON: the arch's name,
what it takes, its outputs and options) and its weights, so loading never runs pickled
code; a custom arch must be registered in the loading process
(``dbml.register_model``), or loading fails saying so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from torch import nn

from .arguments import arguments
from ..zoo import Inputs, arch as zoo_arch, auto, build as zoo_build, resolve_options


@dataclass(frozen=True)
class ModelConfig:
    arch: str                                   # a zoo arch ('auto' already resolved)
    inputs: Inputs
    outputs: int
    options: tuple[tuple[str, object], ...] = ()  # resolved options, sorted; hashable (jobs share graphs by config)

    def options_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.options}

    def to_json(self) -> str:
        return json.dumps({"arch": self.arch, "inputs": json.loads(self.inputs.to_json()),
                           "outputs": self.outputs, "options": self.options_dict()})

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        d = json.loads(text)
        if isinstance(d["inputs"], int):   # a model stored before the zoo: tabular linear / mlp
            options = {} if d["arch"] == "linear" else {"hidden": d["hidden"], "dropout": d["dropout"]}
            return cls(d["arch"], Inputs("tabular", features=d["inputs"]), d["outputs"], _frozen(options))
        return cls(d["arch"], Inputs.from_json(json.dumps(d["inputs"])), d["outputs"], _frozen(d["options"]))

    def describe(self) -> str:
        """For messages: the arch and its options."""
        opts = ", ".join(f"{k} := {json.dumps(v)}" for k, v in self.options_dict().items())
        return f"arch := '{self.arch}'" + (f" ({opts})" if opts else "")


def _frozen(options: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items()))


def config(arch: str, inputs: Inputs, outputs: int, options: dict | None = None, *, hidden=None,
           dropout: float | None = None, fn: str = "train", rows: int | None = None) -> ModelConfig:
    """Validate the arguments that choose the architecture: ``arch`` ('auto' picks one for the
    input kind), its ``options`` (a JSON object from SQL), and the older ``hidden`` and
    ``dropout`` arguments, which are options of 'mlp' (and 'dropout' of most archs)."""
    name = auto(inputs, rows) if arch == "auto" else arch
    options = arguments(name, options, hidden=hidden, dropout=dropout, fn=fn)
    resolved = resolve_options(zoo_arch(name, fn=fn), options, inputs, fn=fn)
    return ModelConfig(name, inputs, outputs, _frozen(resolved))


def build(cfg: ModelConfig) -> nn.Module:
    return zoo_build(cfg.arch, cfg.inputs, cfg.outputs, cfg.options_dict(), fn="load")


def parameter_bytes(cfg: ModelConfig) -> int:
    """The bytes of the parameters of the model ``cfg`` builds, counted on the meta device:
    shapes only, no memory, whatever the size (tied parameters once)."""
    with torch.device("meta"):
        return sum(p.numel() * p.element_size() for p in build(cfg).parameters())


def sample_input(cfg: ModelConfig, rows: int, device=None) -> torch.Tensor:
    """An input batch of ``rows`` rows as the model takes it, for planning ahead:
    sequences at their longest (``zoo.Inputs.sample``)."""
    return cfg.inputs.sample(rows, device)


def build_seeded(cfg: ModelConfig, seed: int) -> nn.Module:
    """The model with its initial weights drawn from ``seed``, leaving the global RNG as it
    was. Layers draw their initial weights from the default generator: the build runs with
    ``seed``'s state put into it, under the lock every job's use of it takes
    (``dbml.scheduler.execute.rng``), so a model built while other jobs run sees only its seed."""
    from ..scheduler.execute.rng import JobRandom  # here: loading a model (predict) imports no scheduler
    return JobRandom(seed).call(build, cfg)
