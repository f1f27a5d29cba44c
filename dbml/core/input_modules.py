"""The torch modules of input encoding that predict and the ONNX export both run
(``InputEncoder.normaliser``, ``InputEncoder.series_scale``, the export's ``Truncate``):
one module per rule, so that the exported graph computes what dbml computes."""

from __future__ import annotations

import torch

FLOAT_MAX = 3.4028234663852886e38    # the largest FLOAT (dbml.core.inputs uses it from here)


class ChannelNormalise(torch.nn.Module):
    """``(x - mean) / std`` per channel of (batch, channels, height, width) images, in
    float32; a NaN (a NULL element of an array image) or ±Inf becomes 0."""

    def __init__(self, means, stds):
        super().__init__()
        self.register_buffer("mean", torch.tensor(means, dtype=torch.float32).reshape(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(stds, dtype=torch.float32).reshape(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (x - self.mean) / self.std
        return torch.where(torch.isfinite(z), z, torch.zeros_like(z))


class Truncate(torch.nn.Module):
    """Token ids (batch, length) cut at ``max_len`` steps, as ``InputEncoder._ids`` cuts a
    text: the ONNX export's first op for text and token models."""

    def __init__(self, max_len: int):
        super().__init__()
        self.max_len = max_len

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :self.max_len]


class SeriesScale(torch.nn.Module):
    """Raw series (batch, steps), NaN where a value is missing or padding -> the model's
    ``[value, present]`` (batch, steps, 2) in float32, over the first ``max_len`` steps. A
    value is present if finite and within FLOAT's range; present values are standardised
    in float64 with ``mean`` and ``std``, or (``per_row``) with the mean and population std
    of the row's present values (std 0, or no value, counts as 1), then clipped to FLOAT's
    range; the rest are 0."""

    def __init__(self, mean: float, std: float, *, per_row: bool, max_len: int):
        super().__init__()
        self.per_row, self.max_len = per_row, max_len
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float64))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float64))

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        x = raw[:, :self.max_len].double()
        ok = torch.isfinite(x) & (x.abs() <= FLOAT_MAX)
        zero = torch.zeros_like(x)
        mean, std = self.mean, self.std
        if self.per_row:
            n = ok.double().sum(1, keepdim=True).clamp(min=1.0)
            mean = torch.where(ok, x, zero).sum(1, keepdim=True) / n
            std = (torch.where(ok, (x - mean) ** 2, zero).sum(1, keepdim=True) / n).sqrt()
            std = torch.where(std > 0, std, torch.ones_like(std))
        v = torch.where(ok, ((x - mean) / std).clamp(-FLOAT_MAX, FLOAT_MAX), zero)
        return torch.stack([v, ok.double()], -1).float()
