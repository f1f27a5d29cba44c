"""Where a database's model catalog lives (its *home*: a schema of the user's database), and
how dbml knows it is its own.

dbml recognises its catalog by a marker it wrote, never by a name: the catalog's schema
holds a table ``catalog`` whose one row is ``MARKER`` (a row, not a comment, because
DuckDB's ``EXPORT DATABASE`` writes rows and drops comments, and an exported catalog must
be recognised once imported). A new catalog goes into the schema ``dbml`` when no schema
of that name exists, else into the first free one of ``dbml_catalog``, ``dbml_catalog_2``,
...; a user's own schema ``dbml``, or tables named like dbml's, are left alone. A catalog
written by dbml before the marker (the schema ``dbml`` with exactly dbml's tables and
columns) is recognised by that structure and marked when first opened writable.

The catalog's statements are written as sqlglot trees over ``dbml.models``,
``dbml.weights``, ``dbml.trials`` (``SCHEMA``); ``render`` puts the home in, fully
qualified with the database's name, so that a database attached ``AS dbml`` or a ``USE``
of another schema changes nothing. This module imports neither torch nor the catalog's
readers: ``dbml.install`` uses it on every connect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import duckdb
from sqlglot import exp

from ..errors import CatalogError

D = "duckdb"
SCHEMA = "dbml"                   # the schema the catalog's trees are written with
MARKER = "dbml model catalog"     # the one row of <home>.catalog
FORMAT = 1                        # its format, for a later migration
NEW_NAMES = ("dbml", "dbml_catalog")   # a new home: the first of these not taken (then dbml_catalog_2, ...)
TABLES = ("models", "weights", "trials", "catalog", "bigquery_models", "deployments")   # the names render places

# dbml.models' columns (sql/catalog.sql), by which a catalog written before the marker is known
MODEL_COLUMNS = ("name", "version", "arch", "task", "features", "label", "config", "preprocessing", "params",
                 "metrics", "rows", "trained_at", "bytes", "uid")
WEIGHT_COLUMNS = ("name", "version", "weights")


@dataclass(frozen=True)
class Home:
    database: str
    schema: str

    def table(self, name: str) -> exp.Table:
        return exp.Table(this=exp.to_identifier(name, quoted=True), db=exp.to_identifier(self.schema, quoted=True),
                         catalog=exp.to_identifier(self.database, quoted=True))

    def name(self, name: str) -> str:
        """``name`` of the home as SQL text, for functions that take a name as a string (nextval)."""
        return self.table(name).sql(D)

    def shown(self) -> str:
        return self.schema


def render(tree: exp.Expression, home: Home) -> str:
    """``tree``'s SQL with every ``dbml.<table>`` (unqualified by a database) put in ``home``."""
    return placed(tree, home).sql(D)


def placed(tree: exp.Expression, home: Home) -> exp.Expression:
    """A copy of ``tree`` with every ``dbml.<table>`` (unqualified by a database) put in ``home``."""
    def place(node):
        if isinstance(node, exp.Table) and node.db == SCHEMA and not node.catalog and node.name in TABLES:
            qualified = home.table(node.name)
            if node.alias:
                qualified.set("alias", node.args["alias"].copy())
            return qualified
        return node
    return tree.transform(place)


def of(cur: duckdb.DuckDBPyConnection) -> Home:
    """The home of the catalog of the dbml instance ``cur`` belongs to (found by its marker
    on a connection dbml is not installed on)."""
    from .runtime import runtime
    try:
        instance = runtime().instances.get(cur.execute("SELECT dbml_instance_id()").fetchall()[0][0])
    except duckdb.CatalogException:
        instance = None
    if instance is not None and instance.home is not None:
        return instance.home
    home, _ = find(cur)
    if home is None:
        raise CatalogError("the database has no dbml catalog; connect with dbml.connect(path) to create it")
    return home


def sql(cur: duckdb.DuckDBPyConnection, tree: exp.Expression) -> str:
    """``render(tree, of(cur))``: the catalog statement ``tree`` as ``cur`` runs it."""
    return render(tree, of(cur))


