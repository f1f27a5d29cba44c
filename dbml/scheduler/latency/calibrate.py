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

``calibrate(quick=True)`` takes about 30 s on a 2-core CPU, the full one about 4 min (the
plans' budgets). Workloads with an ``iteration`` runner (the zoo's networks, passed in by
the runtime) are also run end to end for the iteration scale (:mod:`.iteration`).
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from ..execute.rng import JobRandom
from ..graph.capture import init_state
from ..hostmem import keep_freed_host_memory
from ..graph.graphs import GraphCache
from .estimate import Machine, synchronizer
from .opfeatures import LOG_FLOPS, op_features, op_kind
from ..graph.optim import OptimizerSpec
from .predictor import Predictor, Samples, fit_predictor, load_predictor
from .samples import typical_bandwidth
from .iteration import StepTiming, fit_iteration_scale, step_points
from .workloads import PLANS, BmmLayer, CalibrationPlan, ConvLayer, ConvProbes, Workload, workloads
from .utilisation import device_utilisation

__all__ = ["calibrate", "load_or_calibrate", "collect_samples", "LoadGenerator", "Workload",
           "workloads", "ConvProbes", "ConvLayer", "measure_copy_bandwidth", "time_call", "CalibrationPlan", "PLANS",
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


# -- timing ------------------------------------------------------------------------------------

def time_call(fn, args, kwargs, device: torch.device, repeats: int = REPEATS,
              block_s: float = MIN_BLOCK_S) -> float:
    """Seconds per call of ``fn(*args, **kwargs)``: min over blocks of the block mean."""
    calls = _block_calls(fn, args, kwargs, device, block_s)
    return min(_block(fn, args, kwargs, calls, device) for _ in range(repeats))


def _block_calls(fn, args, kwargs, device: torch.device, block_s: float) -> int:
    """Calls per timed block, from the second of two calls (the first, cold one pays for
    caches, the allocator and kernel selection: sized by it, a 20 us convolution got
    one-call blocks): a block lasts at least ``block_s``."""
    sync = synchronizer(device)
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
    step: Callable[[], object] | None = None    # the whole captured step (the iteration scale)
    graph: fx.GraphModule | None = None


def _prepare(w: Workload | ConvProbes, device: torch.device, seen: set) -> _Prepared:
    if isinstance(w, ConvProbes):
        return _prepare_probes(w, device, seen)
    # seeded inputs and weights, drawn from a generator of their own (never the process's)
    model, x, y = JobRandom(0).call(lambda: (w.model().to(device), w.x().to(device), w.y().to(device)))
    spec = OptimizerSpec(w.optimizer)
    share = ("dbml-calibration", w.describe) if w.iteration is not None else None
    step = GraphCache(model, torch.nn.functional.cross_entropy, spec, job=f"calibrate {w.describe}",
                      share=share).get(x, y)
    params = [p.detach().clone() for p in model.parameters()]
    inputs = params + [b.detach().clone() for b in model.buffers()]
    inputs += [t for p in params for t in init_state(spec, p).values()] + [x, y]
    new = [(node, key) for node in step.gm.graph.nodes if (key := _new_shape(node, seen)) is not None]
    run = None
    if w.iteration is not None:
        run = w.iteration()
        run()   # untimed: the runner's first step builds its executor
    return _Prepared(w.describe, [key for _, key in new], lambda: _calls(step.gm, inputs, [n for n, _ in new]), {},
                     step=run, graph=step.gm)


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


def _probe_calls(layer, tensor: Callable[[tuple[int, ...]], torch.Tensor]) -> list[tuple]:
    """(target, args) of a probe: a conv layer's forward and backward, or one bmm."""
    if isinstance(layer, BmmLayer):
        b, m, k, n = layer.batch, layer.m, layer.k, layer.n
        left = tensor((b, k, m)).transpose(1, 2) if layer.left_t else tensor((b, m, k))
        right = tensor((b, n, k)).transpose(1, 2) if layer.right_t else tensor((b, k, n))
        return [(BMM, (left, right))]
    return _conv_calls(layer, tensor)


BMM = torch.ops.aten.bmm.default


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
                for call in _probe_calls(layer, lambda shape: torch.empty(shape, device=device))]
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
                for call in _probe_calls(layer, lambda shape: torch.randn(shape, device=device))]
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
    """(bandwidth, latency) of ``time = latency + bytes / bandwidth``.

    The bandwidth is the largest copy's throughput, the latency what the smallest took
    beyond it. A least-squares line through two or three noisy points is not robust: on a
    loaded machine one descheduled small copy flattened its slope to 168 MB/s where the
    copy runs at 35 GB/s, and every plan then thought swaps 200x slower than they are."""
    bandwidth = sizes[-1] / times[-1]
    return bandwidth, max(0.0, times[0] - sizes[0] / bandwidth)


# -- calibration ----------------------------------------------------------------------------------

def collect_samples(device: str | torch.device = "cpu", plan: CalibrationPlan = PLANS["quick"],
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
    # (prep, -1, level) -> whole-step runs
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
    for prep in preps:
        getattr(prep.step, "close", lambda: None)()
    samples = Samples(workloads=sum(not p.probe for p in preps))
    for (i, j, level), blocks in sorted(times.items()):
        if j < 0:
            samples.steps.append(StepTiming(preps[i].describe, preps[i].graph, statistics.median(utils[i, level]),
                                            _quantile(blocks, LATENCY_QUANTILE)))
            continue
        kind, f = preps[i].nodes[j]
        samples.add(kind, f, statistics.median(utils[i, level]), _quantile(blocks, LATENCY_QUANTILE), level,
                    probe=preps[i].probe)
    return samples


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def _time_pass(prep: _Prepared, i: int, load: LoadGenerator, plan: CalibrationPlan, times: dict, utils: dict,
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
        if prep.step is not None:   # once per pass and level: ops and their step see alike loads
            times[i, -1, level].append(_block(prep.step, (), {}, 1, load.device))


def machine_from(samples: Samples, copies: dict[str, float]) -> Machine:
    """Roofline figures for the fallback model, from what calibration measured."""
    quiet = [i for i in range(len(samples)) if samples.level[i] == min(samples.level)]
    peak = max((2 ** samples.features[i][LOG_FLOPS] - 1) / samples.latency[i] for i in quiet)
    overhead = min(samples.latency[i] for i in quiet)
    return Machine(peak_flops=max(peak, 1e6), memory_bandwidth=copies["device"],
                   copy_bandwidth=min(copies["h2d"], copies["d2h"]), op_overhead=overhead)


def calibrate(device: str | torch.device = "cpu", quick: bool = False, progress: Progress | None = None,
              *, save: bool = True, plan: CalibrationPlan | None = None,
              work: list[Workload | ConvProbes] | None = None, seed: int = 0) -> Predictor:
    """Measure this device and train its predictor; saved under the cache dir unless
    ``save=False``. ``progress(done, total, stage)`` is called as the work advances
    (``done == total`` once, at the end)."""
    device = torch.device(device)
    keep_freed_host_memory()   # time ops under the allocator training runs with
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
                              seconds=left, seed=seed, fallback_bandwidth=typical_bandwidth(samples),
                              progress=lambda d, n: report(1 + len(work) * plan.passes + TRAIN_TICKS * d // n,
                                                           "training"))
    points = step_points(predictor, samples.steps)
    predictor.iteration_scale, predictor.node_overhead = fit_iteration_scale(points)
    predictor.meta.update(iteration_scale=predictor.iteration_scale, node_overhead=predictor.node_overhead,
                          step_points=points,
                          calibration_seconds=time.perf_counter() - t0, samples=len(samples),
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
