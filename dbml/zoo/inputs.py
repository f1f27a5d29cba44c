"""What a zoo model receives: :class:`Inputs`, one input kind per model, and its JSON form
(stored in the catalog beside the model's config, so a model is rebuilt without running code).

Kinds and the tensor ``x`` a model's ``forward`` gets (B is the batch size):

=========  =================================================================================
tabular    float32 (B, features)
image      float32 (B, C, H, W), ``shape`` = (C, H, W)
tokens     int64 (B, T), T <= max_len; ids in [0, vocab), 0 is padding
series     float32 (B, T, 2), T <= max_len; [..., 0] the standardised value, [..., 1] 1.0
           where a value is present and 0.0 where the row is padded
=========  =================================================================================
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

KINDS = ("tabular", "image", "tokens", "series")


@dataclass(frozen=True)
class Inputs:
    """What a model receives; one input kind per model (see the module docstring)."""

    kind: str
    features: int = 0
    shape: tuple[int, ...] = ()
    vocab: int = 0
    max_len: int = 0

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(self.shape))
        for problem in _problems(self):
            raise ValueError(f"Inputs: {problem}")

    def sample(self, rows: int, device=None):
        """An input batch of ``rows`` rows as a model takes it (zeros; sequences at their
        longest): what a model is planned with ahead of data, and lazy modules are sized by."""
        import torch
        if self.kind == "tabular":
            return torch.zeros(rows, self.features, device=device)
        if self.kind == "image":
            return torch.zeros(rows, *self.shape, device=device)
        if self.kind == "tokens":
            return torch.zeros(rows, self.max_len, dtype=torch.int64, device=device)
        return torch.zeros(rows, self.max_len, 2, device=device)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Inputs":
        """The Inputs ``to_json`` wrote; ValueError naming what is wrong otherwise."""
        try:
            d = json.loads(text)
        except (TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"Inputs: not JSON ({err})") from None
        if not isinstance(d, dict):
            raise ValueError(f"Inputs: expected a JSON object, got {type(d).__name__}")
        unknown = set(d) - {"kind", "features", "shape", "vocab", "max_len"}
        if unknown:
            raise ValueError(f"Inputs: unknown field(s) {', '.join(sorted(unknown))}")
        if not isinstance(d.get("shape", []), list):
            raise ValueError("Inputs: shape must be a list of integers")
        return cls(**{**d, "shape": tuple(d.get("shape", ()))})


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _problems(i: Inputs):
    """Each thing wrong with ``i``, as a sentence (none for a valid one)."""
    if i.kind not in KINDS:
        yield f"kind must be one of {', '.join(KINDS)}, got {i.kind!r}"
        return
    for name in ("features", "vocab", "max_len"):
        if not _is_int(getattr(i, name)) or getattr(i, name) < 0:
            yield f"{name} must be a non-negative integer, got {getattr(i, name)!r}"
            return
    if not all(_is_int(s) and s > 0 for s in i.shape):
        yield f"shape must hold positive integers, got {i.shape!r}"
    elif i.kind == "tabular" and i.features < 1:
        yield "tabular inputs need features >= 1"
    elif i.kind == "image" and len(i.shape) != 3:
        yield f"image inputs need shape = (channels, height, width), got {i.shape!r}"
    elif i.kind == "tokens" and (i.vocab < 2 or i.max_len < 1):
        yield "token inputs need vocab >= 2 (id 0 is padding) and max_len >= 1"
    elif i.kind == "series" and i.max_len < 1:
        yield "series inputs need max_len >= 1"
