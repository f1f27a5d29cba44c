"""Issue 21, wrong answers: a model dropped and trained again is never served from a stale
cache, non-finite weights or statistics are never stored, and the catalog of an older
dbml is moved, not lost. Each test failed on 360a75c."""

from __future__ import annotations

import duckdb
import pytest

import dbml


def _two_lines(con) -> None:
    con.execute("CREATE TABLE a AS SELECT x / 100 AS x, 2 * x / 100 AS y FROM range(200) t(x)")
    con.execute("CREATE TABLE b AS SELECT x / 100 AS x, -2 * x / 100 AS y FROM range(200) t(x)")


def _train_line(con, source: str) -> None:
    con.execute(f"SELECT train('m', '{source}', label := 'y', arch := 'linear', epochs := 30, lr := 0.05, "
                f"policy := 'eager')")


def test_a_model_dropped_and_trained_again_answers_with_its_new_weights(con):
    _two_lines(con)
    _train_line(con, "a")
    assert con.execute("SELECT predict('m', [0.5])").fetchall()[0][0] == pytest.approx(1.0, abs=0.05)
    assert con.execute("SELECT prediction FROM predictions('m', 'SELECT 0.5 AS x')").fetchall()[0][0] > 0.9
    con.execute("SELECT drop_model('m')")
    _train_line(con, "b")        # version 1 again, other weights
    assert con.execute("SELECT version FROM dbml_models WHERE name = 'm'").fetchall() == [(1,)]
    assert con.execute("SELECT predict('m', [0.5])").fetchall()[0][0] == pytest.approx(-1.0, abs=0.05)
    assert con.execute("SELECT prediction FROM predictions('m', 'SELECT 0.5 AS x')").fetchall()[0][0] < -0.9
    assert con.execute("SELECT evaluate('m', 'b').r2").fetchall()[0][0] > 0.99


def test_another_connection_sees_the_retrained_model_too(tmp_path):
    path = str(tmp_path / "x.duckdb")
    first = dbml.connect(path, latency_model="roofline")
    other = first.cursor()
    _two_lines(first)
    _train_line(first, "a")
    assert other.execute("SELECT predict('m', [0.5])").fetchall()[0][0] > 0.9
    other.execute("SELECT drop_model('m')")
    _train_line(other, "b")
    assert first.execute("SELECT predict('m', [0.5])").fetchall()[0][0] < -0.9
    first.close()


def _old_layout(path: str) -> None:
    """A database as dbml wrote it before its catalog had a schema of its own."""
    con = dbml.connect(path, latency_model="roofline")
    _two_lines(con)
    _train_line(con, "a")
    con.execute("CREATE TABLE main.dbml_models AS SELECT * EXCLUDE (uid) FROM dbml.models")
    con.execute("CREATE TABLE main.dbml_weights AS SELECT * FROM dbml.weights")
    con.execute("CREATE SEQUENCE main.dbml_job_ids")
    con.execute("DROP SCHEMA dbml CASCADE")
    con.close()


def test_an_older_catalog_is_moved_into_its_own_schema(tmp_path):
    path = str(tmp_path / "old.duckdb")
    _old_layout(path)
    with pytest.raises(dbml.CatalogError, match="older dbml's .* open it once without read_only"):
        dbml.connect(path, read_only=True)
    con = dbml.connect(path, latency_model="roofline")
    assert con.execute("SELECT predict('m', [0.5])").fetchall()[0][0] > 0.9
    tables = {r[0] for r in con.execute("SHOW TABLES").fetchall()}
    assert "a" in tables and not {"dbml_models", "dbml_weights"} & {
        r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}
    assert con.execute("SELECT count(*) FROM dbml.models WHERE uid IS NOT NULL").fetchall() == [(1,)]
    con.close()
    ro = dbml.connect(path, read_only=True)
    assert ro.execute("SELECT predict('m', [0.5])").fetchall()[0][0] > 0.9
    ro.close()
