"""BigQuery names and functions in DuckDB terms, on sqlglot trees.

* A table ``project.dataset.table`` is DuckDB's three-part ``project.dataset.table`` where a
  database called ``project`` is attached (the project is a catalog, the dataset a schema),
  else ``dataset.table`` of the current database (a local copy of a public dataset). A wildcard table ``dataset.prefix*`` is the union of the schema's
  tables whose names start with ``prefix``, each row with its ``_TABLE_SUFFIX``.
* ``ST_DISTANCE(ST_GEOGPOINT(lon, lat), ST_GEOGPOINT(lon, lat))`` is the haversine distance
  in metres on a sphere of the Earth's mean radius (DuckDB's spatial extension is not needed).
* ``GENERATE_ARRAY(start, end, step)`` with a fractional argument is BigQuery's FLOAT64 array
  ``start + i * step`` up to ``end`` (DuckDB's ``generate_series`` takes integers only).
* ML's preprocessing functions outside ``TRANSFORM`` (``preprocess.py``).
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from ..errors import InvalidArgument
from . import preprocess

EARTH_RADIUS_M = 6371008.8
_HAVERSINE = sqlglot.parse_one(
    "2 * :r * asin(sqrt(power(sin(radians(:lat2 - :lat1) / 2), 2) + "
    "cos(radians(:lat1)) * cos(radians(:lat2)) * power(sin(radians(:lon2 - :lon1) / 2), 2)))", read="duckdb")

# (end - start) / step is a count: 1e-9 keeps an end that floating point lands just short of
_FLOAT_SERIES = sqlglot.parse_one(
    "list_transform(range(CAST(floor((CAST(:end AS DOUBLE) - :start) / :step + 1e-9) AS BIGINT) + 1), "
    "__dbml_i -> CAST(:start AS DOUBLE) + __dbml_i * CAST(:step AS DOUBLE))", read="duckdb")


def to_duckdb(con, tree: exp.Expression, *, live: bool = True) -> exp.Expression:
    """``tree`` (BigQuery) rewritten so that DuckDB's dialect runs it; ``live``: ML's
    preprocessing functions too, their statistics as window aggregates (not in a TRANSFORM,
    which ``preprocess.freeze`` computes once)."""
    tree = tree.transform(lambda node: _table(con, node) if isinstance(node, exp.Table) else node)
    tree = tree.transform(_geography)
    tree = tree.transform(_float_series)
    return preprocess.live(tree) if live else tree


def unnest_structs(con, tree: exp.Expression) -> exp.Expression:
    """``FROM UNNEST(<array of STRUCTs>)``: in BigQuery, one row per element with the STRUCT's fields
    as columns (``SELECT category, weight FROM UNNEST((SELECT category_weights FROM ML.WEIGHTS(...)
    ...))``); DuckDB's UNNEST gives one STRUCT column, so the fields are unnested once more. The
    element type is DuckDB's (a DESCRIBE of the UNNEST alone); an UNNEST that reads the outer
    query's columns, or of other elements, is left as it is."""
    for node in list(tree.find_all(exp.Unnest)):
        if not isinstance(node.parent, exp.From) or len(node.expressions) != 1 or node.args.get("offset"):
            continue
        probe = exp.select(exp.Star()).from_(exp.Unnest(expressions=[node.expressions[0].copy()]))
        try:
            columns = con.execute(exp.Describe(this=probe).sql("duckdb")).fetchall()
        except Exception:   # noqa: BLE001 - correlated or not an array: DuckDB's own reading stands
            continue
        if len(columns) != 1 or not str(columns[0][1]).startswith("STRUCT("):
            continue
        element = exp.select(exp.alias_(exp.Unnest(expressions=[node.expressions[0].copy()]), "__dbml_u")) \
            .subquery("__dbml_e")
        alias = node.args.get("alias")
        name = (alias.columns[0].name if alias is not None and alias.columns else alias.name if alias else "") \
            or "__dbml_s"
        node.replace(exp.select(exp.Unnest(expressions=[exp.column("__dbml_u")])).from_(element).subquery(name))
    return tree


