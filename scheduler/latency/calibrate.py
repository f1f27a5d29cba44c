"""Calibration: measure this device's op latencies and train the latency predictor.

TENSILE (journal IV-A): "When the system initializes, it will measure each GPU
operator's latency with different input data and GPU usage to generate the training
data." Here the operators are those training graphs really contain: calibration builds a
spread of small models (MLPs, CNNs with BatchNorm and pooling, embedding + LayerNorm +
attention), captures each training step with :func:`~.capture.capture` (forward,
backward and the SGD/Adam/AdamW update: the same aten ops, arguments and strides a job's
graph will hold), runs it once for real, and times every kernel node with the arguments
it really received, under several levels of background load. Convolutions, whose
latency has the most parameters, are also probed on their own (:class:`ConvProbes`):
layers drawn as the CNNs draw them, called forward and backward as a step calls them.

* Load: :class:`LoadGenerator`, threads doing matrix products (the background a dbml
  job sees: other jobs' threads); level 0.5 on a 2-core CPU is one busy thread, 1.0 two.
  The load actually present, other processes included, is read with
  :func:`~.utilisation.device_utilisation` in an idle window before each model is timed
  at each level; the median of those readings over the passes is the sample's load
  feature. Capture and the step's re-runs happen at level 0 (they are not timed).
* Timing: the mean over a block of calls lasting at least :data:`MIN_BLOCK_S` (a whole
  load period under a duty-cycled load, so the block sees its average), the block sized
  from a warm call; ``plan.blocks`` blocks per pass, in ``plan.passes`` passes spread over
  the whole run (bursts of load from other processes last seconds: back-to-back repeats
  would all fall into the same one), and the :data:`LATENCY_QUANTILE` of them all. On a
  shared 2-core machine one block varies by 1.5x to 10x; a low quantile of many is
  steadier than their min (split-half spread of log latency 0.18 against 0.31 over 8
  passes). On CUDA blocks are timed with events: the block mean is the kernel's
  throughput latency.
* Copies: host->device and device->host bandwidth (pinned host memory on CUDA).
* A time budget per plan: a busy machine gets fewer samples, not a longer calibration.

``calibrate(quick=True)`` takes about 20 s on a 2-core CPU, the full one about 2.5 min.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from ..graph.capture import capture, init_state
from .estimate import Machine
from .opfeatures import LOG_FLOPS, op_features, op_kind
from ..graph.optim import OptimizerSpec
from .predictor import Predictor, Samples, fit_predictor, load_predictor
from .utilisation import device_utilisation

__all__ = ["calibrate", "load_or_calibrate", "collect_samples", "LoadGenerator", "Workload",
           "workloads", "ConvProbes", "ConvLayer", "measure_copy_bandwidth", "time_call", "Plan", "PLANS",
           "machine_from"]

Progress = Callable[[int, int, str], None]   # (done, total, stage)

LOAD_PERIOD_S = 0.002      # one on/off cycle of a duty-cycled load unit
MIN_BLOCK_S = 1e-4         # a timed block lasts at least this: timer and loop overhead
REPEATS = 3                # min over this many timed blocks (copy bandwidth)
LATENCY_QUANTILE = 0.25    # an op's latency: this quantile of its timed blocks (see collect_samples)
MAX_BLOCK_CALLS = 200
SETTLE_S = 0.005           # after changing the load level (its threads see it within a period)
# Utilisation is read once per workload, level and pass, and a sample gets the median over
# its passes: a shorter window than a prediction's (config.util_window()) suffices,
# and at 50 ms the readings took a third of the timing passes.
UTIL_WINDOW_S = 0.01
TRAIN_TICKS = 20           # progress steps given to training


@dataclass(frozen=True)
class Plan:
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
    blocks: int = 3        # timed blocks per op and pass, back to back
    seconds: float = math.inf
    timing_share: float = 0.75


PLANS = {
    "full": Plan(models=9, levels=(0.0, 0.5, 1.0), steps=3000, passes=8, blocks=2, conv_probes=300,
                 copy_sizes=(1 << 18, 1 << 22, 1 << 25), flops_cap=1e9, seconds=170, timing_share=0.8),
    "quick": Plan(models=2, levels=(0.0, 1.0), steps=1500, passes=4, blocks=2, conv_probes=50,
                  copy_sizes=(1 << 18, 1 << 22), flops_cap=3e8, seconds=27),
}
CUDA_SCALE = 8             # CUDA models: batches CUDA_SCALE times larger, FLOPs cap 100x
MIN_STEP_FLOPS = 1e5
ACTIVATION_CAP = 48 << 20  # bytes of a CNN step's activations (a calibration run holds them)


# -- background load ------------------------------------------------------------------------

class LoadGenerator:
    """Background load at ``level`` in [0, 1] of the device: on a CPU, ``level x cores``
    threads doing matrix products (the last one for the fractional part of every
    :data:`LOAD_PERIOD_S`); on CUDA one thread on its own stream for ``level`` of every
    period (kernels of two streams share the GPU's SMs)."""

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.units = (os.cpu_count() or 1) if self.device.type == "cpu" else 1
        self.size = 96 if self.device.type == "cpu" else 2048
        self.level = 0.0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True,
                                          name=f"dbml-calibration-load-{i}") for i in range(self.units)]

    def duty(self, unit: int) -> float:
        return min(1.0, max(0.0, self.level * self.units - unit))

    @property
    def steady(self) -> bool:
        """Whether every unit is fully on or off (no duty cycling to average over)."""
        return all(self.duty(i) in (0.0, 1.0) for i in range(self.units))

    def __enter__(self) -> "LoadGenerator":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def _run(self, unit: int) -> None:
        a = torch.randn(self.size, self.size, device=self.device)
        b = torch.randn(self.size, self.size, device=self.device)
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        while not self._stop.is_set():
            duty, start = self.duty(unit), time.perf_counter()
            while time.perf_counter() - start < duty * LOAD_PERIOD_S:
                if stream is None:
                    torch.mm(a, b)
                else:
                    with torch.cuda.stream(stream):
                        torch.mm(a, b)
                    stream.synchronize()
            rest = LOAD_PERIOD_S - (time.perf_counter() - start)
            if rest > 0:
                time.sleep(rest)


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
class ConvProbes:
    """Conv layers timed on their own. The full plan's 18 CNNs give some 60 convolution
    shapes, against six parameters (batch, channels in and out, image, kernel, stride) and
    a backend switch (oneDNN or im2col + GEMM, by batch and kernel): their held-out R^2
    swung from 0.4 to 0.9 with the split. Capturing a model costs about a second; a
    probe's preparation, a few milliseconds."""

    layers: tuple[ConvLayer, ...]
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


