"""tune()'s trials in the catalog: the table ``dbml.trials`` (``sql/catalog.sql``) and the
rows users read, ``dbml_trials``.

One row per trial, written by the statement that runs it (``dbml.tuning``): when it
starts (status 'running') and when it ends. A row still 'running' when the database file is
opened was left by a process that ended first (killed, or its machine lost): DuckDB lets
one process at a time write a file, and no statement of the opening process runs yet. It is
shown as 'interrupted' (``settle`` on a writable open, ``view_sql`` on a read-only one, which
cannot write), and tune() on the model goes on without it (a grid tries its point again).

``ROWS`` (a sqlglot tree) is the one reading of the table as users see it, and the owner of
what the best trial is: of a model's finished trials, the one with the lowest objective
(the highest for objectives that grow, 'maximize'), the earliest on a tie. The view
``dbml_trials`` and tune()'s own result are both it.
"""

from __future__ import annotations

import json

import duckdb
import sqlglot
from sqlglot import exp

from ..core import home
from ..core.columns import TRIAL_ROW
from ..core.instance import is_read_only

D = "duckdb"
TRIALS = "dbml.trials"
RUNNING, INTERRUPTED = "running", "interrupted"
ENDED = "the process that ran it ended before it did"
# the table's columns, in order (sql/catalog.sql)
COLUMNS = ("model", "trial", "status", "objective_name", "direction", "objective", "objectives", "params",
           "search", "epochs", "error", "seconds", "peak_bytes", "job_id", "version", "started_at")

# The objective to rank by: NULL where a trial did not finish; sorted last whatever DuckDB's
# default_null_order (the IS NULL key first: sqlglot renders NULLS LAST as DuckDB's default,
# which a setting can change).
_RANK = sqlglot.parse_one("""
    CASE WHEN status <> 'finished' OR objective IS NULL THEN NULL
         WHEN direction = 'maximize' THEN -objective ELSE objective END""", read=D)
_BEST = sqlglot.parse_one(
    "status = 'finished' AND trial = first(trial ORDER BY $rank IS NULL, $rank, trial) OVER (PARTITION BY model)",
    read=D)
_BEST = exp.replace_placeholders(_BEST, rank=_RANK)
_TABLE = exp.to_table(TRIALS, dialect=D)
# A row left running by a process that ended, as shown (status, error) where it cannot be rewritten
_LEFT = exp.column("status").eq(exp.Literal.string(RUNNING))
_SHOWN = {"status": exp.case().when(_LEFT, exp.Literal.string(INTERRUPTED)).else_(exp.column("status")),
          "error": exp.case().when(_LEFT, exp.Literal.string(ENDED)).else_(exp.column("error"))}
_SETTLE = exp.update(_TABLE, {"status": exp.Literal.string(INTERRUPTED), "error": exp.Literal.string(ENDED)},
                     where=_LEFT)


def _rows(shown: dict) -> exp.Select:
    return exp.select(*(_BEST.as_("best") if c == "best" else shown[c].as_(c) if c in shown else exp.column(c)
                        for c in TRIAL_ROW)).from_(_TABLE)


ROWS, _ROWS_SETTLED = _rows({}), _rows(_SHOWN)


def view_sql(con: duckdb.DuckDBPyConnection, where: home.Home) -> exp.Create:
    """The ``dbml_trials`` view (a tree) of the catalog in ``where``: ``ROWS``, or no rows of
    the same columns where it has no ``trials`` table (an older database opened read-only).
    On a read-only database no process writes the file (DuckDB's lock), so a row 'running'
    there is shown as ``settle`` would have written it."""
    if has_table(con, where) and is_read_only(con):
        rows = home.placed(_ROWS_SETTLED, where)
    elif has_table(con, where):
        rows = home.placed(ROWS, where)
    else:
        rows = exp.select(*(exp.cast(exp.Null(), t, dialect=D).as_(c) for c, t in TRIAL_ROW.items())).where(exp.false())
    return exp.Create(this=exp.to_table("dbml_trials"), kind="VIEW", replace=True, expression=rows.copy(),
                      properties=exp.Properties(expressions=[exp.TemporaryProperty()]))


