"""The prediction UDFs as duckdb-python tests its own: a fresh connection per test,
inputs longer than one DuckDB vector, several models (and NULL names) in one vector
through the vectorised path (``inference.per_model``), and the exact error text.

The models are tiny linear ones, trained once per module into a database file (roofline
planning, a few epochs); each test opens its own connection to that file. Expected
values come from a reference computed here in numpy from the stored weights and
preprocessing, one row at a time, not from dbml's inference code.
"""

import io
import json
import re

import duckdb
import numpy as np
import pytest
import torch

import dbml

from helpers import linear, load, moons

VECTOR = duckdb.__standard_vector_size__
ROWS = 2 * VECTOR + 17          # two full vectors and a partial one


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A database with models 'pos' (y from a, b, c), 'neg' (-y) and 'side' (moons' label,
    classification); the connection that trained them is closed."""
    path = str(tmp_path_factory.mktemp("udfs") / "models.duckdb")
    con = dbml.connect(path, latency_model="roofline")
    load(con, "lin", linear(2000))
    load(con, "moons", moons(2000))
    args = "arch := 'linear', epochs := 2, batch_size := 256"
    con.sql(f"SELECT train(name, src, label := lbl, {args}) FROM (VALUES "
            "('pos', 'SELECT a, b, c, y FROM lin', 'y'), ('neg', 'SELECT a, b, c, -y AS z FROM lin', 'z'), "
            "('side', 'SELECT x1, x2, label FROM moons', 'label')) v(name, src, lbl)").fetchall()
    con.close()
    return path


@pytest.fixture
def db(trained):
    """A fresh connection for each test."""
    con = dbml.connect(trained, latency_model="roofline")
    yield con
    con.close()


class Reference:
    """Linear models' outputs computed here, one row at a time, from the stored weights and
    preprocessing of each model's latest version (read once)."""

    def __init__(self, con):
        self.con, self.models = con, {}

    def stored(self, name):
        if name not in self.models:
            blob, prep = self.con.execute(
                "SELECT w.weights, m.preprocessing FROM dbml_weights w JOIN dbml_models m USING (name, version) "
                "WHERE name = ? ORDER BY version DESC LIMIT 1", [name]).fetchall()[0]
            state = torch.load(io.BytesIO(blob), weights_only=True)
            self.models[name] = (state["weight"].double().numpy(), state["bias"].double().numpy(), json.loads(prep))
        return self.models[name]

    def logits(self, name, raw):
        w, b, prep = self.stored(name)
        mean = np.array([f["mean"] for f in prep["features"]])
        std = np.array([f["std"] for f in prep["features"]])
        return w @ ((np.asarray(raw, dtype=np.float64) - mean) / std) + b, prep

    def value(self, name, raw):
        """predict(): the unscaled regression value; NULL for a NULL name or features."""
        if name is None or raw is None:
            return None
        out, prep = self.logits(name, raw)
        return float(out[0] * prep["target_std"] + prep["target_mean"])


INPUTS = f"""SELECT range AS i,
    CASE range % 3 WHEN 0 THEN 'pos' WHEN 1 THEN 'neg' END AS name,
    CASE WHEN range % 7 = 5 THEN NULL ELSE [(range % 101) / 25.0 - 2, (range % 37) / 9.0 - 2, (range % 13) / 3.0 - 2] END AS f
    FROM range({ROWS})"""


