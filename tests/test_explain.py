"""explain(model, source) and the model kinds behind BigQuery ML (dbml/explain.py, dbml/kinds/):
attributions complete (they sum to prediction - baseline), exact where the model allows it,
predictions unchanged; trees and k-means agree with their libraries."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

import dbml

ROWS = 3000   # more than one DuckDB vector


@pytest.fixture
def tab(con):
    con.execute(f"CREATE TABLE t AS SELECT a, c, 2 * a + (c = 'q')::INTEGER + (range % 7) / 70.0 AS y, "
                f"(a + (c = 'q')::INTEGER * 0.3 > 0.6)::INTEGER AS k FROM "
                f"(SELECT range, (range % 101) / 100.0 AS a, ['p', 'q'][1 + range % 2] AS c FROM range({ROWS}))")
    return con


def explained(con, model: str, source: str = "t") -> dict:
    result = con.execute(f"SELECT * FROM explain('{model}', '{source}')")
    names = [d[0] for d in result.description]
    return dict(zip(names, map(list, zip(*result.fetchall()))))


def complete(e: dict) -> np.ndarray:
    total = np.array([sum(a["attribution"] for a in row) for row in e["attributions"]])
    return np.abs(total - (np.array(e["prediction_value"]) - np.array(e["baseline_value"])))


@pytest.mark.slow   # trains a model
def test_linear_regression_is_explained_exactly(tab):
    tab.execute("SELECT train('lin', 't', label := 'y', features := ['a', 'c'], arch := 'linear', epochs := 3)")
    e = explained(tab, "lin")
    assert list(e)[:4] == ["a", "c", "y", "k"] and list(e)[4:] == ["prediction", "attributions", "baseline_value",
                                                                   "prediction_value", "approximation_error"]
    assert len(e["a"]) == ROWS and [f["feature"] for f in e["attributions"][0]] == ["a", "c"]
    assert np.allclose(e["prediction_value"], e["prediction"], atol=1e-4)   # regression: the prediction itself
    assert complete(e).max() < 1e-4 and max(e["approximation_error"]) < 1e-4
    assert len(set(e["baseline_value"])) == 1                           # one baseline: the training means
    a = np.array([row[0]["attribution"] for row in e["attributions"]])
    assert np.corrcoef(a, e["a"])[0, 1] > 0.999                         # linear in the column


@pytest.mark.slow
def test_a_network_is_explained_by_integrated_gradients(tab):
    tab.execute("SELECT train('net', 't', label := 'k', features := ['a', 'c'], arch := 'mlp', epochs := 2)")
    e = explained(tab, "net", "SELECT * FROM t LIMIT 200")
    assert set(e["prediction"]) <= {0, 1} and len(e["prediction"]) == 200
    assert np.allclose(complete(e), e["approximation_error"], atol=1e-9)   # what it misses, it says
    gap = np.abs(np.array(e["prediction_value"]) - np.array(e["baseline_value"]))
    assert np.median(np.array(e["approximation_error"]) / gap) < 0.01


@pytest.mark.slow
def test_trees_are_explained_by_treeshap_and_predict_as_lightgbm(tab):
    lgb = pytest.importorskip("lightgbm")
    tab.execute("SELECT train('gb', 't', label := 'y', features := ['a', 'c'], arch := 'boosted_tree', "
                "options := '{\"max_iterations\": 30}')")
    e = explained(tab, "gb")
    assert complete(e).max() < 1e-6 and max(e["approximation_error"]) == 0
    assert np.allclose(e["prediction_value"], e["prediction"], atol=1e-6)
    tab.execute("SELECT train('rf', 't', label := 'k', features := ['a', 'c'], arch := 'random_forest', "
                "options := '{\"num_parallel_tree\": 20}')")
    from dbml.core.catalog import load
    model = load(tab, "rf", 1)
    x = np.random.default_rng(0).normal(size=(50, model.preprocessing.width)).astype(np.float32)
    probs = model.module.model().predict(x.astype(np.float64))          # LightGBM's own: the trees' mean
    ours = np.exp(model.module.raw(x))
    assert np.allclose(ours[:, 1] / ours.sum(1), probs, atol=1e-9)
    assert isinstance(model.module.model(), lgb.Booster)
    pytest.importorskip("onnx")
    with pytest.raises(duckdb.Error, match="model 'rf' is a random_forest model, which the ONNX export does not"):
        tab.execute("SELECT export_model('rf', 'rf.onnx')")


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_the_default_model_is_explained_without_captum(con, monkeypatch):
    """The default arch (an MLP) is explained by dbml's own integrated gradients: nothing to
    install (a module set to None in sys.modules cannot be imported)."""
    monkeypatch.setitem(__import__("sys").modules, "captum", None)
    monkeypatch.setitem(__import__("sys").modules, "captum.attr", None)
    con.execute("CREATE TABLE t AS SELECT range % 13 / 13.0 AS a, range % 7 / 7.0 AS b, "
                "range % 13 / 13.0 + range % 7 / 7.0 AS y FROM range(300)")
    con.execute("SELECT train('m', 't', label := 'y', epochs := 1)")
    assert con.execute("SELECT arch FROM dbml_models").fetchall() == [("mlp",)]
    e = explained(con, "m", "SELECT * FROM t LIMIT 50")
    gap = np.abs(np.array(e["prediction_value"]) - np.array(e["baseline_value"]))
    assert np.allclose(complete(e), e["approximation_error"], atol=1e-9)
    assert np.median(np.array(e["approximation_error"]) / gap) < 0.01


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
@pytest.mark.parametrize("arch", ["mlp", "linear"])
def test_a_classifier_explains_the_probability_of_its_class(con, arch):
    """prediction_value is the predicted class's probability (predict_proba's), the baseline the
    baseline row's, and the attributions split the difference (ML.EXPLAIN_PREDICT's too)."""
    con.execute("CREATE TABLE t AS SELECT range % 13 / 13.0 AS a, range % 7 / 7.0 AS b, "
                "CASE WHEN range % 13 / 13.0 > range % 7 / 7.0 THEN 'up' ELSE 'down' END AS k FROM range(300)")
    con.execute(f"SELECT train('m', 't', label := 'k', epochs := 2, arch := '{arch}')")
    e = explained(con, "m", "SELECT * FROM t LIMIT 40")
    probs = con.execute("SELECT predict_proba('m', [a, b]) FROM (SELECT * FROM t LIMIT 40)").fetchall()
    assert np.allclose(e["prediction_value"], [p[label] for (p,), label in zip(probs, e["prediction"])], atol=1e-6)
    assert all(0 < v < 1 for v in e["baseline_value"] + e["prediction_value"])
    assert np.allclose(complete(e), e["approximation_error"], atol=1e-9) and max(e["approximation_error"]) < 1e-2
    bq = dbml.execute(con, "SELECT probability, prediction_value FROM ML.EXPLAIN_PREDICT(MODEL m, "
                           "(SELECT a, b FROM t LIMIT 40))").fetchall()
    assert np.allclose([p for p, _ in bq], [v for _, v in bq], atol=1e-6)


@pytest.mark.slow
def test_classification_explains_the_predicted_class(tab):
    tab.execute("SELECT train('cls', 't', label := 'c', features := ['a', 'y'], arch := 'linear', epochs := 2)")
    e = explained(tab, "cls", "SELECT * FROM t LIMIT 100")
    predicted = tab.execute("SELECT prediction FROM predictions('cls', 'SELECT * FROM t LIMIT 100')").fetchall()
    assert e["prediction"] == [p for (p,) in predicted] and set(e["prediction"]) <= {"p", "q"}
    assert complete(e).max() < 1e-4


@pytest.mark.slow   # ~2.4 s: out of the -m 'not slow' inner loop (under a minute)
def test_explain_names_what_it_cannot_do(tab):
    with pytest.raises(duckdb.Error, match="no model named 'nope'"):
        tab.execute("SELECT * FROM explain('nope', 't')")
    tab.execute("CREATE TABLE s AS SELECT [range, range + 1]::FLOAT[] AS series, range % 2 AS y FROM range(200)")
    tab.execute("SELECT train('seq', 's', label := 'y', epochs := 1)")
    with pytest.raises(duckdb.Error, match="explain\\(\\): model 'seq' takes series input; explanations cover "
                                           "tabular models"):
        tab.execute("SELECT * FROM explain('seq', 's')")
    with pytest.raises(duckdb.Error, match="is empty|one SELECT"):
        tab.execute("SELECT * FROM explain('seq', 'DROP TABLE s')")
    assert tab.execute("SELECT count(*) FROM s").fetchall() == [(200,)]


@pytest.mark.slow   # trains a k-means model
def test_kmeans_finds_separated_clusters():
    con = dbml.connect(latency_model="roofline")
    con.execute("CREATE TABLE p AS SELECT (range % 3) * 10 + (hash(range) % 100) / 100.0 AS u FROM range(300)")
    dbml.execute(con, "CREATE MODEL km OPTIONS(model_type='kmeans', num_clusters=3) AS SELECT u FROM p")
    assign = dbml.execute(con, "SELECT CAST(floor(u / 10) AS INTEGER) AS g, count(DISTINCT CENTROID_ID) AS ids "
                               "FROM ML.PREDICT(MODEL km, TABLE p) GROUP BY g ORDER BY g").fetchall()
    assert assign == [(0, 1), (1, 1), (2, 1)]                           # each true cluster one centroid
    centroids = dbml.execute(con, "SELECT numerical_value FROM ML.CENTROIDS(MODEL km) ORDER BY 1").fetchall()
    means = con.execute("SELECT avg(u) FROM p GROUP BY floor(u / 10) ORDER BY 1").fetchall()
    assert [c for (c,) in centroids] == pytest.approx([m for (m,) in means], rel=1e-5)   # the column's own units
    con.close()


def test_readme_documents_every_kind_and_its_options():
    from pathlib import Path
    from dbml.core.kinds import ARCHS
    from dbml.zoo import arch
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    table = readme.split("Beside the zoo, `dbml/core/kinds/`", 1)[1].split("\n\n", 2)[1]
    for name in ARCHS:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{name}` |"))
        for option in arch(name).options:
            assert f"`{option}`" in row, (name, option)


_READ_ONLY_SCRIPT = """
import sys, warnings
import dbml
con = dbml.connect(latency_model="roofline")
con.execute("CREATE TABLE t AS SELECT (range % 101) / 100.0 AS a, (range % 7)::FLOAT AS b, "
            "((range % 101) / 100.0 > 0.5)::INTEGER AS k FROM range(3000)")
