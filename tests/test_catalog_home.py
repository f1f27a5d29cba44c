"""The catalog is known by the marker dbml wrote, never by a name (issue 31, items 4, 12, 16):
a user's own schema ``dbml`` or tables named like dbml's are left alone and shown, a database
attached ``AS dbml`` changes nothing, a failed install releases the file, and EXPORT/IMPORT
DATABASE carries the models (``dbml.core.home``)."""

from __future__ import annotations

import io
import subprocess
import sys

import duckdb
import pytest

import dbml
from dbml.core import home
from dbml.shell import run as shell_run

TABLE = "CREATE TABLE t AS SELECT i::DOUBLE AS a, (i % 2)::INT AS y FROM range(120) r(i)"
TRAIN = "SELECT (train('m', 't', label := 'y', epochs := 1)).version"
PREDICT = "SELECT list(predict('m', [a]) ORDER BY a) FROM t"


def shell(con, text: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = shell_run(con, io.StringIO(text), out, err)
    return status, out.getvalue(), err.getvalue()


def _trained(con) -> list:
    con.execute(TABLE)
    con.execute(TRAIN).fetchall()
    return con.execute(PREDICT).fetchall()[0][0]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_a_user_schema_named_dbml_is_left_alone(tmp_path):
    path = str(tmp_path / "user.duckdb")
    with duckdb.connect(path) as raw:   # the user's own schema dbml, with a table models (no uid column)
        raw.execute("CREATE SCHEMA dbml; CREATE TABLE dbml.models (a INT); INSERT INTO dbml.models VALUES (7)")
    with dbml.connect(path, latency_model="roofline") as con:
        _trained(con)
        assert con.execute("SELECT * FROM dbml.models").fetchall() == [(7,)]
        assert con.execute("SELECT name, version FROM dbml_models").fetchall() == [("m", 1)]
        where = home.of(con.duckdb)
        assert where.schema == "dbml_catalog"
        status, out, err = shell(con, ".tables\n")
        assert status == 0 and "models" in out and "dbml_catalog" not in out, (out, err)
    with dbml.connect(path, latency_model="roofline") as con:   # found again by its marker
        assert home.of(con.duckdb).schema == "dbml_catalog"
        assert con.execute("SELECT count(*) FROM dbml_models").fetchall() == [(1,)]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_tables_named_like_an_older_catalog_are_not_moved(tmp_path):
    path = str(tmp_path / "names.duckdb")
    with duckdb.connect(path) as raw:   # 14 columns of the user's, not the older dbml's 13
        columns = ", ".join(f"c{i} INT" for i in range(13))
        raw.execute(f"CREATE TABLE main.dbml_models (name VARCHAR, {columns}); INSERT INTO main.dbml_models (name) VALUES ('mine')")
        raw.execute("CREATE TABLE main.dbml_weights (name VARCHAR, version INT, weights BLOB)")
    with dbml.connect(path, latency_model="roofline") as con:
        _trained(con)
        # the TEMP view dbml_models is dbml's; the user's table is read by its full name
        assert con.execute("SELECT name FROM names.main.dbml_models").fetchall() == [("mine",)]
        assert con.execute("SELECT name FROM dbml_models").fetchall() == [("m",)]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_an_older_catalog_with_dbmls_own_columns_is_still_moved(tmp_path):
    path = str(tmp_path / "old.duckdb")
    with dbml.connect(path, latency_model="roofline") as con:
        expected = _trained(con)
    with duckdb.connect(path) as raw:   # as a dbml before the marker left it: no catalog table
        raw.execute("DROP TABLE dbml.catalog")
    with dbml.connect(path, latency_model="roofline") as con:
        assert con.execute(PREDICT).fetchall()[0][0] == expected
        assert con.execute("SELECT * FROM dbml.catalog").fetchall() == [(home.MARKER, home.FORMAT)]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_a_database_attached_as_dbml_changes_nothing():
    con = dbml.connect(latency_model="roofline")
    con.execute("ATTACH ':memory:' AS dbml")
    con.execute("CREATE SCHEMA dbml.dbml")   # even with a schema of the catalog's name inside it
    before = _trained(con)
    assert con.execute(PREDICT).fetchall()[0][0] == before
    space = '{"lr": {"choice": [0.01, 0.1]}}'
    rows = con.execute("SELECT * FROM tune('m2', 't', label := 'y', trials := 2, epochs := 1, space := ?)",
                       [space]).fetchall()
    assert len(rows) == 2
    assert con.execute("SELECT count(*) FROM dbml_trials").fetchall() == [(2,)]
    assert con.execute("SELECT drop_model('m')").fetchall() == [(1,)]
    con.close()


def test_a_failed_connect_releases_the_file(tmp_path):
    path = str(tmp_path / "two.duckdb")
    with duckdb.connect(path) as raw:   # two marked catalogs: dbml cannot know which is its own
        for schema in ("a", "b"):
            raw.execute(f"CREATE SCHEMA {schema}; CREATE TABLE {schema}.catalog (marker VARCHAR, format INT)")
            raw.execute(f"INSERT INTO {schema}.catalog VALUES (?, 1)", [home.MARKER])
    with pytest.raises(dbml.CatalogError, match=r"2 dbml catalogs .*DROP SCHEMA"):
        dbml.connect(path, latency_model="roofline")
    other = subprocess.run([sys.executable, "-c", f"import duckdb; duckdb.connect({path!r}).close()"],
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr


def test_the_temp_views_the_shell_hides_are_exactly_dbmls():
    con = dbml.connect(latency_model="roofline")
    temp = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE temporary AND NOT internal").fetchall()}
    assert temp == home.TEMP_VIEWS
    con.close()


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_the_shell_shows_and_dumps_the_users_own_dbml_named_objects(tmp_path):
    path = str(tmp_path / "shown.duckdb")
    with duckdb.connect(path) as raw:
        raw.execute("CREATE SCHEMA dbml; CREATE TABLE dbml.notes (n INT); INSERT INTO dbml.notes VALUES (3)")
        raw.execute("CREATE TABLE dbml_scores (s INT); INSERT INTO dbml_scores VALUES (5)")
        raw.execute("CREATE VIEW dbml_top AS SELECT 1 AS one")
    with dbml.connect(path, latency_model="roofline") as con:
        _trained(con)
        status, tables, _ = shell(con, ".tables\n")
        status2, schema, _ = shell(con, ".schema\n")
        status3, dump, err = shell(con, ".dump\n")
    assert status == status2 == status3 == 0, err
    for shown in ("notes", "dbml_scores", "dbml_top"):
        assert shown in tables and shown in schema and shown in dump
    for hidden in ("weights", "dbml_models", "dbml_jobs", "marker"):   # dbml's own: its catalog and views
        assert hidden not in tables and hidden not in schema and hidden not in dump
    restored = duckdb.connect()
    restored.execute(dump)   # the dump restores the user's objects, and only theirs
    assert restored.execute("SELECT * FROM dbml.notes").fetchall() == [(3,)]
    assert restored.execute("SELECT * FROM dbml_scores").fetchall() == [(5,)]
    assert restored.execute("SELECT * FROM dbml_top").fetchall() == [(1,)]


def _export(tmp_path):
    with dbml.connect(str(tmp_path / "source.duckdb"), latency_model="roofline") as con:
        expected = _trained(con)
        con.execute(f"EXPORT DATABASE '{tmp_path / 'export'}'")
    return expected, str(tmp_path / "export")


@pytest.mark.slow   # four databases, one training
def test_export_and_import_database_carry_the_models(tmp_path):
    expected, exported = _export(tmp_path)
    statement = f"IMPORT DATABASE '{exported}'"
    # from Python: Connection.sql and dbml.execute
    for n, run in enumerate((lambda c: c.sql(statement), lambda c: dbml.execute(c, statement))):
        with dbml.connect(str(tmp_path / f"python{n}.duckdb"), latency_model="roofline") as con:
            run(con)
            assert con.execute(PREDICT).fetchall()[0][0] == expected
            assert con.execute("SELECT count(*) FROM t").fetchall() == [(120,)]
    # in the shell
    with dbml.connect(str(tmp_path / "shell.duckdb"), latency_model="roofline") as con:
        status, out, err = shell(con, statement + ";\nSELECT name FROM dbml_models;\n")
        assert status == 0 and "│ m " in out, err
        assert con.execute(PREDICT).fetchall()[0][0] == expected
    # into plain DuckDB, then opened by dbml: the marker came with the rows
    plain = str(tmp_path / "plain.duckdb")
    with duckdb.connect(plain) as raw:
        raw.execute(statement)
    with dbml.connect(plain, latency_model="roofline") as con:
        assert con.execute(PREDICT).fetchall()[0][0] == expected


@pytest.mark.slow   # two trainings
def test_an_import_over_a_catalog_with_models_is_refused_and_changes_nothing(tmp_path):
    _, exported = _export(tmp_path)
    with dbml.connect(str(tmp_path / "busy.duckdb"), latency_model="roofline") as con:
        con.execute("CREATE TABLE t AS SELECT i::DOUBLE AS a, (i % 3 = 0)::INT AS y FROM range(60) r(i)")
        con.execute("SELECT train('mine', 't', label := 'y', epochs := 1)").fetchall()
        with pytest.raises(dbml.CatalogError, match="IMPORT DATABASE: .* not empty .* new database"):
            con.sql(f"IMPORT DATABASE '{exported}'")
        assert con.execute("SELECT name FROM dbml_models").fetchall() == [("mine",)]
        assert con.execute("SELECT count(*) FROM t").fetchall() == [(60,)]