def workloads(plan: Plan, device: str | torch.device = "cpu", seed: int = 0) -> list[Workload | ConvProbes]:
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
    return out


# -- timing ------------------------------------------------------------------------------------

def _synchronizer(device: torch.device):
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def time_call(fn, args, kwargs, device: torch.device, repeats: int = REPEATS,
              block_s: float = MIN_BLOCK_S) -> float:
    """Seconds per call of ``fn(*args, **kwargs)``: min over blocks of the block mean."""
    calls = _block_calls(fn, args, kwargs, device, block_s)
    return min(_block(fn, args, kwargs, calls, device) for _ in range(repeats))


def _block_calls(fn, args, kwargs, device: torch.device, block_s: float) -> int:
    """Calls per timed block, from the second of two calls (the first, cold one pays for
    caches, the allocator and kernel selection: sized by it, a 20 us convolution got
    one-call blocks): a block lasts at least ``block_s``."""
    sync = _synchronizer(device)
    fn(*args, **kwargs)
    sync()
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    sync()
    warm = time.perf_counter() - t0
    return max(1, min(MAX_BLOCK_CALLS, math.ceil(block_s / max(warm, 1e-7))))


def _block(fn, args, kwargs, calls: int, device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn(*args, **kwargs)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args, **kwargs)
    return (time.perf_counter() - t0) / calls


class _Recorder(fx.Interpreter):
    """Runs a captured step for real and keeps the actual arguments of chosen nodes."""

    def __init__(self, gm: fx.GraphModule, wanted: set[fx.Node]):
        super().__init__(gm)
        self.wanted = wanted
        self.calls: dict[fx.Node, tuple[tuple, dict]] = {}

    def run_node(self, n: fx.Node):
        if n in self.wanted:
            self.calls[n] = self.fetch_args_kwargs_from_env(n)
        return super().run_node(n)


