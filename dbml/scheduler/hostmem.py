"""Host memory for training on CPU: freed blocks stay in the process for the next step.

glibc's malloc serves a request above its mmap threshold (adaptive, at most 32 MiB on
64-bit) with a fresh ``mmap`` and unmaps it on free, and trims the heap's top when more
than 128 KiB is free. A training step frees and reallocates the same large tensors every
iteration, so each one page-faults in anew: on this project's 2-core machine a 32 MiB
``torch.add`` took 20.8 ms allocating its output against 4.4 ms writing into an existing
one, and eager VGG-16 (64², batch 16) stepped in 3.3–4.8 s against 1.7–2.1 s once freed
memory was kept. That cost is also what the latency model cannot see: calibration times
ops on warm buffers. PyTorch's CUDA caching allocator keeps GPU memory for the same
reason; on the host dbml tells malloc to keep it (``mallopt``: no mmap for large blocks,
no trimming), once per process, when the first training step or calibration starts.

The process's resident memory then stays at its high-water mark instead of shrinking
between steps. When a job's steps are over, :func:`give_back_freed_host_memory` returns
what is free to the OS (``malloc_trim``): kept, the freed activations of a ResNet-50 job
(about 600 MB at batch 32, 64x64) stayed resident under everything the job did next,
storing its model included (issue 29: the job's real memory, measured from outside, was
1.9x a plain PyTorch loop's). ``DBML_HOST_MALLOC=system`` leaves malloc as it is. Elsewhere
than glibc (macOS, musl, Windows) nothing changes.

That mark is the heap's, not the live tensors': blocks of many sizes freed in another
order than they were taken leave holes, and a job that swaps to disk to hold a budget
saw its process keep 2-3x the memory its tensors took (ResNet-18 at a 57 MB budget: 223
MB added). While such a job runs (:func:`bounded`), malloc serves blocks of
:data:`BOUNDED_MMAP` and more by ``mmap`` and gives them back on free: the process's
memory then follows the tensors it holds (156 MB for the same job, of which 45 MB are
imports and graphs), at the cost of page faults on those blocks (the executor's buffer
pool reuses the pointwise ones). When the last such job ends, freed memory is kept again.
The threshold was 4 MiB; at 256 KiB (glibc's own default is 128 KiB) the blocks of a
data-parallel worker's half batch and a transformer's heads no longer settle in the heap:
a worker set's first budgeted job held 66.8-67.7 MB against 84.7 (budget 67.3), a
transformer at half its peak 166-174 MB against 210-212, and its iterations were not
slower (0.63 s against 0.86: the planner, seeing less beside its plan, swaps less)
(benchmarks/results/2026-11-28-vm-2c-issue33-bounded-malloc.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

from . import config

__all__ = ["keep_freed_host_memory", "give_back_freed_host_memory", "bounded", "BOUNDED_MMAP"]

BOUNDED_MMAP = 256 << 10   # bytes: while a bounded job runs, blocks this large come from mmap

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # glibc's mallopt parameters (malloc.h)
_MMAP_THRESHOLD_MAX = (1 << 31) - 1              # the largest value mallopt accepts (an int)
_lock = threading.Lock()
_state: dict[str, bool] = {}


def keep_freed_host_memory() -> bool:
    """Tell glibc's malloc to keep freed memory for reuse (once per process); whether it
    is kept now. False when ``DBML_HOST_MALLOC=system`` or the C library is not glibc."""
    with _lock:
        if "kept" not in _state:
            _state["kept"] = config.host_malloc_kept() and _mallopt_keep()
        return _state["kept"]


def give_back_freed_host_memory() -> bool:
    """Return the freed memory malloc kept (every arena's free pages) to the OS: after a
    job's last step, when no next step will reuse it. Other jobs running meanwhile only
    fault their next step's pages in again. A no-op (False) where nothing is kept."""
    with _lock:
        if not _state.get("kept"):
            return False
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version   # glibc only: musl has mallopt as a no-op stub
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def _set(threshold: int) -> bool:
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, threshold))


def _mallopt_keep() -> bool:
    return _set(_MMAP_THRESHOLD_MAX)


class bounded:
    """``with bounded(): ...`` — while any such block runs (they nest and overlap across
    threads), large freed blocks go back to the OS (see the module docstring). Only where
    dbml manages malloc (:func:`keep_freed_host_memory` is in force); a no-op elsewhere."""

    def __enter__(self) -> "bounded":
        with _lock:
            self.active = bool(_state.get("kept"))
            if self.active:
                _state["bounded"] = _state.get("bounded", 0) + 1
                if _state["bounded"] == 1:
                    _set(BOUNDED_MMAP)
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            if self.active:
                self.active = False
                _state["bounded"] -= 1
                if _state["bounded"] == 0:
                    _set(_MMAP_THRESHOLD_MAX)
