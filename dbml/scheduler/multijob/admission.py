"""Admission control (TENSILE III-D): :class:`AdmissionQueue` holds the jobs waiting for
room, in arrival order, and admits or rejects them when room may have appeared.

A job is admitted only if a joint plan of the running jobs and it exists within the
budget; so no job ever runs in an infeasible joint plan. A job that cannot fit even alone
is rejected at once with InfeasibleBudget (its ``min_budget`` is the budget it needs). A
job that fits alone but not beside the running ones waits; whenever room may have
appeared (a job left, a plan was updated, the budget grew), the waiting jobs are
re-checked in arrival order and each that fits is admitted (first fit; ``strict_fifo``
admits none past the first that does not fit, so a large job is never overtaken).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable

from ..plan.planner import InfeasibleBudget
from .solve import JobGraphs, Solution

__all__ = ["AdmissionQueue", "Waiter", "POLL_SECONDS"]

POLL_SECONDS = 0.05   # how often a waiting job looks at its ``cancelled`` callable


@dataclass
class Waiter:
    """A job in the queue. ``state`` moves once, from "waiting" to "admitted",
    "withdrawn" (timeout, cancellation, unregister) or "rejected" (with ``error``)."""
    job: JobGraphs
    state: str = "waiting"
    error: Exception | None = None
    alone_peak: int = 0                  # its planned peak alone at some budget >= this


class AdmissionQueue:
    """The waiting jobs, under the scheduler's condition ``cond`` (every method takes
    it; it is re-entrant), which is notified whenever a waiter's state changes.
    ``clock`` is what deadlines are measured on."""

    def __init__(self, cond: threading.Condition, clock: Callable[[], float], strict_fifo: bool = False):
        self._cond, self._clock, self.strict_fifo = cond, clock, strict_fifo
        self._waiting: deque[Waiter] = deque()

    def names(self) -> list[str]:
        with self._cond:
            return [w.job.name for w in self._waiting]

    def blocked(self) -> bool:
        """Whether a newcomer must queue behind the waiting jobs (strict FIFO only)."""
        with self._cond:
            return self.strict_fifo and bool(self._waiting)

    def enqueue(self, job: JobGraphs, alone_peak: int) -> Waiter:
        with self._cond:
            waiter = Waiter(job, alone_peak=alone_peak)
            self._waiting.append(waiter)
            return waiter

    def wait(self, waiter: Waiter, deadline: float | None, cancelled: Callable[[], bool] | None) -> bool:
        """Block until ``waiter`` is admitted (True) or withdrawn (False: ``deadline`` on
        the clock passed, ``cancelled()`` turned true, or the job was unregistered); raise
        its error if it was rejected."""
        with self._cond:
            while waiter.state == "waiting":
                left = None if deadline is None else deadline - self._clock()
                if (left is not None and left <= 0) or (cancelled is not None and cancelled()):
                    waiter.state = "withdrawn"
                    self._waiting.remove(waiter)
                    return False
                self._cond.wait(POLL_SECONDS if left is None else min(left, POLL_SECONDS))
            if waiter.state == "rejected":
                raise waiter.error
            return waiter.state == "admitted"   # not "withdrawn" by unregister(job)

    def withdraw(self, job: str) -> bool:
        """Take ``job`` out of the queue (its wait returns False); True if it was there."""
        with self._cond:
            for w in self._waiting:
                if w.job.name == job and w.state == "waiting":
                    self._finish(w, "withdrawn")
                    return True
            return False

    def recheck(self, *, fit: Callable[[JobGraphs], Solution], alone_peak: Callable[[JobGraphs], int],
                admit: Callable[[JobGraphs, Solution], None], budget_bytes: int) -> None:
        """Re-check the waiting jobs in arrival order, admitting each that fits.

        ``fit(job)``: the solution of the running jobs and ``job``, or InfeasibleBudget;
        ``alone_peak(job)``: its reservation alone, or InfeasibleBudget; ``admit(job,
        solution)``: publish it. The caller holds the scheduler's plan lock."""
        for w in self.snapshot():
            try:
                solution = fit(w.job)
            except InfeasibleBudget:
                if budget_bytes < w.alone_peak:   # the budget shrank: does it still fit alone?
                    try:
                        w.alone_peak = alone_peak(w.job)
                    except InfeasibleBudget as err:
                        self._finish(w, "rejected", err)
                        continue
                if self.strict_fifo:
                    return
                continue
            except Exception as err:   # the planner failed on its sequence: its own error
                self._finish(w, "rejected", err)
                continue
            with self._cond:
                if w.state != "waiting":   # withdrawn while we planned
                    continue
                admit(w.job, solution)
                self._finish(w, "admitted")

    def snapshot(self) -> list[Waiter]:
        with self._cond:
            return list(self._waiting)

    def _finish(self, w: Waiter, state: str, error: Exception | None = None) -> None:
        with self._cond:
            if w.state == "waiting":
                w.state, w.error = state, error
                self._waiting.remove(w)
                self._cond.notify_all()
