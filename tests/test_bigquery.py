"""BigQuery ML syntax (dbml/bigquery/): rewritten into dbml calls by dbml.execute and the shell,
one entry point (``dbml.bigquery.translate``) for both."""

from __future__ import annotations

import io
import json

import pytest
from sqlglot import parse_one

import dbml
from dbml import bigquery
from dbml.bigquery import create, looks_like_bigquery
from dbml.shell import run

TABLE = ("CREATE TABLE pts AS SELECT (range % 100) / 100.0 AS a, (range % 7) / 7.0 AS b, "
         "CASE WHEN (range % 100) / 100.0 + (range % 7) / 7.0 > 1 THEN 1 ELSE 0 END AS y FROM range(1000)")
CREATE = ("CREATE {how} `shop.m` OPTIONS(model_type = 'logistic_reg', input_label_cols = ['y'], "
          "max_iterations = 4, learn_rate = 0.1) AS SELECT a, b, y FROM pts")


def versions(con, name: str = "m") -> int:
    return con.execute("SELECT count(*) FROM dbml_models WHERE name = ?", [name]).fetchall()[0][0]


def one(con, sql: str) -> dict:
    result = dbml.execute(con, sql)
    names = [d[0] for d in result.description]
    rows = result.fetchall()
    assert len(rows) == 1, rows
    return dict(zip(names, rows[0]))


def plan(con, sql: str) -> dict:
    return create.plan(con, bigquery.parse(sql))


@pytest.mark.slow   # trains three small models
def test_create_evaluate_predict_training_info_and_drop(con):
    con.execute(TABLE)
    summary = one(con, CREATE.format(how="MODEL"))
    assert summary["status"] == "finished" and summary["epochs"] == 4
    (arch, task, label), = con.execute("SELECT arch, task, label FROM dbml_models WHERE name = 'm'").fetchall()
    assert (arch, task, label) == ("linear", "classification", "y")
    given = one(con, "SELECT * FROM ML.EVALUATE(MODEL `shop.m`, TABLE pts)")
    assert list(given) == ["precision", "recall", "accuracy", "f1_score", "log_loss", "roc_auc"]
    assert given["accuracy"] > 0.85 and given["roc_auc"] > 0.9          # it learned (chance is ~0.5)
    held_out = one(con, "SELECT * FROM ML.EVALUATE(MODEL m)")           # the rows train() held out
    assert held_out["accuracy"] == pytest.approx(summary["val_metric"], abs=1e-12)
    result = dbml.execute(con, "SELECT * FROM ML.PREDICT(MODEL m, (SELECT a, b FROM pts WHERE a > 0.9))")
    assert [d[0] for d in result.description] == ["predicted_y", "predicted_y_probs", "a", "b"]
    rows = result.fetchall()
    assert len(rows) == 90 and {r[0] for r in rows} <= {0, 1}
    assert all(r[1][0]["label"] == r[0] and sum(p["prob"] for p in r[1]) == pytest.approx(1) for r in rows)
    info = dbml.execute(con, "SELECT iteration, loss, duration_ms FROM ML.TRAINING_INFO(MODEL m)").fetchall()
    assert [r[0] for r in info] == [0, 1, 2, 3] and info[-1][1] < info[0][1] and all(r[2] >= 0 for r in info)
    with pytest.raises(dbml.InvalidArgument, match="Already exists: model m; use CREATE OR REPLACE MODEL"):
        dbml.execute(con, CREATE.format(how="MODEL"))
    assert versions(con) == 1                                # refused before training
    dbml.execute(con, CREATE.format(how="MODEL IF NOT EXISTS"))
    assert versions(con) == 1
    dbml.execute(con, CREATE.format(how="OR REPLACE MODEL"))
    assert versions(con) == 2                                # dbml keeps versions: the next one
    assert dbml.execute(con, "DROP MODEL m").fetchall() == [(2,)]
    with pytest.raises(dbml.InvalidArgument, match="Not found: model m"):
        dbml.execute(con, "DROP MODEL m")
    dbml.execute(con, "DROP MODEL IF EXISTS m")
    assert versions(con) == 0
    with pytest.raises(dbml.ModelNotFound, match="Not found: model m"):
        dbml.execute(con, "SELECT * FROM ML.EVALUATE(MODEL m)")   # an error, never 0 rows


