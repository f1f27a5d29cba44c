"""The DuckDB database instances dbml is installed in.

DuckDB registers a Python UDF in the whole database instance (every connection and
cursor to it sees the function) but ties it to the connection that registered it. So
dbml's UDFs never hold on to one connection: each instance has an :class:`Instance`
that knows every live connection dbml was installed on, and a UDF takes a fresh cursor
from whichever is still open. Closing the connection that installed dbml leaves the
others working.
"""

from __future__ import annotations

import threading
import uuid
import weakref

import duckdb

from .errors import DbmlError

_INSTANCES: dict[str, "Instance"] = {}
_LOCK = threading.Lock()


class Instance:
    def __init__(self):
        self.id = uuid.uuid4().hex
        self._connections: list[weakref.ref] = []
        self._lock = threading.Lock()

    def add(self, con: duckdb.DuckDBPyConnection) -> None:
        with self._lock:
            if not any(ref() is con for ref in self._connections):
                self._connections.append(weakref.ref(con))

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new cursor on any still-open connection to this instance."""
        with self._lock:
            for ref in list(self._connections):
                con = ref()
                try:
                    if con is not None:
                        return con.cursor()
                except duckdb.ConnectionException:
                    pass
                self._connections.remove(ref)
        raise DbmlError("dbml: every connection dbml was installed on is closed; call dbml.install(con) again")


def attach(con: duckdb.DuckDBPyConnection) -> tuple[Instance, bool]:
    """The Instance behind ``con`` (created if dbml is new there) and whether it is new."""
    with _LOCK:
        try:
            key = con.execute("SELECT dbml_instance_id()").fetchall()[0][0]
        except duckdb.CatalogException:
            key = None
        instance = _INSTANCES.get(key)
        new = instance is None
        if new:
            instance = Instance()
            _INSTANCES[instance.id] = instance
        instance.add(con)
        return instance, new
