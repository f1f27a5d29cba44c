"""dbml — in-database machine learning for DuckDB.

    con = dbml.connect("shop.duckdb")
    con.sql("SELECT train('churn', 'customers', label := 'churned')")

``connect`` opens a DuckDB connection with dbml installed; ``install`` adds dbml to a
connection you already have. Both are idempotent.
"""

from __future__ import annotations

from importlib import resources

import duckdb

from . import settings as _settings
from .errors import (CatalogError, DbmlError, InvalidArgument, ModelNotFound, SourceError,
                     TrainingError)

__version__ = "0.1.0"
__all__ = ["connect", "install", "DbmlError", "InvalidArgument", "SourceError", "ModelNotFound",
           "TrainingError", "CatalogError"]


def install(con: duckdb.DuckDBPyConnection, **settings) -> duckdb.DuckDBPyConnection:
    """Install dbml into ``con``: settings, catalog tables, UDFs and macros (``sql/``, and
    ``train`` generated from ``dbml.spec``). Returns ``con``."""
    from .instance import attach
    from .spec import train_macro_sql
    from .udfs import register

    _settings.apply(con, **settings)
    instance, new = attach(con)
    if new:
        register(instance)
    for sql in sorted(resources.files("dbml.sql").iterdir(), key=lambda p: p.name):
        if sql.name.endswith(".sql"):
            con.execute(sql.read_text())
    con.execute(train_macro_sql())
    return con


def connect(database: str = ":memory:", read_only: bool = False, **settings) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection to ``database`` with dbml installed; ``settings`` as in dbml.settings."""
    return install(duckdb.connect(database, read_only=read_only), **settings)