def test_options_map_to_train_arguments(con):
    con.execute("CREATE TABLE houses AS SELECT 1.5 AS x, 'Oslo' AS city, 2.0 AS price")
    p = plan(con, "CREATE OR REPLACE MODEL m OPTIONS(model_type='DNN_REGRESSOR', input_label_cols=['price'], "
                  "max_iterations=7, learn_rate=0.05, batch_size=32, hidden_units=[16, 8], dropout=0.1, "
                  "optimizer='SGD', l2_reg=0.01, l1_reg=0.001, activation_fn='TANH', data_split_method='RANDOM', "
                  "data_split_eval_fraction=0.2) AS SELECT * FROM houses WHERE city = 'Oslo'")
    (args, hyperparameters), = p["runs"]
    assert hyperparameters is None
    assert json.loads(args.pop("options")) == {"activation": "tanh", "hidden": [16, 8], "dropout": 0.1}
    assert args == {"label": "price", "arch": "dnn", "task": "regression", "text": [], "epochs": 7, "lr": 0.05,
                    "batch_size": 32, "weight_decay": 0.01, "l1_reg": 0.001, "optimizer": "sgd", "validation": 0.2}
    assert p["source"] == p["query"] == "SELECT * FROM houses WHERE city = 'Oslo'"
    statement = create.train_statement("m", p["source"], args).sql("duckdb")
    assert "lr => CAST(0.05 AS DOUBLE)" in statement and "epochs => CAST(7 AS INT)" in statement   # train()'s types
    default = plan(con, "CREATE MODEL m OPTIONS(model_type='linear_reg') AS SELECT x, price AS label FROM houses")
    assert default["runs"][0][0]["label"] == "label"          # BigQuery's default label column
    tree = plan(con, "CREATE MODEL m OPTIONS(model_type='boosted_tree_regressor', input_label_cols=['price'], "
                     "max_iterations=5, tree_method='HIST', num_parallel_tree=1, l1_reg=0.5, early_stop=false) "
                     "AS SELECT x, price FROM houses")
    assert json.loads(tree["runs"][0][0]["options"]) == {"max_iterations": 5, "tree_method": "HIST",
                                                        "num_parallel_tree": 1, "l1_reg": 0.5, "early_stop": False}


def test_every_option_has_one_owner():
    """Each BigQuery option is mapped to a train() argument, taken by a fitted kind under its own
    name, or read by the translation itself: none is accepted and dropped silently."""
    from dbml.bigquery.create import OPTIONS, TORCH, TRANSLATED, TORCH_ARGUMENTS
    from dbml.zoo import arch
    bad = []
    for option, archs in OPTIONS.items():
        for a in archs:
            owners = [option in TRANSLATED, a in TORCH and option in TORCH_ARGUMENTS,
                      a not in TORCH and option in arch(a).options]
            if sum(owners) != 1:
                bad.append((option, a, owners))
    assert not bad


@pytest.mark.parametrize("options,message", [
    ("model_type='automl_classifier', input_label_cols=['y']",
     "model_type 'automl_classifier' \\(remote, imported and AutoML models\\) is not supported in dbml"),
    ("model_type='tensorflow', model_path='gs://bucket/*'", "model_type 'tensorflow' \\(remote, imported and AutoML"),
    ("model_type='arima_plus'", "model_type 'arima_plus' is not supported in dbml; use one of linear_reg"),
    ("model_type='logistic_reg', input_label_cols=['y'], colour='red'",
     "option colour is not supported in dbml; supported options are model_type, input_label_cols"),
    ("model_type='kmeans', learn_rate=0.1", "option learn_rate is not supported for model_type kmeans"),
    ("input_label_cols=['y']", "needs OPTIONS\\(model_type = '...'\\)"),
    ("model_type='logistic_reg', input_label_cols=['y', 'a']", "input_label_cols must name one column"),
    ("model_type='logistic_reg', input_label_cols=['y'], data_split_method='seq'",
     "data_split_method 'seq' is not supported \\(SEQ and CUSTOM need data_split_col\\)"),
    ("model_type='dnn_classifier', input_label_cols=['y'], optimizer='FTRL'",
     "optimizer 'FTRL' is not supported in dbml; use one of ADAM, SGD, ADAGRAD"),
    ("model_type='logistic_reg', input_label_cols=['y'], l2_reg=HPARAM_RANGE(0, 1)",
     "HPARAM_RANGE and HPARAM_CANDIDATES need num_trials"),
    ("model_type='logistic_reg', input_label_cols=['y'], num_trials=2, l2_reg=HPARAM_RANGE(1, 0)",
     "HPARAM_RANGE\\(min, max\\) takes two numbers, min < max"),
    ("model_type='logistic_reg', input_label_cols=['y'], max_iterations=(SELECT 1)",
     "option max_iterations must be a constant"),
])
@pytest.mark.slow   # ~1.0 s: out of the -m 'not slow' inner loop (under a minute)
def test_unsupported_pieces_are_named_and_nothing_is_trained(con, options, message):
    con.execute(TABLE)
    with pytest.raises(dbml.InvalidArgument, match=message):
        dbml.execute(con, f"CREATE MODEL m OPTIONS({options}) AS SELECT a, b, y FROM pts")
    assert versions(con) == 0


