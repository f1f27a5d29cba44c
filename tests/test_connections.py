"""Connections dbml did not make the usual way: read-only databases and cursors (issue 10,
items 11 and 12).

A database opened with ``read_only=True`` predicts, evaluates and shows its catalog, and
refuses what would write it with an error naming the fix. Every cursor of an installed
connection has dbml's macros, views and settings; a TEMP table or view, which dbml's own
connection cannot see, gets an error that says so and what to do instead.
"""

import gc
import threading

import pytest

import dbml

from helpers import linear, load

# issue 10 reliability tests: whole databases and subprocesses; in the full suite, not the fast loop
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A database file with model 'lin' (regression on a, b, c); the connection that trained
    it is closed and collected, so the file can be opened read-only."""
    path = str(tmp_path_factory.mktemp("connections") / "models.duckdb")
    con = dbml.connect(path, latency_model="roofline")
    load(con, "lin", linear(300))
    con.sql("SELECT train('lin', 'SELECT a, b, c, y FROM lin', label := 'y', arch := 'linear', "
            "epochs := 1, batch_size := 64)").fetchall()
    con.close()
    del con
    gc.collect()
    return path


@pytest.fixture
def ro(trained):
    con = dbml.connect(trained, read_only=True)
    yield con
    con.close()
    del con
    gc.collect()


def test_read_only_connection_predicts_evaluates_and_reads_the_catalog(ro):
    assert ro.sql("SELECT name, version FROM dbml_models").fetchall() == [("lin", 1)]
    assert ro.sql("SELECT count(*) FROM dbml_epochs WHERE model = 'lin'").fetchall() == [(1,)]
    assert ro.sql("SELECT count(*) FROM dbml_jobs").fetchall() == [(0,)]
    value, = ro.sql("SELECT predict('lin', [0.1, 0.2, 0.3])").fetchall()[0]
    assert isinstance(value, float)
    rows = ro.sql("SELECT * FROM predictions('lin', 'SELECT a, b, c FROM lin')").fetchall()
    assert len(rows) == 300 and all(r[-1] is not None for r in rows)
    metrics, = ro.sql("SELECT evaluate('lin', 'lin')").fetchall()[0]
    assert metrics["rows"] == 300


@pytest.mark.parametrize("call", ["train('lin2', 'lin', label := 'y')", "drop_model('lin')"])
def test_read_only_connection_refuses_writes_naming_the_fix(ro, call):
    fn = call.split("(")[0]
    with pytest.raises(Exception, match=rf"{fn}\(\): the database is open read-only.*without read_only"):
        ro.sql(f"SELECT {call}").fetchall()
    assert ro.sql("SELECT name, version FROM dbml_models").fetchall() == [("lin", 1)]


def test_read_only_database_without_a_catalog(tmp_path):
    import duckdb
    path = str(tmp_path / "plain.duckdb")
    duckdb.connect(path).close()
    with pytest.raises(dbml.CatalogError, match="read-only and has no dbml catalog.*without read_only"):
        dbml.connect(path, read_only=True)


def test_every_cursor_has_dbml_and_its_settings(trained):
    con = dbml.connect(trained)
    try:
        con.execute("SET VARIABLE dbml_shuffle_window = 1234")
        results = {}

        def use():
            cur = con.cursor()
            results["predict"] = cur.sql("SELECT predict('lin', [0.1, 0.2, 0.3])").fetchall()[0][0]
            results["rows"] = len(cur.sql("SELECT * FROM predictions('lin', 'lin')").fetchall())
            results["jobs"] = cur.sql("SELECT count(*) FROM dbml_jobs").fetchall()[0][0]
            results["macro"] = cur.sql("SELECT count(*) FROM duckdb_functions() WHERE function_name = 'train' "
                                       "AND function_type = 'macro'").fetchall()[0][0]
            results["setting"] = cur.sql("SELECT getvariable('dbml_shuffle_window')").fetchall()[0][0]
            results["nested"] = cur.cursor().sql("SELECT count(*) FROM dbml_epochs").fetchall()[0][0]
            cur.close()

        thread = threading.Thread(target=use)
        thread.start()
        thread.join()
        assert results == {"predict": pytest.approx(results["predict"]), "rows": 300, "jobs": 0, "macro": 1,
                           "setting": 1234, "nested": 1}
    finally:
        con.close()
        del con
        gc.collect()


@pytest.mark.parametrize("query", ["SELECT train('t2', 'tmp', label := 'y')",
                                   "SELECT train('t2', 'SELECT a, y FROM tmp_view', label := 'y')",
                                   "SELECT evaluate('lin', 'tmp')",
                                   "SELECT * FROM predictions('lin', 'SELECT * FROM tmp_view')"])
def test_temp_sources_are_refused_saying_why_and_what_to_do(query):
    con = dbml.connect(latency_model="roofline")
    try:
        load(con, "lin", linear(50))
        con.execute("CREATE TEMP TABLE tmp AS SELECT * FROM lin")
        con.execute("CREATE TEMP VIEW tmp_view AS SELECT * FROM lin")
        if "lin'" in query:
            con.sql("SELECT train('lin', 'lin', label := 'y', arch := 'linear', epochs := 1)").fetchall()
        with pytest.raises(Exception, match=r"TEMP.*own connection.*CREATE TABLE or CREATE VIEW in the database"):
            con.sql(query).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("query", ["SELECT train('t2', 'lin', label := 'y', epochs := 1)",
                                   "SELECT train('t2', 'SELECT * FROM lin JOIN other USING (a)', label := 'y')",
                                   "SELECT evaluate('lin', 'SELECT * FROM lin')"])
def test_a_temp_object_shadowing_a_table_is_refused(query):
    """A TEMP table named like a database table: the caller sees the TEMP one, dbml's own
    connection the database's. On f30edaf dbml trained on (or evaluated) the table the
    caller does not see; now the source is refused, saying why."""
    con = dbml.connect(latency_model="roofline")
    try:
        load(con, "lin", linear(50))
        con.execute("CREATE TABLE other AS SELECT DISTINCT a FROM lin")
        con.sql("SELECT train('lin', 'lin', label := 'y', arch := 'linear', epochs := 1)").fetchall()
        con.execute("CREATE TEMP TABLE lin AS SELECT a, -y AS y FROM main.lin LIMIT 10")
        with pytest.raises(Exception, match=r"reads 'lin', which on this connection is a TEMP table or view; "
                                            r"dbml runs sources on its own connection"):
            con.sql(query).fetchall()
        assert con.sql("SELECT count(*) FROM dbml_models").fetchall()[0][0] == 1
    finally:
        con.close()
