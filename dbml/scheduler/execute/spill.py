"""The CPU's slow tier: swapped tensors in a file on disk, outside the process's memory.

On the CPU "device" and "host" are the same RAM: a swapped-out tensor copied into a host
buffer still occupies the process, and a budget only moves bytes between two columns of
a report. The slow tier that really is outside the budget is disk, where DuckDB spills
too (its ``temp_directory``): this machine's disk is as slow next to its CPU as PCIe is
next to a GPU.

:class:`SpillFile` is one job's file. A swapped storage gets an *extent* (offset, size
rounded up to :data:`BLOCK`); extents are reused by size (a training step swaps the same
sizes every iteration), so the file grows to the most the job ever held on disk at once.
Reads and writes bypass the page cache (``O_DIRECT``) through one aligned bounce buffer
of :data:`CHUNK` bytes, so the kernel keeps no copy of the bytes in RAM either (a file
system that refuses ``O_DIRECT`` is written through the cache, synced and dropped from
it with ``posix_fadvise(DONTNEED)``). Both run on the copy thread, overlapping compute:
``os.pwrite``/``os.preadv`` and torch's copies release the GIL.

The file is named ``dbml_swap_<pid>_<job>_<n>.bin`` and removed when the job ends, fails
or is cancelled (:meth:`SpillFile.close`, also from ``__del__``); :func:`sweep_stale`
removes the files of processes that no longer run (a crash), on the next open.
``limit`` bounds the file (DuckDB's ``max_temp_directory_size`` less what DuckDB holds
there): a swap past it raises :class:`SpillFull`, naming the setting.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch

from ..errors import SchedulerError

__all__ = ["SpillFile", "Parked", "Extent", "SpillError", "SpillFull", "sweep_stale", "BLOCK", "CHUNK", "file_system",
           "Tier", "measure_tier", "calibrate_tier", "tier_of"]

BLOCK = 4096          # O_DIRECT's alignment of offsets, lengths and buffers (a page covers every block size)
# the bounce buffer: 2 MiB per job, large enough that a syscall's cost is small. Its pages are
# the job's real memory beside its plan (runner.bounce_reserve): 4 MiB wrote 1.6 GB/s and read
# 1.4 here, 2 MiB 1.5-2 % and 6 % slower, and a 67.3 MB job planned 4 MB more of tensors in
# the 2 MB it left: 6.3-7.4 s against 7.6-8.2 s (benchmarks/pieces_cost.py 67.3MB)
CHUNK = 2 << 20
_PREFIX = "dbml_swap_"
_NAME = re.compile(rf"{_PREFIX}(\d+)_.*\.bin$")
_serial = itertools.count()


class SpillError(SchedulerError, OSError):
    """Swapped tensors could not be written to or read from the spill file (a full
    disk, an unwritable directory); ``directory`` names where."""

    def __init__(self, err: int, message: str, directory: str = ""):
        super().__init__(err, message)
        self.directory = directory


class SpillFull(SpillError):
    """The spill file would pass its limit (the temp directory's size limit)."""


@dataclass(frozen=True)
class Extent:
    """Where one swapped storage lies in a spill file: ``nbytes`` at ``offset`` (a whole
    number of blocks, ``capacity`` bytes, reserved for it)."""

    offset: int
    nbytes: int
    capacity: int

    def numel(self) -> int:   # the bytes of the storage, as a flat uint8 host copy would say
        return self.nbytes


def _round(n: int) -> int:
    return max(BLOCK, -(-n // BLOCK) * BLOCK)


def file_system(path: str | os.PathLike) -> str:
    """The type of the file system holding ``path`` (``/proc/mounts``' longest matching
    mount point), or '' where it cannot be told. 'tmpfs' and 'ramfs' are RAM: a spill
    there saves nothing."""
    target = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1].replace("\\040", " ")
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, parts[2]
    except OSError:
        return ""
    return kind


class SpillFile:
    """One job's swapped tensors in one file of ``directory`` (see the module docstring).

    Thread-safe: the copy thread and the compute thread (a passive swap, the state read
    between iterations) may both use it; one lock guards the bounce buffer and the free
    lists."""

    def __init__(self, directory: str | os.PathLike, job: str = "job", *, limit: int | None = None,
                 direct: bool = True):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job)[:40]
        self.path = self.directory / f"{_PREFIX}{os.getpid()}_{safe}_{next(_serial)}.bin"
        self.limit = limit
        self.direct = False
        self.fd = -1
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
                self.direct = True
            except OSError as e:
                if e.errno != errno.EINVAL:   # EINVAL: the file system refuses O_DIRECT (tmpfs)
                    raise
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | (0 if self.path.exists() else os.O_EXCL), 0o600)
        self._map = mmap.mmap(-1, CHUNK)                 # page-aligned: O_DIRECT's buffer
        self._bounce = torch.frombuffer(self._map, dtype=torch.uint8)
        self._lock = threading.Lock()
        self._free: dict[int, list[int]] = {}            # capacity -> offsets of free extents
        self.end = 0                                     # the file's length in use
        self.in_use = 0                                  # bytes of live extents (capacities)
        self.peak = 0                                    # the largest ``end``
        self.written = self.read_bytes = 0               # bytes moved, for reports
        self.kind = file_system(self.directory)

    # -- extents -------------------------------------------------------------------------
    def _take(self, nbytes: int) -> Extent:
        cap = _round(nbytes)
        free = self._free.get(cap)
        if free:
            offset = free.pop()
        else:
            if self.limit is not None and self.end + cap > self.limit:
                raise SpillFull(errno.ENOSPC,
                                f"swapping {nbytes} bytes to {self.path.name} would pass the temp directory's "
                                f"limit ({self.limit} bytes, DuckDB's max_temp_directory_size less what DuckDB "
                                f"holds there)", str(self.directory))
            offset = self.end
            self.end += cap
            self.peak = max(self.peak, self.end)
        self.in_use += cap
        return Extent(offset, nbytes, cap)

    def reserve(self, sizes) -> None:
        """Extents for swaps of these sizes (bytes), taken ahead and given back free: the
        file is allocated on disk now (``fallocate``), not while an iteration runs."""
        with self._lock:
            taken = [self._take(n) for n in sizes]
            for e in taken:
                self._give(e)
        if taken and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(self.fd, 0, self.end)
            except OSError:
                pass   # a file system without fallocate grows the file as it is written

    def _give(self, e: Extent) -> None:
        self._free.setdefault(e.capacity, []).append(e.offset)
        self.in_use -= e.capacity

    def free(self, e: Extent) -> None:
        """The extent is no longer needed (its tensor is back, or the iteration ended)."""
        with self._lock:
            self._give(e)

    # -- bytes ---------------------------------------------------------------------------
    def write(self, src: torch.Tensor) -> Extent:
        """Write the flat uint8 CPU tensor ``src`` to a new extent; returns it once on disk."""
        n = src.numel()
        with self._lock:
            e = self._take(n)
            try:
                for a in range(0, n, CHUNK):
                    b = min(n, a + CHUNK)
                    self._bounce[:b - a].copy_(src[a:b])
                    length = _round(b - a)
                    if length > b - a:
                        self._bounce[b - a:length].zero_()   # the block's tail: deterministic bytes on disk
                    _full_write(self.fd, memoryview(self._map)[:length], e.offset + a)
                if not self.direct:
                    os.fdatasync(self.fd)
                    os.posix_fadvise(self.fd, e.offset, e.capacity, os.POSIX_FADV_DONTNEED)
            except OSError as err:
                self._give(e)
                raise SpillError(err.errno or errno.EIO, f"writing swapped tensors to {self.path} failed "
                                 f"({err.strerror or err})", str(self.directory)) from err
            except BaseException:
                self._give(e)
                raise
            self.written += n
        return e

    def read(self, e: Extent, dst: torch.Tensor) -> None:
        """Read extent ``e`` into the flat uint8 CPU tensor ``dst`` (``e.nbytes`` long)."""
        n = e.nbytes
        with self._lock:
            for a in range(0, n, CHUNK):
                b = min(n, a + CHUNK)
                _full_read(self.fd, memoryview(self._map)[:_round(b - a)], e.offset + a)
                dst[a:b].copy_(self._bounce[:b - a])
            if not self.direct:
                os.posix_fadvise(self.fd, e.offset, e.capacity, os.POSIX_FADV_DONTNEED)
            self.read_bytes += n

    def close(self) -> None:
        """Remove the file (the job ended, failed or was cancelled); idempotent."""
        with self._lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
                try:
                    self.path.unlink()
                except FileNotFoundError:
                    pass
                self._free.clear()
                self.end = self.in_use = 0

    def __del__(self):
        if getattr(self, "fd", -1) >= 0 and getattr(self, "_lock", None) is not None:
            self.close()


