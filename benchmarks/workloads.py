"""The workloads of ``python -m dbml bench``: zoo models, their batch and the batch's shape.

The paper's five CNNs at input sizes a CPU allows (64x64 for VGG-16, ResNet-50 and
DenseNet-121; 96x96 for the Inceptions, whose stems need it), a GPT-sized-down
transformer over 128 tokens and a wide MLP; batch 16, Adam, 10 classes. Every model comes
from :func:`dbml.zoo.build` under a fixed seed, exactly as ``train()`` builds it, and
dropout is off so that every method computes the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dbml.zoo import Inputs, build

__all__ = ["Workload", "WORKLOADS", "QUICK", "workload", "CLASSES"]

CLASSES = 10


@dataclass(frozen=True)
class Workload:
    name: str
    arch: str
    inputs: Inputs
    options: dict = field(default_factory=dict)
    batch: int = 16
    heavy: bool = False       # a big CNN (minutes per method on 2 cores)

    def model(self, seed: int = 0) -> torch.nn.Module:
        torch.manual_seed(seed)
        return build(self.arch, self.inputs, CLASSES, dict(self.options))

    def batch_tensors(self, batch: int | None = None, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """A fixed batch (x, y) of ``batch`` rows (default the workload's)."""
        n = batch or self.batch
        g = torch.Generator().manual_seed(seed)
        i = self.inputs
        if i.kind == "tokens":
            x = torch.randint(1, i.vocab, (n, i.max_len), generator=g)
        elif i.kind == "image":
            x = torch.randn(n, *i.shape, generator=g)
        else:
            x = torch.randn(n, i.features, generator=g)
        return x, torch.randint(0, CLASSES, (n,), generator=g)

    def describe(self) -> str:
        i = self.inputs
        shape = {"image": "x".join(map(str, i.shape[1:])), "tokens": f"{i.max_len} tokens",
                 "tabular": f"{i.features} features"}.get(i.kind, "")
        return f"{self.arch} ({shape}, batch {self.batch})"


def _image(size: int) -> Inputs:
    return Inputs("image", shape=(3, size, size))


# every method must draw the same numbers: dropout masks come from the global generator,
# which interleaved runners share (they would each draw different masks)
NO_DROPOUT = {"dropout": 0.0}

WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("vgg16", "vgg16", _image(64), NO_DROPOUT, heavy=True),
    Workload("resnet50", "resnet50", _image(64), heavy=True),
    Workload("densenet121", "densenet121", _image(64), heavy=True),
    Workload("inception_v3", "inception_v3", _image(96), NO_DROPOUT, heavy=True),
    Workload("inception_v4", "inception_v4", _image(96), NO_DROPOUT, heavy=True),
    Workload("transformer", "transformer", Inputs("tokens", vocab=1000, max_len=128),
             {"width": 256, "depth": 4, "heads": 8, "ff": 1024, "dropout": 0.0}),
    Workload("mlp", "mlp", Inputs("tabular", features=784), {"hidden": (1024, 1024, 1024, 1024)}),
)}

# --quick: the two that run in seconds (CI's smoke test)
QUICK = ("mlp", "transformer")


def workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"--workloads: unknown workload {name!r}; workloads are {', '.join(WORKLOADS)}") from None
