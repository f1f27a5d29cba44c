"""The DuckDB database instances dbml is installed in.

DuckDB registers a Python UDF in the whole database instance (every connection and
cursor to it sees the function) but ties its Python function to the connection that
registered it: once that connection closes, calling the UDF from another connection
runs a dangling function. So for a database file dbml registers its UDFs through a
connection of its own (the instance's *owner*), which lives as long as any connection
dbml was installed on; UDFs take their cursors from it. When the last of those
connections is closed (``dbml.Connection.close()``, or garbage-collected: DuckDB has no
close hook, so a raw connection closed directly is released when collected), its running jobs are cancelled
("the connection was closed") and waited for, then the owner unregisters the UDFs and
closes, so the file is released. For an in-memory database only the installing
connection and its cursors can reach it, so that connection is the owner. At exit,
running jobs are cancelled (one line each on stderr), their threads joined, and every
owner closed, before DuckDB's objects are torn down.
"""

from __future__ import annotations

import atexit
import sys
import threading
import uuid
import weakref
from typing import Callable

import duckdb

from .duckmem import DatabaseMemory
from .jobs import JobManager, interrupt_off_main_thread
from .runtime import runtime

# The open databases are the process's (dbml.core.runtime): ``instances`` (id -> Instance),
# ``closing`` (database file -> set once its last instance has closed), ``users`` (a user
# connection -> its release), all under ``lock``.


def _train(cur: duckdb.DuckDBPyConnection, spec, progress):
    """``training.train``, imported with torch when the first job runs, once its source and the
    columns it names are there (``source.job_source``): a misnamed label fails without torch."""
    from .source import job_source
    job_source(cur, spec)
    from .training import train
    return train(cur, spec, progress)


class Instance:
    def __init__(self, owner: duckdb.DuckDBPyConnection, owns: bool, path: str = ""):
        self.id = uuid.uuid4().hex
        self.owner = owner
        self.path = path
        self.functions: list[str] = []   # filled by dbml.udfs.register
        self.home = None                  # where its model catalog lives (dbml.core.home.settle)
        # its jobs' budgets are taken off this database's memory_limit, and given back
        self.memory = DatabaseMemory(self.cursor)
        self.jobs = JobManager(self.cursor, run=_train, memory=self.memory)
        self._owns = owns
        self._users = 0
        # dbml.connect(path, read_only=True): predict, predictions and evaluate work; whatever
        # writes the database (train, drop_model, calibrate) is refused by udfs.functions.
        self.read_only = is_read_only(owner)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        return self.owner.cursor()

    def _add_user(self, con: duckdb.DuckDBPyConnection) -> None:
        users = runtime().users
        if con in users:   # installed again: already counted
            return
        self._users += 1
        release = users[con] = weakref.finalize(con, self._release)
        release.atexit = False  # at exit, _close_all does it

    def _release(self) -> None:
        """One user connection less; after the last, cancel and wait for the jobs, then close.
        While it closes, a new ``attach`` to the same file waits (the runtime's ``closing``):
        its UDFs are the database instance's, and would be unregistered under the newcomer's feet."""
        rt = runtime()
        with rt.lock:
            self._users -= 1
            if self._users:
                return
            rt.instances.pop(self.id, None)
            closed = rt.closing.setdefault(self.path, threading.Event()) if self._owns else None
        try:
            self.jobs.shutdown("the connection was closed")
            if self._owns:
                self.close()
        finally:
            if closed is not None:
                with rt.lock:
                    if rt.closing.get(self.path) is closed:
                        del rt.closing[self.path]
                closed.set()

    def close(self, owner: bool = True) -> None:
        """Unregister the UDFs and close the owner connection (unless not ``owner``: the
        user's own, for an in-memory database)."""
        try:
            for name in self.functions:
                self.owner.remove_function(name)
            if owner:
                self.owner.close()
        except duckdb.Error:  # already closed
            pass


@atexit.register
def _close_all() -> None:
    """At exit: cancel running jobs (one line each on stderr) and join their threads, then
    close what dbml registered (DuckDB's bindings report UDFs left alive as leaks, and a
    job thread still inside DuckDB at teardown aborts the process)."""
    rt = runtime()
    with rt.lock:
        instances = list(rt.instances.values())
        rt.instances.clear()
    for instance in instances:
        for job in instance.jobs.shutdown("Python is exiting"):
            print(f"dbml: {job.error}", file=sys.stderr, flush=True)
    for instance in instances:
        instance.close()


def install_sigint_hook() -> None:
    """Chain a hook before Python's SIGINT handler (once, from the main thread): Ctrl-C also
    interrupts training statements whose UDF DuckDB runs on one of its worker threads,
    where no KeyboardInterrupt arrives (``jobs.interrupt_off_main_thread``). The chain is
    the runtime's (``Runtime.hook_sigint``), which puts the previous handler back at reset."""
    runtime().hook_sigint(interrupt_off_main_thread)


def release_user(con: duckdb.DuckDBPyConnection) -> None:
    """``con`` is being closed: if dbml is installed on it, release it now (the last
    connection of a database cancels its running jobs, waits for them and closes the
    owner, so the file is free once ``close()`` returns). ``dbml.Connection.close`` calls
    it; a raw DuckDB connection closed directly is released when it is collected."""
    release = runtime().users.pop(con, None)
    if release is not None:
        release()


def attach(con: duckdb.DuckDBPyConnection, register: Callable[[Instance], None]) -> tuple[Instance, bool]:
    """The Instance behind ``con`` (created if dbml is new there, its UDFs registered with
    ``register`` before any other connection can find it) and whether it is new. If the
    file's previous instance is still closing, waits for it first."""
    path = _path(con)
    rt = runtime()
    while True:
        with rt.lock:
            closing = rt.closing.get(path) if path else None
            if closing is None:
                try:
                    instance = rt.instances.get(con.execute("SELECT dbml_instance_id()").fetchall()[0][0])
                except duckdb.CatalogException:
                    instance = None
                new = instance is None
                if new:
                    instance = Instance(*_owner(con, path), path=path)
                    try:
                        register(instance)
                    except BaseException:   # the owner's connection would keep the file
                        instance.close(owner=instance._owns)
                        raise
                    rt.instances[instance.id] = instance
                instance._add_user(con)
                break
        closing.wait()
    install_sigint_hook()
    return instance, new


def _path(con: duckdb.DuckDBPyConnection) -> str:
    """The file of ``con``'s database ('' in memory)."""
    return con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
                       ).fetchall()[0][0] or ""


def _owner(con: duckdb.DuckDBPyConnection, path: str) -> tuple[duckdb.DuckDBPyConnection, bool]:
    if not path:
        return con, False
    return duckdb.connect(path, read_only=is_read_only(con)), True


def is_read_only(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``con``'s database was opened with ``read_only=True``."""
    return con.execute("SELECT current_setting('access_mode')").fetchall()[0][0] == "read_only"
