"""A job's rows, from the driver's DuckDB to its workers on a Ray cluster.

DuckDB stays the source of truth: the driver encodes the job's source once into its
scratch table (``training._materialise``: features, label, validation flag, in the
job's one random order), and every worker of the job gets a copy of that table in an
in-memory DuckDB of its own, in the same order, so ``training._fit_model`` runs there
unchanged (the same epochs, the same shuffle, the same validation rows as a local job).

Two ways, by size:

- **Through Ray's object store** (the default): the table is read as Arrow record
  batches of about ``CHUNK_BYTES``, each put in the object store and its ref handed to
  the workers through the hub (``dbml.cluster.hub``); each worker takes them in order and appends
  them to its table. The driver keeps at most ``WINDOW`` chunks that not every worker
  has taken, so a job holds at most ``WINDOW * CHUNK_BYTES`` of the object store
  whatever its size: never one giant table. Several workers on one node read one copy.
- **As Parquet files** in ``cluster_storage`` (a directory every node mounts), when
  the rows are larger than ``cluster_parquet_bytes``: DuckDB writes them (zstd, in
  order) and each worker's DuckDB reads them. Why past a size: the object store path
  costs a few ms per chunk and streams at memory speed on one node, but across nodes
  every worker of a large job pulls every byte uncompressed from the driver's node;
  written once to shared storage, compressed, the rows cost the driver one write and
  no object store space, and a retried worker reads them again without the driver.
  Below about a gigabyte the write is the larger cost (see docs/architecture.md).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from ..errors import JobCancelled
from .hub import END

CHUNK_BYTES = 8 * 2**20   # an object per chunk: large against Ray's per-object cost (~1 ms), small against memory
WINDOW = 8                # chunks a job may have in the object store that not every worker has taken
SAMPLE_ROWS = 256         # rows read to estimate a row's bytes
COLUMNS = ("x", "y", "is_val")   # the scratch table's columns a worker trains on


@dataclass
class Shipment:
    """What a sender shipped: rows, bytes, chunks, how, and how long it took."""
    rows: int = 0
    bytes: int = 0
    chunks: int = 0
    how: str = "object store"
    seconds: float = 0.0
    most_in_flight: int = 0    # the most chunks in the object store that not every worker had taken


class Sender:
    """Ships the scratch ``table`` (read on a cursor of ``cur``'s database) to ``consumers``
    workers of job ``key``, on a thread of its own; ``error`` holds what stopped it."""

    def __init__(self, ray, cur, table: str, hub, key: str, consumers: int, *, parquet_dir: str | None = None,
                 parquet_bytes: int | None = None):
        self.ray, self.cur, self.table, self.hub, self.key = ray, cur, table, hub, key
        self.consumers, self.parquet_dir, self.parquet_bytes = consumers, parquet_dir, parquet_bytes
        self.shipment = Shipment()
        self.error: BaseException | None = None
        self.files: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Sender":
        self.ray.get(self.hub.expect.remote(self.key, self.consumers))
        self._thread = threading.Thread(target=self._run, name=f"dbml-ship-{self.key}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for path in self.files:
            try:
                os.remove(path)
            except OSError:
                pass

    def _run(self) -> None:
        started = time.perf_counter()
        cur = self.cur.cursor()
        try:
            rows, row_bytes = self._size(cur)
            if self.parquet_dir and self.parquet_bytes is not None and rows * row_bytes > self.parquet_bytes:
                self._parquet(cur, rows, row_bytes)
            else:
                self._stream(cur, row_bytes)
        except BaseException as e:   # the job's follow loop raises it
            self.error = e
        finally:
            self.shipment.seconds = time.perf_counter() - started
            cur.close()

    def _rows(self, cur):
        """The scratch table's rows, in its order, as a relation."""
        return cur.table(self.table).select(*COLUMNS)

    def _size(self, cur) -> tuple[int, int]:
        rows = _count(cur, self.table)
        sample = self._rows(cur).limit(SAMPLE_ROWS).to_arrow_table()
        return rows, max(1, sample.nbytes // max(1, sample.num_rows))

    def _stream(self, cur, row_bytes: int) -> None:
        reader = self._rows(cur).to_arrow_reader(max(1, CHUNK_BYTES // row_bytes))
        index = 0
        for batch in reader:
            while (in_flight := index - 1 - self.ray.get(self.hub.taken.remote(self.key))) >= WINDOW:
                if self._stop.wait(0.01):
                    return
            if self._stop.is_set():
                return
            self.shipment.most_in_flight = max(self.shipment.most_in_flight, in_flight + 1)
            ref = self.ray.put(pa.Table.from_batches([batch]))
            self.ray.get(self.hub.feed.remote(self.key, index, [ref]))
            self.shipment.rows += batch.num_rows
            self.shipment.bytes += batch.nbytes
            index += 1
        self.shipment.chunks = index
        self.ray.get(self.hub.feed.remote(self.key, index, END))

    def _parquet(self, cur, rows: int, row_bytes: int) -> None:
        path = os.path.join(self.parquet_dir, f"dbml-{self.key.replace(':', '-')}-{uuid.uuid4().hex[:8]}.parquet")
        self.files.append(path)
        rows_relation = self._rows(cur)
        rows_relation.write_parquet(path, compression="zstd")
        self.shipment = Shipment(rows=rows, bytes=os.path.getsize(path), chunks=1, how="parquet")
        # Parquet has no fixed-size list: FLOAT[n] comes back as FLOAT[], so the types go along
        types = {name: str(t) for name, t in zip(rows_relation.columns, rows_relation.types)}
        self.ray.get(self.hub.feed.remote(self.key, 0, {"parquet": path, "types": types}))
        self.ray.get(self.hub.feed.remote(self.key, 1, END))


@dataclass
class Received:
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0
    how: str = "object store"

    @property
    def rows_per_s(self) -> float:
        return self.rows / max(self.seconds, 1e-9)


def receive(ray, hub, key: str, rank: int, cur, table: str, progress) -> Received:
    """Worker ``rank``'s side: the job's rows, in order, into ``table`` of ``cur``'s database.
    ``progress.cancelled()`` stops it (JobCancelled)."""
    got, started, index = Received(), time.perf_counter(), 0
    while True:
        chunk = ray.get(hub.chunk.remote(key, index))
        if progress.cancelled():
            raise JobCancelled(f"job {progress.id} was cancelled while its rows were shipped; nothing was stored")
        if chunk is None:
            continue
        if chunk == END:
            break
        if isinstance(chunk, dict):
            path = chunk["parquet"]
            cur.read_parquet(path).select(*_typed(chunk["types"])).create(table)
            got.how, got.bytes = "parquet", os.path.getsize(path)
            got.rows = _count(cur, table)
        else:
            data = ray.get(chunk[0])
            _append(cur, table, data, first=index == 0)
            got.rows, got.bytes = got.rows + data.num_rows, got.bytes + data.nbytes
        hub.ack.remote(key, rank, index)
        index += 1
    got.seconds = time.perf_counter() - started
    return got


def _count(cur, table: str) -> int:
    return cur.table(table).count("*").fetchall()[0][0]


def _typed(types: dict[str, str]) -> list:
    """The select list that gives the columns read from Parquet the scratch table's types."""
    return [duckdb.ColumnExpression(name).cast(duckdb.sqltype(sql_type)).alias(name)
            for name, sql_type in types.items()]


def _append(cur, table: str, data: pa.Table, *, first: bool) -> None:
    chunk = cur.from_arrow(data)
    if first:
        chunk.create(table)
    else:
        chunk.insert_into(table)
