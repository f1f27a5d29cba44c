"""What dbml keeps of a model created by BigQuery ML's CREATE MODEL, beside the catalog:
its model_type, the training query (what ``ML.EVALUATE(MODEL m)``, ``ML.FEATURE_INFO`` and
``ML.GLOBAL_EXPLAIN`` read), the held-out query where the split is BigQuery's own (``SEQ``,
``CUSTOM``), the frozen ``TRANSFORM`` and the hyperparameter trial.

One row per stored model in ``dbml.bigquery_models`` (the catalog's schema, out of SHOW
TABLES), keyed by the model's ``uid``: a version dropped and trained again by ``train()``
has another uid, so a stale row never applies to it (and is deleted at the next CREATE
MODEL). The queries are kept before ``TRANSFORM``: the functions apply the model's frozen
TRANSFORM to them as to any input.
"""

from __future__ import annotations

import json

from sqlglot import exp

from ..core.catalog import MODELS
from ..errors import InvalidArgument, ModelNotFound
from ..core.source import refused

TABLE = "dbml.bigquery_models"


def ensure(con) -> None:
    con.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (uid UUID PRIMARY KEY, model_type VARCHAR, source VARCHAR, "
                f"eval_source VARCHAR, transform VARCHAR[], trial JSON)")


def record(con, name: str, version: int, model_type: str, source: str, eval_source: str | None,
           transform: list[str] | None, trial: dict | None) -> None:
    ensure(con)
    con.execute(f"DELETE FROM {TABLE} WHERE uid NOT IN (SELECT uid FROM {MODELS})")   # dropped models' rows
    con.execute(f"INSERT INTO {TABLE} SELECT uid, ?, ?, ?, ?, ? FROM {MODELS} WHERE name = ? AND version = ?",
                [model_type, source, eval_source, transform, None if trial is None else json.dumps(trial), name,
                 version])


def latest(con, name: str, fn: str) -> int:
    rows = con.execute(f"SELECT max(version) FROM {MODELS} WHERE name = ?", [name]).fetchall()
    if rows[0][0] is None:
        raise ModelNotFound(f"BigQuery ML: Not found: model {name} ({fn}); CREATE MODEL {name} first, or pick one "
                            f"from SELECT name FROM dbml_models")
    return rows[0][0]


def _exists(con) -> bool:
    return con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'dbml' AND table_name = ? "
                       "AND NOT temporary", [TABLE.split(".")[1]]).fetchall()[0][0] > 0


def info(con, name: str, version: int) -> dict:
    """The row of (name, version), or {} for a model trained by train()."""
    if not _exists(con):
        return {}
    rows = con.execute(f"SELECT b.model_type, b.source, b.eval_source, b.transform, b.trial FROM {TABLE} b "
                       f"JOIN {MODELS} m USING (uid) WHERE m.name = ? AND m.version = ?", [name, version]).fetchall()
    if not rows:
        return {}
    model_type, source, eval_source, transform, trial = rows[0]
    return {"model_type": model_type, "source": source, "eval_source": eval_source,
            "transform": [checked_expression(t, name) for t in transform or []],
            "trial": json.loads(trial) if trial else None}


def trials(con, name: str) -> list[tuple[int, dict]]:
    if not _exists(con):
        return []
    rows = con.execute(f"SELECT m.version, b.trial FROM {TABLE} b JOIN {MODELS} m USING (uid) "
                       f"WHERE m.name = ? AND b.trial IS NOT NULL ORDER BY m.version", [name]).fetchall()
    return [(v, json.loads(t)) for v, t in rows]


def checked_expression(text: str, name: str) -> exp.Expression:
    """A stored TRANSFORM expression, parsed and checked: no query, table or call with effects
    (the catalog is data: an edited row must not become code)."""
    import sqlglot
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