def _columns(con, database: str, schema: str, table: str) -> tuple[str, ...]:
    rows = con.execute("SELECT column_name FROM duckdb_columns() WHERE database_name = ? AND schema_name = ? "
                       "AND table_name = ? ORDER BY column_index", [database, schema, table]).fetchall()
    return tuple(r[0] for r in rows)


def _marked(con, home: Home) -> bool:
    if _columns(con, home.database, home.schema, "catalog")[:2] != ("marker", "format"):
        return False
    try:
        rows = con.execute(exp.select("marker").from_(home.table("catalog")).sql(D)).fetchall()
    except duckdb.Error:
        return False
    return [r[0] for r in rows] == [MARKER]


def _legacy(con, home: Home) -> bool:
    """A catalog dbml wrote before the marker: exactly dbml's tables and columns in the schema ``dbml``."""
    return (home.schema == "dbml" and _columns(con, home.database, "dbml", "models") == MODEL_COLUMNS
            and _columns(con, home.database, "dbml", "weights") == WEIGHT_COLUMNS)


def database(con: duckdb.DuckDBPyConnection) -> str:
    return con.execute("SELECT current_database()").fetchall()[0][0]


def find(con: duckdb.DuckDBPyConnection) -> tuple[Home | None, bool]:
    """The home of the catalog in ``con``'s current database and whether it carries the
    marker (False: a catalog written before it); (None, False) when there is none."""
    db = database(con)
    schemas = [r[0] for r in con.execute(
        "SELECT schema_name FROM duckdb_tables() WHERE database_name = ? AND table_name = 'catalog' "
        "AND NOT temporary ORDER BY schema_name", [db]).fetchall()]
    marked = [Home(db, s) for s in schemas if _marked(con, Home(db, s))]
    if len(marked) > 1:
        raise CatalogError(f"dbml.connect(): the database holds {len(marked)} dbml catalogs (in the schemas "
                           f"{', '.join(h.schema for h in marked)}); drop the one you do not want "
                           f"(DROP SCHEMA name CASCADE) and connect again")
    if marked:
        return marked[0], True
    legacy = Home(db, "dbml")
    if _legacy(con, legacy):
        return legacy, False
    return None, False


def _free_name(con: duckdb.DuckDBPyConnection, db: str) -> str:
    taken = {r[0] for r in con.execute("SELECT schema_name FROM duckdb_schemas() WHERE database_name = ?",
                                       [db]).fetchall()}
    for name in NEW_NAMES:
        if name not in taken:
            return name
    n = 2
    while f"dbml_catalog_{n}" in taken:
        n += 1
    return f"dbml_catalog_{n}"


def create(con: duckdb.DuckDBPyConnection, home: Home, *, mark: bool, then=None) -> None:
    """Create what ``home`` lacks of the catalog (sql/catalog.sql: all of it for a new home,
    ``trials`` and ``catalog`` for an older one) and, when ``mark``, the marker; then
    ``then(cursor, home)`` (``older``'s move): one transaction, on a cursor of its own
    whose ``USE`` of the home leaves ``con``'s current schema alone."""
    cur = con.cursor()
    try:
        cur.execute("BEGIN TRANSACTION")
        try:
            cur.execute(_create_schema(home))
            cur.execute(exp.Use(this=exp.Table(this=exp.to_identifier(home.schema, quoted=True),
                                               db=exp.to_identifier(home.database, quoted=True))).sql(D))
            cur.execute(resources.files("dbml.sql").joinpath("catalog.sql").read_text())
            if mark:
                cur.execute(exp.insert(exp.values([(exp.Literal.string(MARKER), exp.Literal.number(FORMAT))]),
                                       home.table("catalog")).sql(D))
            if then is not None:
                then(cur, home)
            cur.execute("COMMIT")
        except BaseException:
            try:
                cur.execute("ROLLBACK")
            except duckdb.Error:
                pass
            raise
    finally:
        cur.close()


def _create_schema(home: Home) -> str:
    return exp.Create(this=exp.Table(this=exp.to_identifier(home.schema, quoted=True),
                                     db=exp.to_identifier(home.database, quoted=True)),
                      kind="SCHEMA", exists=True).sql(D)


