"""GPU-ratio emulation on a CPU (``python -m dbml bench --emulate a6000``).

On a CPU, copying a tensor to "host" memory is a ``memcpy`` at tens of GB/s while the op
that produced it ran at tens of GFLOP/s: copies are almost free next to compute, and every
swapping method looks better than it would on a GPU, where compute runs at tens of TFLOP/s
and a host copy crosses PCIe at ~25 GB/s.

The model (issue 22: the GPU's achieved rate, not its peak). A workload's iteration on the
GPU takes ``T_gpu``: per op, the roofline of the GPU running at the fraction of its peak
FLOP rate and memory bandwidth its kernels achieve at the benchmark's batch
(``Profile.efficiency``), plus a kernel launch (``Profile.launch``), summed over the
captured step's ops (:func:`gpu_iteration_seconds`). On this CPU the same iteration takes
``T_cpu`` (eager PyTorch, measured). For copies to keep the GPU's copy-to-compute ratio,
a copy of ``B`` bytes must take ``(B / pcie) * T_cpu / T_gpu`` here, i.e. run at

    emulated bandwidth = pcie * T_gpu / T_cpu          (bytes/s, per workload)

The first version used stated peaks against peaks (``flops_cpu * pcie / flops_gpu``): it
made copies many times too slow for networks whose GPU time is not peak FLOPs (small
kernels, memory-bound ops, launches: an MLP at batch 16 runs at a tiny fraction of the
peak), and vDNN, which dbml reproduces, ran at EOR 1.0-4.5 where TENSILE's paper measured
1.78-2.61. ``Profile.efficiency`` is calibrated so that dbml's vDNN lands near the paper's
points on the A6000 (``benchmarks/README.md`` says how far off it remains).
:class:`ThrottledCpuDevice` enforces the bandwidth: each copy runs, then sleeps until
``B / emulated bandwidth`` has passed since it started. Copies on dbml's copy thread
overlap compute as CUDA streams would; a copy made on the compute thread (a passive
swap-in) stalls it, as a synchronous copy would. The planner is told the emulated
bandwidth (:class:`EmulatedLatency`), as a predictor calibrated on that GPU would know it.
Only the copy-to-compute ratio is emulated, and every emulated figure is labelled
``emulated:<profile>``.

No GPU has been lent to this project yet: the profiles are set from published figures
(the RTX A6000's ~24 TFLOPS achieved FP32 matmul and PCIe 4.0's ~24-26 GB/s one way, the
H100's PCIe 5.0 at ~50 GB/s; copies both ways at once much slower than one way), not
measured. ``benchmarks/gpu_check.sh`` measures them on a real card and writes a profile
(JSON) that ``--emulate path.json`` loads.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from dbml.scheduler.execute.devices import CpuDevice
from dbml.scheduler.latency.estimate import Machine, measure_machine

__all__ = ["Profile", "PROFILES", "profile", "load_profile", "profile_json", "emulated_bandwidth", "gpu_iteration_seconds", "gpu_machine",
           "ThrottledCpuDevice", "EmulatedLatency", "copy_seconds"]


@dataclass(frozen=True)
class Profile:
    """A GPU as the emulation sees it. Until a GPU is lent to this project every profile
    is set from published figures, not measured (``source`` says which);
    ``benchmarks/gpu_check.sh`` measures ``flops``, ``pcie`` and ``duplex`` on a real card
    and writes them as JSON, which :func:`profile` loads (``--emulate path.json``)."""

    name: str
    flops: float     # achieved FP32 matmul (a large square GEMM, no TF32), FLOP/s
    pcie: float      # host<->device copy bandwidth achieved, one direction alone, bytes/s
    source: str
    memory: float = 768e9      # device memory bandwidth, bytes/s
    launch: float = 5e-6       # seconds per kernel launch
    # Fraction of ``flops`` a kernel achieves at the benchmark's batch 16: 0.564 keeps the
    # FLOP rate that was calibrated (vDNN near the paper's points, benchmarks/README.md)
    # when ``flops`` was the stated peak at 0.35 of it (0.35 x 38.7 / 24 for the A6000).
    efficiency: float = 0.564
    memory_efficiency: float = 0.35   # fraction of ``memory`` a kernel achieves at batch 16
    # Each direction's bandwidth while copies run both ways at once: much slower than one
    # way alone on the platforms measured in public. Recorded for the profile (and measured
    # by gpu_check.sh); dbml's copy channel runs one copy at a time, so the emulation does
    # not use it yet.
    duplex: float = 0.0


# Published figures (issue 29, part 6), no measurement of ours. ACHIEVED: the RTX A6000's
# achieved FP32 matmul (~24 TFLOPS) over its stated 38.7: where no achieved figure is at
# hand the stated peak is scaled by it, and the source says "estimated". Two-way copies:
# assumed 0.55 of one way per direction until gpu_check.sh measures a card.
ACHIEVED = 24.0 / 38.7
DUPLEX = 0.55

PROFILES = {p.name: p for p in (
    Profile("a6000", 24e12, 25e9, "RTX A6000: ~24 TFLOPS achieved FP32 matmul (38.7 stated), 768 GB/s; PCIe 4.0 "
            "x16, ~24-26 GB/s achieved one way; two-way concurrent much slower (assumed 0.55 each); published",
            768e9, duplex=DUPLEX * 25e9),
    Profile("a100", 19.5e12 * ACHIEVED, 22e9, "A100 PCIe: 19.5 TFLOPS FP32 stated (no TF32), achieved estimated "
            "at the A6000's ratio, 1.9 TB/s; PCIe 4.0 x16, ~22 GB/s; published", 1935e9, duplex=DUPLEX * 22e9),
    Profile("v100", 15.7e12 * ACHIEVED, 11e9, "V100: 15.7 TFLOPS FP32 stated, achieved estimated at the A6000's "
            "ratio, 900 GB/s; PCIe 3.0 x16, ~11 GB/s; published", 900e9, duplex=DUPLEX * 11e9),
    Profile("rtx2080ti", 13.4e12 * ACHIEVED, 11e9, "RTX 2080 Ti: 13.4 TFLOPS FP32 stated, achieved estimated at "
            "the A6000's ratio, 616 GB/s; PCIe 3.0 x16, ~11 GB/s; published", 616e9, duplex=DUPLEX * 11e9),
    Profile("h100", 51.2e12 * ACHIEVED, 50e9, "H100 PCIe: 51.2 TFLOPS FP32 stated, achieved estimated at the "
            "A6000's ratio, 2.0 TB/s; PCIe 5.0 x16, ~50 GB/s one way; two-way concurrent much slower (assumed "
            "0.55 each); published", 2.0e12, 4e-6, duplex=DUPLEX * 50e9),
)}

PROFILE_FORMAT = 1   # the JSON gpu_check.sh writes: {"format": 1, "name", "flops", "pcie", ...}


def profile(name: str) -> Profile:
    """A named profile, or one written as JSON by ``gpu_check.sh`` (a path ending .json)."""
    if name.endswith(".json"):
        return load_profile(name)
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"--emulate: unknown GPU profile {name!r}; profiles are {', '.join(PROFILES)}, "
                         f"or a gpu_check.sh profile (a .json path)") from None


def load_profile(path: str) -> Profile:
    """The profile ``benchmarks/gpu_check.sh`` measured and wrote (:func:`profile_json`)."""
    import json
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as err:
        raise ValueError(f"--emulate: cannot read the profile {path!r} ({err.strerror}); write one with "
                         f"benchmarks/gpu_check.sh") from None
    if data.get("format") != PROFILE_FORMAT:
        raise ValueError(f"--emulate: {path!r} is not a gpu_check.sh profile of format {PROFILE_FORMAT} "
                         f"(format {data.get('format')!r})")
    fields = {f.name for f in dataclasses.fields(Profile)}
    missing = {"name", "flops", "pcie", "source"} - set(data)
    if missing:
        raise ValueError(f"--emulate: the profile {path!r} lacks {', '.join(sorted(missing))}")
    return Profile(**{k: v for k, v in data.items() if k in fields})


def profile_json(p: Profile) -> dict:
    """What :func:`load_profile` reads back: the profile's fields and the format."""
    return {"format": PROFILE_FORMAT, **dataclasses.asdict(p)}


