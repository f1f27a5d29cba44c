"""Device backends: where tensors live, how they travel to the host and back.

One interface, two backends:

* :class:`CpuDevice` — the device is the CPU. Its "device memory" is the executor's
  ledger; a swap-out really copies the storage out (and the device tensor is dropped),
  a swap-in copies it back into a fresh allocation. With a :class:`~.spill.SpillFile`
  (``spill=``, what dbml gives every job) the copies go to disk, outside the process's
  memory: the budget then limits real memory. Without one they go to host buffers in
  RAM — the same memory, which saves nothing real; the benchmark's GPU emulation uses
  it, as a GPU's host tier — from a pool allocated and touched ahead, as CUDA's pinned
  ones are: a swap in the first iteration does not pay the page faults of fresh memory.
* :class:`CudaDevice` — a GPU. Copies run on a side stream into pinned host buffers
  taken from a pool allocated ahead (never per swap); the copy waits on an event
  recorded on the compute stream after the trigger op; ``record_stream`` tells the
  caching allocator about tensors used across streams; the compute stream waits for a
  swap-in's event before its first use. Memory truth: ``torch.cuda`` statistics.

Storages travel as flat ``uint8`` tensors (:func:`storage_bytes`), so any dtype, view
or layout round-trips bit for bit; :func:`as_view` rebuilds a node's tensor on top. A
*host copy* is whatever ``copy_out`` returns (a host tensor, or a spill file's
:class:`~.spill.Extent`): only the device reads it (``copy_in``, ``host_tensor``) and
gives it back (``free_host``); ``host_nbytes`` says its size.

Copies are performed by a :class:`CopyChannel`: one thread per device (TENSILE's Swap
Executor), serving copy jobs in order of their issue time, each no earlier than it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch

from .spill import Extent, SpillFile, tier_of

__all__ = ["Device", "Zeros", "CpuDevice", "CudaDevice", "CopyChannel", "make_device", "storage_bytes", "as_view"]


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 tensor over the whole storage of ``t`` (shares memory)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def as_view(flat: torch.Tensor, dtype: torch.dtype, size, stride, offset: int) -> torch.Tensor:
    """The tensor ``(dtype, size, stride, offset)`` over the storage of ``flat``."""
    return torch.empty(0, dtype=dtype, device=flat.device).set_(flat.untyped_storage(), offset, size, stride)


@dataclass(frozen=True)
class Zeros:
    """The host copy of a storage whose bytes are all zero: fresh optimizer state (Adam's
    moments, a momentum buffer) starts as one, so a plan that keeps that state on the
    host at the start allocates nothing for it anywhere (torch.optim, too, creates it
    only at the first step); a swap-in writes zeros into its destination."""

    nbytes: int

    def numel(self) -> int:
        return self.nbytes


class Device:
    """The interface the executor uses; both backends implement every method."""

    type = "abstract"
    # a swap-in's destination is allocated on the compute thread when the swap-in is
    # issued (where the ledger counts it), not on the copy thread: on the CPU a copy
    # thread's allocations come from another malloc arena, whose freed blocks the
    # compute thread cannot reuse, so the process would hold both arenas' peaks
    alloc_on_issue = False
    spill: SpillFile | None = None

    def __init__(self, device: torch.device):
        self.torch_device = device

    def copy_bandwidth(self) -> float | None:
        """Bytes/s of a swap each way where the device knows it better than the latency
        model's machine figures (a spill file's disk), else None."""
        return None

    def close(self) -> None:
        """Give back what the device holds outside memory (its spill file)."""
        if self.spill is not None:
            self.spill.close()

    def host_nbytes(self, host) -> int:
        """The bytes of a host copy."""
        return host.numel()

    def host_tensor(self, host) -> torch.Tensor:
        """A host copy as a CPU tensor of its bytes (read from disk for a spilled one)."""
        if isinstance(host, Zeros):
            return torch.zeros(host.nbytes, dtype=torch.uint8)
        if isinstance(host, Extent):
            out = torch.empty(host.nbytes, dtype=torch.uint8)
            self.spill.read(host, out)
            return out
        return host

    # compute-side markers: "everything issued on the compute stream so far"
    def compute_marker(self):
        return None

    def wait_marker(self, marker) -> None:
        """On the copy thread: wait until the compute work before ``marker`` is done."""

    def alloc(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.torch_device)

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def free_host(self, buf: torch.Tensor) -> None:
        """Give a host buffer back (to the pool, where there is one)."""

    def reserve_host(self, sizes) -> None:
        """Allocate host buffers ahead for swaps of these sizes (bytes)."""


class _HostPool:
    """Host buffers by size, allocated ahead (``reserve_host``) and reused: a swap never
    allocates host memory while an iteration runs, unless more are in use than were
    reserved."""

    pin = False

    def _init_pool(self) -> None:
        self._pool: dict[int, list[torch.Tensor]] = defaultdict(list)
        self._pool_lock = threading.Lock()

    def _new_host(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)

    def reserve_host(self, sizes) -> None:
        for n in sizes:
            buf = self._new_host(n)
            buf.zero_()   # touch every page now, not in the first iteration's copy
            self.free_host(buf)

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        with self._pool_lock:
            free = self._pool.get(nbytes)
            if free:
                return free.pop()
        return self._new_host(nbytes)

    def free_host(self, buf: torch.Tensor) -> None:
        if isinstance(buf, Zeros):
            return
        with self._pool_lock:
            self._pool[buf.numel()].append(buf)

    def copy_out(self, src: torch.Tensor, marker) -> torch.Tensor:
        """On the copy thread: copy device bytes ``src`` to a new host buffer; return it
        once the copy has completed."""
        self.wait_marker(marker)
        dst = self.host_buffer(src.numel())
        dst.copy_(src)
        return dst

    def copy_in(self, host: torch.Tensor, dst: torch.Tensor):
        """On the copy thread: copy ``host`` into device bytes ``dst``; return a marker
        the compute stream must wait for before using ``dst``."""
        if isinstance(host, Zeros):
            dst.zero_()
        else:
            dst.copy_(host)
        return None

    def use_on_compute(self, dst: torch.Tensor, marker) -> None:
        """On the compute thread, before ``dst`` (a swapped-in storage) is first read."""


class CpuDevice(_HostPool, Device):
    """The CPU. ``spill``: the job's spill file, where swapped tensors go (disk); without
    one, host buffers in RAM (see the module docstring)."""

    type = "cpu"
    alloc_on_issue = True

    def __init__(self, device: torch.device | str = "cpu", *, spill: SpillFile | None = None):
        super().__init__(torch.device(device))
        self._init_pool()
        self.spill = spill

    @property
    def tier(self) -> str:
        """Where swapped tensors go: 'disk' (a spill file), or 'memory' (RAM host buffers,
        or a spill file on a RAM file system such as tmpfs)."""
        return "disk" if self.spill is not None and self.spill.kind not in ("tmpfs", "ramfs") else "memory"

    def copy_bandwidth(self) -> float | None:
        if self.spill is None:
            return None
        return tier_of(self.spill.directory).bandwidth

    def reserve_host(self, sizes) -> None:
        if self.spill is None:
            return super().reserve_host(sizes)
        self.spill.reserve(sizes)

    def free_host(self, buf) -> None:
        if isinstance(buf, Extent):
            self.spill.free(buf)
        else:
            super().free_host(buf)

    def copy_out(self, src: torch.Tensor, marker):
        if self.spill is None:
            return super().copy_out(src, marker)
        return self.spill.write(src)

    def copy_in(self, host, dst: torch.Tensor):
        if isinstance(host, Extent):
            self.spill.read(host, dst)
            return None
        return super().copy_in(host, dst)


class CudaDevice(_HostPool, Device):
    """A CUDA GPU: side copy stream, pinned host pool, events, record_stream."""

    type = "cuda"

    def __init__(self, device: torch.device | str = "cuda", *, pin: bool = True):
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"CudaDevice needs a cuda device, got {device}")
        super().__init__(device)
        self.pin = pin and torch.cuda.is_available()
        self._init_pool()
        self._copy_stream = torch.cuda.Stream(device) if torch.cuda.is_available() else None

    # -- streams and events -----------------------------------------------------
    def compute_marker(self):
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.torch_device))
        return event

    def wait_marker(self, marker) -> None:
        if marker is not None:
            self._copy_stream.wait_event(marker)

    def copy_out(self, src: torch.Tensor, marker) -> torch.Tensor:
        with torch.cuda.stream(self._copy_stream):
            self.wait_marker(marker)
            dst = self.host_buffer(src.numel())
            dst.copy_(src, non_blocking=self.pin)
            src.record_stream(self._copy_stream)  # src may be freed by compute meanwhile
            done = torch.cuda.Event()
            done.record(self._copy_stream)
        done.synchronize()
        return dst

    def alloc(self, nbytes: int) -> torch.Tensor:
        with torch.cuda.stream(self._copy_stream):
            return torch.empty(nbytes, dtype=torch.uint8, device=self.torch_device)

    def copy_in(self, host: torch.Tensor, dst: torch.Tensor):
        with torch.cuda.stream(self._copy_stream):
            if isinstance(host, Zeros):
                dst.zero_()
            else:
                dst.copy_(host, non_blocking=self.pin)
            done = torch.cuda.Event()
            done.record(self._copy_stream)
        done.synchronize()  # the host buffer may go back to the pool only after this
        return done

    def use_on_compute(self, dst: torch.Tensor, marker) -> None:
        stream = torch.cuda.current_stream(self.torch_device)
        if marker is not None:
            stream.wait_event(marker)
        dst.record_stream(stream)  # allocated on the copy stream, used on the compute stream


def make_device(device: "str | torch.device | Device") -> Device:
    """The :class:`Device` for ``device``; a Device instance is used as it is (e.g. a
    benchmark's copy-throttled CPU device)."""
    if isinstance(device, Device):
        return device
    device = torch.device(device)
    if device.type == "cpu":
        return CpuDevice(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but CUDA is not available; use device='cpu'")
        return CudaDevice(device)
    raise ValueError(f"unsupported device {device}; expected 'cpu' or 'cuda'")


class CopyChannel:
    """One copy thread serving jobs in order of issue time, each no earlier than it.

    A job is a callable run on the thread; ``submit`` returns at once. ``drain`` waits
    until every submitted job has run. An exception in a job is re-raised by ``drain``
    (and by the next ``submit``)."""

    def __init__(self, name: str = "dbml-copy"):
        self._heap: list = []
        self._counter = itertools.count()
        self._cv = threading.Condition()
        self._pending = 0
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, at: float, job: Callable[[], None]) -> None:
        with self._cv:
            self._raise()
            heapq.heappush(self._heap, (at, next(self._counter), job))
            self._pending += 1
            self._cv.notify_all()

    def drain(self) -> None:
        with self._cv:
            while self._pending and self._error is None:
                self._cv.wait()
            self._raise()

    def close(self, wait: bool = True) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if wait and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _next_job(self):
        with self._cv:
            while True:
                if self._closed:
                    return None
                if self._heap:
                    wait = self._heap[0][0] - time.perf_counter()
                    if wait <= 0:
                        return heapq.heappop(self._heap)[2]
                    self._cv.wait(timeout=wait)
                else:
                    self._cv.wait()

    def _loop(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - handed to the compute thread
                with self._cv:
                    self._error = e
            # the job's closure may hold device bytes (a swap-in's destination): let them
            # go now, not when the next job arrives
            job = None
            with self._cv:
                self._pending -= 1
                self._cv.notify_all()
