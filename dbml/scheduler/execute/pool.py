"""The reuse pool: released buffers kept for a later pointwise output of the same size.

Like a caching allocator's cache, it saves CPU allocations and page faults and gives
the same bits (pointwise kernels write the same values into any buffer). It never makes
the device hold more than planned: ledger + pool stays within the limit (the plan's
peak, or the budget), and the pool gives buffers back before an allocation outside it
would pass that limit. Its bytes are told to the job's account as pool bytes.
"""

from __future__ import annotations

import sys

import torch

from .devices import as_view, storage_bytes
from .iteration import Account
from .program import Reuse

__all__ = ["BufferPool"]


class BufferPool:
    """Released buffers by size, at most ``demand[size]`` of each (as many as ops
    that take one): the executor checks that before it offers one to :meth:`recycle`."""

    def __init__(self, demand: dict[int, int], account: Account):
        self.demand = demand
        self.account = account
        # by size; the executor's hot loop reads it directly (``free.get(nbytes)``)
        self.free: dict[int, list[torch.Tensor]] = {}
        self.bytes = 0
        self.reserved_peak = 0     # largest ledger + pool

    def hold_within(self, total: int, limit: int) -> None:
        """Ledger + pool may not exceed the limit: give pooled buffers back when an
        allocation outside the pool (ledger ``total``) would make it."""
        while self.bytes and total + self.bytes > limit:
            size = max(n for n, bufs in self.free.items() if bufs)
            self.free[size].pop()
            self.bytes -= size
            self.account.add_pool(-size)
        self.reserved_peak = max(self.reserved_peak, total + self.bytes)

    def recycle(self, value: torch.Tensor, nbytes: int, total: int, limit: int) -> None:
        """Keep a released buffer for a later output of the same size when nothing else
        holds it, and only while ledger + pool stays within the limit (the plan's peak or
        the budget): the pool never makes the device hold more than planned."""
        if total + self.bytes + nbytes > limit:
            return
        # three references: the caller's, this parameter, getrefcount's argument
        if sys.getrefcount(value) > 3 or torch._C._storage_Use_Count(value.untyped_storage()._cdata) != 2:
            return  # shared with someone else (a caller's tensor, a view we do not own)
        self.free.setdefault(nbytes, []).append(storage_bytes(value))
        self.bytes += nbytes
        self.account.add_pool(nbytes)
        self.reserved_peak = max(self.reserved_peak, total + self.bytes)

    def take(self, r: Reuse) -> torch.Tensor:
        """A pooled buffer of ``r.nbytes`` (the caller checked there is one), as the
        op's output layout."""
        self.bytes -= r.nbytes
        self.account.add_pool(-r.nbytes)
        return as_view(self.free[r.nbytes].pop(), r.dtype, r.size, r.stride, 0)

    def clear(self) -> None:
        """Give every buffer back (another executor is about to run)."""
        self.free.clear()
        if self.bytes:
            self.account.add_pool(-self.bytes)
        self.bytes = 0
