"""One memory truth for every method the benchmark compares: live tensor storage bytes.

Owns :class:`MemoryTracker`, the host-memory tag (:func:`mark_host`, :func:`is_host`,
:func:`host_copy`), the instrumentation of a dbml ``ScheduledStep``'s device
(:func:`instrument`, :func:`tracking_dbml`), :func:`measure_step` (one step measured) and
:func:`downsample` (a timeline cut to a plottable size, peaks kept).

The tracker builds on :class:`~dbml.scheduler.execute.measure.PeakMeter`'s idea: a
``TorchDispatchMode`` that sees every aten op on the calling (compute) thread and keeps,
per live storage, its bytes. What it adds:

* Two kinds of memory. A storage tagged host (:func:`mark_host`: a copy moved off the
  device) counts as host memory, never as device memory; every other storage on the
  tracked device type is "device memory". A swap-in's destination is device memory again
  (a fresh storage). On CPU both live in RAM: the tag is what tells a swapped-out copy
  from an activation.
* Other threads. A dispatch mode is thread-local, so a copy thread's allocations are
  counted through :meth:`MemoryTracker.track` (thread-safe: every change of the books
  happens under one lock). :func:`instrument` wires dbml's copy thread to it.
* A timeline: with ``record=True``, (seconds since ``__enter__``, device bytes, host bytes)
  at every change, for the memory-over-one-iteration plots.
* ``torch.compile``: :meth:`~MemoryTracker.ignore_compile_internals` is True, so a
  compiled region is compiled (not traced op by op through the mode) and the mode sees the
  aten ops of the compiled artifact at runtime. AOT backends (``aot_eager``,
  ``aot_eager_decomp_partition``) run aten ops through the dispatcher, so every buffer is
  seen. Inductor's generated code allocates its buffers with ``empty_strided_cpu``, below
  the dispatcher: unseen (a pointwise-only region: not one byte), unless
  :func:`see_inductor_buffers` was called before the code was compiled.

Counting rules: a storage counts once, however many views of it exist (``StorageWeakRef``
keys); it stops counting as soon as it is freed (expired references are dropped after
each op, before its outputs are counted, and on every ``track``); a storage first seen as
an op's input existed before the call and is counted as alive from the start (its bytes
are added to the peak and to every earlier timeline point). Pass the tensors alive before
the call as ``base`` (``live_tensors(model, optimizer, x, y)``) as a temporary: the tracker
keeps weak references only, and a list held elsewhere would keep, e.g., last step's
gradients alive. Not seen: scratch memory a kernel allocates and frees inside one op.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, ContextManager, Iterable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

# PeakMeter's flattening, so that both count the same tensors of a nested argument
from dbml.scheduler.execute.measure import _tensors as tensors_in
from dbml.scheduler.execute.measure import live_tensors

__all__ = ["MemoryTracker", "mark_host", "is_host", "host_copy", "current_tracker", "downsample",
           "instrument", "tracking_dbml", "measure_step", "see_inductor_buffers", "live_tensors"]


# -- the host tag: a weak registry of storages that are host memory ------------------------
# StorageWeakRef keys: a weak reference keeps the storage's bookkeeping object (not its
# memory) alive, so a freed storage's key is never reused by a new one while it is here.
_HOST: set[StorageWeakRef] = set()
_HOST_PRUNED_AT = 64            # prune expired tags when the registry doubles past this
_REGISTRY = threading.Lock()    # guards _HOST, _HOST_PRUNED_AT and _current
_current: "MemoryTracker | None" = None


def _storage_ref(t: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(t.untyped_storage())


def _tagged_host(ref: StorageWeakRef) -> bool:
    with _REGISTRY:
        return ref in _HOST


def mark_host(t: torch.Tensor) -> None:
    """Tag ``t``'s storage as host memory (a copy moved off the device), for every tracker,
    for as long as it lives. The active tracker (if any) counts it as host from now on;
    if it already counted it as device memory, it moves the bytes (its device peak may
    already include them: allocate host copies with :func:`host_copy` to avoid that)."""
    global _HOST_PRUNED_AT
    with _REGISTRY:
        _HOST.add(_storage_ref(t))
        if len(_HOST) > 2 * _HOST_PRUNED_AT:
            _HOST.difference_update([r for r in _HOST if r.expired()])
            _HOST_PRUNED_AT = max(64, len(_HOST))
        tracker = _current
    if tracker is not None:
        tracker.track(t)


def is_host(t: torch.Tensor) -> bool:
    """Whether ``t``'s storage is tagged host memory."""
    return _tagged_host(_storage_ref(t))


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` moved to the host: allocated and copied with the dispatch modes of
    this thread suspended (so no tracker counts it as device memory, even for a moment),
    then tagged host. For activation offloading (``saved_tensors_hooks``) on a CPU."""
    with _disable_current_modes():
        out = torch.empty_like(t, device="cpu")
        out.copy_(t)
    mark_host(out)
    return out


def current_tracker() -> "MemoryTracker | None":
    """The tracker active now (entered on some thread), where other threads report to."""
    with _REGISTRY:
        return _current


def _set_current(tracker: "MemoryTracker | None") -> "MemoryTracker | None":
    global _current
    with _REGISTRY:
        previous, _current = _current, tracker
    return previous


# -- the tracker --------------------------------------------------------------------------
class MemoryTracker(TorchDispatchMode):
    """Peaks of live device and host storage bytes while the context is active on the
    calling (compute) thread; :meth:`track` counts allocations made on other threads.

    ``device_peak_bytes`` includes ``base_bytes`` (the device bytes of ``base``);
    ``host_peak_bytes`` the host-tagged storages given, tracked or used by an op (for dbml:
    the host buffers its swaps used; a pool's untouched buffers are not counted).
    ``current_device_bytes``/``current_host_bytes``: now; ``timeline`` (``record=True``):
    ``(seconds since __enter__, device bytes, host bytes)`` at every change; ``ops``: aten
    ops seen on the compute thread; ``tracked``: :meth:`track` calls. The "current
    tracker" (:func:`current_tracker`) is process-wide: one tracked compute thread at a
    time. ``device``: the device type whose storages count (default ``"cpu"``)."""

    def __init__(self, base: Iterable[torch.Tensor] = (), *, record: bool = False, device: str = "cpu"):
        super().__init__()
        self.record = record
        self.device_type = torch.device(device).type
        self._lock = threading.Lock()
        self._live: dict[StorageWeakRef, tuple[int, bool]] = {}   # storage -> (bytes, host)
        self.current_device_bytes = self.current_host_bytes = 0
        self.device_peak_bytes = self.host_peak_bytes = 0
        self.timeline: list[tuple[float, int, int]] = []
        self.ops = 0            # ops seen on the compute thread
        self.tracked = 0        # tensors reported through track()
        self.result: Any = None  # what measure_step's step_fn returned
        self._t0: float | None = None
        self._previous: MemoryTracker | None = None
        for t in tensors_in(list(base)):
            self._count(t)
        self.base_bytes = self.current_device_bytes
        self.base_host_bytes = self.current_host_bytes

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """torch.compile'd regions run compiled; the mode sees their ops at runtime."""
        return True

    def __enter__(self):
        self._t0 = time.perf_counter()
        with self._lock:
            self._changed()
        self._previous = _set_current(self)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            _set_current(self._previous)
            self._previous = None
            with self._lock:
                self._prune()
                self._changed()

    # -- bookkeeping (every method below runs under self._lock) -----------------------
    def _key(self, t: Any) -> tuple[StorageWeakRef, int] | None:
        if (type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter)) \
                or t.layout is not torch.strided or t.device.type != self.device_type:
            return None
        storage = t.untyped_storage()
        return StorageWeakRef(storage), storage.nbytes()

    def _count(self, t: Any, *, alive_from_start: bool = False) -> None:
        """Count ``t``'s storage if new, grown, or newly tagged host."""
        key = self._key(t)
        if key is None:
            return
        ref, nbytes = key
        host = _tagged_host(ref)
        old_bytes, old_host = self._live.get(ref, (0, host))
        if old_host != host:          # tagged host since it was counted: move its bytes
            self._adjust(-old_bytes, old_host)
            old_bytes = 0
        elif ref in self._live and nbytes <= old_bytes:
            return
        self._live[ref] = (max(nbytes, old_bytes), host)
        added = max(nbytes, old_bytes) - old_bytes
        if alive_from_start:
            self._alive_throughout(added, host)
        else:
            self._adjust(added, host)

    def _adjust(self, nbytes: int, host: bool) -> None:
        if host:
            self.current_host_bytes += nbytes
            self.host_peak_bytes = max(self.host_peak_bytes, self.current_host_bytes)
        else:
            self.current_device_bytes += nbytes
            self.device_peak_bytes = max(self.device_peak_bytes, self.current_device_bytes)

    def _alive_throughout(self, nbytes: int, host: bool) -> None:
        """A storage that existed before the call and was untouched so far: it was alive
        at every moment recorded, so it adds to the peak and to every timeline point."""
        if host:
            self.current_host_bytes += nbytes
            self.host_peak_bytes += nbytes
        else:
            self.current_device_bytes += nbytes
            self.device_peak_bytes += nbytes
        d, h = (0, nbytes) if host else (nbytes, 0)
        self.timeline[:] = [(s, dev + d, hst + h) for s, dev, hst in self.timeline]

    def _prune(self) -> None:
        for ref in [r for r in self._live if r.expired()]:
            nbytes, host = self._live.pop(ref)
            if host:
                self.current_host_bytes -= nbytes
            else:
                self.current_device_bytes -= nbytes

    def _changed(self) -> None:
        if not self.record or self._t0 is None:
            return
        point = (time.perf_counter() - self._t0, self.current_device_bytes, self.current_host_bytes)
        if not self.timeline or self.timeline[-1][1:] != point[1:]:
            self.timeline.append(point)

    # -- the two ways bytes arrive ----------------------------------------------------------
    def track(self, t: torch.Tensor) -> None:
        """Count a tensor that became live now without passing this thread's dispatcher
        (a copy thread's allocation). Thread-safe; counting the same storage twice is a
        no-op, so the compute thread may report its own allocations too."""
        with self._lock:
            self.tracked += 1
            self._prune()
            self._count(t)
            self._changed()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with self._lock:
            for t in tensors_in((args, kwargs)):
                key = self._key(t)
                if key is not None and key[0] not in self._live:
                    self._count(t, alive_from_start=True)
        out = func(*args, **kwargs)
        with self._lock:
            self.ops += 1
            self._prune()   # frees since the last op (this thread's or the copy thread's)
            for t in tensors_in(out):
                self._count(t)
            self._changed()
        return out


# -- dbml: the copy thread and the host pool of a ScheduledStep's device -------------------
def _track_in_current(t: torch.Tensor) -> None:
    tracker = current_tracker()
    if tracker is not None:
        tracker.track(t)


def instrument(step) -> None:
    """Patch ``step.device`` (a ``ScheduledStep``'s device) once, for every tracker to come:
    ``alloc`` reports each device allocation (the copy thread's swap-ins) to the current
    tracker; ``_new_host`` allocates every host buffer with the modes suspended and tags it
    host; ``host_buffer`` reports the host buffer a swap-out takes from the pool. Host
    buffers that exist already (the pool, the state kept on the host) are tagged now, so
    calling it after the step's first iteration works too."""
    device = step.device
    if getattr(device, "_memtrack_instrumented", False):
        return
    alloc, new_host, host_buffer = device.alloc, device._new_host, device.host_buffer

    def tracked_alloc(nbytes: int) -> torch.Tensor:
        t = alloc(nbytes)
        _track_in_current(t)
        return t

    def tagged_new_host(nbytes: int) -> torch.Tensor:
        with _disable_current_modes():   # never device memory, even for a moment
            buf = new_host(nbytes)
        mark_host(buf)
        return buf

    def tracked_host_buffer(nbytes: int) -> torch.Tensor:
        buf = host_buffer(nbytes)   # from the pool, or a new one through _new_host
        _track_in_current(buf)
        return buf

    # instance attributes shadow the methods; the pool's own calls of self._new_host too
    device.alloc, device._new_host, device.host_buffer = tracked_alloc, tagged_new_host, tracked_host_buffer
    with device._pool_lock:
        existing = [buf for bufs in device._pool.values() for buf in bufs]
    for buf in existing + list(step.state.host.values()):
        if isinstance(buf, torch.Tensor):   # a Zeros or a spill file's Extent holds no memory to tag
            mark_host(buf)
    device._memtrack_instrumented = True


@contextmanager
def tracking_dbml(step, tracker: MemoryTracker):
    """Within the block, ``step``'s copy thread and host pool report to ``tracker``:
    instruments ``step`` (once) and makes ``tracker`` the current tracker."""
    instrument(step)
    previous = _set_current(tracker)
    try:
        yield tracker
    finally:
        _set_current(previous)


# -- inductor: buffers allocated below the dispatcher ------------------------------------
def see_inductor_buffers() -> None:
    """Make the buffers of inductor-compiled CPU code count: its generated module allocates
    with ``torch._C._dynamo.guards._empty_strided_cpu`` (no dispatcher, so no mode sees
    it, and an output first used by an eager op would be taken for a tensor alive from the
    start). This wraps that function once, process-wide, so every allocation is reported to
    the current tracker (if any; from any thread). A generated module binds the function
    when it is loaded: call this before ``torch.compile`` compiles (or loads from its
    cache) the code to be measured. Frees are seen as for any storage."""
    guards = torch._C._dynamo.guards
    allocate = guards._empty_strided_cpu
    if getattr(allocate, "_memtrack", False):
        return

    def reported(*args, **kwargs):
        t = allocate(*args, **kwargs)
        _track_in_current(t)
        return t

    reported._memtrack = True
    guards._empty_strided_cpu = reported


# -- one step measured; timelines cut to size ------------------------------------------
def measure_step(step_fn: Callable[[], Any], base: Iterable[torch.Tensor], *,
                 instrument: Callable[[MemoryTracker], ContextManager] | None = None,
                 record: bool = False) -> MemoryTracker:
    """Run ``step_fn()`` once under a fresh tracker and return the tracker (its ``result``
    is what ``step_fn`` returned). ``base``: the tensors alive before the step, passed as a
    temporary (``live_tensors(model, optimizer, x, y)``). ``instrument``: a context
    manager factory taking the tracker, entered inside it (``lambda t: tracking_dbml(step, t)``)."""
    tracker = MemoryTracker(base, record=record)
    del base  # weak references only from here: a list held would keep its tensors alive
    with tracker, (instrument(tracker) if instrument is not None else nullcontext()):
        tracker.result = step_fn()
    return tracker


def downsample(timeline: list[tuple[float, int, int]], n: int = 400) -> list[tuple[float, int, int]]:
    """At most ``n`` points: the timeline cut into ``n`` runs of consecutive points, each
    represented by its point of most device bytes (so peaks survive), in time order."""
    if n <= 0:
        raise ValueError(f"downsample(): n must be positive, got {n}")
    if len(timeline) <= n:
        return list(timeline)
    out = []
    for i in range(n):
        bucket = timeline[i * len(timeline) // n:(i + 1) * len(timeline) // n]
        out.append(max(bucket, key=lambda p: p[1]))
    return out
