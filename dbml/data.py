"""Streaming data out of DuckDB into torch.

DuckDB assembles each row's features as one ``FLOAT[n]`` column; a cursor streams the
query as Arrow record batches (``to_arrow_reader``), and each batch becomes torch tensors
without a copy: the fixed-size list's float buffer is viewed as an (rows, n) array.
A background thread runs ahead of training by a few batches, so the training loop only
waits on data when DuckDB cannot keep up; that wait is measured.
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Iterator

import duckdb
import numpy as np
import pyarrow as pa
import torch

# Arrow buffers are immutable, so their numpy views are read-only; torch warns once that
# it cannot protect them. Training only reads batches, so the zero-copy view is safe.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

_DONE = object()


def column_to_numpy(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow column as numpy, zero-copy where Arrow allows: ``FLOAT[n]`` -> (rows, n)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_fixed_size_list(col.type):
        flat = col.flatten().to_numpy(zero_copy_only=col.null_count == 0)
        return flat.reshape(len(col), col.type.list_size)
    return col.to_numpy(zero_copy_only=col.null_count == 0)


def batch_to_tensors(batch: pa.RecordBatch) -> tuple[torch.Tensor, ...]:
    """Every column of a record batch as a CPU tensor sharing Arrow's memory."""
    return tuple(torch.from_numpy(column_to_numpy(c)) for c in batch.columns)


@dataclass
class StreamStats:
    rows: int = 0
    batches: int = 0
    wait_seconds: float = 0.0        # time the consumer spent waiting for a batch
    fetch_seconds: float = 0.0       # time the producer spent in DuckDB and conversion

    def add(self, other: "StreamStats") -> None:
        self.rows += other.rows
        self.batches += other.batches
        self.wait_seconds += other.wait_seconds
        self.fetch_seconds += other.fetch_seconds


@dataclass
class BatchStream:
    """Iterate a query's rows as tensors, ``batch_rows`` at a time, fetched ahead on a thread.

    ``con`` is used by the fetching thread alone while the iteration lasts: pass a cursor
    that nothing else uses meanwhile (temporary tables of that cursor are visible).
    """

    con: duckdb.DuckDBPyConnection
    sql: str
    batch_rows: int
    prefetch: int = 4
    stats: StreamStats = field(default_factory=StreamStats)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        q: queue.Queue = queue.Queue(maxsize=max(1, self.prefetch))
        stop = threading.Event()
        producer = threading.Thread(target=self._produce, args=(q, stop), daemon=True,
                                    name="dbml-batch-stream")
        producer.start()
        try:
            while True:
                t0 = time.perf_counter()
                item = q.get()
                self.stats.wait_seconds += time.perf_counter() - t0
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                self.stats.rows += len(item[0])
                self.stats.batches += 1
                yield item
        finally:
            stop.set()
            _drain(q)
            producer.join()

    def _produce(self, q: queue.Queue, stop: threading.Event) -> None:
        reader = None
        try:
            t0 = time.perf_counter()
            reader = self.con.sql(self.sql).to_arrow_reader(self.batch_rows)
            for batch in reader:
                tensors = batch_to_tensors(batch)
                self.stats.fetch_seconds += time.perf_counter() - t0
                if not _put(q, tensors, stop):
                    return
                t0 = time.perf_counter()
            _put(q, _DONE, stop)
        except BaseException as e:  # handed to the consumer, raised there
            _put(q, e, stop)
        finally:
            if reader is not None:
                reader.close()


def _put(q: queue.Queue, item, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def _drain(q: queue.Queue) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return