def _float_series(node: exp.Expression) -> exp.Expression:
    if not isinstance(node, exp.GenerateSeries) or node.args.get("step") is None:
        return node
    parts = [node.args["start"], node.args["end"], node.args["step"]]
    if not any(isinstance(p, exp.Literal) and not p.is_string and not p.this.lstrip("-").isdigit() for p in parts):
        return node     # integers: DuckDB's generate_series, as BigQuery's INT64 arrays
    start, end, step = (p.copy() for p in parts)
    return exp.replace_placeholders(_FLOAT_SERIES.copy(), start=start, end=end, step=step)


def _table(con, table: exp.Table) -> exp.Expression:
    if not isinstance(table.this, exp.Identifier) or _is_model(table):
        return table
    if table.name.endswith("*"):
        return _wildcard(con, table)
    catalog = table.args.get("catalog")
    if catalog is not None and not _attached(con, catalog.name):
        table = table.copy()
        table.set("catalog", None)   # no database of the project's name: the dataset is a schema here
    elif catalog is not None:
        table = table.copy()
        table.set("catalog", exp.to_identifier(catalog.name, quoted=True))
    return table


def _attached(con, name: str) -> bool:
    """Whether a database (DuckDB's catalog) called ``name`` is attached: BigQuery's project."""
    query = exp.select(exp.func("count", exp.Star())).from_(exp.func("duckdb_databases")).where(
        exp.column("database_name").eq(exp.Placeholder()))
    return con.execute(query.sql("duckdb"), [name]).fetchall()[0][0] > 0


def _is_model(table: exp.Table) -> bool:
    """``MODEL m`` of a model function: a model's name, never a table (``m*`` is no wildcard)."""
    from .parse import MLFunction
    return isinstance(table.parent, (MLFunction, exp.Predict)) and table.arg_key == "this"


def _wildcard(con, table: exp.Table) -> exp.Expression:
    prefix, schema = table.name[:-1], table.db or None
    rows = con.execute("SELECT table_name FROM duckdb_tables() WHERE starts_with(table_name, ?) "
                       "AND schema_name = coalesce(?, current_schema()) ORDER BY table_name",
                       [prefix, schema]).fetchall()
    if not rows:
        raise InvalidArgument(f"BigQuery: wildcard table {table.sql('bigquery')} matches no table "
                              f"{schema + '.' if schema else ''}{prefix}... in this database")
    parts = [exp.select(exp.Star(), exp.alias_(exp.Literal.string(name[len(prefix):]), "_TABLE_SUFFIX"))
             .from_(exp.table_(name, db=schema, quoted=True)) for (name,) in rows]
    union = parts[0]
    for part in parts[1:]:
        union = exp.union(union, part, distinct=False)
    return exp.Subquery(this=union, alias=exp.TableAlias(this=exp.to_identifier(table.alias or table.name[:-1])))


def _point(node: exp.Expression) -> tuple[exp.Expression, exp.Expression]:
    if isinstance(node, exp.Anonymous) and node.name.upper() == "ST_GEOGPOINT" and len(node.expressions) == 2:
        return node.expressions[0], node.expressions[1]
    raise InvalidArgument(f"BigQuery: {node.sql('bigquery')[:60]}: dbml computes ST_DISTANCE between "
                          f"ST_GEOGPOINT(longitude, latitude) points only (no other geography is supported)")


def _geography(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.StDistance):
        (lon1, lat1), (lon2, lat2) = _point(node.this), _point(node.expression)
        return exp.Paren(this=exp.replace_placeholders(_HAVERSINE.copy(), r=exp.Literal.number(EARTH_RADIUS_M),
                                                       lon1=lon1, lat1=lat1, lon2=lon2, lat2=lat2))
    if isinstance(node, exp.Anonymous) and node.name.upper().startswith("ST_") and node.name.upper() != "ST_GEOGPOINT":
        raise InvalidArgument(f"BigQuery: the geography function {node.name} is not supported in dbml "
                              f"(ST_DISTANCE between ST_GEOGPOINTs is)")
    return node