class Parked:
    """Tensors kept in a spill file, outside the process's memory, until read back: a copy a
    job keeps but does not compute with (early stopping's best epoch's weights). Each tensor
    is written as it comes (an iterator of values read from the spill file one at a time
    holds one in memory at a time); iterating reads them back the same way, each into a
    fresh tensor. :meth:`free` gives the extents back to the file (its next copy reuses them)."""

    def __init__(self, spill: SpillFile, tensors: Iterable[torch.Tensor]):
        self.spill = spill
        self.entries: list[tuple[Extent, torch.dtype, tuple[int, ...]]] = []
        try:
            for t in tensors:
                t = t.detach().contiguous()
                self.entries.append((spill.write(t.reshape(-1).view(torch.uint8)), t.dtype, tuple(t.shape)))
        except BaseException:
            self.free()
            raise

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for e, dtype, shape in self.entries:
            out = torch.empty(shape, dtype=dtype)
            self.spill.read(e, out.reshape(-1).view(torch.uint8))
            yield out

    def read_into(self, tensors: Iterable[torch.Tensor]) -> None:
        """Read the copies back into ``tensors`` (as many, of their shapes and dtypes, on the
        CPU): straight into a contiguous one's storage, no tensor in between."""
        tensors = list(tensors)
        if len(tensors) != len(self.entries):
            raise ValueError(f"Parked.read_into(): {len(tensors)} tensors for {len(self.entries)} copies")
        for t, (e, dtype, shape) in zip(tensors, self.entries):
            if t.dtype != dtype or tuple(t.shape) != shape:
                raise ValueError(f"Parked.read_into(): a {t.dtype} {tuple(t.shape)} tensor for a {dtype} {shape} copy")
            if t.is_contiguous() and t.device.type == "cpu":
                self.spill.read(e, t.detach().reshape(-1).view(torch.uint8))
            else:
                out = torch.empty(shape, dtype=dtype)
                self.spill.read(e, out.reshape(-1).view(torch.uint8))
                t.detach().copy_(out)

    def free(self) -> None:
        for e, _, _ in self.entries:
            self.spill.free(e)
        self.entries = []


