"""The data path: Arrow record batches from DuckDB become tensors without copies."""

import threading

import duckdb
import pytest
import torch

from dbml.core.data import BatchStream, batch_to_tensors


def test_fixed_size_list_batch_is_viewed_not_copied():
    con = duckdb.connect()
    batch = next(iter(con.sql("SELECT [range, range + 1, range + 2]::FLOAT[3] AS x, range::BIGINT AS y "
                              "FROM range(5000)").to_arrow_reader(4096)))
    x, y = batch_to_tensors(batch)
    assert x.shape == (4096, 3) and x.dtype == torch.float32 and y.dtype == torch.int64
    values = batch.column(0).flatten().buffers()[1]
    assert x.data_ptr() == values.address                      # the Arrow buffer itself
    assert y.data_ptr() == batch.column(1).buffers()[1].address
    assert torch.equal(x[7], torch.tensor([7.0, 8.0, 9.0]))


def test_stream_batches_cover_the_query_larger_than_a_vector():
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT [range]::FLOAT[1] AS x, range AS y FROM range(10000)")
    stream = BatchStream(con, "SELECT x, y FROM t", 3000)
    sizes = [len(x) for x, _ in stream]
    assert sizes == [3000, 3000, 3000, 1000]
    assert stream.stats.rows == 10000 and stream.stats.batches == 4


def producers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "dbml-batch-stream"}


def test_stream_stops_early_and_reports_errors():
    con = duckdb.connect()
    before = producers()
    stream = BatchStream(con, "SELECT [range]::FLOAT[1] AS x FROM range(100000)", 100, prefetch=2)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    assert producers() <= before                # the fetching thread ended with the loop
    bad = BatchStream(con, "SELECT * FROM no_such_table", 100)
    with pytest.raises(duckdb.CatalogException, match="no_such_table"):
        list(bad)
