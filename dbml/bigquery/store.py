"""What dbml keeps of a model created by BigQuery ML's CREATE MODEL, beside the catalog:
its model_type, the training query (what ``ML.EVALUATE(MODEL m)``, ``ML.FEATURE_INFO`` and
``ML.GLOBAL_EXPLAIN`` read), the held-out query where the split is BigQuery's own (``SEQ``,
``CUSTOM``), the frozen ``TRANSFORM`` and the hyperparameter trials.

One row per (name, version, trained_at) in ``dbml_bigquery_models``: a version dropped and
trained again by ``train()`` has another ``trained_at``, so a stale row never applies to it.
"""

from __future__ import annotations

import json

from sqlglot import exp

from ..errors import InvalidArgument, ModelNotFound
from ..source import EFFECTFUL

TABLE = "dbml_bigquery_models"


def ensure(con) -> None:
    con.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (name VARCHAR, version INTEGER, trained_at TIMESTAMP, "
                f"model_type VARCHAR, source VARCHAR, eval_source VARCHAR, transform VARCHAR[], trial JSON)")


def record(con, name: str, version: int, model_type: str, source: str, eval_source: str | None,
           transform: list[str] | None, trial: dict | None) -> None:
    ensure(con)
    con.execute(f"INSERT INTO {TABLE} SELECT name, version, trained_at, ?, ?, ?, ?, ? FROM dbml_models "
                f"WHERE name = ? AND version = ?",
                [model_type, source, eval_source, transform, None if trial is None else json.dumps(trial), name, version])


def latest(con, name: str, fn: str) -> int:
    rows = con.execute("SELECT max(version) FROM dbml_models WHERE name = ?", [name]).fetchall()
    if rows[0][0] is None:
        raise ModelNotFound(f"BigQuery ML: Not found: model {name} ({fn}); CREATE MODEL {name} first, or pick one "
                            f"from SELECT name FROM dbml_models")
    return rows[0][0]


def info(con, name: str, version: int) -> dict:
    """The row of (name, version), or {} for a model trained by train() (or before this table)."""
    exists = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND NOT temporary",
                         [TABLE]).fetchall()[0][0]
    if not exists:
        return {}
    rows = con.execute(f"SELECT b.model_type, b.source, b.eval_source, b.transform, b.trial FROM {TABLE} b "
                       f"JOIN dbml_models m USING (name, version, trained_at) WHERE name = ? AND version = ?",
                       [name, version]).fetchall()
    if not rows:
        return {}
    model_type, source, eval_source, transform, trial = rows[0]
    return {"model_type": model_type, "source": source, "eval_source": eval_source,
            "transform": [checked_expression(t, name) for t in transform or []],
            "trial": json.loads(trial) if trial else None}


def trials(con, name: str) -> list[tuple[int, dict]]:
    ensure(con)
    rows = con.execute(f"SELECT b.version, b.trial FROM {TABLE} b JOIN dbml_models m USING (name, version, trained_at) "
                       f"WHERE name = ? AND b.trial IS NOT NULL ORDER BY b.version", [name]).fetchall()
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
                              (isinstance(n, exp.Anonymous) and str(n.this).lower() in EFFECTFUL)
                              for n in tree.walk())
    if bad:
        raise InvalidArgument(f"BigQuery ML: model {name}'s stored TRANSFORM is damaged ({text[:60]!r}); "
                              f"create the model again")
    return tree