@dataclass
class _Prepared:
    """Calls to time, each pass afresh: a captured workload's kernel nodes, or probes."""

    describe: str
    nodes: list[tuple[str, list[float]]]        # (kind, features), new shapes only
    calls: Callable[[], list[tuple]]            # -> (target, args, kwargs) per node
    blocks: dict[tuple[int, float], int]        # (node index, level) -> calls per block
    probe: bool = False


def _prepare(w: Workload | ConvProbes, device: torch.device, seen: set) -> _Prepared:
    if isinstance(w, ConvProbes):
        return _prepare_probes(w, device, seen)
    torch.manual_seed(0)
    model = w.model().to(device)
    x, y = w.x().to(device), w.y().to(device)
    spec = OptimizerSpec(w.optimizer)
    step = capture(model, torch.nn.functional.cross_entropy, spec, (x, y), job=f"calibrate {w.describe}")
    params = [p.detach().clone() for p in model.parameters()]
    inputs = params + [b.detach().clone() for b in model.buffers()]
    inputs += [t for p in params for t in init_state(spec, p).values()] + [x, y]
    new = [(node, key) for node in step.gm.graph.nodes if (key := _new_shape(node, seen)) is not None]
    return _Prepared(w.describe, [key for _, key in new], lambda: _calls(step.gm, inputs, [n for n, _ in new]), {})


def _new_shape(node: fx.Node, seen: set) -> tuple[str, list[float]] | None:
    """(kind, features) of ``node`` if it is a kernel of a shape calibration has not timed
    yet (adding it to ``seen``), else None."""
    kind = op_kind(node)
    if kind is None or (kind, tuple(f := op_features(node))) in seen:
        return None
    seen.add((kind, tuple(f)))
    return kind, f


def _calls(gm: fx.GraphModule, inputs: list[torch.Tensor], nodes: list[fx.Node]) -> list[tuple]:
    """(target, args, kwargs) of ``nodes``, from a fresh real run of the step."""
    recorder = _Recorder(gm, set(nodes))
    with torch.no_grad():
        recorder.run(*inputs)
    return [(n.target, *recorder.calls[n]) for n in nodes]


CONV = torch.ops.aten.convolution.default
CONV_BACKWARD = torch.ops.aten.convolution_backward.default


