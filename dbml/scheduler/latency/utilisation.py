"""How busy the device is right now: the load feature of the latency predictor.

:func:`device_utilisation` returns the fraction of the device in use, in ``[0, 1]``:

``cpu``   CPU *pressure*: with R runnable threads besides the caller (averaged over a
          short window from the kernel's run queue, ``/proc/loadavg``; the whole machine:
          other processes load the device too) and C cores, ``R / (R + C)``. Busy share
          is the wrong measure on a CPU: it reads 100% as soon as the cores are full,
          while a time-shared op slows down further with every extra runnable thread
          (0 idle, 1/3 one busy thread on 2 cores, 1/2 cores full, 2/3 twice
          oversubscribed). Where there is no ``/proc/loadavg`` (macOS, Windows) this
          process's own CPU time over the window is used instead (busy share): dbml's
          jobs are threads of this process.
``cuda``  NVML's GPU utilisation (share of the last sample period a kernel ran) through
          ``torch.cuda.utilization``, which maps torch's device index to NVML's under
          ``CUDA_VISIBLE_DEVICES``. Without pynvml or a driver it degrades to 0.0 with one
          warning: the predictor then predicts for an idle device.

Reading it is meant to happen while the caller is not computing itself (before a plan is
made, or in calibration between benchmarks), so it measures the *background* load.
"""

from __future__ import annotations

import os
import resource
import time
import warnings

import torch

from .. import config

__all__ = ["device_utilisation", "utilisation_source", "runnable_threads"]

PROC_LOADAVG = "/proc/loadavg"
CPU_READS = 10             # run-queue samples per window
_warned: set[str] = set()


def runnable_threads() -> int | None:
    """Threads on the machine's run queue now (the reader included), or None."""
    try:
        with open(PROC_LOADAVG) as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def _cpu_utilisation(window: float) -> float:
    if runnable_threads() is None:
        return _own_process_utilisation(window)
    counts, end = [], time.perf_counter() + window
    while True:
        counts.append(runnable_threads() - 1)  # not the reader itself
        if time.perf_counter() >= end:
            break
        time.sleep(window / CPU_READS)
    others = max(0.0, sum(counts) / len(counts))
    return others / (others + (os.cpu_count() or 1))


def _own_process_utilisation(window: float) -> float:
    """This process's CPU seconds per wall second per core (no /proc/stat here)."""
    def used() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    t0, c0 = time.perf_counter(), used()
    time.sleep(window)
    wall, cpu = time.perf_counter() - t0, used() - c0
    return min(1.0, max(0.0, cpu / (wall * (os.cpu_count() or 1))))


def _cuda_utilisation(device: torch.device) -> float | None:
    if not torch.cuda.is_available():
        return None
    try:
        return min(1.0, max(0.0, torch.cuda.utilization(device) / 100.0))
    except Exception:  # noqa: BLE001 - no pynvml, no driver, no NVML for this device
        return None


def utilisation_source(device: str | torch.device = "cpu") -> str:
    """Where :func:`device_utilisation` reads from: 'proc-loadavg', 'rusage', 'nvml' or 'none'."""
    device = torch.device(device)
    if device.type == "cuda":
        return "nvml" if _cuda_utilisation(device) is not None else "none"
    if device.type == "cpu":
        return "proc-loadavg" if runnable_threads() is not None else "rusage"
    return "none"


def device_utilisation(device: str | torch.device = "cpu", window: float | None = None) -> float:
    """Fraction of ``device`` busy now, in [0, 1]; 0.0 (warned once) where unmeasurable."""
    device = torch.device(device)
    if device.type == "cpu":
        return _cpu_utilisation(config.util_window() if window is None else window)
    util = _cuda_utilisation(device) if device.type == "cuda" else None
    if util is None:
        if str(device) not in _warned:
            _warned.add(str(device))
            warnings.warn(f"device utilisation of {device} cannot be read (no NVML/driver); "
                          "latency predictions assume an idle device", RuntimeWarning, stacklevel=2)
        return 0.0
    return util
