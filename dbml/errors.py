"""The exceptions dbml raises, and the one table that turns scheduler errors into them.

    DbmlError                  every error dbml raises on purpose
    ├── InvalidArgument        a SQL or Python argument is wrong; the message names it and the fix
    │   ├── SourceError        the source is not one SELECT / a table, or it is empty
    │   ├── ModelNotFound      no model of that name in the catalog
    │   └── BudgetTooSmall     no plan fits the memory budget (``min_budget``: the smallest that does)
    ├── TrainingError          training failed (e.g. the loss became NaN); nothing was stored
    ├── JobCancelled           the job was cancelled (cancel_job, or while it waited for memory);
    │                          nothing was stored
    ├── Interrupted            the statement was interrupted (Ctrl-C, Connection.interrupt());
    │                          its jobs were cancelled, nothing of them stored
    └── CatalogError           the catalog tables are not what this dbml expects

    RowSkipped (a UserWarning) a row predictions() or evaluate() left out under
                               on_error := 'skip' (an unreadable image, an empty text); the
                               message names the row (its file) and why

Inside DuckDB every one of them surfaces as the UDF's error, its message unchanged, so
callers can match on the text whether they call Python or SQL.

The memory scheduler (``dbml.scheduler``) has a tree of its own, rooted at
``SchedulerError``; :func:`scheduler_errors` maps it onto this one.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterator


class DbmlError(Exception):
    """Base of every error dbml raises on purpose."""


class InvalidArgument(DbmlError, ValueError):
    """An argument is wrong: the message names the argument and the fix."""


class SourceError(InvalidArgument):
    """The training / evaluation source is not a single SELECT or table, or it yields no rows."""


class ModelNotFound(InvalidArgument, LookupError):
    """No model of that name in the catalog."""


class BudgetTooSmall(InvalidArgument):
    """The job's model and batch fit no plan within its memory budget; ``min_budget`` (bytes)
    is the smallest budget that does (a tune() trial that raises it is 'infeasible')."""

    def __init__(self, message: str, min_budget: int):
        super().__init__(message)
        self.min_budget = min_budget


class TrainingError(DbmlError, RuntimeError):
    """Training failed; nothing was written to the catalog."""


class JobCancelled(DbmlError):
    """The job was cancelled; nothing was stored."""


class Interrupted(DbmlError):
    """The statement was interrupted; its training jobs were cancelled and nothing of them stored."""


class CatalogError(DbmlError):
    """The catalog tables exist but are not what this version of dbml expects."""


class RowSkipped(UserWarning):
    """A source row that predictions() or evaluate() skipped under ``on_error := 'skip'``."""


class VersionStored(UserWarning):
    """tune() stored its best trial as the model's next version: which, and what the model's name serves now."""


@contextmanager
def scheduler_errors(model: str, *, job_id: int, memory_budget: int | None,
                     shared_budget: Callable[[], int]) -> Iterator[None]:
    """Map the scheduler's errors raised inside the block to user errors (httpx's
    ``map_exceptions``), in one table:

    ===================================  =========================================================
    ``NotAdmitted``                      ``JobCancelled``: cancelled while it waited for memory
    ``InfeasibleBudget``                 ``BudgetTooSmall``: the budget, the smallest that fits,
                                         and the setting or argument that raises it
    ``BudgetExceeded``                   ``TrainingError``: what the job held against the budget
                                         it ran under (never finishes above it)
    ``SpillError`` (``SpillFull``)        ``TrainingError``: swapped tensors found no room in the
                                         temp directory; the settings that give them room
    ``CaptureError``, ``SequenceError``,  unchanged: a bug in the capture, a plan or the executor;
    ``ExecutionError``, ``PlanningError``, its message names the job and the node or pass, and
    any other ``SchedulerError``          its traceback is kept (``dbml_jobs.error`` shows it
                                         after its type name)
    ===================================  =========================================================

    ``model`` is the job's model, ``memory_budget`` its own budget (None: it has none);
    ``shared_budget()`` the budget shared by the device's jobs (the setting, or the device's
    default), named when the job has no ``memory_budget``; it is asked for only then (on CUDA
    the default is the free memory at that moment).
    """
    # Imported here, not at the top: every dbml module imports this one, the predict path
    # (dbml.core.inference) included, and that path must not load the scheduler (make_fx, fx).
    from .scheduler.errors import BudgetExceeded, InfeasibleBudget, NotAdmitted
    from .scheduler.execute.spill import SpillError, SpillFull

    try:
        yield
    except SpillError as e:
        own = memory_budget is not None
        budget = "pass a larger memory_budget :=" if own else "SET VARIABLE dbml_memory_budget to more"
        why = ("more room than DuckDB's max_temp_directory_size leaves there" if isinstance(e, SpillFull)
               else f"a file there, and writing it failed ({e.strerror})")
        fix = "SET max_temp_directory_size to more" if isinstance(e, SpillFull) else \
            "SET temp_directory to a folder with room"
        raise TrainingError(f"train(): the tensors the memory scheduler swaps out go to DuckDB's temp_directory "
                            f"({e.directory}) and need {why}; nothing was stored; {fix}, or {budget}") from None
    except BudgetExceeded as e:
        own = memory_budget is not None
        fix = "pass a larger memory_budget :=" if own else "SET VARIABLE dbml_memory_budget to more"
        raise TrainingError(f"train(): the job held {_size(e.held)} in an iteration, over the {_size(e.limit)} its "
                            f"plan promised within memory_budget {_size(e.budget or e.limit)}; nothing was "
                            f"stored; {fix}, or a smaller batch_size") from None
    except NotAdmitted:
        raise JobCancelled(f"job {job_id} ({model!r}) was cancelled while it waited for memory; "
                           f"nothing was stored") from None
    except InfeasibleBudget as e:
        raise _budget_too_small(memory_budget, shared_budget, e.min_budget) from None
    # Every other SchedulerError passes as it is (see the table): wrapping it would change
    # the text a user sees (DuckDB puts the exception's type name before a UDF's message).


# The smallest budget is what this run's plan reached, planned with the latencies measured
# in this process: another run's can need more (one model's was 1.8 MB on one call and 2.1 MB
# on the next), so the budget a message suggests has this headroom, and passing it works.
SUGGESTED_HEADROOM = 1.2


def _budget_too_small(memory_budget: int | None, shared_budget: Callable[[], int], min_budget: int) -> BudgetTooSmall:
    own = memory_budget is not None
    budget = memory_budget if own else shared_budget()
    fix = budget_fix(int(min_budget * SUGGESTED_HEADROOM), own)
    return BudgetTooSmall(
        f"train(): memory_budget {_size(budget)} is below the smallest budget this model and batch "
        f"can be trained in, {_size(min_budget)}; {fix} or more, or a smaller batch_size", min_budget)


def budget_fix(nbytes: int, own: bool) -> str:
    """What a message tells the user to run for a budget of at least ``nbytes``: the job's
    own argument (``own``: ``pass memory_budget := '140KB'``) or the shared setting
    (``SET VARIABLE dbml_memory_budget = '140KB'``), built as trees."""
    from sqlglot import exp
    size = exp.Literal.string(_round_up(nbytes))
    if own:
        return "pass " + exp.PropertyEQ(this=exp.to_identifier("memory_budget"), expression=size).sql("duckdb")
    item = exp.SetItem(this=exp.EQ(this=exp.column("dbml_memory_budget"), expression=size), kind="VARIABLE")
    return exp.Set(expressions=[item]).sql("duckdb")


def _round_up(n: int) -> str:
    """A size at least ``n`` bytes, in KB or MB with two significant digits: 109404 -> '110KB'."""
    unit, scale = ("MB", 1e6) if n >= 1e6 else ("KB", 1e3)
    value = n / scale
    step = 10 ** (math.floor(math.log10(value)) - 1)
    return f"{math.ceil(value / step) * step:g}{unit}"


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB ({n} bytes)"
