"""ML.EVALUATE, ML.CONFUSION_MATRIX and ML.ROC_CURVE agree with scikit-learn's metrics on the
same predictions (issue 24's goal): the predictions are ML.PREDICT's, the figures
scikit-learn's own functions of them."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dbml

sk = pytest.importorskip("sklearn.metrics")

ROWS = 1500   # more than one DuckDB vector


def frame(con, sql: str) -> dict:
    result = dbml.execute(con, sql)
    names = [d[0] for d in result.description]
    return dict(zip(names, map(list, zip(*result.fetchall()))))


def one(con, sql: str) -> dict:
    return {k: v[0] for k, v in frame(con, sql).items()}


@pytest.fixture(scope="module")
def con():
    c = dbml.connect(latency_model="roofline")
    # noisy labels: no model is perfect, so every metric is informative
    c.execute(f"""CREATE TABLE t AS
        SELECT a, b, c,
               (a + b + 0.8 * (hash(i, 1) % 1000 / 1000.0 - 0.5) > 1)::INTEGER AS y2,
               ['low', 'mid', 'high'][1 + least(2, floor((a + b + 0.6 * hash(i, 2) % 1000 / 1000.0) / 0.8))::INTEGER] AS y3,
               1 + 4 * a + 2 * b + (c = 'x')::INTEGER + (hash(i, 3) % 1000 / 1000.0) AS price
        FROM (SELECT range AS i, (range % 97) / 97.0 AS a, (range % 13) / 13.0 AS b,
                     ['x', 'y', 'z'][1 + range % 3] AS c FROM range({ROWS}))""")
    for name, kind, label in (("bin", "logistic_reg", "y2"), ("multi", "logistic_reg", "y3"),
                              ("reg", "linear_reg", "price")):
        dbml.execute(c, f"CREATE MODEL {name} OPTIONS(model_type='{kind}', input_label_cols=['{label}'], "
                        f"max_iterations=3, learn_rate=0.05) AS SELECT a, b, c, {label} FROM t")
    yield c
    c.close()


@pytest.mark.slow   # trains three models (module fixture)
@pytest.mark.parametrize("threshold", [None, 0.3])
def test_binary_classification_metrics_agree_with_scikit_learn(con, threshold):
    setting = "" if threshold is None else f", STRUCT({threshold} AS threshold)"
    p = frame(con, f"SELECT y2, predicted_y2, predicted_y2_probs FROM ML.PREDICT(MODEL bin, TABLE t{setting})")
    y, prob1 = np.array(p["y2"]), np.array([{d["label"]: d["prob"] for d in r}[1] for r in p["predicted_y2_probs"]])
    pred = (prob1 >= (threshold or 0.5)).astype(int)
    assert (np.array(p["predicted_y2"]) == pred).all()
    got = one(con, f"SELECT * FROM ML.EVALUATE(MODEL bin, TABLE t{setting})")
    want = {"precision": sk.precision_score(y, pred), "recall": sk.recall_score(y, pred),
            "accuracy": sk.accuracy_score(y, pred), "f1_score": sk.f1_score(y, pred),
            "log_loss": sk.log_loss(y, np.stack([1 - prob1, prob1], 1)), "roc_auc": sk.roc_auc_score(y, prob1)}
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert 0.6 < want["accuracy"] < 0.99                    # neither chance nor perfect: the test means something
    matrix = frame(con, f"SELECT * FROM ML.CONFUSION_MATRIX(MODEL bin, TABLE t{setting})")
    assert matrix["expected_label"] == ["0", "1"]
    assert np.array([matrix["_0"], matrix["_1"]]).T.tolist() == sk.confusion_matrix(y, pred).tolist()


@pytest.mark.slow
def test_roc_curve_agrees_with_scikit_learn(con):
    p = frame(con, "SELECT y2, predicted_y2_probs FROM ML.PREDICT(MODEL bin, TABLE t)")
    y, prob1 = np.array(p["y2"]), np.array([{d["label"]: d["prob"] for d in r}[1] for r in p["predicted_y2_probs"]])
    fpr, tpr, thresholds = sk.roc_curve(y, prob1, drop_intermediate=False)
    chosen = thresholds[1:][:: max(1, len(thresholds) // 20)]
    curve = frame(con, f"SELECT * FROM ML.ROC_CURVE(MODEL bin, TABLE t, [{', '.join(repr(float(t)) for t in chosen)}])")
    want = {t: (f, r) for t, f, r in zip(thresholds, fpr, tpr)}
    for t, f, r in zip(curve["threshold"], curve["false_positive_rate"], curve["recall"]):
        assert (f, r) == pytest.approx(want[t], abs=1e-12)
    assert all(tp + fn == y.sum() and fp + tn == len(y) - y.sum() for tp, fp, tn, fn in
               zip(curve["true_positives"], curve["false_positives"], curve["true_negatives"], curve["false_negatives"]))
    default = frame(con, "SELECT * FROM ML.ROC_CURVE(MODEL bin, TABLE t)")    # BigQuery's own thresholds
    assert len(default["threshold"]) > 20 and default["threshold"] == sorted(default["threshold"], reverse=True)


@pytest.mark.slow
def test_multiclass_metrics_are_scikit_learns_macro_averages(con):
    p = frame(con, "SELECT y3, predicted_y3, predicted_y3_probs FROM ML.PREDICT(MODEL multi, TABLE t)")
    (classes,), = con.execute("SELECT preprocessing->'classes' FROM dbml_models WHERE name = 'multi'").fetchall()
    classes = json.loads(classes)
    prob = np.array([[{d["label"]: d["prob"] for d in r}[c] for c in classes] for r in p["predicted_y3_probs"]])
    y, pred = p["y3"], p["predicted_y3"]
    got = one(con, "SELECT * FROM ML.EVALUATE(MODEL multi, TABLE t)")
    want = {"precision": sk.precision_score(y, pred, average="macro", zero_division=0),
            "recall": sk.recall_score(y, pred, average="macro", zero_division=0),
            "accuracy": sk.accuracy_score(y, pred), "f1_score": sk.f1_score(y, pred, average="macro", zero_division=0),
            "log_loss": sk.log_loss(y, prob, labels=classes),
            "roc_auc": sk.roc_auc_score(y, prob, multi_class="ovr", average="macro", labels=classes)}
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert 0.4 < want["accuracy"] < 0.99


@pytest.mark.slow
def test_regression_metrics_agree_with_scikit_learn(con):
    p = frame(con, "SELECT price, predicted_price FROM ML.PREDICT(MODEL reg, TABLE t)")
    y, pred = np.array(p["price"]), np.array(p["predicted_price"])
    got = one(con, "SELECT * FROM ML.EVALUATE(MODEL reg, TABLE t)")
    want = {"mean_absolute_error": sk.mean_absolute_error(y, pred), "mean_squared_error": sk.mean_squared_error(y, pred),
            "mean_squared_log_error": sk.mean_squared_log_error(y, pred),
            "median_absolute_error": sk.median_absolute_error(y, pred), "r2_score": sk.r2_score(y, pred),
            "explained_variance": sk.explained_variance_score(y, pred)}
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert 0.5 < want["r2_score"] < 1


@pytest.mark.slow   # trains a k-means model
def test_davies_bouldin_index_is_scikit_learns():
    con = dbml.connect(latency_model="roofline")
    con.execute("CREATE TABLE p AS SELECT (range % 3) * 4 + (hash(range, 1) % 1000) / 1000.0 AS u, "
                "(range % 3) * 2 + (hash(range, 2) % 1000) / 500.0 AS v FROM range(600)")
    dbml.execute(con, "CREATE MODEL km OPTIONS(model_type='kmeans', num_clusters=3, max_iterations=50, "
                      "min_rel_progress=0) AS SELECT u, v FROM p")
    got = one(con, "SELECT * FROM ML.EVALUATE(MODEL km)")
    p = frame(con, "SELECT u, v, CENTROID_ID FROM ML.PREDICT(MODEL km, TABLE p)")
    (prep,), = con.execute("SELECT preprocessing FROM dbml_models WHERE name = 'km'").fetchall()
    stats = {f["name"]: (f["mean"], f["std"]) for f in json.loads(prep)["features"]}
    x = np.stack([(np.array(p[c]) - stats[c][0]) / stats[c][1] for c in ("u", "v")], 1)
    assert got["davies_bouldin_index"] == pytest.approx(sk.davies_bouldin_score(x, p["CENTROID_ID"]), rel=1e-4)
    con.close()
