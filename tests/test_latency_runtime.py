"""The latency predictor from SQL and the CLI: install, the dbml_predictor view, cold start."""

from pathlib import Path

import duckdb
import pytest

import dbml
from dbml.core import latency

from helpers import job_of, load, moons


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty predictor cache, and no predictor loaded in this process."""
    monkeypatch.setenv("DBML_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(latency, "_PREDICTOR_CACHE", {})
    return tmp_path / "cache"


def train(con, name):
    return job_of(con, con.sql(f"SELECT train('{name}', 'SELECT x1, x2, label FROM moons', label := 'label', "
                               f"epochs := 1)").fetchall()[0][0])


@pytest.mark.slow
@pytest.mark.xdist_group("installed")   # one `dbml install --quick` for the session (conftest)
def test_cli_install_then_train_plans_with_the_predictor(installed_predictor, monkeypatch):
    """Not marked ``calibrates``: the calibration ran in the CLI's process, and conftest's
    guard fails this test if training here calibrated again."""
    r, cache = installed_predictor
    assert r.returncode == 0, r.stderr
    assert "100%" in r.stderr                                   # the progress bar ran to the end
    saved = Path(r.stdout.strip().splitlines()[-1].removeprefix("saved "))
    assert saved.exists() and saved.parent == cache
    monkeypatch.setenv("DBML_CACHE_DIR", str(cache))
    monkeypatch.setattr(latency, "_PREDICTOR_CACHE", {})
    written = saved.stat().st_mtime_ns
    con = dbml.connect()
    rows = con.sql("SELECT op, samples, r2, baseline_r2, median_rel_error, fingerprint, model_bytes "
                   "FROM dbml_predictor").fetchall()
    ops = {r[0] for r in rows}
    assert {"aten.mm.default", "aten.addmm.default"} <= ops
    assert all(r[1] > 0 and 0 < r[6] <= 5_000_000 and "torch=" in r[5] for r in rows)
    load(con, "moons", moons(800))
    assert train(con, "planned")["latency_model"] == "predictor"
    assert saved.stat().st_mtime_ns == written                  # loaded, not recalibrated and saved again
    con.close()


@pytest.mark.slow
@pytest.mark.calibrates
def test_train_without_a_predictor_calibrates_once_and_says_so(fresh_cache):
    con = dbml.connect()
    assert con.sql("SELECT count(*) FROM dbml_predictor").fetchall() == [(0,)]
    load(con, "moons", moons(800))
    first = train(con, "cold")
    assert "quick calibration ran now" in first["latency_model"]
    files = sorted(p.name for p in fresh_cache.iterdir())
    assert any(f.endswith(".pt") for f in files)
    assert train(con, "warm")["latency_model"] == "predictor"   # once per machine, not per job
    assert sorted(p.name for p in fresh_cache.iterdir()) == files
    result = con.sql("SELECT calibrate(quick := true)").fetchall()[0][0]
    assert result["op_kinds"] > 10 and result["samples"] > 100 and Path(result["path"]).exists()
    con.close()


def test_unknown_latency_model(con):
    load(con, "moons", moons(300))
    con.execute("SET VARIABLE dbml_latency_model = 'crystal ball'")
    with pytest.raises(duckdb.Error, match=r"latency_model 'crystal ball' is unknown; SET VARIABLE "
                                           r"dbml_latency_model = one of 'predictor', 'roofline'"):
        train(con, "m")
