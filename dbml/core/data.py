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
from dataclasses import dataclass, field
from typing import Callable, Iterator

import duckdb
import numpy as np
import pyarrow as pa
import torch
from sqlglot import exp

_DONE = object()
READ_ROWS = 65536   # rows per Arrow record batch fetched from DuckDB
# A column converted later (dbml.core.inputs: images, texts, sequences) can hold large rows: fetch
# and shuffle fewer of them at a time, so memory stays bounded by this many rows' raw values.
CONVERTED_ROWS = 2048


def column_to_numpy(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow column as numpy, zero-copy where Arrow allows: ``FLOAT[n]`` -> (rows, n)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_fixed_size_list(col.type):
        flat = col.flatten().to_numpy(zero_copy_only=col.null_count == 0)
        return flat.reshape(len(col), col.type.list_size)
    return col.to_numpy(zero_copy_only=col.null_count == 0)


def shared_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor over ``array``'s memory, also where it is a read-only view of Arrow's
    buffers: dbml only reads the tensors it makes of them (a batch is copied before anything
    changes it). ``torch.from_numpy`` warns that such an array is not writable (a user's
    warnings-as-errors then fails the statement); DLPack hands over the same memory without
    a writable flag to warn about."""
    return torch.from_dlpack(array)


def batch_to_tensors(batch: pa.RecordBatch) -> tuple[torch.Tensor, ...]:
    """Every column of a record batch as a CPU tensor sharing Arrow's memory."""
    return tuple(shared_tensor(column_to_numpy(c)) for c in batch.columns)


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


def scratch_rows(table: str, condition: exp.Expression | str) -> exp.Select:
    """``x, y`` of a job's scratch table ``table`` where ``condition`` holds."""
    return exp.select("x", "y").from_(exp.to_table(table, dialect="duckdb")).where(condition, dialect="duckdb")


def drop_scratch(table: str) -> exp.Drop:
    """``DROP TABLE IF EXISTS`` of a job's scratch table ``table``."""
    return exp.Drop(tables=[exp.to_table(table, dialect="duckdb")], kind="TABLE", exists=True)


@dataclass
class BatchStream:
    """Iterate the rows of one or more queries as tensors, ``batch_rows`` at a time,
    fetched ahead on a thread.

    The queries run one after another on a cursor of their own (so they see ``con``'s
    database but not its temporary tables). ``start()`` begins fetching before iteration
    does. With a ``shuffle`` seed, rows are shuffled within windows of ``window_rows``
    (see :func:`shuffle_windows`); without one, each batch is a zero-copy view of Arrow's
    buffers.
    """

    con: duckdb.DuckDBPyConnection
    sql: exp.Query | str | list[exp.Query | str]     # trees rendered here, where they run
    batch_rows: int
    prefetch: int = 4
    shuffle: int | None = None
    window_rows: int = 65536
    convert: Callable[[pa.Array], torch.Tensor] | None = None   # the first column -> tensor (dbml.core.inputs)
    stats: StreamStats = field(default_factory=StreamStats)

    def __post_init__(self):
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, self.prefetch))
        self._stop = threading.Event()
        self._producer: threading.Thread | None = None

    def start(self) -> "BatchStream":
        if self._producer is None:
            self._producer = threading.Thread(target=self._produce, args=(self._queue, self._stop),
                                              daemon=True, name="dbml-batch-stream")
            self._producer.start()
        return self

    def close(self) -> None:
        """Stop fetching (also when iteration ended early) and release the cursor."""
        self._stop.set()
        _drain(self._queue)
        if self._producer is not None:
            self._producer.join()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        q = self.start()._queue
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
            self.close()

    def _produce(self, q: queue.Queue, stop: threading.Event) -> None:
        cur = None
        try:
            cur = self.con.cursor()
            batches = self._fetch(cur)
            if self.shuffle is not None:
                window = self.window_rows if self.convert is None else min(self.window_rows, CONVERTED_ROWS)
                batches = shuffle_windows(batches, self.batch_rows, window,
                                          np.random.default_rng(self.shuffle))
            t0 = time.perf_counter()
            for tensors in batches:
                if self.convert is not None:   # decoded here, on the producer thread
                    tensors = (self.convert(tensors[0]), *tensors[1:])
                self.stats.fetch_seconds += time.perf_counter() - t0
                if not _put(q, tensors, stop):
                    return
                t0 = time.perf_counter()
            _put(q, _DONE, stop)
        except BaseException as e:  # handed to the consumer, raised there
            _put(q, e, stop)
        finally:
            if cur is not None:
                cur.close()

    def _fetch(self, cur: duckdb.DuckDBPyConnection) -> Iterator[tuple[torch.Tensor, ...]]:
        """Arrow record batches of a whole number of batches (at least READ_ROWS rows: fewer
        round trips to DuckDB), cut into ``batch_rows`` views when not shuffling."""
        rows = READ_ROWS if self.convert is None else CONVERTED_ROWS
        read_rows = self.batch_rows * max(1, -(-rows // self.batch_rows))
        for query in self.sql if isinstance(self.sql, list) else [self.sql]:
            reader = cur.sql(query if isinstance(query, str) else query.sql("duckdb")).to_arrow_reader(read_rows)
            try:
                for batch in reader:
                    tensors = batch_to_tensors(batch) if self.convert is None else \
                        (batch.column(0), *batch_to_tensors(batch.select(range(1, batch.num_columns))))
                    if self.shuffle is not None:
                        yield tensors
                    else:
                        yield from _slices(tensors, 0, len(tensors[0]), self.batch_rows)
            finally:
                reader.close()


def shuffle_windows(batches: Iterator[tuple[torch.Tensor, ...]], batch_rows: int, window_rows: int,
                    rng: np.random.Generator) -> Iterator[tuple[torch.Tensor, ...]]:
    """Re-batch a stream into ``batch_rows`` rows drawn at random from windows of ``window_rows``.

    A shuffle buffer, as streaming data loaders use: memory stays bounded by the window
    whatever the table's size. The rows it is fed were put in a random order once per job
    (and each epoch starts at a random row), so the windows are random samples of the data.
    """
    pending: list[tuple[torch.Tensor, ...]] = []
    held = 0
    for batch in batches:
        pending.append(batch)
        held += len(batch[0])
        if held >= window_rows:
            window = _permuted(pending, rng)
            cut = held - held % batch_rows
            yield from _slices(window, 0, cut, batch_rows)
            pending = [tuple(_cut(t, cut, held) for t in window)] if cut < held else []
            held -= cut
    if held:
        window = _permuted(pending, rng)
        yield from _slices(window, 0, held, batch_rows)


# A column of a batch is a tensor, or (when BatchStream converts it later) an Arrow array.
def _permuted(parts: list[tuple], rng: np.random.Generator) -> tuple:
    order = torch.from_numpy(rng.permutation(sum(len(p[0]) for p in parts)))
    columns = (_concat([p[i] for p in parts]) if len(parts) > 1 else parts[0][i] for i in range(len(parts[0])))
    return tuple(torch.index_select(c, 0, order) if isinstance(c, torch.Tensor) else c.take(pa.array(order.numpy()))
                 for c in columns)


def _concat(columns: list):
    return torch.cat(columns) if isinstance(columns[0], torch.Tensor) else pa.concat_arrays(columns)


def _cut(column, start: int, stop: int):
    return column[start:stop] if isinstance(column, torch.Tensor) else column.slice(start, stop - start)


def _slices(window: tuple, start: int, stop: int, step: int):
    for i in range(start, stop, step):
        yield tuple(_cut(t, i, min(i + step, stop)) for t in window)


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
