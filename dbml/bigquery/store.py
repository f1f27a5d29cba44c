"""What dbml keeps of a model created by BigQuery ML's CREATE MODEL, beside the catalog:
its model_type, the training query (what ``ML.EVALUATE(MODEL m)``, ``ML.FEATURE_INFO`` and
``ML.GLOBAL_EXPLAIN`` read), the held-out query of a ``SEQ`` or ``CUSTOM`` model stored before
train() held those rows out itself (``split :=``), the frozen ``TRANSFORM`` and the hyperparameter trial.

One row per stored model in ``dbml.bigquery_models`` (the catalog's home, ``dbml.core.home``, out of SHOW
TABLES), keyed by the model's ``uid``: a version dropped and trained again by ``train()``
has another uid, so a stale row never applies to it (and is deleted at the next CREATE
MODEL). The queries are kept before ``TRANSFORM``: the functions apply the model's frozen
TRANSFORM to them as to any input.
"""

from __future__ import annotations

import json

import sqlglot
from sqlglot import exp

from ..core import catalog, home
from ..core.catalog import MODELS
from ..errors import InvalidArgument, ModelNotFound
from ..core.source import refused

TABLE = "dbml.bigquery_models"
_SCHEMA, _NAME = TABLE.split(".")
# the store's table, its name set where it is created
_CREATE = sqlglot.parse_one("CREATE TABLE IF NOT EXISTS t (uid UUID PRIMARY KEY, model_type VARCHAR, source VARCHAR, "
                            "eval_source VARCHAR, transform VARCHAR[], trial JSON)", read="duckdb")


def _table(alias: str | None = None) -> exp.Table:
    table = exp.table_(_NAME, db=_SCHEMA)
    return table.as_(alias) if alias else table


def _models(alias: str | None = None) -> exp.Table:
    table = exp.to_table(MODELS)
    return table.as_(alias) if alias else table


def _of(version: bool, prefix: str = "") -> exp.Expression:
    """``name = ?`` (and ``version = ?``) of the catalog's models."""
    name = exp.column("name", table=prefix or None).eq(exp.Placeholder())
    return exp.and_(name, exp.column("version", table=prefix or None).eq(exp.Placeholder())) if version else name


def _joined(*columns: str) -> exp.Select:
    """The store's rows beside their catalog rows (``b`` and ``m``)."""
    return exp.select(*columns).from_(_table("b")).join(_models("m"), using=["uid"])


def ensure(con) -> None:
    create = _CREATE.copy()
    create.this.set("this", _table())
    con.execute(home.sql(con, create))


def record(con, name: str, version: int, model_type: str, source: str, eval_source: str | None,
           transform: list[str] | None, trial: dict | None) -> None:
    ensure(con)
    # dropped models' rows
    con.execute(home.sql(con, exp.delete(_table(), where=exp.column("uid").isin(query=exp.select("uid").from_(_models())).not_())))
    row = exp.select("uid", *(exp.Placeholder() for _ in range(5))).from_(_models()).where(_of(version=True))
    con.execute(home.sql(con, exp.insert(row, _table())),
                [model_type, source, eval_source, transform, None if trial is None else json.dumps(trial), name,
                 version])


def resolve(con, name: str, version: int | str | None, fn: str) -> int:
    """The version of ``name`` a model function reads: ``catalog.resolve``'s (``version``, the
    pinned one, or the latest), its errors in BigQuery's words where the model does not exist."""
    if not catalog.identify_any(con, name):
        raise ModelNotFound(f"BigQuery ML: Not found: model {name} ({fn}); CREATE MODEL {name} first, or pick one "
                            f"from SELECT name FROM dbml_models")
    return catalog.resolve(con, name, version, fn=fn)[1]


def _exists(con) -> bool:
    where = home.of(con)
    return con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND schema_name = ? "
                       "AND table_name = ? AND NOT temporary", [where.database, where.schema, _NAME]).fetchall()[0][0] > 0


def info(con, name: str, version: int) -> dict:
    """The row of (name, version), or {} for a model trained by train()."""
    if not _exists(con):
        return {}
    query = _joined("b.model_type", "b.source", "b.eval_source", "b.transform", "b.trial").where(_of(True, "m"))
    rows = con.execute(home.sql(con, query), [name, version]).fetchall()
    if not rows:
        return {}
    model_type, source, eval_source, transform, trial = rows[0]
    return {"model_type": model_type, "source": source, "eval_source": eval_source,
            "transform": [checked_expression(t, name) for t in transform or []],
            "trial": json.loads(trial) if trial else None}


def trials(con, name: str) -> list[tuple[int, dict]]:
    if not _exists(con):
        return []
    query = (_joined("m.version", "b.trial").where(_of(False, "m")).where(exp.column("trial", table="b").is_(exp.null())
                                                                            .not_()).order_by("m.version"))
    rows = con.execute(home.sql(con, query), [name]).fetchall()
    return [(v, json.loads(t)) for v, t in rows]


def checked_expression(text: str, name: str) -> exp.Expression:
    """A stored TRANSFORM expression, parsed and checked: no query, table or call with effects
    (the catalog is data: an edited row must not become code)."""
    try:
        tree = sqlglot.parse_one(text, read="duckdb")
    except sqlglot.errors.ParseError:
        tree = None
    bad = tree is None or any(isinstance(n, (exp.Query, exp.Table, exp.Subquery, exp.Command)) or
                              (isinstance(n, exp.Anonymous) and str(n.this).lower() in refused())
                              for n in tree.walk())
    if bad:
        raise InvalidArgument(f"BigQuery ML: model {name}'s stored TRANSFORM is damaged ({text[:60]!r}); "
                              f"create the model again")
    return tree