def settle(con: duckdb.DuckDBPyConnection, read_only: bool) -> Home:
    """The home of ``con``'s database's catalog, made complete and marked (created when
    there is none, with an older dbml's tables moved in: ``older``). Read-only, the catalog
    must be there."""
    home, marked = find(con)
    if read_only:
        if home is not None:
            return home
        if older(con) is not None:
            raise CatalogError("dbml.connect(): the database is open read-only and its dbml catalog is an older "
                               "dbml's (main.dbml_models); open it once without read_only (dbml.connect(path)) "
                               "so dbml can move it to its own schema")
        raise CatalogError("dbml.connect(): the database is open read-only and has no dbml catalog to create; "
                           "open it once without read_only (dbml.connect(path)) so dbml can create it")
    if home is None:
        home = Home(database(con), _free_name(con, database(con)))
        create(con, home, mark=True, then=older(con))
    elif not marked or not _columns(con, home.database, home.schema, "trials"):
        create(con, home, mark=not marked)
    return home


OLD_MODEL_COLUMNS = MODEL_COLUMNS[:-1]   # main.dbml_models of a dbml before the schema: no uid


def older(con: duckdb.DuckDBPyConnection):
    """The move of an older dbml's catalog (``main.dbml_models``, ``main.dbml_weights``,
    ``main.dbml_job_ids``) into a new home, giving each model a uid, for ``settle``; None
    unless both tables have exactly that dbml's columns (a user's own tables of those names
    are left alone)."""
    db = database(con)
    if (_columns(con, db, "main", "dbml_models") != OLD_MODEL_COLUMNS
            or _columns(con, db, "main", "dbml_weights") != WEIGHT_COLUMNS):
        return None

    def old(name: str) -> exp.Table:
        return exp.Table(this=exp.to_identifier(name, quoted=True), db=exp.to_identifier("main"),
                         catalog=exp.to_identifier(db, quoted=True))

    def move(cur: duckdb.DuckDBPyConnection, home: Home) -> None:
        cur.execute(exp.insert(exp.select("*", "gen_random_uuid()", dialect=D).from_(old("dbml_models")),
                               home.table("models")).sql(D))
        cur.execute(exp.insert(exp.select("*").from_(old("dbml_weights")), home.table("weights")).sql(D))
        for name in ("dbml_weights", "dbml_models"):
            cur.execute(exp.Drop(tables=[old(name)], kind="TABLE").sql(D))
        cur.execute(exp.Drop(tables=[old("dbml_job_ids")], kind="SEQUENCE", exists=True).sql(D))
    return move


# What else dbml creates in a database, which the shell's .tables, .schema and .dump leave out
# with the catalog's home: its TEMP views (tests/test_catalog_home.py checks the list against
# a fresh connection's) and the in-memory database it attaches for training (sql/scratch.sql).
TEMP_VIEWS = frozenset({"dbml_models", "dbml_weights", "dbml_trials", "dbml_jobs", "dbml_epochs", "dbml_memory",
                        "dbml_predictor", "dbml_leaderboard"})
SCRATCH = "dbml_scratch"


def owns(home: Home | None, database: str, schema: str, name: str) -> bool:
    """Whether the object ``database.schema.name`` is dbml's own (not the user's)."""
    if database == SCRATCH:
        return True
    if database == "temp":
        return name in TEMP_VIEWS
    return home is not None and (database, schema) == (home.database, home.schema)


def shell_home(con: duckdb.DuckDBPyConnection) -> Home | None:
    """The catalog's home for the shell's listings: None where there is none."""
    try:
        return of(con)
    except CatalogError:
        return None


# -- IMPORT DATABASE ------------------------------------------------------------------------
#
# EXPORT DATABASE writes the catalog with the user's tables (its schema, its rows and the
# marker), so an export restores its models wherever it is imported. DuckDB's IMPORT DATABASE
# creates each exported schema and fails on one that exists, as the catalog dbml installs in
# every database it connects to does. So dbml's statement paths (the shell, Connection.sql,
# dbml.execute) run an IMPORT DATABASE through ``import_database``: where the export brings a
# catalog (or a schema of the home's name), the database's own catalog must be empty and is
# dropped in the import's transaction; the import's catalog is then the database's.

