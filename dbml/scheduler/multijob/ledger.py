"""The device's memory ledger: what all jobs' executors hold together, and its peak."""

from __future__ import annotations

import threading

__all__ = ["DeviceLedger", "JobAccount"]


class DeviceLedger:
    """The device memory every job's executors hold together, and its peak: the
    measured global peak of concurrent jobs (TENSILE's global peak is the sum of the
    jobs' peaks in the plan; this is what they held at the same moment).

    Each job opens one :class:`JobAccount` (shared by its executors, one per graph) and
    reports every change of its ledger (``add``) and of its pool of released buffers
    (``add_pool``) as it happens; the totals are updated under one lock, so the peak is
    exact for the order the changes took (a sum of per-job peaks read afterwards would
    not be: jobs peak at different moments). ``peak_bytes`` counts ledgers,
    ``reserved_peak_bytes`` ledgers and pools (like CUDA's allocated and reserved).
    A job's account keeps what it holds between iterations (its resident parameters and
    optimizer state) until it is closed. The peaks are those of the current busy period
    (since an account opened on an idle device: one holding nothing), so they stay
    readable after the jobs end and start afresh with the next jobs. Idle is "nothing
    held", not "no account open": an account left open holding nothing (a runner never
    closed) must not carry an old busy period's peak into the next jobs' figures.

    >>> led = DeviceLedger(); a, b = led.account("a"), led.account("b")
    >>> a.add(60); b.add(50); a.add(-40); b.add(20); led.current_bytes, led.peak_bytes
    (90, 110)
    >>> a.close(); led.current_bytes, sorted(led.accounts())
    (70, ['b'])
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._accounts: dict[int, "JobAccount"] = {}
        self.current_bytes = 0
        self.peak_bytes = 0
        self.pool_bytes = 0
        self.reserved_peak_bytes = 0

    def account(self, job: str) -> "JobAccount":
        """Open ``job``'s account. One opened on an idle device (nothing held) starts a new
        busy period: the peaks are measured afresh from then on."""
        acct = JobAccount(self, job)
        with self._lock:
            if self.current_bytes == 0:
                self.peak_bytes = self.current_bytes
                self.reserved_peak_bytes = self.current_bytes + self.pool_bytes
            self._accounts[id(acct)] = acct
        return acct

    def accounts(self) -> dict[str, int]:
        """Per open account (by job name), the bytes its ledger holds now."""
        with self._lock:
            return {a.job: a.bytes for a in self._accounts.values()}

    def snapshot(self) -> dict:
        with self._lock:
            return {"current_bytes": self.current_bytes, "peak_bytes": self.peak_bytes,
                    "pool_bytes": self.pool_bytes, "reserved_peak_bytes": self.reserved_peak_bytes,
                    "jobs": {a.job: a.bytes for a in self._accounts.values()}}


class JobAccount:
    """One job's part of a :class:`DeviceLedger` (see there). Thread-safe: the job's
    compute thread and its copy thread both report to it."""

    __slots__ = ("ledger", "job", "bytes", "pool", "open")

    def __init__(self, ledger: DeviceLedger, job: str):
        self.ledger, self.job = ledger, job
        self.bytes = self.pool = 0
        self.open = True

    def add(self, nbytes: int) -> None:
        with self.ledger._lock:
            self._apply(nbytes)

    def set(self, nbytes: int) -> None:
        """The job's ledger holds ``nbytes`` now (at an iteration boundary)."""
        with self.ledger._lock:
            self._apply(nbytes - self.bytes)

    def _apply(self, nbytes: int) -> None:   # the caller holds the ledger's lock
        if not self.open:
            return
        led = self.ledger
        self.bytes += nbytes
        led.current_bytes += nbytes
        if nbytes > 0:
            if led.current_bytes > led.peak_bytes:
                led.peak_bytes = led.current_bytes
            if led.current_bytes + led.pool_bytes > led.reserved_peak_bytes:
                led.reserved_peak_bytes = led.current_bytes + led.pool_bytes

    def add_pool(self, nbytes: int) -> None:
        led = self.ledger
        with led._lock:
            if not self.open:
                return
            self.pool += nbytes
            led.pool_bytes += nbytes
            if led.current_bytes + led.pool_bytes > led.reserved_peak_bytes:
                led.reserved_peak_bytes = led.current_bytes + led.pool_bytes

    def close(self) -> None:
        """The job holds nothing on the device any more."""
        led = self.ledger
        with led._lock:
            if self.open:
                led.current_bytes -= self.bytes
                led.pool_bytes -= self.pool
                self.bytes = self.pool = 0
                self.open = False
                led._accounts.pop(id(self), None)
