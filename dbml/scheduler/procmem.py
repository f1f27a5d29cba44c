"""The process's real memory: what a job added to it, as seen from outside.

The executor's ledger counts tensors; the process also holds graphs, plans, batches,
allocator slack and anything else a job brings. What a user pays is the process's
resident memory, so a job's summary and every benchmark row also report
``real_peak_bytes``: the process's resident-set high-water mark while the job ran, less
its resident set when the job started (Linux: ``/proc/self/status``' ``VmHWM`` and
``VmRSS``).

The kernel's high-water mark is never reset here (``/proc/self/clear_refs`` could, but
it would also hide earlier peaks from whoever measures the process from outside, such as
``/usr/bin/time``). So: when the mark rose while the job ran, the job's peak *is* the
mark (exact); when it did not (an earlier, larger peak of the process hides it), a
sampler thread's largest reading of ``VmRSS`` (every :data:`SAMPLE_S`) is used instead —
a lower bound, marked ``exact=False``. With several jobs running at once the figure is
the process's, not the job's alone.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["status_bytes", "rss_bytes", "hwm_bytes", "RealMemory", "watch"]

SAMPLE_S = 0.005


def status_bytes(*fields: str) -> dict[str, int]:
    """Fields of ``/proc/self/status`` in bytes (e.g. 'VmRSS', 'VmHWM'); {} off Linux."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in fields:
                    out[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return out


def rss_bytes() -> int | None:
    return status_bytes("VmRSS").get("VmRSS")


def hwm_bytes() -> int | None:
    return status_bytes("VmHWM").get("VmHWM")


@dataclass(frozen=True)
class RealMemory:
    """What a job added to the process's resident memory at its peak."""

    start_rss: int
    peak_rss: int
    exact: bool     # the kernel's high-water mark (True), or the sampler's largest reading

    @property
    def added(self) -> int:
        return max(0, self.peak_rss - self.start_rss)


class _Sampler:
    """One thread for the whole process, reading VmRSS while any watch is open."""

    def __init__(self):
        self._lock = threading.Lock()
        self._watches: dict[int, list[int]] = {}   # id -> [largest rss seen]
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self, key: int, rss: int) -> None:
        with self._lock:
            self._watches[key] = [rss]
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="dbml-rss", daemon=True)
                self._thread.start()

    def close(self, key: int) -> int:
        with self._lock:
            return self._watches.pop(key, [0])[0]

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._watches:
                    self._thread = None
                    return
            rss = rss_bytes() or 0
            with self._lock:
                for seen in self._watches.values():
                    if rss > seen[0]:
                        seen[0] = rss
            self._wake.wait(SAMPLE_S)


_SAMPLER = _Sampler()   # the process's one sampler thread (per process by nature)


class watch:
    """``with watch() as w: ...`` then ``w.result`` (None off Linux): the real memory the
    block added to the process at its peak (see the module docstring)."""

    def __init__(self):
        self.result: RealMemory | None = None
        self._start = self._hwm = None

    def __enter__(self) -> "watch":
        s = status_bytes("VmRSS", "VmHWM")
        if "VmRSS" in s and "VmHWM" in s:
            self._start, self._hwm = s["VmRSS"], s["VmHWM"]
            _SAMPLER.open(id(self), self._start)
        return self

    @property
    def start(self) -> int | None:
        """The process's resident memory when the watch began (None off Linux)."""
        return self._start

    def stop(self) -> RealMemory | None:
        if self._start is None or self.result is not None:
            return self.result
        sampled = _SAMPLER.close(id(self))
        hwm = hwm_bytes() or 0
        if hwm > self._hwm:
            self.result = RealMemory(self._start, max(hwm, sampled), True)
        else:
            self.result = RealMemory(self._start, max(sampled, rss_bytes() or 0), False)
        return self.result

    def __exit__(self, *exc) -> None:
        self.stop()
