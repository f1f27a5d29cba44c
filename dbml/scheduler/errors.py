"""The scheduler's exceptions, all in one tree.

``dbml.scheduler`` is a library for any PyTorch training step, so its errors do not know
about SQL; the dbml runtime maps them to user errors in one table
(``dbml.errors.scheduler_errors``).

Our exception hierarchy::

    SchedulerError
    ├── CaptureError       the training step could not be captured as a static graph
    ├── SequenceError      an access sequence breaks the contract in graph/sequence.py
    ├── InfeasibleBudget   no plan fits the budget; carries the smallest feasible budget
    ├── NotAdmitted        a job waiting for admission was cancelled or timed out
    ├── PlanningError      the planner broke one of its own invariants (a bug, with the job and pass)
    └── ExecutionError     the executor could not perform its plan (a bug, with the node)

Each keeps the builtin base it had before the tree existed (``RuntimeError`` or
``ValueError``), so code that catches those still does.
"""

from __future__ import annotations

__all__ = ["SchedulerError", "CaptureError", "SequenceError", "InfeasibleBudget", "NotAdmitted",
           "PlanningError", "ExecutionError", "BudgetExceeded"]


class SchedulerError(Exception):
    """The root of every error the scheduler raises on purpose."""


class CaptureError(SchedulerError, RuntimeError):
    """The training step could not be captured as a static graph."""


class SequenceError(SchedulerError, ValueError):
    """An access sequence that breaks the contract in graph/sequence.py."""


class InfeasibleBudget(SchedulerError, ValueError):
    """No plan fits the budget; ``min_budget`` is the smallest one the planner can meet."""

    def __init__(self, jobs: str, budget: int, min_budget: int):
        self.budget, self.min_budget = budget, min_budget
        super().__init__(f"jobs {jobs} cannot fit a budget of {budget} bytes "
                         f"({budget / 2**20:.1f} MB); the smallest feasible budget is "
                         f"{min_budget} bytes ({min_budget / 2**20:.1f} MB)")


class NotAdmitted(SchedulerError, RuntimeError):
    """A job waiting for admission was cancelled or timed out; it holds no memory."""


class PlanningError(SchedulerError, RuntimeError):
    """The planner broke one of its own invariants (a bug); the message names the job and pass."""


class ExecutionError(SchedulerError, RuntimeError):
    """The executor could not perform its plan (a bug in a plan or in the executor)."""


class BudgetExceeded(SchedulerError, RuntimeError):
    """An iteration held more device memory than its limit (the plan's peak, within the
    budget): the run stops rather than finish above the budget it promised to keep."""

    def __init__(self, job: str, held: int, limit: int, budget: int | None):
        self.held, self.limit, self.budget = held, limit, budget
        super().__init__(f"job {job!r} held {held} bytes in an iteration, over its limit of {limit} bytes "
                         f"(budget {budget} bytes)")
