"""ONNX export (dbml/export.py): onnxruntime's predictions match dbml's on 1,000 rows."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

import dbml

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

TOLERANCE = 1e-4


def session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def dbml_probabilities(con, model: str, expr: str, table: str) -> np.ndarray:
    return np.array([r[0] for r in con.execute(f"SELECT map_values(predict_proba('{model}', {expr})) FROM {table} "
                                               f"ORDER BY id").fetchall()])


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_an_mlp_takes_raw_features_with_its_standardisation_folded_in(con, tmp_path):
    con.execute("CREATE TABLE pts AS SELECT range AS id, (range % 100) * 3.0 - 40 AS a, "
                "CASE WHEN range % 13 = 0 THEN NULL ELSE (range % 7) * 1000.0 END AS b, "
                "CASE WHEN (range % 100) > 50 THEN 'hi' ELSE 'lo' END AS y FROM range(1000)")
    con.sql("SELECT train('m', 'SELECT a, b, y FROM pts', label := 'y', arch := 'mlp', epochs := 2)").fetchall()
    out = con.execute(f"SELECT export_model('m', '{tmp_path / 'm.onnx'}')").fetchall()[0][0]
    assert out["input"] == "features" and out["features"] == ["a", "b"] and out["outputs"] == ["logits", "probabilities"]
    x = np.array(con.execute("SELECT a, b FROM pts ORDER BY id").fetchall(), dtype=np.float64)
    x = np.where(np.equal(x, None), np.nan, x).astype(np.float32)   # NULL -> NaN, as the export says
    _, probabilities = session(tmp_path / "m.onnx").run(None, {"features": x})
    want = dbml_probabilities(con, "m", "[a, b]", "pts")
    assert np.abs(probabilities - want).max() <= TOLERANCE
    meta = {p.key: p.value for p in onnx.load(tmp_path / "m.onnx").metadata_props}
    assert json.loads(meta["dbml.classes"]) == ["hi", "lo"] and meta["dbml.model"] == "m"


@pytest.mark.slow   # trains a small CNN
def test_a_cnn_takes_pixels_with_its_channel_normalisation_folded_in(con, tmp_path):
    con.execute("CREATE TABLE imgs AS SELECT range AS id, list_transform(range(64), "
                "lambda i: ((i * 7 + range * 13) % 17) / 16.0 + CASE WHEN range % 3 = 0 AND i < 32 THEN 1.0 ELSE 0.0 END)"
                "::FLOAT[] AS px, (range % 3 = 0)::INTEGER AS y FROM range(1000)")
    con.sql("SELECT train('c', 'SELECT px, y FROM imgs', label := 'y', arch := 'cnn', shape := [1, 8, 8], "
            "options := '{\"width\": 4, \"depth\": 2}', epochs := 1)").fetchall()
    dbml.export_model(con, "c", str(tmp_path / "c.onnx"))
    x = np.array([r[0] for r in con.execute("SELECT px FROM imgs ORDER BY id").fetchall()],
                 dtype=np.float32).reshape(-1, 1, 8, 8)
    _, probabilities = session(tmp_path / "c.onnx").run(None, {"image": x})
    assert np.abs(probabilities - dbml_probabilities(con, "c", "px", "imgs")).max() <= TOLERANCE


@pytest.mark.slow   # trains a small transformer
def test_a_transformer_takes_token_ids(con, tmp_path):
    words = "['alpha', 'beta', 'gamma', 'delta', 'omega', 'sigma']"
    con.execute(f"CREATE TABLE docs AS SELECT range AS id, array_to_string(list_transform(range(4 + range % 5), "
                f"lambda i: {words}[1 + (i * 3 + range) % 6]), ' ') AS body, (range % 2) AS y FROM range(1000)")
    con.sql("SELECT train('t', 'SELECT body, y FROM docs', label := 'y', arch := 'transformer', "
            "options := '{\"width\": 16, \"depth\": 1, \"heads\": 2, \"ff\": 32}', epochs := 1)").fetchall()
    out = dbml.export_model(con, "t", str(tmp_path / "t.onnx"))
    assert out["input"] == "tokens"
    encoder = dbml.core.inference.catalog.load(con.duckdb.cursor(), "t", 1).preprocessing.input
    bodies = [r[0] for r in con.execute("SELECT body FROM docs ORDER BY id").fetchall()]
    ids = encoder.to_tensor(pa.array(bodies)).numpy()       # dbml's tokenisation: not in the graph
    _, probabilities = session(tmp_path / "t.onnx").run(None, {"tokens": ids})
    assert np.abs(probabilities - dbml_probabilities(con, "t", "body", "docs")).max() <= TOLERANCE


def test_a_regressor_returns_the_label_in_its_units(con, tmp_path):
    con.execute("CREATE TABLE h AS SELECT range AS id, range / 10.0 AS size, 1000 + 3 * range AS price "
                "FROM range(1000)")
    con.sql("SELECT train('r', 'SELECT size, price FROM h', label := 'price', arch := 'linear', epochs := 2)").fetchall()
    dbml.export_model(con, "r", str(tmp_path / "r.onnx"))
    x = np.array(con.execute("SELECT size FROM h ORDER BY id").fetchall(), dtype=np.float32)
    (value,) = session(tmp_path / "r.onnx").run(None, {"features": x})
    want = np.array([r[0] for r in con.execute("SELECT predict('r', [size]) FROM h ORDER BY id").fetchall()])
    assert np.abs(value - want).max() <= TOLERANCE * max(1.0, np.abs(want).max())


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_bad_exports_name_the_argument_and_write_nothing(con, tmp_path):
    con.execute("CREATE TABLE pts AS SELECT range::DOUBLE AS a, range % 2 AS y FROM range(100)")
    con.sql("SELECT train('m', 'pts', label := 'y', epochs := 1)").fetchall()
    target = tmp_path / "m.onnx"
    target.write_text("keep me")
    with pytest.raises(Exception, match="exists; pass overwrite := true"):
        con.execute(f"SELECT export_model('m', '{target}')").fetchall()
    assert target.read_text() == "keep me"                      # nothing lost
    con.execute(f"SELECT export_model('m', '{target}', overwrite := true)").fetchall()
    assert onnx.load(target).graph.input[0].name == "features"
    with pytest.raises(Exception, match="no model named 'nope'"):
        con.execute(f"SELECT export_model('nope', '{tmp_path / 'n.onnx'}')").fetchall()
    with pytest.raises(Exception, match="the folder .* does not exist"):
        con.execute(f"SELECT export_model('m', '{tmp_path / 'no' / 'x.onnx'}')").fetchall()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]   # no temporary file left