# torch's warning about Arrow's read-only arrays, as a user's warnings-as-errors turns it
warnings.filterwarnings("error", message="The given NumPy array is not writable")
for arch in ("auto", "linear"):
    con.execute(f"SELECT train('m_{arch}', 't', label := 'k', arch := '{arch}', epochs := 2)")
    con.execute(f"SELECT * FROM predictions('m_{arch}', 't')").fetchall()
    con.execute(f"SELECT * FROM explain('m_{arch}', 't')").fetchall()
    con.execute(f"SELECT evaluate('m_{arch}', 't'), predict('m_{arch}', [0.5, 2.0])").fetchall()
dbml.execute(con, "CREATE MODEL km OPTIONS(model_type='kmeans', num_clusters=3, max_iterations=2) AS SELECT a, b FROM t")
print("ok")
"""


@pytest.mark.slow   # a fresh process (torch warns once per process), trains three models
def test_no_read_only_array_warning_from_training_predictions_or_explain(tmp_path):
    """dbml hands Arrow's read-only rows to torch without its "not writable" warning, so it
    neither prints on the first predictions/explain nor fails a statement under a user's
    warnings-as-errors (dbml's own filter for it was overridden by the user's)."""
    import subprocess
    import sys
    from pathlib import Path
    done = subprocess.run([sys.executable, "-c", _READ_ONLY_SCRIPT], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "ok", done.stderr[-3000:]
    assert "not writable" not in done.stderr
