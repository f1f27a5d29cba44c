"""What calibration measures: its budgets (:class:`CalibrationPlan`) and the small models
and convolution layers it times (:func:`workloads`), drawn as the training graphs that
dbml runs contain them: MLPs, CNNs with BatchNorm and pooling, embedding + LayerNorm +
attention, and convolution layers probed on their own."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["CalibrationPlan", "PLANS", "Workload", "ConvLayer", "BmmLayer", "ConvProbes", "workloads"]


@dataclass(frozen=True)
class CalibrationPlan:
    """How much to measure: models per family, load levels, training steps, and a time
    budget: timing stops taking new models at ``timing_share`` of ``seconds`` and
    training stops when the budget is spent (a busy machine gets fewer samples, not a
    longer wait)."""

    models: int
    levels: tuple[float, ...]
    steps: int
    copy_sizes: tuple[int, ...]
    flops_cap: float       # FLOPs of one training step, on CPU; CUDA scales it
    passes: int = 3        # timed passes over every op, spread over the run
    conv_probes: int = 0   # conv layers timed on their own (see ConvProbes)
    bmm_probes: int = 0    # batched matmuls timed on their own (see BmmLayer)
    blocks: int = 3        # timed blocks per op and pass, back to back
    seconds: float = math.inf
    timing_share: float = 0.75


PLANS = {
    "full": CalibrationPlan(models=9, levels=(0.0, 0.5, 1.0), steps=3000, passes=8, blocks=2, conv_probes=300,
                 bmm_probes=150,
                 copy_sizes=(1 << 18, 1 << 22, 1 << 25), flops_cap=1e9, seconds=240, timing_share=0.8),
    "quick": CalibrationPlan(models=2, levels=(0.0, 1.0), steps=1500, passes=4, blocks=2, conv_probes=50,
                  bmm_probes=50,
                  copy_sizes=(1 << 18, 1 << 22), flops_cap=3e8, seconds=32),
}
CUDA_SCALE = 8             # CUDA models: batches CUDA_SCALE times larger, FLOPs cap 100x
MIN_STEP_FLOPS = 1e5
ACTIVATION_CAP = 48 << 20  # bytes of a CNN step's activations (a calibration run holds them)



# -- workloads ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    """One small model, batch and optimizer whose training step calibration times."""

    family: str
    model: Callable[[], torch.nn.Module]
    x: Callable[[], torch.Tensor]
    y: Callable[[], torch.Tensor]
    optimizer: str
    describe: str
    # A runner of the real training step (the executor's iteration), for the iteration
    # scale (.iteration): ``iteration()`` returns ``run()``, called once per timing, and
    # ``run.close()``. Where given, the step is captured under the shared graph name
    # ("dbml-calibration", describe), so that the runner's capture is a cache hit.
    iteration: Callable[[], Callable[[], None]] | None = None


CLASSES = 10


def _log_int(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def _batch_for(target: float, per_example: float, most: int) -> int:
    """The batch that brings a step to about ``target`` FLOPs: the sizes calibration
    covers spread evenly in log FLOPs instead of clustering where shapes happen to fall."""
    return int(min(most, max(1, round(target / max(per_example, 1.0)))))


def _mlp(rng: random.Random, target: float, scale: int) -> Workload:
    widths = [_log_int(rng, 8, 1024) for _ in range(rng.randint(2, 5))] + [CLASSES]
    batch = _batch_for(target, 6 * sum(a * b for a, b in zip(widths, widths[1:])), 2048 * scale)
    norm = rng.random() < 0.3
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(widths) - 2:
            layers += ([torch.nn.LayerNorm(b)] if norm else []) + [torch.nn.ReLU()]
    return Workload("mlp", lambda: torch.nn.Sequential(*layers), lambda: torch.randn(batch, widths[0]),
                    lambda: torch.randint(0, CLASSES, (batch,)), "", f"mlp b{batch} {widths}")


def _cnn(rng: random.Random, target: float, scale: int) -> Workload:
    size, channels = rng.choice([4, 8, 12, 16, 24, 32, 48]), rng.choice([1, 3, 8, 16])
    hw, per_example, layers, c0, activations = size, 0.0, [], channels, channels * size * size
    for index in range(rng.randint(2, 5)):
        out, k = _log_int(rng, 4, 128), rng.choice([1, 3, 3, 5])
        stride = 2 if hw >= 8 and rng.random() < 0.3 else 1
        layers.append(torch.nn.Conv2d(channels, out, k, stride=stride, padding=k // 2))
        hw = (hw + 2 * (k // 2) - k) // stride + 1
        per_example += 6 * out * channels * k * k * hw * hw
        activations += 3 * out * hw * hw   # conv, norm, relu outputs, per example
        if rng.random() < 0.7:
            layers.append(torch.nn.BatchNorm2d(out))
        layers.append(torch.nn.ReLU())
        # Max-pool after the first layer and average-pool after the second where the
        # image allows (every plan, the quick one too, times both), at random later.
        if hw >= 4 and (index < 2 or rng.random() < 0.5):
            max_pool = index == 0 or (index > 1 and rng.random() < 0.5)
            layers.append(torch.nn.MaxPool2d(2) if max_pool else torch.nn.AvgPool2d(2))
            hw //= 2
        channels = out
    layers += [torch.nn.Flatten(), torch.nn.Linear(channels * hw * hw, CLASSES)]
    most = max(1, int(ACTIVATION_CAP * scale / (4 * activations)))
    batch = _batch_for(target, per_example, min(512 * scale, most))
    return Workload("cnn", lambda: torch.nn.Sequential(*layers), lambda: torch.randn(batch, c0, size, size),
                    lambda: torch.randint(0, CLASSES, (batch,)), "",
                    f"cnn b{batch} {c0}x{size}x{size} " + " ".join(
                        f"conv{m.kernel_size[0]}s{m.stride[0]}->{m.out_channels}" if isinstance(m, torch.nn.Conv2d)
                        else type(m).__name__[:4] for m in layers[:-2]))


class _Attention(torch.nn.Module):
    """Embedding, LayerNorm, one softmax attention head (bmm), mean over tokens, a head."""

    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.embed, self.norm = torch.nn.Embedding(vocab, dim), torch.nn.LayerNorm(dim)
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, CLASSES)

    def forward(self, tokens):
        h = self.norm(self.embed(tokens))
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)
        return self.out((h + scores @ v).mean(dim=1))


def _attention(rng: random.Random, target: float, scale: int) -> Workload:
    length, vocab, dim = _log_int(rng, 4, 128), _log_int(rng, 32, 8000), _log_int(rng, 8, 256)
    batch = _batch_for(target, 6 * length * (3 * dim * dim + 2 * length * dim), 256 * scale)
    return Workload("attention", lambda: _Attention(vocab, dim), lambda: torch.randint(0, vocab, (batch, length)),
                    lambda: torch.randint(0, CLASSES, (batch,)), "",
                    f"attention b{batch} len{length} vocab{vocab} dim{dim}")


# CNNs twice: convolutions and their backwards are the costly kernels with the most
# parameters (channels, size, kernel, stride) to cover.
FAMILIES = (_mlp, _cnn, _attention, _cnn)
OPTIMIZER_CYCLE = ("adam", "sgd", "adamw")


@dataclass(frozen=True)
class ConvLayer:
    """One convolution layer of a CNN training step: its forward and its backward (input
    gradient only where the layer is not the first) are timed without capturing a model."""

    batch: int
    channels: int
    size: int
    out: int
    kernel: int
    stride: int
    input_grad: bool

    @property
    def out_size(self) -> int:
        return (self.size + 2 * (self.kernel // 2) - self.kernel) // self.stride + 1


@dataclass(frozen=True)
class BmmLayer:
    """One batched matmul of an attention layer, ``(batch, m, k) @ (batch, k, n)``, with
    either operand transposed as attention's backward reads them (issue 22: ``bmm``'s
    held-out R^2 was 0.45 with only the attention models' few shapes to learn from)."""

    batch: int
    m: int
    k: int
    n: int
    left_t: bool = False
    right_t: bool = False


