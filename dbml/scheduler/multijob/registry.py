"""One MemoryScheduler and one DeviceLedger per device, process-wide: every job on a
device must plan through the same scheduler, or the jobs do not see each other.

They live in one object, :class:`Devices` (``DEVICES``, the scheduler's only per-process
state: the scheduler imports nothing of dbml, so dbml's runtime holds it by reference and
``reset`` empties it where no job holds a device), with what a spilling CPU job measured of
the process's memory beside its plan (``real_reserves``: the next job of its architecture
starts from it, ``execute/runner.py``)."""

from __future__ import annotations

import threading
from typing import Hashable

from ..plan.planner import PlanSettings
from .ledger import DeviceLedger
from .scheduler import MemoryScheduler

__all__ = ["Devices", "device_ledger", "existing_scheduler", "shared_scheduler", "reset"]


def _device_key(device: str) -> str:
    kind, _, index = str(device).partition(":")
    return f"{kind}:{index or 0}" if kind == "cuda" else kind


class Devices:
    """The process's schedulers and ledgers, by device ("cpu", "cuda:0", ...)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.schedulers: dict[str, MemoryScheduler] = {}
        self.ledgers: dict[str, DeviceLedger] = {}
        # (shared graph, batch signature) -> the reserve the last such job measured
        self.real_reserves: dict[Hashable, int] = {}

    def shared_scheduler(self, device: str = "cpu", budget_bytes: int | None = None,
                         settings: PlanSettings | None = None) -> MemoryScheduler:
        key = _device_key(device)
        with self.lock:
            ms = self.schedulers.get(key)
            if ms is None:
                if budget_bytes is None:
                    raise ValueError(f"shared_scheduler({device!r}): the first call for a device must "
                                     f"give budget_bytes, the memory all its jobs may use")
                ms = self.schedulers[key] = MemoryScheduler(budget_bytes, settings, ledger=self._ledger(key))
        return ms

    def existing_scheduler(self, device: str = "cpu") -> MemoryScheduler | None:
        with self.lock:
            return self.schedulers.get(_device_key(device))

    def _ledger(self, key: str) -> DeviceLedger:   # the caller holds self.lock
        if key not in self.ledgers:
            self.ledgers[key] = DeviceLedger()
        return self.ledgers[key]

    def device_ledger(self, device: str = "cpu") -> DeviceLedger:
        with self.lock:
            return self._ledger(_device_key(device))

    def idle(self) -> bool:
        """No job planned on any device, no memory held on any ledger."""
        with self.lock:
            return (not any(ms.jobs() for ms in self.schedulers.values())
                    and not any(led.current_bytes or led.accounts() for led in self.ledgers.values()))

    def reset(self) -> bool:
        """Drop every scheduler and ledger if :meth:`idle`; whether it did."""
        if not self.idle():
            return False
        with self.lock:
            self.schedulers.clear()
            self.ledgers.clear()
            self.real_reserves.clear()
        return True


DEVICES = Devices()


def shared_scheduler(device: str = "cpu", budget_bytes: int | None = None,
                     settings: PlanSettings | None = None) -> MemoryScheduler:
    """The process-wide MemoryScheduler of ``device`` ("cpu", "cuda", "cuda:1"; "cuda"
    means "cuda:0"), created at the first call, which must give ``budget_bytes``.

    Every job on the device should plan through this one instance: jobs planned by
    different instances do not see each other and may together exceed the memory.
    ``budget_bytes`` and ``settings`` count only at creation: a job that wants another
    budget asks the scheduler with ``hold_budget``, which changes it only while no job
    holds it (one connection's budget never shrinks another's running jobs).
    """
    return DEVICES.shared_scheduler(device, budget_bytes, settings)


def existing_scheduler(device: str = "cpu") -> MemoryScheduler | None:
    """The process-wide MemoryScheduler of ``device`` if one was created, else None."""
    return DEVICES.existing_scheduler(device)


def device_ledger(device: str = "cpu") -> DeviceLedger:
    """The process-wide :class:`~.ledger.DeviceLedger` of ``device``: every job running on
    it reports the memory its executors hold here, whether it plans through the shared
    scheduler (which uses this ledger) or alone, so its peak is the device's measured
    global peak."""
    return DEVICES.device_ledger(device)


def reset() -> bool:
    """A fresh process's devices (no scheduler, no ledger), if no job holds one; whether
    it reset. Tests call it through ``dbml.core.runtime.reset``."""
    return DEVICES.reset()
