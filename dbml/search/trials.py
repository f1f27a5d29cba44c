"""tune()'s trials in the catalog: the table ``dbml.trials`` (``sql/catalog.sql``) and the
rows users read, ``dbml_trials``.

One row per trial, written by the statement that runs it (``dbml.tuning``): when it
starts (status 'running') and when it ends. ``ROWS_SQL`` is the one reading of the table
as users see it, and the owner of what the best trial is: of a model's finished trials,
the one with the lowest objective (the highest for objectives that grow, 'maximize'),
the earliest on a tie. The view ``dbml_trials`` and tune()'s own result are both it.
"""

from __future__ import annotations

import json

import duckdb

from ..core.columns import TRIAL_ROW

TRIALS = "dbml.trials"
# the table's columns, in order (sql/catalog.sql)
COLUMNS = ("model", "trial", "status", "objective_name", "direction", "objective", "objectives", "params",
           "search", "epochs", "error", "seconds", "peak_bytes", "job_id", "version", "started_at")

_BEST = """
    status = 'finished' AND trial = first(trial ORDER BY
        CASE WHEN status <> 'finished' OR objective IS NULL THEN NULL
             WHEN direction = 'maximize' THEN -objective ELSE objective END ASC NULLS LAST, trial)
        OVER (PARTITION BY model)"""
ROWS_SQL = f"SELECT {', '.join(_BEST + ' AS best' if c == 'best' else c for c in TRIAL_ROW)} FROM {TRIALS}"


def view_sql(con: duckdb.DuckDBPyConnection) -> str:
    """The ``dbml_trials`` view: ``ROWS_SQL``, or no rows of the same columns where the
    database has no ``dbml.trials`` (an older database opened read-only)."""
    if has_table(con):
        return f"CREATE OR REPLACE TEMP VIEW dbml_trials AS {ROWS_SQL}"
    empty = ", ".join(f"NULL::{t} AS {c}" for c, t in TRIAL_ROW.items())
    return f"CREATE OR REPLACE TEMP VIEW dbml_trials AS SELECT {empty} WHERE false"


def has_table(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
                            "AND schema_name = 'dbml' AND table_name = 'trials' AND NOT temporary").fetchall()[0][0])


def load(cur: duckdb.DuckDBPyConnection, model: str) -> list[dict]:
    """Every stored trial of ``model``, in trial order, as the table holds it (JSON decoded)."""
    rows = cur.execute(f"SELECT {', '.join(COLUMNS)} FROM {TRIALS} WHERE model = ? ORDER BY trial",
                       [model]).fetchall()
    out = []
    for row in rows:
        record = dict(zip(COLUMNS, row))
        record["params"], record["search"] = json.loads(record["params"]), json.loads(record["search"])
        out.append(record)
    return out


def save(cur: duckdb.DuckDBPyConnection, record: dict) -> None:
    """Write one trial (a dict of COLUMNS; params and search as Python values), replacing
    the row of the same model and trial."""
    values = [json.dumps(record[c]) if c in ("params", "search") else record[c] for c in COLUMNS]
    cur.execute(f"INSERT OR REPLACE INTO {TRIALS} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                values)


def delete(cur: duckdb.DuckDBPyConnection, model: str, trials: list[int]) -> None:
    if trials:
        cur.execute(f"DELETE FROM {TRIALS} WHERE model = ? AND list_contains(?, trial)", [model, trials])


def rows(cur: duckdb.DuckDBPyConnection, model: str, trials: list[int]) -> list[dict]:
    """The ``dbml_trials`` rows of these trials of ``model``, in trial order."""
    result = cur.execute(f"SELECT * FROM ({ROWS_SQL}) WHERE model = ? AND list_contains(?, trial) ORDER BY trial",
                         [model, trials])
    names = [d[0] for d in result.description]
    return [dict(zip(names, row)) for row in result.fetchall()]


def best(cur: duckdb.DuckDBPyConnection, model: str) -> int | None:
    """The number of ``model``'s best trial (see the module docstring), or None."""
    found = cur.execute(f"SELECT trial FROM ({ROWS_SQL}) WHERE model = ? AND best", [model]).fetchall()
    return found[0][0] if found else None
