"""The start-up cache (dbml.core.startcache): what dbml's macros say, computed once per version
of their definitions and read back by later processes."""

import json

import dbml.udfs as udfs
from dbml.core import startcache


def test_the_cached_macros_are_what_reading_them_gives(tmp_path, monkeypatch):
    monkeypatch.setenv("DBML_CACHE_DIR", str(tmp_path))
    udfs.macro_definitions.cache_clear()
    try:
        cached = udfs.macro_definitions()
        [path] = (tmp_path / "startup").glob("macros-*.json")
        from importlib import resources

        from dbml.core.spec import train_macro_sql
        from dbml.search.tunespec import tune_macro_sql
        fresh = udfs._read_definitions(resources.files("dbml.sql").joinpath("macros.sql").read_text(),
                                       {"train": train_macro_sql(), "tune": tune_macro_sql()})
        assert cached == fresh == json.loads(path.read_text())
        assert fresh["generated"]["train"] == train_macro_sql().sql("duckdb")
        assert {"evaluate", "predictions", "explain", "tune"} <= udfs.table_macros() and "train" not in udfs.table_macros()
        assert udfs.macro_signatures()["evaluate"] == udfs.MacroSignature(("model", "source"), ("on_error",))
    finally:
        udfs.macro_definitions.cache_clear()


def test_other_inputs_compute_again_and_replace_the_old_answer(tmp_path, monkeypatch):
    monkeypatch.setenv("DBML_CACHE_DIR", str(tmp_path))
    calls = []

    def compute(value):
        calls.append(value)
        return {"value": value}
    assert startcache.cached("x", ["a"], lambda: compute(1)) == {"value": 1}
    assert startcache.cached("x", ["a"], lambda: compute(2)) == {"value": 1}   # read back
    assert startcache.cached("x", ["b"], lambda: compute(3)) == {"value": 3}   # a changed input
    assert calls == [1, 3] and len(list((tmp_path / "startup").glob("x-*.json"))) == 1


def test_a_folder_that_cannot_be_written_only_costs_the_time(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("DBML_CACHE_DIR", str(blocked))   # a file where the folder would be
    assert startcache.cached("x", ["a"], lambda: {"v": 1}) == {"v": 1}