@pytest.mark.slow   # ~1.3 s: out of the -m 'not slow' inner loop (under a minute)
def test_predict_over_several_vectors_and_models_matches_a_reference(db):
    """'pos', 'neg' and NULL names alternate row by row, in every vector; some feature
    lists are NULL. Every row gets its own model's prediction, NULL where a name or the
    features are NULL, in row order."""
    rows = db.sql(f"SELECT i, name, f, predict(name, f) FROM ({INPUTS}) ORDER BY i").fetchall()
    assert len(rows) == ROWS > 2 * VECTOR
    ref = Reference(db)
    want = [ref.value(name, f) for _, name, f, _ in rows]
    got = [p for *_, p in rows]
    assert [g is None for g in got] == [w is None for w in want]
    assert sum(w is not None for w in want) > VECTOR        # most rows are predicted
    np.testing.assert_allclose([g for g in got if g is not None], [w for w in want if w is not None],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.slow   # ~0.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_vector_of_one_model_gives_what_a_mixed_vector_gives(db):
    """Vectors naming only 'pos' (per_model's single-model path) against vectors where
    'pos' rows are mixed with NULL names (the split-and-reassemble path)."""
    mixed = db.sql(f"SELECT i, name, predict(name, f) FROM ({INPUTS}) WHERE name = 'pos' OR name IS NULL "
                   f"ORDER BY i").fetchall()
    alone = dict(db.sql(f"SELECT i, predict('pos', f) FROM ({INPUTS}) WHERE name = 'pos' ORDER BY i").fetchall())
    assert all(p is None for _, name, p in mixed if name is None)
    from_mixed = {i: p for i, name, p in mixed if name == "pos"}
    assert from_mixed.keys() == alone.keys() and len(alone) > VECTOR // 2
    assert [from_mixed[i] is None for i in alone] == [alone[i] is None for i in alone]
    np.testing.assert_allclose([from_mixed[i] for i in alone if alone[i] is not None],
                               [alone[i] for i in alone if alone[i] is not None], rtol=1e-6)


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_predict_label_and_proba_over_several_vectors(db):
    rows = db.sql(f"""SELECT range AS i, [(range % 89) / 30.0 - 1, (range % 53) / 40.0 - 0.5] AS f,
                             predict_label(CASE WHEN range % 11 = 3 THEN NULL ELSE 'side' END, f) AS label,
                             predict_proba('side', f) AS proba
                      FROM range({ROWS}) ORDER BY i""").fetchall()
    assert len(rows) == ROWS
    ref = Reference(db)
    for i, f, label, proba in rows:
        out, prep = ref.logits("side", f)
        p = np.exp(out - out.max())
        p /= p.sum()
        assert proba is None or list(proba) == [str(c) for c in prep["classes"]]   # named, in class order
        np.testing.assert_allclose(list(proba.values()), p, rtol=1e-5, atol=1e-6)
        assert label == (None if i % 11 == 3 else str(prep["classes"][int(np.argmax(out))]))
    assert {label for *_, label, _ in rows} == {None, "0", "1"}   # both classes occur


def udf_error(message: str) -> str:
    """``match=`` for a dbml error raised inside a UDF: the whole message, to the end."""
    return re.escape(message) + "$"


def test_unknown_model_in_a_mixed_vector_names_it(db):
    with pytest.raises(duckdb.InvalidInputException, match=udf_error(
            "ModelNotFound: predict(): no model named 'ghost'; train it first with train('ghost', ...) "
            "or pick one from SELECT name FROM dbml_models")):
        db.sql(f"SELECT predict(CASE WHEN range = {VECTOR + 5} THEN 'ghost' ELSE 'pos' END, [1.0, 2.0, 3.0]) "
               f"FROM range({ROWS})").fetchall()


def test_wrong_feature_count_names_the_features(db):
    with pytest.raises(duckdb.InvalidInputException, match=udf_error(
            "InvalidArgument: predict(): model 'pos' takes 3 features (a, b, c), got a list of 2; "
            "pass [a, b, c] in that order")):
        db.sql(f"SELECT predict('pos', CASE WHEN range = {ROWS - 1} THEN [1.0, 2.0] ELSE [1.0, 2.0, 3.0] END) "
               f"FROM range({ROWS})").fetchall()


def test_label_of_a_regression_model_points_to_predict(db):
    with pytest.raises(duckdb.InvalidInputException, match=udf_error(
            "InvalidArgument: predict_label(): model 'neg' is a regression model; use predict('neg', ...)")):
        db.sql("SELECT predict_label('neg', [1.0, 2.0, 3.0])").fetchall()


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_a_retrained_model_is_used_from_the_next_call(db):
    train = ("SELECT train('again', 'SELECT a, b, c, y FROM lin', label := 'y', arch := 'linear', epochs := 1, "
             "batch_size := 256, seed := {})")
    db.sql(train.format(1)).fetchall()
    before = db.sql("SELECT predict('again', [1.0, 2.0, 3.0])").fetchall()[0][0]
    assert before == pytest.approx(Reference(db).value("again", [1.0, 2.0, 3.0]), rel=1e-5)
    db.sql(train.format(5)).fetchall()
    after = db.sql("SELECT predict('again', [1.0, 2.0, 3.0])").fetchall()[0][0]
    assert after != before and after == pytest.approx(Reference(db).value("again", [1.0, 2.0, 3.0]), rel=1e-5)