@pytest.mark.parametrize("sql, message", [
    ("SELECT * FROM ML.FORECAST(MODEL m)", "ML.FORECAST is not supported in dbml; supported: ML.PREDICT"),
    ("SELECT * FROM ML.EVALUATE(m)", "ML.EVALUATE takes MODEL <name> first"),
    ("SELECT ML.NOPE(a) FROM pts", "the function ML.NOPE is not supported in dbml"),
    ("CREATE MODEL m OPTIONS(model_type='linear_reg' AS SELECT 1", "BigQuery ML: cannot read this statement"),
    ("CREATE MODEL m OPTIONS(model_type='linear_reg') AS", "needs AS <query> \\(the training data\\)"),
    ("SELECT * FROM ML.PREDICT(MODEL m, TABLE pts, STRUCT(0.5))", "each setting is <value> AS <name>"),
])
def test_bigquery_errors_name_the_piece_not_a_parser_trace(con, sql, message):
    con.execute(TABLE)
    with pytest.raises(dbml.DbmlError, match=message):
        dbml.execute(con, sql)


@pytest.mark.parametrize("sql", ["SELECT 1 AS model", "CREATE TABLE model_runs AS SELECT 1 AS x",
                                 "SELECT 'ML.PREDICT' AS text", "DROP TABLE IF EXISTS models"])
def test_other_sql_runs_unchanged(con, sql):
    assert not looks_like_bigquery(sql)
    dbml.execute(con, sql)


def test_the_shell_and_dbml_execute_share_one_entry_point(con, monkeypatch):
    seen = []
    original = bigquery.translate
    monkeypatch.setattr(bigquery, "translate", lambda c, s: seen.append(s) or original(c, s))
    dbml.execute(con, "SELECT 1; SELECT 2")
    # the shell: what DuckDB's parser refuses (here, BigQuery's DROP MODEL) goes the same way
    assert run(con, io.StringIO("DROP MODEL IF EXISTS `shop.m`;\n"), io.StringIO(), io.StringIO()) == 0
    assert seen == ["SELECT 1", "SELECT 2", "DROP MODEL IF EXISTS `shop.m`"]


@pytest.mark.slow   # trains a model
def test_the_shell_accepts_bigquery_ml(con):
    con.execute(TABLE)
    out, err = io.StringIO(), io.StringIO()
    status = run(con, io.StringIO(CREATE.format(how="MODEL").replace("max_iterations = 4", "max_iterations = 1")
                                  + ";\n.mode csv\nSELECT count(*) AS n FROM ML.PREDICT(MODEL m, TABLE pts);\n"
                                  "CREATE MODEL m2 OPTIONS(model_type='linear_reg', colour='red') AS SELECT * FROM pts;\n"),
                 out, err)
    assert status == 1 and out.getvalue().splitlines()[-2:] == ["n", "1000"]
    assert err.getvalue().strip().splitlines()[-1].startswith(
        "Error: BigQuery ML: CREATE MODEL m2: option colour is not supported in dbml; supported options are")


@pytest.mark.slow   # trains two models
def test_a_transform_is_frozen_and_applied_to_every_input_once(con):
    con.execute(TABLE)
    dbml.execute(con, "CREATE MODEL m TRANSFORM(ML.STANDARD_SCALER(a) OVER () AS a_s, b, y) "
                      "OPTIONS(model_type='logistic_reg', input_label_cols=['y'], max_iterations=3) "
                      "AS SELECT a, b, y FROM pts")
    (features,), = con.execute("SELECT features FROM dbml_models WHERE name = 'm'").fetchall()
    assert features == ["a_s", "b"]
    (mean,), = con.execute("SELECT avg(a) FROM pts").fetchall()
    (stored,), = con.execute("SELECT transform FROM dbml.bigquery_models").fetchall()
    assert repr(float(mean)) in stored[0]                  # the statistic, frozen at training
    assert one(con, "SELECT * FROM ML.EVALUATE(MODEL m)")["accuracy"] > 0.5      # held-out rows, transformed once
    assert one(con, "SELECT * FROM ML.EVALUATE(MODEL m, (SELECT * FROM pts WHERE a < 0.5))")["accuracy"] > 0.5
    info = dbml.execute(con, "SELECT input FROM ML.FEATURE_INFO(MODEL m)").fetchall()
    assert info == [("a_s",), ("b",)]
    probs = "SELECT predicted_y_probs FROM ML.PREDICT(MODEL m, {}) WHERE a = 0.42 AND b = 0"
    alone = dbml.execute(con, probs.format("(SELECT * FROM pts WHERE a = 0.42 AND b = 0 LIMIT 1)")).fetchall()
    among = dbml.execute(con, probs.format("TABLE pts")).fetchall()
    assert alone[0] == among[0]                              # one row scaled as the training rows were


