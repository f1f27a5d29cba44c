"""DuckDB (and Arrow) types of the UDFs, derived from dbml's tables.

Result and row STRUCTs come from ``dbml.core.columns``; ``dbml_train``'s (``dbml_tune``'s) parameter types from
``dbml.core.spec.TRAIN_PARAMS`` (``dbml.search.tunespec.TUNE_PARAMS``) followed by ``dbml.core.settings.SETTINGS``, the connection id and the
connection's TEMP tables and views. Nothing here lists a
column or a parameter.
"""

from __future__ import annotations

import functools

import duckdb

from ..core import columns
from ..core.settings import SETTINGS
from ..core.spec import TRAIN_PARAMS
from ..search.tunespec import TUNE_PARAMS

# the Arrow type name of each SQL type an Arrow UDF returns
ARROW = {"BIGINT": "int64", "INTEGER": "int32", "DOUBLE": "float64", "VARCHAR": "string"}


@functools.cache   # ~200 parameters of a few types: DuckDB parses each name once (60 ms at start-up)
def sql(name: str) -> duckdb.sqltypes.DuckDBPyType:
    """``'BIGINT'``, ``'VARCHAR[]'``... -> the DuckDB type."""
    return duckdb.sqltype(name)


def struct(table: dict[str, str]) -> duckdb.sqltypes.DuckDBPyType:
    return duckdb.struct_type({name: sql(sql_type) for name, sql_type in table.items()})


def arrow_struct(table: dict[str, str]):
    import pyarrow as pa   # on first use: a shell that never trains never imports it
    return pa.struct([(name, getattr(pa, ARROW[sql_type])()) for name, sql_type in table.items()])


def rows(table: dict[str, str]) -> duckdb.sqltypes.DuckDBPyType:
    """A view's rows: a LIST of its STRUCT, unnested by the view."""
    return duckdb.list_type(struct(table))


TRAIN_ARGS = (tuple(sql(p.sql_type) for p in TRAIN_PARAMS) + tuple(sql(s.sql_type) for s in SETTINGS)
              + (sql("BIGINT"), sql("VARCHAR[]")))   # the calling connection's id and TEMP objects

# dbml_tune: tune()'s parameters (dbml.search.tunespec.TUNE_PARAMS), the settings, the connection's id and TEMP objects
TUNE_ARGS = (tuple(sql(p.sql_type) for p in TUNE_PARAMS) + tuple(sql(s.sql_type) for s in SETTINGS)
             + (sql("BIGINT"), sql("VARCHAR[]")))
TRIAL_ROWS = rows(columns.TRIAL_ROW)

TRAIN_RESULT = struct(columns.TRAIN_RESULT)
JOB_ROWS = rows(columns.JOB_ROW)
MEMORY_ROWS = rows(columns.MEMORY_ROW)
PREDICTOR_ROWS = rows(columns.PREDICTOR_ROW)
CALIBRATE_RESULT = struct(columns.CALIBRATE_RESULT)
DEPLOY_RESULT = struct(columns.DEPLOY_RESULT)
EVALUATE_RESULT = struct(columns.EVALUATE_RESULT)
EXPLAIN_RESULT = struct(columns.EXPLAIN_RESULT)
PROBABILITIES = sql("MAP(VARCHAR, DOUBLE)")   # predict_proba: class label -> probability, in class order
EXPORT_RESULT = sql("STRUCT(path VARCHAR, bytes BIGINT, version INTEGER, input VARCHAR, outputs VARCHAR[], "
                    "features VARCHAR[])")
# predict()'s input: a list of numbers, an image BLOB or a text. A Python UDF cannot be
# overloaded, but DuckDB casts each of those to this UNION implicitly.
PREDICT_INPUT = sql("UNION(image BLOB, text VARCHAR, numbers DOUBLE[])")


def __getattr__(name: str):
    if name == "TRAIN_RESULT_ARROW":   # the Arrow type train() returns, made (with pyarrow) when first asked for
        return arrow_struct(columns.TRAIN_RESULT)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
