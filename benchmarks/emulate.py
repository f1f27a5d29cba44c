"""GPU-ratio emulation on a CPU (``python -m dbml bench --emulate a6000``).

On a CPU, copying a tensor to "host" memory is a ``memcpy`` at tens of GB/s while the op
that produced it ran at tens of GFLOP/s: copies are almost free next to compute, and every
swapping method looks better than it would on a GPU, where compute runs at tens of TFLOP/s
and a host copy crosses PCIe at ~25 GB/s.

The model. On the GPU, an op of ``F`` FLOPs takes ``F / flops_gpu`` and a copy of ``B``
bytes ``B / pcie_gpu``: their ratio is ``(B / F) * flops_gpu / pcie_gpu``. On this CPU
the op takes ``F / flops_cpu``; for the copy to keep the GPU's ratio it must take
``B * flops_gpu / (pcie_gpu * flops_cpu)``, i.e. run at

    emulated bandwidth = flops_cpu * pcie_gpu / flops_gpu          (bytes/s)

with ``flops_cpu`` the CPU's measured float32 matmul throughput at the benchmark's thread
count (the roofline model's ``peak_flops``) and the GPU's figures its stated FP32 peak and
PCIe bandwidth (peak against peak). :class:`ThrottledCpuDevice` enforces it: each copy
runs, then sleeps until ``B / emulated bandwidth`` has passed since it started. Copies on
dbml's copy thread overlap compute as CUDA streams would; a copy made on the compute
thread (a passive swap-in) stalls it, as a synchronous copy would. The planner is told
the emulated bandwidth (:class:`EmulatedLatency`), as a predictor calibrated on that GPU
would know it. Memory-bound ops and kernel launch overheads are not rescaled: only the
copy-to-compute ratio is emulated, and every emulated figure is labelled
``emulated:<profile>``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from dbml.scheduler.execute.devices import CpuDevice
from dbml.scheduler.latency.estimate import Machine, measure_machine

__all__ = ["Profile", "PROFILES", "profile", "emulated_bandwidth", "ThrottledCpuDevice", "EmulatedLatency",
           "copy_seconds"]


@dataclass(frozen=True)
class Profile:
    name: str
    flops: float     # stated FP32 peak, FLOP/s
    pcie: float      # host<->device copy bandwidth, one direction, bytes/s
    source: str


PROFILES = {p.name: p for p in (
    Profile("a6000", 38.7e12, 25e9, "RTX A6000: 38.7 TFLOPS FP32; PCIe 4.0 x16, ~25 GB/s achieved"),
    Profile("a100", 19.5e12, 25e9, "A100 PCIe: 19.5 TFLOPS FP32 (no TF32); PCIe 4.0 x16, ~25 GB/s"),
    Profile("v100", 15.7e12, 12e9, "V100: 15.7 TFLOPS FP32; PCIe 3.0 x16, ~12 GB/s"),
    Profile("rtx2080ti", 13.4e12, 12e9, "RTX 2080 Ti: 13.4 TFLOPS FP32; PCIe 3.0 x16, ~12 GB/s"),
    Profile("h100", 51.2e12, 50e9, "H100 PCIe: 51.2 TFLOPS FP32; PCIe 5.0 x16, ~50 GB/s"),
)}


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"--emulate: unknown GPU profile {name!r}; profiles are {', '.join(PROFILES)}") from None


def emulated_bandwidth(p: Profile, cpu_flops: float | None = None) -> float:
    """Bytes/s a CPU copy may run at so that copy time / op time is ``p``'s."""
    cpu_flops = cpu_flops if cpu_flops is not None else measure_machine("cpu").peak_flops
    return cpu_flops * p.pcie / p.flops


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