def _full_write(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _full_read(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        done = os.preadv(fd, [view], offset)
        if done == 0:
            raise OSError(errno.EIO, f"spill file ended at {offset}: a swapped tensor's bytes are missing")
        view, offset = view[done:], offset + done


def sweep_stale(directory: str | os.PathLike) -> list[str]:
    """Remove the spill files in ``directory`` left by processes that no longer run (a
    crash or ``kill -9``); the names removed. A live process's files are left alone."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        m = _NAME.match(entry.name)
        if not m or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        try:
            os.unlink(entry.path)
            removed.append(entry.name)
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- the tier's speed ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Tier:
    """A spill directory's measured speed: bytes/s each way and the fixed cost of one copy
    (s), as calibration measures host<->device copies."""

    write: float
    read: float
    latency: float

    @property
    def bandwidth(self) -> float:
        """What the planner plans each copy with (``AccessSequence.copy_bandwidth``, one
        figure for both ways): the slower way. A swap-out frees its bytes only once written,
        so the write is what the peak waits for; a swap-in planned at the write's speed
        arrives early, never late."""
        return min(self.write, self.read)


PROBE_BYTES = 32 << 20
_tiers: dict[int, Tier] = {}     # by the file system's st_dev: a cache of pure facts of this machine
_tiers_lock = threading.Lock()


def measure_tier(directory: str | os.PathLike, nbytes: int = PROBE_BYTES) -> Tier:
    """Write and read back ``nbytes`` in chunks through a spill file in ``directory``
    (as swaps do: O_DIRECT, the copy thread's bounce buffer), and one block each way for
    the fixed cost. Best of two rounds: a loaded machine's slow round is noise. The bytes
    written are one :data:`CHUNK` of memory written to ``nbytes // CHUNK`` extents and read
    back into another: two chunks of the process's memory, not twice ``nbytes`` (64 MB, which a
    first job measured as its own where no install had calibrated the tier)."""
    spill = SpillFile(directory, "probe")
    try:
        chunk = min(nbytes, CHUNK)
        count = max(1, nbytes // chunk)
        src = torch.ones(chunk, dtype=torch.uint8)
        dst = torch.empty(chunk, dtype=torch.uint8)
        small = torch.ones(BLOCK, dtype=torch.uint8)
        write = read = lat = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            extents = [spill.write(src) for _ in range(count)]
            t1 = time.perf_counter()
            for e in extents:
                spill.read(e, dst)
            t2 = time.perf_counter()
            for e in extents:
                spill.free(e)
            f = spill.write(small)
            spill.read(f, small)
            t4 = time.perf_counter()
            spill.free(f)
            write, read, lat = min(write, t1 - t0), min(read, t2 - t1), min(lat, (t4 - t2) / 2)
        return Tier(write=chunk * count / write, read=chunk * count / read, latency=lat)
    finally:
        spill.close()


def _tiers_file() -> Path:
    from .. import config
    return config.cache_dir() / "spill-tiers.json"


def calibrate_tier(directory: str | os.PathLike) -> Tier:
    """Measure the file system holding ``directory`` and keep the figures in the cache
    (``<cache>/spill-tiers.json``, by file system): ``python -m dbml install`` does this
    for the directory DuckDB spills to by default, so a job plans with the tier's speed
    from its first iteration, as with the copy bandwidth calibration measures."""
    import json
    Path(directory).mkdir(parents=True, exist_ok=True)
    tier = measure_tier(directory)
    dev = os.stat(directory).st_dev
    path = _tiers_file()
    try:
        known = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        known = {}
    known[str(dev)] = {"write": tier.write, "read": tier.read, "latency": tier.latency}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(known, indent=1))
    with _tiers_lock:
        _tiers[dev] = tier
    return tier


def tier_of(directory: str | os.PathLike) -> Tier:
    """The speed of the file system holding ``directory``: ``DBML_SPILL_BANDWIDTH`` where
    set (the tests pin it: plans then do not depend on a disk's noisy speed), else
    calibrated at install (:func:`calibrate_tier`), else measured once per process and
    file system (:func:`measure_tier`, about 0.1 s on this project's machines)."""
    import json
    from .. import config
    fixed = config.spill_bandwidth_override()
    if fixed is not None:
        return Tier(fixed, fixed, 0.0)
    Path(directory).mkdir(parents=True, exist_ok=True)
    dev = os.stat(directory).st_dev
    with _tiers_lock:
        if dev not in _tiers:
            try:
                known = json.loads(_tiers_file().read_text()).get(str(dev))
                _tiers[dev] = Tier(float(known["write"]), float(known["read"]), float(known["latency"]))
            except (OSError, ValueError, TypeError, KeyError, AttributeError):
                _tiers[dev] = measure_tier(directory)
        return _tiers[dev]