_CREATE_SCHEMA = re.compile(r'^CREATE SCHEMA ("(?:[^"]|"")*"|[^\s;]+)\s*;', re.MULTILINE)
_CREATE_MARKER = re.compile(r'^CREATE TABLE ("(?:[^"]|"")*"|[^\s.;]+)\."?catalog"?\s*\(\s*"?marker"? VARCHAR',
                            re.MULTILINE | re.IGNORECASE)


def _unquote(name: str) -> str:
    return name[1:-1].replace('""', '"') if name.startswith('"') else name


def import_path(sql: str) -> str | None:
    """The directory of an ``IMPORT DATABASE 'dir'`` statement; None for any other statement."""
    head = sql.lstrip()
    if head[:6].upper() != "IMPORT":
        return None
    from sqlglot.tokens import TokenType
    from sqlglot.dialects.duckdb import DuckDB
    try:
        tokens = [t for t in DuckDB().tokenize(head) if t.token_type != TokenType.SEMICOLON]
    except Exception:  # noqa: BLE001 - not one this reads: DuckDB answers it
        return None
    if (len(tokens) >= 3 and [t.text.upper() for t in tokens[:2]] == ["IMPORT", "DATABASE"]
            and tokens[2].token_type == TokenType.STRING):
        return tokens[2].text
    return None


def _used(con: duckdb.DuckDBPyConnection, home: Home) -> int:
    """How many models and trials the catalog in ``home`` holds."""
    count = 0
    for name in ("models", "trials"):
        if _columns(con, home.database, home.schema, name):
            count += con.execute(exp.select("count(*)").from_(home.table(name)).sql(D)).fetchall()[0][0]
    return count


def import_database(con: duckdb.DuckDBPyConnection, sql: str, run):
    """Run ``sql``, an IMPORT DATABASE of ``import_path(sql)``, by ``run(sql)`` on ``con``
    (a connection dbml is installed on), making room for the catalog it brings; returns
    what ``run`` returned and the dbml instance, whose home it has set (the caller makes
    the connection's views again: ``dbml.import_database``)."""
    from .runtime import runtime
    path = import_path(sql)
    instance = runtime().instances.get(con.execute("SELECT dbml_instance_id()").fetchall()[0][0])
    here = instance.home
    try:
        with open(f"{path}/schema.sql", encoding="utf-8") as f:
            schema_sql = f.read()
    except OSError:
        return run(sql), instance   # DuckDB says what is wrong with the directory
    schemas = {_unquote(m.group(1)) for m in _CREATE_SCHEMA.finditer(schema_sql)}
    brings = [_unquote(m.group(1)) for m in _CREATE_MARKER.finditer(schema_sql)]
    if not brings and here.schema not in schemas:
        return run(sql), instance
    used = _used(con, here)
    if used:
        raise CatalogError(f"IMPORT DATABASE: the export holds {'a dbml catalog' if brings else 'a schema ' + here.schema} "
                           f"and this database's dbml catalog is not empty ({used} models and trials); import into "
                           f"a new database (e.g. dbml shell new.duckdb), or drop its models first (drop_model)")
    own = _begin(con)
    try:
        con.execute(exp.Drop(tables=[exp.Table(this=exp.to_identifier(here.schema, quoted=True),
                                                db=exp.to_identifier(here.database, quoted=True))],
                             kind="SCHEMA", cascade=True).sql(D))
        result = run(sql)
        if own:
            con.execute("COMMIT")
    except BaseException:
        if own:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass
        raise
    instance.home = settle(con, False)
    return result, instance


def _begin(con: duckdb.DuckDBPyConnection) -> bool:
    """Begin a transaction unless one is open (the user's own then holds the import); True if begun."""
    try:
        con.execute("BEGIN TRANSACTION")
        return True
    except duckdb.TransactionException:
        return False