@pytest.mark.slow   # trains six models
def test_hyperparameter_tuning_searches_the_given_space_and_serves_the_best_trial(con):
    con.execute(TABLE)
    result = dbml.execute(con, "CREATE MODEL m OPTIONS(model_type='logistic_reg', input_label_cols=['y'], "
                               "max_iterations=3, num_trials=3, l2_reg=HPARAM_CANDIDATES([0.0, 5.0]), "
                               "learn_rate=HPARAM_RANGE(0.01, 0.3)) AS SELECT a, b, y FROM pts").fetchall()
    assert [r[0] for r in result] == [1, 2, 3] and sum(r[3] for r in result) == 1
    trials = dbml.execute(con, "SELECT trial_id, hyperparameters, hparam_tuning_evaluation_metrics, is_optimal "
                               "FROM ML.TRIAL_INFO(MODEL m) ORDER BY trial_id").fetchall()
    assert trials[0][1] == {"l2_reg": 0.0, "learn_rate": pytest.approx((0.01 * 0.3) ** 0.5)}
    assert all(t[1]["l2_reg"] in (0.0, 5.0) and 0.01 <= t[1]["learn_rate"] <= 0.3 for t in trials)
    best = max(trials, key=lambda t: (t[2]["accuracy"], -t[0]))
    assert [t[0] for t in trials if t[3]] == [best[0]]
    optimal = one(con, "SELECT * FROM ML.EVALUATE(MODEL m)")["accuracy"]
    assert optimal == pytest.approx(best[2]["accuracy"], abs=1e-12)      # ML.EVALUATE reads the optimal trial
    again = dbml.execute(con, "CREATE OR REPLACE MODEL m OPTIONS(model_type='logistic_reg', input_label_cols=['y'], "
                              "max_iterations=3, num_trials=3, l2_reg=HPARAM_CANDIDATES([0.0, 5.0]), "
                              "learn_rate=HPARAM_RANGE(0.01, 0.3)) AS SELECT a, b, y FROM pts").fetchall()
    assert [r[2] for r in again] == [r[2] for r in result]                 # the same trials, the same metrics
    assert [r[1] for r in again] == [4, 5, 6]
    served = dbml.execute(con, "SELECT trial_id, is_optimal FROM ML.TRIAL_INFO(MODEL m) ORDER BY 1").fetchall()
    assert served == [(t[0], t[3]) for t in trials]                        # the latest run's three, not six
    second = one(con, "SELECT * FROM ML.EVALUATE(MODEL m, STRUCT(2 AS trial_id))")["accuracy"]
    assert second == pytest.approx(trials[1][2]["accuracy"], abs=1e-12)     # trial_id picks the version


@pytest.mark.slow   # trains two models
def test_l1_reg_is_an_l1_penalty_in_the_loss(con):
    """MSE on the standardised target plus l1 * |w|: for a feature equal to the standardised
    target the optimum is w = 1 - l1 / 2 (the MSE's gradient is 2 (w - 1)), 0.75 at l1 = 0.5."""
    con.execute("CREATE TABLE n AS SELECT x, 3 * x + 1 AS y FROM (SELECT range / 100.0 AS x FROM range(500))")
    weights = {}
    for l1 in (0.0, 0.5):
        dbml.execute(con, f"CREATE OR REPLACE MODEL m OPTIONS(model_type='linear_reg', input_label_cols=['y'], "
                          f"l1_reg={l1}, max_iterations=40, learn_rate=0.02) AS SELECT x, y FROM n")
        weights[l1] = dict(dbml.execute(con, "SELECT processed_input, weight FROM ML.WEIGHTS(MODEL m, "
                                             "STRUCT(true AS standardize))").fetchall())
    assert weights[0.5]["x"] / weights[0.0]["x"] == pytest.approx(0.75, abs=0.03)