def _conv_calls(layer: ConvLayer, tensor: Callable[[tuple[int, ...]], torch.Tensor]) -> list[tuple]:
    """(target, args) of ``layer``'s forward and backward, as a captured step calls them
    (bias, padding ``kernel // 2``); ``tensor(shape)`` makes the tensors."""
    n, c, s, o, k, st = layer.batch, layer.channels, layer.size, layer.out, layer.kernel, layer.stride
    geometry = ([st, st], [k // 2, k // 2], [1, 1], False, [0, 0], 1)
    x, w = tensor((n, c, s, s)), tensor((o, c, k, k))
    grad = tensor((n, o, layer.out_size, layer.out_size))
    return [(CONV, (x, w, tensor((o,)), *geometry)),
            (CONV_BACKWARD, (grad, x, w, [o], *geometry, [layer.input_grad, True, True]))]


def _prepare_probes(probes: ConvProbes, device: torch.device, seen: set) -> _Prepared:
    """Featurise each probe call from an fx node over fake tensors, as capture makes them
    (so a probe and a captured node of one shape have one feature vector)."""
    mode = FakeTensorMode()
    with mode:
        fake = [call for layer in probes.layers
                for call in _conv_calls(layer, lambda shape: torch.empty(shape, device=device))]
    keep = []
    for index, (target, args) in enumerate(fake):
        graph = fx.Graph()
        node = graph.call_function(target, fx.node.map_aggregate(
            args, lambda v: _placeholder(graph, v) if isinstance(v, torch.Tensor) else v))
        with mode:
            node.meta["val"] = target(*args)
        if (key := _new_shape(node, seen)) is not None:
            keep.append((index, key))

    def calls() -> list[tuple]:
        made = [call for layer in probes.layers
                for call in _conv_calls(layer, lambda shape: torch.randn(shape, device=device))]
        return [(*made[index], {}) for index, _ in keep]

    return _Prepared(probes.describe, [key for _, key in keep], calls, {}, probe=True)


def _placeholder(graph: fx.Graph, value: torch.Tensor) -> fx.Node:
    node = graph.placeholder(f"arg{len(graph.nodes)}")
    node.meta["val"] = value
    return node


# -- copies --------------------------------------------------------------------------------------

def measure_copy_bandwidth(device: str | torch.device, sizes: tuple[int, ...]) -> dict[str, float]:
    """Host->device ('h2d') and device->host ('d2h') bytes/s, the fixed cost per copy
    ('latency', s) from a least-squares line over ``sizes``, and on-device copy
    bandwidth ('device', bytes/s read + write)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    out: dict[str, float] = {}
    for name in ("h2d", "d2h"):
        times = []
        for n in sizes:
            host = torch.empty(n, dtype=torch.uint8, pin_memory=cuda)
            dev = torch.empty(n, dtype=torch.uint8, device=device)
            src, dst = (host, dev) if name == "h2d" else (dev, host)
            times.append(time_call(dst.copy_, (src,), {"non_blocking": cuda}, device))
        out[name], out[f"{name}_latency"] = _line(sizes, times)
    big = torch.empty(sizes[-1], dtype=torch.uint8, device=device)
    out["device"] = 2 * sizes[-1] / time_call(torch.empty_like(big).copy_, (big,), {}, device)
    return out


def _line(sizes: tuple[int, ...], times: list[float]) -> tuple[float, float]:
    """(bandwidth, latency) of ``time = latency + bytes / bandwidth``."""
    n = torch.tensor(sizes, dtype=torch.float64)
    t = torch.tensor(times, dtype=torch.float64)
    a = torch.stack([torch.ones_like(n), n], dim=1)
    latency, slope = torch.linalg.lstsq(a, t[:, None]).solution[:, 0].tolist()
    if slope <= 0:
        return sizes[-1] / times[-1], 0.0
    return 1.0 / slope, max(0.0, latency)


# -- calibration ----------------------------------------------------------------------------------

def collect_samples(device: str | torch.device = "cpu", plan: Plan = PLANS["quick"],
                    work: list[Workload | ConvProbes] | None = None, progress: Progress | None = None,
                    deadline: float = math.inf) -> Samples:
    """Time every distinct kernel call of every workload's training step at every load
    level, in ``plan.passes`` passes over all workloads of ``plan.blocks`` blocks per op
    each; an op's latency is the :data:`LATENCY_QUANTILE` of all its blocks.

    The passes over an op are spread over the whole calibration instead of back to back:
    on a shared machine, load from other processes comes in bursts of seconds, which
    back-to-back repeats all fall into. The first pass takes no new workload after
    ``deadline`` (``time.perf_counter()``); later passes stop at it."""
    device = torch.device(device)
    work = work if work is not None else workloads(plan, device)
    preps: list[_Prepared] = []
    times: dict[tuple[int, int, float], list[float]] = defaultdict(list)   # (prep, node, level) -> blocks
    utils: dict[tuple[int, float], list[float]] = defaultdict(list)        # (prep, level) -> readings
    seen: set = set()
    total = len(work) * plan.passes
    with LoadGenerator(device) as load:
        for p in range(plan.passes):
            for i, w in enumerate(work):
                if time.perf_counter() > deadline and (p > 0 or i > 0):
                    break
                load.level = 0.0   # capture and the step's re-run are not timed: no need to slow them
                if p == 0:
                    preps.append(_prepare(w, device, seen))
                if i < len(preps):
                    _time_pass(preps[i], i, load, plan, times, utils, first=p % len(plan.levels))
                if progress is not None:
                    progress(p * len(work) + i + 1, total, f"pass {p + 1}/{plan.passes}: {w.describe}")
    samples = Samples(workloads=sum(not p.probe for p in preps))
    for (i, j, level), blocks in sorted(times.items()):
        kind, f = preps[i].nodes[j]
        samples.add(kind, f, statistics.median(utils[i, level]), _quantile(blocks, LATENCY_QUANTILE), level,
                    probe=preps[i].probe)
    return samples


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def _time_pass(prep: _Prepared, i: int, load: LoadGenerator, plan: Plan, times: dict, utils: dict,
               first: int) -> None:
    """``plan.blocks`` timed blocks of every node of ``prep`` at every load level,
    starting at level index ``first`` (rotated per pass: the level timed right after the
    step's re-run, with cold caches, changes). A short node's blocks, and the first
    node's after the settling sleep, follow one untimed call: without it a 20 us
    convolution timed 300 us. A node of one call per block needs none (measured: its
    cold call is as fast), and the untimed call would cost as much as a block."""
    calls = prep.calls()
    levels = plan.levels[first:] + plan.levels[:first]
    for level in levels:
        load.level = level
        time.sleep(SETTLE_S)
        utils[i, level].append(device_utilisation(load.device, window=UTIL_WINDOW_S))
        # Under a duty-cycled load a block spans whole periods: it sees the average.
        block_s = MIN_BLOCK_S if load.steady else LOAD_PERIOD_S
        for j, (fn, args, kwargs) in enumerate(calls):
            if (j, level) not in prep.blocks:   # sizing the block makes the untimed call
                prep.blocks[j, level] = _block_calls(fn, args, kwargs, load.device, block_s)
            elif j == 0 or prep.blocks[j, level] > 1:
                fn(*args, **kwargs)
            n = prep.blocks[j, level]
            times[i, j, level].extend(_block(fn, args, kwargs, n, load.device) for _ in range(plan.blocks))


def machine_from(samples: Samples, copies: dict[str, float]) -> Machine:
    """Roofline figures for the fallback model, from what calibration measured."""
    quiet = [i for i in range(len(samples)) if samples.level[i] == min(samples.level)]
    peak = max((2 ** samples.features[i][LOG_FLOPS] - 1) / samples.latency[i] for i in quiet)
    overhead = min(samples.latency[i] for i in quiet)
    return Machine(peak_flops=max(peak, 1e6), memory_bandwidth=copies["device"],
                   copy_bandwidth=min(copies["h2d"], copies["d2h"]), op_overhead=overhead)


def calibrate(device: str | torch.device = "cpu", quick: bool = False, progress: Progress | None = None,
              *, save: bool = True, plan: Plan | None = None,
              work: list[Workload | ConvProbes] | None = None, seed: int = 0) -> Predictor:
    """Measure this device and train its predictor; saved under the cache dir unless
    ``save=False``. ``progress(done, total, stage)`` is called as the work advances
    (``done == total`` once, at the end)."""
    device = torch.device(device)
    name = "quick" if quick else "full"
    plan = plan or PLANS[name]
    work = work if work is not None else workloads(plan, device, seed)
    t0 = time.perf_counter()
    total = len(work) * plan.passes + 2 + TRAIN_TICKS
    report = (lambda done, stage: progress(done, total, stage)) if progress else (lambda done, stage: None)
    report(0, "copy bandwidth")
    copies = measure_copy_bandwidth(device, plan.copy_sizes)
    report(1, "timing ops")
    samples = collect_samples(device, plan, work, lambda d, n, s: report(1 + d, s),
                              deadline=t0 + plan.timing_share * plan.seconds)
    report(1 + len(work) * plan.passes, "training the predictor")
    left = max(1.0, plan.seconds - (time.perf_counter() - t0) - 1.0)
    predictor = fit_predictor(samples, device, machine_from(samples, copies), copies, steps=plan.steps,
                              seconds=left, seed=seed,
                              progress=lambda d, n: report(1 + len(work) * plan.passes + TRAIN_TICKS * d // n,
                                                           "training"))
    predictor.meta.update(calibration_seconds=time.perf_counter() - t0, samples=len(samples),
                          plan=name if plan is PLANS[name] else "custom",
                          models=samples.workloads, probe_samples=sum(samples.probe),
                          workloads_planned=sum(isinstance(w, Workload) for w in work))
    if save:
        predictor.save()
    report(total, "done")
    return predictor


def load_or_calibrate(device: str | torch.device = "cpu", quick: bool = False,
                      progress: Progress | None = None) -> Predictor:
    """The cached predictor for this device, calibrating (and saving) one if there is none."""
    return load_predictor(device) or calibrate(device, quick=quick, progress=progress)