def gpu_machine(p: Profile) -> Machine:
    """The GPU as the roofline model sees it: the rates its kernels achieve, and launches."""
    return Machine(peak_flops=p.flops * p.efficiency, memory_bandwidth=p.memory * p.memory_efficiency,
                   copy_bandwidth=p.pcie, op_overhead=p.launch)


def gpu_iteration_seconds(p: Profile, graph) -> float:
    """Seconds one iteration of a captured step (its fx graph) takes on ``p``'s GPU."""
    from dbml.scheduler.latency.estimate import RooflineModel
    model = RooflineModel(gpu_machine(p))
    return sum(model.predict(n) for n in graph.nodes if n.op == "call_function")


def emulated_bandwidth(p: Profile, gpu_seconds: float, cpu_seconds: float) -> float:
    """Bytes/s a CPU copy may run at so that copy time / iteration time is ``p``'s:
    ``pcie * T_gpu / T_cpu`` (the module docstring)."""
    return p.pcie * gpu_seconds / cpu_seconds


def copy_seconds(bandwidth: float):
    """``nbytes -> seconds`` a copy takes at ``bandwidth`` (for peers that copy synchronously)."""
    return lambda nbytes: nbytes / bandwidth


def _hold(started: float, nbytes: int, bandwidth: float) -> None:
    left = started + nbytes / bandwidth - time.perf_counter()
    if left > 0:
        time.sleep(left)


class ThrottledCpuDevice(CpuDevice):
    """dbml's CPU device whose host copies run at ``bandwidth`` bytes/s (at most)."""

    def __init__(self, bandwidth: float):
        super().__init__("cpu")
        self.bandwidth = bandwidth

    def copy_out(self, src: torch.Tensor, marker) -> torch.Tensor:
        t0 = time.perf_counter()
        dst = super().copy_out(src, marker)
        _hold(t0, src.numel(), self.bandwidth)
        return dst

    def copy_in(self, host: torch.Tensor, dst: torch.Tensor):
        t0 = time.perf_counter()
        marker = super().copy_in(host, dst)
        _hold(t0, host.numel(), self.bandwidth)
        return marker


class EmulatedLatency:
    """A latency model whose machine copies at the emulated bandwidth; op latencies are
    ``base``'s (this CPU's)."""

    def __init__(self, base, bandwidth: float):
        self.base = base
        machine: Machine = getattr(base, "machine", None) or measure_machine("cpu")
        self.machine = dataclasses.replace(machine, copy_bandwidth=bandwidth)

    def predict(self, node) -> float:
        return self.base.predict(node)

    def __getattr__(self, name):   # anything else a latency model offers (e.g. a predictor's report)
        return getattr(self.base, name)