@dataclass(frozen=True)
class ConvProbes:
    """Conv layers timed on their own. The full plan's 18 CNNs give some 60 convolution
    shapes, against six parameters (batch, channels in and out, image, kernel, stride) and
    a backend switch (oneDNN or im2col + GEMM, by batch and kernel): their held-out R^2
    swung from 0.4 to 0.9 with the split. Capturing a model costs about a second; a
    probe's preparation, a few milliseconds."""

    layers: tuple  # ConvLayer and BmmLayer
    describe: str


PROBES_PER_BATCH = 25     # probes share a load level's settling and utilisation reading
# A probe's forward FLOPs are log-uniform from PROBE_MIN_FLOPS to the step FLOPs cap over
# PROBE_FLOPS_SHARE: the range the captured CNNs' layers span (2 to 5 layers a step, each
# forward, input and weight gradient). Probes only up to a 250th of the cap (the
# expensive end) covered half that range in log FLOPs: held-out R^2 fell with the spread.
PROBE_MIN_FLOPS = 1e3
PROBE_FLOPS_SHARE = 16


def _conv_layer(rng: random.Random, flops: float, scale: int) -> ConvLayer:
    """A layer as :func:`_cnn` draws them, at a depth after 0 to 2 poolings (redrawn while
    one example takes over ``flops`` forward FLOPs), its batch bringing it to ``flops``."""
    while True:
        first = rng.random() < 0.3
        size = max(1, rng.choice([4, 8, 12, 16, 24, 32, 48]) // 2 ** (0 if first else rng.randint(0, 2)))
        channels = rng.choice([1, 3, 8, 16]) if first else _log_int(rng, 4, 128)
        out, kernel = _log_int(rng, 4, 128), rng.choice([1, 3, 3, 5])
        stride = 2 if size >= 8 and rng.random() < 0.3 else 1
        hw = (size + 2 * (kernel // 2) - kernel) // stride + 1
        per_example = 2 * out * channels * kernel * kernel * hw * hw
        if per_example <= flops:
            break
    most = max(1, int(ACTIVATION_CAP * scale / (4 * 3 * (channels * size * size + out * hw * hw))))
    return ConvLayer(_batch_for(flops, per_example, min(512 * scale, most)), channels, size, out, kernel, stride,
                     not first)


def workloads(plan: CalibrationPlan, device: str | torch.device = "cpu", seed: int = 0) -> list[Workload | ConvProbes]:
    """``plan.models`` random models per family, seeded, each sized to a step of FLOPs
    drawn log-uniformly up to the plan's cap; ``plan.conv_probes`` conv layers in batches
    spread among them (a deadline cuts both alike)."""
    cuda = torch.device(device).type == "cuda"
    scale, cap = (CUDA_SCALE, plan.flops_cap * 100) if cuda else (1, plan.flops_cap)
    rng, out = random.Random(seed), []
    for i in range(plan.models * len(FAMILIES)):
        target = math.exp(rng.uniform(math.log(MIN_STEP_FLOPS), math.log(cap)))
        w = FAMILIES[i % len(FAMILIES)](rng, target, scale)
        out.append(Workload(w.family, w.model, w.x, w.y, OPTIMIZER_CYCLE[i % 3], w.describe))
    rng = random.Random(f"conv probes {seed}")   # the models above do not depend on the probes
    batches = math.ceil(plan.conv_probes / PROBES_PER_BATCH)
    for b in range(batches):
        n = min(PROBES_PER_BATCH, plan.conv_probes - b * PROBES_PER_BATCH)
        flops = [math.exp(rng.uniform(math.log(PROBE_MIN_FLOPS), math.log(cap / PROBE_FLOPS_SHARE))) for _ in range(n)]
        probes = ConvProbes(tuple(_conv_layer(rng, f, scale) for f in flops), f"conv probes {b + 1}/{batches}")
        out.insert(round((b + 1) * len(out) / (batches + 1)), probes)
    rng = random.Random(f"bmm probes {seed}")
    batches = math.ceil(plan.bmm_probes / PROBES_PER_BATCH)
    for b in range(batches):
        n = min(PROBES_PER_BATCH, plan.bmm_probes - b * PROBES_PER_BATCH)
        probes = ConvProbes(tuple(_bmm_layer(rng, cap / PROBE_FLOPS_SHARE, scale) for _ in range(n)),
                            f"bmm probes {b + 1}/{batches}")
        out.insert(round((b + 1) * len(out) / (batches + 1)), probes)
    return out


def _bmm_layer(rng: random.Random, most_flops: float, scale: int) -> BmmLayer:
    """Sizes log-uniform as attention's: heads x batch, tokens, head width; redrawn while
    over ``most_flops``."""
    while True:
        m, n = _log_int(rng, 4, 512), _log_int(rng, 4, 512)
        k = _log_int(rng, 4, 256)
        batch = _log_int(rng, 1, 256 * scale)
        if 2 * batch * m * k * n <= most_flops:
            return BmmLayer(batch, m, k, n, rng.random() < 0.4, rng.random() < 0.4)
