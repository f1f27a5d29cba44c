"""The catalog as users read it: the TEMP views ``dbml_models``, ``dbml_weights`` and
``dbml_leaderboard``, over the tables in the catalog's home (``dbml.core.home``).

``dbml_models`` is ``dbml.models`` with ``model`` first (the name every other view uses;
``name`` stays for the queries written before) and ``deployed``: the version the model's
plain name serves (``catalog.resolve``: the one ``deploy()`` pinned in
``dbml.deployments``, else the latest). An older catalog opened read-only has no
``dbml.deployments``: there every model serves its latest.

``dbml_leaderboard`` ranks every stored version by its validation metric (``metric``:
accuracy or R², both growing with quality, as tune()'s objective ``val_metric``), ties
broken by the lower validation loss: ``rank_in_model`` among the model's versions,
``rank`` among every version of every model with the same metric. A version without a
metric (no validation rows, k-means) ranks last.

They are TEMP views, made on every connection (``dbml._install_sql``), not views stored in
the file: a view in ``main`` would show in the user's ``SHOW TABLES`` and ``EXPORT DATABASE``
and could not be made on a database opened read-only; a plain DuckDB connection reads the
tables behind them, ``dbml.models``, ``dbml.deployments`` and ``dbml.trials``.
"""

from __future__ import annotations

import duckdb
from sqlglot import exp, parse_one

from . import home

D = "duckdb"

_DEPLOYED = parse_one("""
SELECT m.name AS model, m.* EXCLUDE (uid),
       m.version = coalesce(d.version, max(m.version) OVER (PARTITION BY m.name)) AS deployed
FROM dbml.models AS m LEFT JOIN dbml.deployments AS d ON d.model = m.name""", read=D)
_LATEST = parse_one("""
SELECT name AS model, * EXCLUDE (uid), version = max(version) OVER (PARTITION BY name) AS deployed
FROM dbml.models""", read=D)

LEADERBOARD = parse_one("""
SELECT model, version, task, arch, metric, value, val_loss,
       rank() OVER (PARTITION BY model ORDER BY value DESC NULLS LAST, val_loss ASC NULLS LAST) AS rank_in_model,
       rank() OVER (PARTITION BY metric ORDER BY value DESC NULLS LAST, val_loss ASC NULLS LAST) AS rank,
       deployed, trained_at
FROM (SELECT model, version, task, arch, metrics->>'val_metric_name' AS metric,
             TRY_CAST(metrics->>'val_metric' AS DOUBLE) AS value,
             TRY_CAST(metrics->>'val_loss' AS DOUBLE) AS val_loss, deployed, trained_at
      FROM dbml_models)""", read=D)


WEIGHTS = parse_one("SELECT name AS model, * FROM dbml.weights", read=D)


def has_deployments(con: duckdb.DuckDBPyConnection, where: home.Home) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND schema_name = ? "
                            "AND table_name = 'deployments' AND NOT temporary",
                            [where.database, where.schema]).fetchall()[0][0])


def _view(name: str, query: exp.Expression) -> exp.Create:
    return exp.Create(this=exp.to_table(name), kind="VIEW", replace=True, expression=query.copy(),
                      properties=exp.Properties(expressions=[exp.TemporaryProperty()]))


def views(con: duckdb.DuckDBPyConnection, where: home.Home) -> list[exp.Create]:
    """The views' statements (trees) over the catalog in ``where`` (``home.placed``: fully
    qualified), in the order they are made."""
    models = _DEPLOYED if has_deployments(con, where) else _LATEST
    return [_view("dbml_models", home.placed(models, where)), _view("dbml_weights", home.placed(WEIGHTS, where)),
            _view("dbml_leaderboard", LEADERBOARD)]
