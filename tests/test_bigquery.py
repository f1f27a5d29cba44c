"""BigQuery ML syntax (dbml/bigquery.py): rewritten into dbml calls by dbml.execute and the shell."""

from __future__ import annotations

import io

import pytest

import dbml
from dbml import bigquery
from dbml.shell import run

TABLE = ("CREATE TABLE pts AS SELECT (range % 100) / 100.0 AS a, (range % 7) / 7.0 AS b, "
         "CASE WHEN (range % 100) / 100.0 + (range % 7) / 7.0 > 1 THEN 1 ELSE 0 END AS y FROM range(1000)")
CREATE = ("CREATE {how} `shop.m` OPTIONS(model_type = 'logistic_reg', input_label_cols = ['y'], "
          "max_iterations = 4, learn_rate = 0.1) AS SELECT a, b, y FROM pts")


def versions(con) -> int:
    return con.execute("SELECT count(*) FROM dbml_models WHERE name = 'm'").fetchall()[0][0]


@pytest.mark.slow   # trains three small models
def test_create_evaluate_predict_training_info_and_drop(con):
    con.execute(TABLE)
    summary = dbml.execute(con, CREATE.format(how="MODEL")).fetchall()[0][0]
    assert summary["status"] == "finished" and summary["epochs"] == 4
    (arch, task, label), = con.execute("SELECT arch, task, label FROM dbml_models WHERE name = 'm'").fetchall()
    assert (arch, task, label) == ("linear", "classification", "y")
    accuracy = dbml.execute(con, "SELECT accuracy FROM ML.EVALUATE(MODEL `shop.m`, TABLE pts)").fetchall()[0][0]
    assert accuracy > 0.85                                   # it learned (chance is ~0.5)
    stored = dbml.execute(con, "SELECT * FROM ML.EVALUATE(MODEL m)").fetchall()
    assert stored[0][0] == "accuracy" and stored[0][1] > 0.8
    result = dbml.execute(con, "SELECT * FROM ML.PREDICT(MODEL m, (SELECT a, b FROM pts WHERE a > 0.9))")
    assert [d[0] for d in result.description] == ["a", "b", "predicted_y"]
    rows = result.fetchall()
    assert len(rows) == 90 and {r[2] for r in rows} <= {0, 1}
    info = dbml.execute(con, "SELECT iteration, loss, duration_ms FROM ML.TRAINING_INFO(MODEL m)").fetchall()
    assert [r[0] for r in info] == [1, 2, 3, 4] and info[-1][1] < info[0][1] and all(r[2] > 0 for r in info)
    with pytest.raises(Exception, match="Already exists: model m; use CREATE OR REPLACE MODEL"):
        dbml.execute(con, CREATE.format(how="MODEL"))
    assert versions(con) == 1                                # refused before training
    dbml.execute(con, CREATE.format(how="MODEL IF NOT EXISTS"))
    assert versions(con) == 1
    dbml.execute(con, CREATE.format(how="OR REPLACE MODEL"))
    assert versions(con) == 2                                # dbml keeps versions: the next one
    assert dbml.execute(con, "DROP MODEL m").fetchall() == [(2,)]
    with pytest.raises(Exception, match="Not found: model m"):
        dbml.execute(con, "DROP MODEL m")
    dbml.execute(con, "DROP MODEL IF EXISTS m")
    assert versions(con) == 0


def test_options_map_to_train_arguments(con):
    steps = bigquery.translate(con, "CREATE OR REPLACE MODEL m OPTIONS(model_type='DNN_REGRESSOR', "
                                    "input_label_cols=['price'], max_iterations=7, learn_rate=0.05, batch_size=32, "
                                    "hidden_units=[16, 8], dropout=0.1, optimizer='SGD', l2_reg=0.01, "
                                    "data_split_method='RANDOM', data_split_eval_fraction=0.2) "
                                    "AS SELECT * FROM houses WHERE city = 'Oslo'")
    assert steps == ["SELECT train('m', 'SELECT * FROM houses WHERE city = ''Oslo''', label := 'price', "
                     "arch := 'mlp', task := 'regression', epochs := 7, lr := 0.05, batch_size := 32, "
                     "hidden := [16, 8], dropout := 0.1, weight_decay := 0.01, optimizer := 'sgd', "
                     "validation := 0.2)"]
    no_split = bigquery.translate(con, "CREATE OR REPLACE MODEL m OPTIONS(input_label_cols=['y'], "
                                       "data_split_method='NO_SPLIT') AS SELECT * FROM t")
    assert no_split == ["SELECT train('m', 'SELECT * FROM t', label := 'y', validation := 0.0)"]


@pytest.mark.parametrize("options,message", [
    ("model_type='boosted_tree_classifier', input_label_cols=['y']",
     "model_type 'boosted_tree_classifier' is not supported; use one of dnn_classifier, dnn_regressor"),
    ("model_type='dnn_classifier', input_label_cols=['y'], early_stop=true",
     "option early_stop is not supported by dbml; supported options are model_type, input_label_cols"),
    ("model_type='dnn_classifier'", "needs input_label_cols = \\['<label column>'\\]"),
    ("input_label_cols=['y', 'z']", "needs input_label_cols"),
    ("input_label_cols=['y'], data_split_method='seq'", "data_split_method 'seq' is not supported"),
])
def test_unsupported_options_are_named_and_nothing_is_trained(con, options, message):
    con.execute(TABLE)
    with pytest.raises(dbml.InvalidArgument, match=message):
        dbml.execute(con, f"CREATE MODEL m OPTIONS({options}) AS SELECT a, b, y FROM pts")
    assert versions(con) == 0


@pytest.mark.parametrize("sql", ["SELECT 1 AS model", "CREATE TABLE model_runs AS SELECT 1 AS x",
                                 "SELECT 'ML.PREDICT' AS text", "DROP TABLE IF EXISTS models"])
def test_other_sql_runs_unchanged(con, sql):
    assert bigquery.translate(con, sql) is None
    dbml.execute(con, sql)


def test_the_shell_accepts_bigquery_ml(con):
    con.execute(TABLE)
    out, err = io.StringIO(), io.StringIO()
    status = run(con, io.StringIO(CREATE.format(how="MODEL").replace("max_iterations = 4", "max_iterations = 1")
                                  + ";\n.mode csv\nSELECT count(*) AS n FROM ML.PREDICT(MODEL m, TABLE pts);\n"
                                  "CREATE MODEL m OPTIONS(input_label_cols=['y'], colour='red') AS SELECT * FROM pts;\n"),
                 out, err)
    assert status == 1 and out.getvalue().splitlines()[-2:] == ["n", "1000"]
    assert err.getvalue().strip().splitlines() == [
        "Error: CREATE MODEL m: option colour is not supported by dbml; supported options are model_type, "
        "input_label_cols, max_iterations, learn_rate, batch_size, hidden_units, dropout, optimizer, l2_reg, "
        "data_split_method, data_split_eval_fraction (the README's BigQuery ML table maps each)"]
