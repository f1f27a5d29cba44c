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
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Runtime", "runtime", "reset"]


CTRL_C_GRACE_S = 0.5   # how long the wake-up fd's thread leaves a Ctrl-C to Python's own handler


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
        # statements waiting on jobs off the main thread that a Ctrl-C interrupts (dbml.jobs),
        # and when the last Ctrl-C came (time.perf_counter(); a statement that began before it
        # and waits only after it is interrupted when its wait begins)
        self.sigint_previous = None
        self.off_main: set = set()
        self.sigint_at = float("-inf")
        self.interrupting_statements: set = set()   # DuckDB connections whose statement a Ctrl-C stops (:meth:`interrupting`)
        self._fork_hooked = False   # os.register_at_fork(self._forked) done (it cannot be undone)
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
        """Chain ``interrupt`` before Python's SIGINT handler (once, from the main thread).

        Python runs a signal's handler only when the main thread runs Python code; while it
        waits inside DuckDB on a statement whose UDF DuckDB runs on one of its own threads
        (the shell's statements, relation results), the handler would run only once the
        statement ended, that is, once the job trained to its end. So the hook also reads
        the process's signal wake-up fd (``signal.set_wakeup_fd``: Python's C-level handler
        writes each signal's number there at once) on a thread of its own, which interrupts
        at the moment of the Ctrl-C; a wake-up fd set before is chained (each byte passed on)."""
        if self.sigint_previous is not None or threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGINT)
        if not callable(previous):   # SIG_IGN / SIG_DFL: Ctrl-C is not Python's to handle
            return

        def ctrl_c() -> None:
            self.sigint_at = time.perf_counter()
            for con in list(self.interrupting_statements):
                con.interrupt()
            interrupt()

        reader, writer = socket.socketpair()

        # Ctrl-Cs that Python's handler (hook) has run for, and that the wake-up fd brought:
        # one byte each (Python's handler can run once for several), [hook's, watcher's]
        counts = [0, 0]
        ran = threading.Condition()

        def seen(signum, frame) -> None:
            """Python's handler ran for a Ctrl-C: in the shell's statement, all it does."""
            with ran:
                counts[0] += 1
                ran.notify_all()

        def hook(signum, frame):
            seen(signum, frame)
            ctrl_c()
            return previous(signum, frame)

        signal.signal(signal.SIGINT, hook)
        writer.setblocking(False)
        try:
            chained = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except ValueError:          # not the main interpreter: the Python-level hook only
            reader.close()
            writer.close()
            self.sigint_previous = (previous, hook, None, None)
            return

        def watch() -> None:
            with reader:
                while True:
                    try:
                        data = reader.recv(256)
                    except OSError:
                        return
                    if not data:    # unhooked: the writer was closed
                        return
                    if chained != -1:
                        try:
                            os.write(chained, data)
                        except OSError:
                            pass
                    if signal.SIGINT not in data:
                        continue
                    counts[1] += data.count(signal.SIGINT)
                    # the shell's statement (Python's handler a no-op meanwhile): at once; else
                    # only where Python's handler has not run within the grace (the main
                    # thread inside DuckDB): where it runs, it interrupts, and its
                    # KeyboardInterrupt comes with the statement's own error, not after it
                    with ran:
                        late = not self.interrupting_statements and \
                            not ran.wait_for(lambda: counts[0] >= counts[1], CTRL_C_GRACE_S)
                    if late or self.interrupting_statements:
                        ctrl_c()

        threading.Thread(target=watch, name="dbml-ctrl-c", daemon=True).start()
        self.sigint_previous = (previous, hook, (reader, writer, chained), seen)
        if not self._fork_hooked:   # a forked child has no watching thread: its signals stay its own
            os.register_at_fork(after_in_child=self._forked)
            self._fork_hooked = True

    def _forked(self) -> None:
        """In a child forked from this process (os.fork, multiprocessing's 'fork'): the wake-up
        fd is the parent's socket and no thread reads it here; put back the one chained
        before, and let the Python-level hook alone handle the child's Ctrl-C."""
        hooked = self.sigint_previous
        if hooked is None or hooked[2] is None:
            return
        previous, hook, (reader, writer, chained), _ = hooked
        try:
            signal.set_wakeup_fd(chained)
        except ValueError:
            pass
        self.sigint_previous = (previous, hook, None, None)

    def ctrl_c_since(self, t: float) -> bool:
        """Whether a Ctrl-C came at or after ``t`` (``time.perf_counter()``): a statement that
        began then was interrupted, though its Ctrl-C may have reached nothing of it yet."""
        return self.sigint_at >= t

    @contextmanager
    def interrupting(self, con) -> Iterator[None]:
        """While the body runs a statement on DuckDB connection ``con`` from the main thread
        (the shell's): a Ctrl-C interrupts it at once, as DuckDB's CLI does, through the
        wake-up fd's thread (``con.interrupt()``, and the dbml statements waiting off the main
        thread), and raises no KeyboardInterrupt afterwards: the statement's own error says
        it was interrupted, and ``sigint_at`` that a Ctrl-C came. Without the wake-up fd
        (not dbml's to set) Python's handler stays, late as it may run."""
        hooked = self.sigint_previous
        if hooked is None or hooked[2] is None or threading.current_thread() is not threading.main_thread():
            yield
            return
        handler = signal.getsignal(signal.SIGINT)
        self.interrupting_statements.add(con)
        signal.signal(signal.SIGINT, hooked[3])   # counts the Ctrl-C; the wake-up fd's thread acts on it
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, handler)
            self.interrupting_statements.discard(con)

    def unhook_sigint(self) -> None:
        """Put back the handler (and wake-up fd) chained before, if dbml's are still the ones installed."""
        if self.sigint_previous is None or threading.current_thread() is not threading.main_thread():
            return
        previous, hook, wakeup, _ = self.sigint_previous
        if signal.getsignal(signal.SIGINT) is hook:
            signal.signal(signal.SIGINT, previous)
        if wakeup is not None:
            reader, writer, chained = wakeup
            current = signal.set_wakeup_fd(chained, warn_on_full_buffer=False)
            if current != writer.fileno():   # someone else's since: theirs stays
                signal.set_wakeup_fd(current)
            writer.close()          # the watching thread reads the end, closes its side and stops
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
        self.sigint_at = float("-inf")
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
