"""ONNX export of series and text models (issue 24 part 3): onnxruntime on sequences longer
than any training one matches dbml's predict to 1e-5; the metadata carries max_len, the
series scaling and the tokenizer's rule, enough to tokenize as dbml does."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import dbml

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

TOLERANCE = 1e-5
SMALL = "options := '{\"width\": 8, \"depth\": 1, \"heads\": 2, \"ff\": 16}', epochs := 1, policy := 'eager'"


def _run(path, name: str, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["probabilities"], {name: x})[0]


def _meta(path) -> dict:
    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


@pytest.mark.parametrize("scale", ["global", "row"])
@pytest.mark.slow   # ~0.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_series_model_runs_in_onnxruntime_on_longer_series(con, tmp_path, scale):
    con.execute("""CREATE TABLE s AS SELECT range AS id, list_transform(range(4 + range % 5),
        lambda i: ((range % 4) * 10.0 + CASE WHEN range % 2 = 0 THEN i ELSE -i END * 0.5)::FLOAT)::DOUBLE[] AS xs,
        (range % 2)::INTEGER AS y FROM range(30)""")
    con.execute(f"SELECT train('m', 's', label := 'y', features := ['xs'], arch := 'transformer', "
                f"series_scale := '{scale}', {SMALL})").fetchall()
    out = dbml.export_model(con, "m", str(tmp_path / "m.onnx"))
    assert out["input"] == "series"
    meta = _meta(tmp_path / "m.onnx")
    assert meta["dbml.max_len"] == "8" and meta["dbml.series_scale"] == scale
    rng = np.random.default_rng(0)
    series = [list(np.round(rng.normal(5, 3, n), 3)) for n in (3, 8, 12, 20)]   # up to 20 steps: past max_len 8
    series[1][2] = None                                                           # a NULL element
    x = np.full((len(series), 24), np.nan, dtype=np.float32)                      # NaN: NULL and padding
    for i, v in enumerate(series):
        x[i, :len(v)] = [np.nan if e is None else e for e in v]
    want = np.array([con.execute("SELECT map_values(predict_proba('m', ?::FLOAT[]))", [v]).fetchall()[0][0] for v in series])
    assert np.abs(_run(tmp_path / "m.onnx", "series", x) - want).max() <= TOLERANCE


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_a_text_model_runs_in_onnxruntime_on_texts_longer_than_any_training_text(con, tmp_path):
    words = "['alpha', 'beta', 'gamma', 'delta', 'omega', 'sigma']"
    con.execute(f"CREATE TABLE docs AS SELECT range AS id, array_to_string(list_transform(range(4 + range % 3), "
                f"lambda i: {words}[1 + (i * 3 + range) % 6]), ' ') AS body, (range % 2) AS y FROM range(30)")
    con.execute(f"SELECT train('t', 'docs', label := 'y', features := ['body'], arch := 'transformer', "
                f"{SMALL})").fetchall()
    dbml.export_model(con, "t", str(tmp_path / "t.onnx"))
    meta = _meta(tmp_path / "t.onnx")
    rule, vocab = json.loads(meta["dbml.tokenizer"]), json.loads(meta["dbml.vocab"])
    assert int(meta["dbml.max_len"]) == rule["max_len"] == 6
    texts = ["Alpha, BETA gamma!", "omega " * 40 + "zeta", "delta"]                # 81 tokens: past max_len
    ids = [[vocab.index(t) + 2 if t in vocab else rule["unknown"]                   # tokenised from the metadata
            for t in re.findall(rule["pattern"], s.lower())] or rule["no_tokens"] for s in texts]
    x = np.full((len(ids), max(map(len, ids))), rule["padding"], dtype=np.int64)
    for i, row in enumerate(ids):
        x[i, :len(row)] = row
    want = np.array([con.execute("SELECT map_values(predict_proba('t', ?))", [s]).fetchall()[0][0] for s in texts])
    assert np.abs(_run(tmp_path / "t.onnx", "tokens", x) - want).max() <= TOLERANCE
