"""The process's one runtime: the mutable state that is per process by nature, in one
object with one lifetime.

What a database owns lives on its :class:`~dbml.instance.Instance` (its jobs, its memory,
its functions). What the whole process shares lives here: the open databases (so a second
connection to a file finds the first one's Instance), the SIGINT chain and the statements
it interrupts, the Ray cluster connection, the models a statement is tuning, the BigQuery
surface's registered result views, the decode thread pool, the environment variables dbml
sets for a library that reads only its environment, and (by reference: the scheduler
imports nothing of dbml) the scheduler's device schedulers and ledgers.

Module-level state elsewhere is only registries of built-ins and caches of pure facts
(``tests/test_state.py`` holds the list, each with its reason).

``runtime()`` is the object; ``reset()`` returns it to a fresh process's state where no
database is open, and is what the test fixtures call between tests.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import weakref

__all__ = ["Runtime", "runtime", "reset"]


class Runtime:
    """Per-process state; one instance, ``runtime()``."""

    def __init__(self):
        # the open databases (dbml.instance): id -> Instance; a file whose last Instance is
        # closing -> set once it has closed; a user connection -> its release
        self.lock = threading.Lock()
        self.instances: dict[str, object] = {}
        self.closing: dict[str, threading.Event] = {}
        self.users: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # the SIGINT chain: the handler dbml chained before (None: not hooked), and the
        # statements waiting on jobs off the main thread that a Ctrl-C interrupts (dbml.jobs)
        self.sigint_previous = None
        self.off_main: set = set()
        # the Ray cluster this process is connected to (dbml.cluster), one per process
        self.cluster_lock = threading.Lock()
        self.cluster = None
        # models a statement of this process is tuning (dbml.search)
        self.tuning_lock = threading.Lock()
        self.tuning: set[str] = set()
        # the BigQuery surface's result views, per connection (oldest first), and their names
        self.views: dict[int, list[str]] = {}
        self.view_names = itertools.count(1)   # never reset: a name is unique for the process
        # image decoding's thread pool (dbml.inputs), started at the first use
        self.decode_pool = None
        # variables dbml set in os.environ for a library that reads only its environment
        self.environment: dict[str, str] = {}
        # the interactive shell's import of torch and the scheduler while it waits (dbml.core.preload)
        self.preload = None
        self.jobs_warmed = threading.Lock()   # held for good once a job's one-off set-up ran (preload.ready)
        # the estimate's learned fixed costs (dbml.core.estimate: read once from the cache
        # directory), and whether this process's first job has been estimated (training.first_job)
        self.overheads_lock = threading.Lock()
        self.overheads: dict = {}
        self.first_job_taken = threading.Lock()   # held for good by the process's first job

    # --- the signal chain -----------------------------------------------------------------

    def hook_sigint(self, interrupt) -> None:
        """Chain ``interrupt`` before Python's SIGINT handler (once, from the main thread)."""
        if self.sigint_previous is not None or threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGINT)
        if not callable(previous):   # SIG_IGN / SIG_DFL: Ctrl-C is not Python's to handle
            return

        def hook(signum, frame):
            interrupt()
            return previous(signum, frame)

        signal.signal(signal.SIGINT, hook)
        self.sigint_previous = (previous, hook)

    def unhook_sigint(self) -> None:
        """Put back the handler chained before, if dbml's hook is still the one installed."""
        if self.sigint_previous is None or threading.current_thread() is not threading.main_thread():
            return
        previous, hook = self.sigint_previous
        if signal.getsignal(signal.SIGINT) is hook:
            signal.signal(signal.SIGINT, previous)
        self.sigint_previous = None

    # --- the environment ------------------------------------------------------------------

    def environ_default(self, name: str, value: str) -> None:
        """``os.environ.setdefault(name, value)``, for a library that reads a setting only
        from its environment; the one place dbml writes the environment."""
        if name not in os.environ:
            os.environ[name] = self.environment[name] = value

    # --- lifetime -------------------------------------------------------------------------

    def idle(self) -> bool:
        """No database open and no statement tuning or waiting: nothing uses the state."""
        with self.lock:
            if self.instances or self.closing:
                return False
        with self.tuning_lock:
            return not self.tuning and not self.off_main

    def reset(self) -> bool:
        """A fresh process's state, where it is safe: when :meth:`idle` (else nothing is
        touched and False is returned). The cluster connection stays (a Ray cluster is
        started once per process), as does the scheduler's device registry of any job
        still running; the view names keep counting."""
        if not self.idle():
            return False
        from ..scheduler.multijob import registry
        self.unhook_sigint()
        self.views.clear()
        pool, self.decode_pool = self.decode_pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        registry.reset()
        return True


_RUNTIME = Runtime()


def runtime() -> Runtime:
    """The process's runtime."""
    return _RUNTIME


def reset() -> bool:
    """``runtime().reset()``: the test fixtures call it after each test."""
    return _RUNTIME.reset()
