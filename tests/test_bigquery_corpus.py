"""Every statement of Google's BigQuery ML tutorials and reference pages (tests/bigquery_corpus/,
each with its URL) runs verbatim through ``dbml.execute``, in its file's order, on tables of
the same names and columns (tests/bigquery_tables.py); each model function's result has the
columns BigQuery ML documents, in its order. Issue 24's goal: a clear "not supported in dbml"
error counts only for remote and AutoML models, and the corpus has none, so every statement
must run.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

import dbml
from bigquery_tables import create

pytest.importorskip("lightgbm", reason="the corpus trains boosted trees and random forests: pip install 'dbml[trees]'")

CORPUS = Path(__file__).parent / "bigquery_corpus"
FILES = sorted(CORPUS.glob("*.sql"))

# BigQuery ML's documented output columns of each function (its reference pages), first ones
# in order; PREDICT and EXPLAIN_PREDICT are followed by the input columns.
REGRESSION = ["mean_absolute_error", "mean_squared_error", "mean_squared_log_error", "median_absolute_error",
              "r2_score", "explained_variance"]
CLASSIFICATION = ["precision", "recall", "accuracy", "f1_score", "log_loss", "roc_auc"]
CLUSTERING = ["davies_bouldin_index", "mean_squared_distance"]
DOCUMENTED = {
    "TRAINING_INFO": [["training_run", "iteration", "loss", "eval_loss", "learning_rate", "duration_ms"]],
    "EVALUATE": [REGRESSION, CLASSIFICATION, CLUSTERING,   # a tuned model's: its trial first
                 ["trial_id", *REGRESSION], ["trial_id", *CLASSIFICATION]],
    "ROC_CURVE": [["threshold", "recall", "false_positive_rate", "true_positives", "false_positives",
                   "true_negatives", "false_negatives"]],
    "FEATURE_INFO": [["input", "min", "max", "mean", "median", "stddev", "category_count", "null_count",
                      "dimension"]],
    "WEIGHTS": [["processed_input", "weight", "category_weights"],
                ["trial_id", "processed_input", "weight", "category_weights"]],   # a tuned model's
    "GLOBAL_EXPLAIN": [["feature", "attribution"], ["class_label", "feature", "attribution"]],
    "FEATURE_IMPORTANCE": [["feature", "importance_weight", "importance_gain", "importance_cover"]],
    "TRIAL_INFO": [["trial_id", "hyperparameters", "hparam_tuning_evaluation_metrics", "training_loss",
                    "eval_loss", "status", "error_message", "is_optimal"]],
    "CENTROIDS": [["centroid_id", "feature", "numerical_value", "categorical_value"]],
    "CONFUSION_MATRIX": [["expected_label"]],
    "PREDICT": [["predicted_"], ["CENTROID_ID", "NEAREST_CENTROIDS_DISTANCE"]],
    "EXPLAIN_PREDICT": [["predicted_", "top_feature_attributions", "baseline_prediction_value", "prediction_value",
                         "approximation_error"],
                        ["predicted_", "probability", "top_feature_attributions", "baseline_prediction_value",
                         "prediction_value", "approximation_error"]],
}


def whole_function(statement: str) -> str | None:
    """The function of a statement that is ``SELECT * FROM ML.<function>(...)`` and nothing else."""
    from sqlglot import exp
    from dbml.bigquery.parse import MLFunction, function_name, parse
    tree = parse(statement)
    source = tree.args.get("from_") or tree.args.get("from")
    if not isinstance(tree, exp.Select) or [e.sql() for e in tree.expressions] != ["*"] or source is None \
            or any(tree.args.get(k) for k in ("joins", "where", "group", "order", "limit", "qualify")):
        return None
    node = source.this.this if isinstance(source.this, exp.Table) else source.this
    if isinstance(node, exp.Predict):
        return "PREDICT"
    return function_name(node) if isinstance(node, MLFunction) else None


def statements(path: Path) -> list[tuple[str, str]]:
    """(source URL, statement) of a corpus file: each statement follows its ``-- source:`` line."""
    chunks = re.split(r"^-- source: (\S+)\n", path.read_text(), flags=re.MULTILINE)
    assert chunks[0].strip() == "", f"{path.name}: text before the first -- source: line"
    return [(url, text.strip().rstrip(";")) for url, text in zip(chunks[1::2], chunks[2::2])]


def _matches(columns: list[str], documented: list[str]) -> bool:
    head = columns[:len(documented)]
    return all(c == d or (d.endswith("_") and c.startswith(d)) for c, d in zip(head, documented)) \
        and len(head) == len(documented)


def test_the_corpus_is_the_one_of_the_issue():
    counted = [s for path in FILES for s in statements(path)]
    assert len(FILES) == 13 and len(counted) == 90
    assert all(url.startswith("https://cloud.google.com/") for url, _ in counted)


@pytest.mark.slow   # the corpus trains 30 models: about 25 s in all on 2 cores
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_statement_runs_verbatim(path):
    con = dbml.connect(latency_model="roofline")
    create(con)
    failures = []
    for i, (url, statement) in enumerate(statements(path), 1):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = dbml.execute(con, statement)
                columns = [d[0] for d in result.description] if result is not None and result.description else []
                rows = result.fetchall() if columns else []
        except Exception as e:  # noqa: BLE001 - every failure is listed, with its statement
            failures.append(f"#{i} ({url}): {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            continue
        fn = whole_function(statement)
        if fn is not None:
            if not any(_matches(columns, d) for d in DOCUMENTED[fn]):
                failures.append(f"#{i} ({url}): ML.{fn} returned columns {columns}, not BigQuery ML's "
                                f"{' or '.join(map(str, DOCUMENTED[fn]))}")
            elif fn != "CONFUSION_MATRIX" and not rows:
                failures.append(f"#{i} ({url}): ML.{fn} returned no rows")
    con.close()
    assert not failures, f"{path.name}: {len(failures)} statement(s) failed:\n" + "\n".join(failures)
