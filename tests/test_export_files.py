"""Issue 21, files: export_model never writes over a database file (from a read-only
connection neither), writes nothing while DuckDB's enable_external_access is false (but
under its allowed_directories), honours the umask, and turns file-system failures into an
error naming the path. Each test failed on 360a75c."""

from __future__ import annotations

import os
import stat

import duckdb
import pytest

import dbml

pytest.importorskip("onnx")


def _model(con) -> None:
    con.execute("CREATE TABLE pts AS SELECT range::DOUBLE AS a, range % 2 AS y FROM range(100)")
    con.execute("SELECT train('m', 'pts', label := 'y', epochs := 1, policy := 'eager')")


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_export_never_writes_over_an_attached_database_file(tmp_path):
    path = tmp_path / "shop.duckdb"
    con = dbml.connect(str(path), latency_model="roofline")
    _model(con)
    con.execute("CHECKPOINT")
    before = path.read_bytes()
    for target in (path, f"{path}.wal"):
        with pytest.raises(duckdb.Error, match=r"is the file of the attached database 'shop.duckdb'; writing there "
                                               r"would destroy it"):
            con.execute("SELECT export_model('m', ?, overwrite := true)", [str(target)]).fetchall()
    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).close()
    con.execute(f"ATTACH '{other}' AS other")
    with pytest.raises(duckdb.Error, match=r"attached database 'other.duckdb'"):
        con.execute("SELECT export_model('m', ?, overwrite := true)", [str(other)]).fetchall()
    con.close()
    assert path.read_bytes() == before
    ro = dbml.connect(str(path), read_only=True)
    with pytest.raises(duckdb.Error, match=r"is the file of the attached database"):
        ro.execute("SELECT export_model('m', ?, overwrite := true)", [str(path)]).fetchall()
    assert ro.execute("SELECT count(*) FROM dbml_models").fetchall() == [(1,)]
    ro.close()


def test_export_honours_enable_external_access(tmp_path):
    con = dbml.connect(latency_model="roofline")
    _model(con)
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    con.execute(f"SET allowed_directories = ['{allowed}']")
    con.execute("SET enable_external_access = false")
    with pytest.raises(duckdb.Error, match=r"enable_external_access is false, so DuckDB writes no files"):
        con.execute("SELECT export_model('m', ?)", [str(tmp_path / "m.onnx")]).fetchall()
    assert not (tmp_path / "m.onnx").exists()
    con.execute("SELECT export_model('m', ?)", [str(allowed / "m.onnx")]).fetchall()
    assert (allowed / "m.onnx").exists()


def test_exported_files_honour_the_umask(con, tmp_path):
    _model(con)
    old = os.umask(0o022)
    try:
        con.execute("SELECT export_model('m', ?)", [str(tmp_path / "m.onnx")]).fetchall()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.onnx").stat().st_mode) == 0o644


def test_file_system_failures_name_the_path(con, tmp_path):
    _model(con)
    long = tmp_path / ("x" * 300 + ".onnx")
    with pytest.raises(duckdb.Error, match=r"InvalidArgument: export_model\(\): cannot write .* \(File name too long\)"):
        con.execute("SELECT export_model('m', ?)", [str(long)]).fetchall()
    assert list(tmp_path.iterdir()) == []