_LOAD = (exp.select(*COLUMNS).from_(_TABLE).where("model = ?", dialect=D).order_by("trial", dialect=D))


def _save_sql(rows: int) -> exp.Insert:
    """INSERT OR REPLACE of ``rows`` trials, their values as placeholders."""
    insert = exp.insert(exp.values([tuple(exp.Placeholder() for _ in COLUMNS) for _ in range(rows)]), _TABLE,
                        columns=COLUMNS)
    insert.set("alternative", "REPLACE")
    return insert


_DELETE = exp.delete(_TABLE, where="model = ? AND list_contains(?, trial)", dialect=D)
_ROWS_OF = (exp.select("*").from_(ROWS.subquery()).where("model = ? AND list_contains(?, trial)", dialect=D)
            .order_by("trial", dialect=D))
_BEST_OF = exp.select("trial").from_(ROWS.subquery()).where("model = ? AND best", dialect=D)
ALL_ROWS_OF = exp.select("*").from_(ROWS.subquery()).where("model = ?", dialect=D).order_by("trial", dialect=D)


def settle(con: duckdb.DuckDBPyConnection, model: str | None = None, where: home.Home | None = None) -> int:
    """Mark the trials left 'running' (of ``model``, or of every model) 'interrupted': call it
    where no statement of this process can be running them, when the file is first opened
    writable in this process, or when tune() starts on ``model`` (one tune() per model at a
    time). ``where``: the catalog's home (found from ``con`` by default). Returns how many
    there were."""
    where = where or home.of(con)
    if not has_table(con, where):
        return 0
    update = _SETTLE if model is None else _SETTLE.where(exp.column("model").eq(exp.Placeholder()), copy=True)
    return con.execute(home.render(update, where), [] if model is None else [model]).fetchall()[0][0]


def has_table(con: duckdb.DuckDBPyConnection, where: home.Home) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND schema_name = ? "
                            "AND table_name = 'trials' AND NOT temporary", [where.database, where.schema]).fetchall()[0][0])


def load(cur: duckdb.DuckDBPyConnection, model: str) -> list[dict]:
    """Every stored trial of ``model``, in trial order, as the table holds it (JSON decoded)."""
    rows = cur.execute(home.sql(cur, _LOAD), [model]).fetchall()
    out = []
    for row in rows:
        record = dict(zip(COLUMNS, row))
        record["params"], record["search"] = json.loads(record["params"]), json.loads(record["search"])
        out.append(record)
    return out


def save(cur: duckdb.DuckDBPyConnection, *records: dict) -> None:
    """Write trials (dicts of COLUMNS; params and search as Python values) in one statement,
    replacing the rows of the same model and trial. One write for the trials that start or
    end together (a fused job's): a write per trial was a tenth of a 32-trial search."""
    if not records:
        return
    values = [json.dumps(r[c]) if c in ("params", "search") else r[c] for r in records for c in COLUMNS]
    cur.execute(home.sql(cur, _save_sql(len(records))), values)


def delete(cur: duckdb.DuckDBPyConnection, model: str, trials: list[int]) -> None:
    if trials:
        cur.execute(home.sql(cur, _DELETE), [model, trials])


def rows(cur: duckdb.DuckDBPyConnection, model: str, trials: list[int]) -> list[dict]:
    """The ``dbml_trials`` rows of these trials of ``model``, in trial order."""
    result = cur.execute(home.sql(cur, _ROWS_OF), [model, trials])
    names = [d[0] for d in result.description]
    return [dict(zip(names, row)) for row in result.fetchall()]


def best(cur: duckdb.DuckDBPyConnection, model: str) -> int | None:
    """The number of ``model``'s best trial (see the module docstring), or None."""
    found = cur.execute(home.sql(cur, _BEST_OF), [model]).fetchall()
    return found[0][0] if found else None