@pytest.mark.slow   # trains a model
def test_auto_class_weights_balances_the_classes(con):
    con.execute("CREATE TABLE rare AS SELECT range / 1000.0 AS x, (range % 10 = 0)::INTEGER AS y FROM range(1000)")
    summary = one(con, "CREATE MODEL m OPTIONS(model_type='logistic_reg', input_label_cols=['y'], "
                       "auto_class_weights=true, data_split_method='no_split', max_iterations=1) "
                       "AS SELECT x, y FROM rare")
    assert summary["rows"] == 900 + 100 * 9                 # each rare row counted nine times
    assert dbml.execute(con, "SELECT count(*) FROM ML.PREDICT(MODEL m, TABLE rare)").fetchall() == [(1000,)]


def test_the_readme_names_every_option_function_and_model_type():
    from pathlib import Path
    from dbml.bigquery.create import MODEL_TYPES, OPTIONS
    from dbml.bigquery.functions import HANDLERS
    from dbml.bigquery.preprocess import ANALYTIC, SCALAR
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("### BigQuery ML syntax", 1)[1].split("\n### ", 1)[0]
    kinds = readme.split("Beside the zoo, `dbml/core/kinds/`", 1)[1].split("\n\n", 2)[1]
    from dbml.bigquery.create import TORCH, TORCH_ARGUMENTS, TRANSLATED
    for option, archs in OPTIONS.items():
        if option in TRANSLATED or option in TORCH_ARGUMENTS:
            assert f"`{option}`" in section, option
        if any(a not in TORCH for a in archs) and option not in TRANSLATED:
            assert f"`{option}`" in kinds, option
    for fn in [*HANDLERS, *ANALYTIC, *SCALAR]:
        assert f"`ML.{fn}" in section, fn
    for model_type in MODEL_TYPES:
        assert f"`{model_type}`" in section, model_type


@pytest.mark.slow   # trains two models
def test_ml_predict_after_drop_and_retrain_uses_the_new_model(con):
    """Issue 21 item 1 through BigQuery ML: versions restart at 1 after a drop, and the
    model served must be the new one."""
    con.execute("CREATE TABLE up AS SELECT range / 100.0 AS x, 2 * range / 100.0 AS label FROM range(400)")
    con.execute("CREATE TABLE down AS SELECT range / 100.0 AS x, -2 * range / 100.0 AS label FROM range(400)")
    ask = "SELECT predicted_label FROM ML.PREDICT(MODEL m, (SELECT 3.0 AS x))"
    dbml.execute(con, "CREATE MODEL m OPTIONS(model_type='linear_reg', max_iterations=20) AS SELECT x, label FROM up")
    (before,), = dbml.execute(con, ask).fetchall()
    dbml.execute(con, "DROP MODEL m")
    dbml.execute(con, "CREATE MODEL m OPTIONS(model_type='linear_reg', max_iterations=20) AS SELECT x, label FROM down")
    (after,), = dbml.execute(con, ask).fetchall()
    assert before > 3 and after < -3, (before, after)


@pytest.mark.parametrize("kind,classifier", [("linear_reg", "logistic_reg"), ("dnn_regressor", "dnn_classifier")])
def test_a_regression_on_a_text_label_suggests_bigquerys_classifier(con, kind, classifier):
    """BigQuery's syntax has no task argument: the fix is the classifier model_type."""
    con.execute(TABLE)
    with pytest.raises(dbml.InvalidArgument, match=rf"^BigQuery ML: CREATE MODEL m: model_type {kind} predicts a "
                                                   rf"number, and the label column y is VARCHAR; for its classes use "
                                                   rf"model_type = '{classifier}', or CAST the label"):
        dbml.execute(con, f"CREATE MODEL m OPTIONS(model_type='{kind}', input_label_cols=['y']) "
                          f"AS SELECT a, b, CAST(y AS STRING) AS y FROM pts")
    assert versions(con) == 0


@pytest.mark.slow   # trains a small model
def test_ml_predict_names_the_input_columns_the_rows_lack(con):
    con.execute(TABLE)
    dbml.execute(con, "CREATE MODEL m OPTIONS(model_type='logistic_reg', input_label_cols=['y'], max_iterations=2) "
                      "AS SELECT a, b, y FROM pts")
    with pytest.raises(dbml.InvalidArgument, match=r"^BigQuery ML: model m needs the input column b, which the rows "
                                                   r"passed lack; it reads a, b: select them in the input query$"):
        dbml.execute(con, "SELECT * FROM ML.PREDICT(MODEL m, (SELECT a FROM pts))")
    with pytest.raises(dbml.InvalidArgument, match=r"needs the input columns b, y \(the label: y\)"):
        dbml.execute(con, "SELECT * FROM ML.EVALUATE(MODEL m, (SELECT a FROM pts))")
    assert len(dbml.execute(con, "SELECT * FROM ML.PREDICT(MODEL m, (SELECT B, a FROM pts))").fetchall()) == 1000
