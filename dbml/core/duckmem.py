"""DuckDB's ``memory_limit``, shared with the training jobs of its database.

Training runs inside the database process, so the memory of a job and that of DuckDB's
queries come out of one budget: DuckDB's ``memory_limit``. :class:`DatabaseMemory`, one per
database instance (``Instance.memory``), is the one owner of the rule that joins them:

- While CPU jobs of the database hold memory, DuckDB's limit is the user's limit minus
  what they hold. A job holds its budget (``hold``) from the moment its runner is made
  until it ends, finished, failed or cancelled (``release``). The tensile jobs that share
  the device's scheduler plan jointly within its one budget, so they hold it once
  together (``pool``); every other job holds its own budget.
- The user's limit is the setting as DuckDB shows it while no job holds memory. A
  ``SET memory_limit`` while jobs hold memory is the user's new limit: dbml sees it at its
  next hold or release (the setting is then not the one dbml made), lowers it from then
  on, and leaves it once the last job lets go. Until then the value the user set is in
  force as set. (A SET of exactly the value dbml made cannot be told apart.)
- Once the last job lets go, the user's limit is restored exactly as DuckDB shows it:
  ``RESET`` where it was DuckDB's default (the same bytes), else the fewest bytes DuckDB
  shows as the same text (``current_setting`` rounds down to 0.1 of its unit, so the bytes
  behind it cannot be read; its own ``SET memory_limit = '18.8 GiB'`` would show 18.7).
- When DuckDB cannot give the memory back (``SET memory_limit`` below what its queries
  pin fails; below what they hold in evictable blocks it spills them and succeeds), the
  job waits, cancellable, until it can: the sum never passes the user's limit. While it
  waits it reads what the queries hold (``duckdb_memory()``) and asks again once that
  fell or its target changed, else once a second: each refused SET has DuckDB evict what
  it can first, and blocks a query has unpinned count the same until they are evicted.
  A job whose budget would leave DuckDB less than ``MIN_DUCKDB_BYTES`` is refused at once
  (the default budget leaves at least that: ``settings.default_budget``).
- A database whose configuration is locked (``SET lock_configuration = true``) keeps its
  limit: dbml changes no setting its owner locked, and its jobs run beside DuckDB's whole
  limit (their default budget is still the share of it).
- Only this database instance's limit is lowered: the one of the database whose
  ``train()`` started the job, which every connection and cursor to it shares (DuckDB's
  ``memory_limit`` is global to its instance). Another database open in the same process
  has a buffer pool and a limit of its own, as DuckDB has it, and keeps them.

On CUDA a job's budget is device memory, which is not DuckDB's: it holds nothing here.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable

import duckdb

from ..errors import InvalidArgument

# DuckDB keeps at least this much of its limit beside the jobs: the job's own data path
# (the scan of its scratch table, Arrow batches) runs in DuckDB while it trains, and an
# ORDER BY or hash join needs a few blocks per thread to spill at all. A choice, stated.
MIN_DUCKDB_BYTES = 128 * 2**20
RETRY_S = 0.05   # how often a waiting job reads what DuckDB's queries hold
REASK_S = 1.0    # and how often it asks again anyway (blocks a query unpinned stay counted until evicted)
UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB")   # DuckDB's BytesToHumanReadableString


@dataclass(frozen=True)
class Limit:
    """``memory_limit`` as DuckDB shows it, and the fewest bytes it shows so."""
    text: str
    bytes: int


def shown(text: str) -> Limit:
    """The fewest bytes DuckDB shows as ``text``: it prints the whole units, then one digit
    of the next unit down rounded down (``(rest * 10) // 1024``)."""
    m = re.fullmatch(r"(\d+)(?:\.(\d))? (bytes?|[KMGTP]iB)", text.strip())
    if m is None:
        raise ValueError(f"memory_limit {text!r} is not in DuckDB's form")
    unit = UNITS.index(m.group(3) if m.group(3) != "byte" else "bytes")
    whole, tenth = int(m.group(1)), int(m.group(2) or 0)
    rest = -(-tenth * 1024 // 10)   # the least remainder whose digit is ``tenth``
    return Limit(text, whole * 1024**unit + (rest * 1024**(unit - 1) if unit else 0))


class DatabaseMemory:
    """The memory jobs hold in one database instance, taken off DuckDB's ``memory_limit``
    (the module docstring has the rules). ``cursor()``: a new cursor to the database."""

    def __init__(self, cursor: Callable[[], duckdb.DuckDBPyConnection]):
        self._cursor = cursor
        self._cond = threading.Condition()
        self._holds: dict[str, tuple[str | None, int]] = {}   # job -> (pool, bytes)
        self._waiting: set[str] = set()
        self._user: Limit | None = None      # the user's limit, while jobs hold memory
        self._made: str | None = None        # the text of the limit dbml set last

    def user_limit(self) -> int:
        """The user's ``memory_limit`` in bytes: the setting, less nothing dbml took off."""
        with self._cond, self._cursor() as cur:
            return self._user_limit(cur).bytes

    def waiting(self, job: str) -> bool:
        with self._cond:
            return job in self._waiting

    def hold(self, job: str, budget: int, *, pool: str | None = None,
             cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Lower DuckDB's limit by ``budget`` for ``job`` (jobs of one ``pool`` hold its
        budget once); waits while DuckDB cannot give the memory back. True once held;
        False if ``cancelled()`` turned true while it waited. Raises InvalidArgument if the
        budget would leave DuckDB less than ``MIN_DUCKDB_BYTES`` even alone."""
        refused: tuple[int, int, float] | None = None   # (target, what queries held, when): DuckDB's last no
        with self._cond, self._cursor() as cur:
            if _locked(cur):
                return True
            try:
                while True:
                    user = self._user_limit(cur)
                    if budget > user.bytes - MIN_DUCKDB_BYTES:
                        raise InvalidArgument(_too_large(budget, user))
                    holds = {**self._holds, job: (pool, budget)}
                    target = user.bytes - _total(holds)
                    if refused is None or refused[0] != target or queries_hold(cur) < refused[1] \
                            or time.monotonic() - refused[2] > REASK_S:
                        if self._lower(cur, target):
                            self._holds = holds
                            return True
                        refused = (target, queries_hold(cur), time.monotonic())
                    if cancelled():
                        return False
                    self._waiting.add(job)
                    self._cond.wait(RETRY_S)
            finally:
                self._waiting.discard(job)

    def release(self, job: str) -> None:
        """``job`` holds nothing any more: DuckDB gets it back (the user's limit, exactly,
        once no job holds memory). Raising the limit never fails."""
        with self._cond:
            if job not in self._holds:
                return
            try:
                with self._cursor() as cur:
                    user = self._user_limit(cur)
                    del self._holds[job]
                    if _locked(cur):   # locked while the job ran: the limit stays as its owner locked it
                        pass
                    elif self._holds:
                        self._lower(cur, user.bytes - _total(self._holds))
                    else:
                        _restore(cur, user)
            except duckdb.ConnectionException:   # the database was closed: nobody to give it back to
                self._holds.pop(job, None)
            finally:
                if not self._holds:
                    self._user = self._made = None
                self._cond.notify_all()

    # -- internals (the caller holds _cond) ------------------------------------------------
    def _user_limit(self, cur) -> Limit:
        now = _setting(cur)
        if self._user is None or now != self._made:   # idle, or the user SET it meanwhile
            self._user = shown(now)
        return self._user

    def _lower(self, cur, limit: int) -> bool:
        """Set DuckDB's limit to ``limit`` bytes; False where DuckDB cannot free that much."""
        if limit < MIN_DUCKDB_BYTES:
            return False
        try:
            cur.execute("SET GLOBAL memory_limit = ?", [f"{limit}B"])
        except duckdb.OutOfMemoryException:
            return False
        self._made = _setting(cur)
        return True


def _total(holds: dict[str, tuple[str | None, int]]) -> int:
    """Jobs' own budgets, plus each pool's budget once."""
    own = sum(b for pool, b in holds.values() if pool is None)
    pools: dict[str, int] = {}
    for pool, b in holds.values():
        if pool is not None:
            pools[pool] = max(pools.get(pool, 0), b)
    return own + sum(pools.values())


def queries_hold(cur) -> int:
    """What DuckDB's queries and tables hold in its buffer pool now (``duckdb_memory()``)."""
    return int(cur.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchall()[0][0] or 0)


def _locked(cur) -> bool:
    return bool(cur.execute("SELECT current_setting('lock_configuration')").fetchall()[0][0])


def _setting(cur) -> str:
    return cur.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]


def _restore(cur, user: Limit) -> None:
    if user.text == default_limit():
        cur.execute("RESET GLOBAL memory_limit")
    else:
        cur.execute("SET GLOBAL memory_limit = ?", [f"{user.bytes}B"])


@functools.cache
def default_limit() -> str:
    """DuckDB's default ``memory_limit`` in this process, as it shows it (a share of the
    machine's memory): read from a database of its own, so that none is changed to learn it."""
    with duckdb.connect() as con:
        return _setting(con)


# what _too_large tells the user to change (names of settings only: nothing of the user's in it)
_TOO_LARGE_FIX = ("SET memory_limit higher, or pass a smaller memory_budget := (or SET VARIABLE "
                  "dbml_memory_budget)")


def _too_large(budget: int, user: Limit) -> str:
    return (f"train(): a memory budget of {budget / 1e6:.1f} MB would leave DuckDB's memory_limit "
            f"({user.text}) less than the {MIN_DUCKDB_BYTES // 2**20} MiB its queries need (the job's own "
            f"data among them); {_TOO_LARGE_FIX}")
