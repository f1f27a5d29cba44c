"""One MemoryScheduler and one DeviceLedger per device, process-wide: every job on a
device must plan through the same scheduler, or the jobs do not see each other."""

from __future__ import annotations

import threading

from ..plan.planner import PlanSettings
from .ledger import DeviceLedger
from .scheduler import MemoryScheduler

__all__ = ["device_ledger", "existing_scheduler", "shared_scheduler"]

_DEFAULTS: dict[str, MemoryScheduler] = {}
_LEDGERS: dict[str, DeviceLedger] = {}
_DEFAULTS_LOCK = threading.Lock()


def _device_key(device: str) -> str:
    kind, _, index = str(device).partition(":")
    return f"{kind}:{index or 0}" if kind == "cuda" else kind


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
    key = _device_key(device)
    with _DEFAULTS_LOCK:
        ms = _DEFAULTS.get(key)
        if ms is None:
            if budget_bytes is None:
                raise ValueError(f"shared_scheduler({device!r}): the first call for a device must "
                                 f"give budget_bytes, the memory all its jobs may use")
            ms = _DEFAULTS[key] = MemoryScheduler(budget_bytes, settings, ledger=_ledger(key))
    return ms


def existing_scheduler(device: str = "cpu") -> MemoryScheduler | None:
    """The process-wide MemoryScheduler of ``device`` if one was created, else None."""
    with _DEFAULTS_LOCK:
        return _DEFAULTS.get(_device_key(device))


def _ledger(key: str) -> DeviceLedger:   # the caller holds _DEFAULTS_LOCK
    if key not in _LEDGERS:
        _LEDGERS[key] = DeviceLedger()
    return _LEDGERS[key]


def device_ledger(device: str = "cpu") -> DeviceLedger:
    """The process-wide :class:`~.ledger.DeviceLedger` of ``device``: every job running on
    it reports the memory its executors hold here, whether it plans through the shared
    scheduler (which uses this ledger) or alone, so its peak is the device's measured
    global peak."""
    with _DEFAULTS_LOCK:
        return _ledger(_device_key(device))
