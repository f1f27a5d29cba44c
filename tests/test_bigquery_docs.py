"""BigQuery ML statements of Google's reference pages that dbml refused or answered wrongly
(issue 32, item 12), run as published there but for the table's and columns' names (the
reference pages' placeholders ``mydataset.mymodel``, ``mydataset.mytable``; the table is
``bigquery_tables.MYTABLE``).

Pages: hyperparameter tuning (https://cloud.google.com/bigquery/docs/hp-tuning-overview),
wide-and-deep models (.../reference/standard-sql/bigqueryml-syntax-create-wnd-models), the
generalized linear models' CLASS_WEIGHTS (.../bigqueryml-syntax-create-glm), ML.PREDICT
(.../bigqueryml-syntax-predict), ML.WEIGHTS (.../bigqueryml-syntax-weights), ML.EVALUATE
(.../bigqueryml-syntax-evaluate: ``trial_id`` first for a tuned model).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import dbml
from dbml import bigquery
from dbml.bigquery import create, tuning

from bigquery_tables import MYTABLE


@pytest.fixture
def bq(con):
    con.execute("CREATE SCHEMA mydataset")
    con.execute(MYTABLE)
    return con


def rows(con, sql: str) -> list[dict]:
    result = dbml.execute(con, sql)
    names = [d[0] for d in result.description]
    return [dict(zip(names, r)) for r in result.fetchall()]


def plan(con, sql: str) -> dict:
    return create.plan(con, bigquery.parse(sql))


TUNED = """CREATE MODEL `mydataset.mymodel`
OPTIONS (
  MODEL_TYPE = 'LOGISTIC_REG',
  INPUT_LABEL_COLS = ['label'],
  MAX_ITERATIONS = 3,
  NUM_TRIALS = 3,
  HPARAM_TUNING_OBJECTIVES = ['{objective}'])
AS SELECT column1, column2, column3, label FROM `mydataset.mytable`"""


@pytest.mark.slow   # trains six small models
@pytest.mark.parametrize("objective, best", [("ROC_AUC", max), ("LOG_LOSS", min)])
def test_hparam_tuning_objectives_rank_the_trials_by_that_figure(bq, objective, best):
    dbml.execute(bq, TUNED.format(objective=objective))
    trials = rows(bq, "SELECT * FROM ML.TRIAL_INFO(MODEL `mydataset.mymodel`)")
    key = objective.lower()
    assert [set(t["hparam_tuning_evaluation_metrics"]) for t in trials] == [{key}] * 3
    scores = {t["trial_id"]: t["hparam_tuning_evaluation_metrics"][key] for t in trials}
    assert len(set(scores.values())) >= 2                  # the trials differ: the choice is the objective's
    optimal, = [t["trial_id"] for t in trials if t["is_optimal"]]
    assert optimal == min(t for t, v in scores.items() if v == best(scores.values()))   # ties: the earliest
    # ML.EVALUATE of the tuned model: the optimal trial, its trial_id first (BigQuery ML's columns)
    evaluated, = rows(bq, "SELECT * FROM ML.EVALUATE(MODEL `mydataset.mymodel`)")
    assert list(evaluated)[:2] == ["trial_id", "precision"] and evaluated["trial_id"] == optimal
    assert evaluated[key] == pytest.approx(scores[optimal], abs=1e-12)    # measured on the same rows
    weights = rows(bq, "SELECT * FROM ML.WEIGHTS(MODEL `mydataset.mymodel`)")   # trial_id first there too
    assert list(weights[0])[:2] == ["trial_id", "processed_input"] and {w["trial_id"] for w in weights} == {optimal}
    other = next(t for t in scores if t != optimal)
    chosen, = rows(bq, f"SELECT * FROM ML.EVALUATE(MODEL `mydataset.mymodel`, STRUCT({other} AS trial_id))")
    assert chosen["trial_id"] == other and chosen[key] == pytest.approx(scores[other], abs=1e-12)


@pytest.mark.parametrize("options, message", [
    ("NUM_TRIALS = 2, HPARAM_TUNING_OBJECTIVES = ['R2_SCORE']",
     "hparam_tuning_objectives takes one objective of a classification model, e.g. hparam_tuning_objectives = "
     "\\['PRECISION'\\]; one of PRECISION, RECALL, ACCURACY, F1_SCORE, LOG_LOSS, ROC_AUC; got \\['R2_SCORE'\\]"),
    ("HPARAM_TUNING_OBJECTIVES = ['ROC_AUC']", "hparam_tuning_objectives ranks the trials of num_trials"),
])
def test_hparam_tuning_objectives_refused_before_training(bq, options, message):
    with pytest.raises(dbml.InvalidArgument, match=message):
        dbml.execute(bq, f"CREATE MODEL `mydataset.mymodel` OPTIONS (MODEL_TYPE = 'LOGISTIC_REG', "
                         f"INPUT_LABEL_COLS = ['label'], {options}) AS SELECT * FROM `mydataset.mytable`")
    assert bq.execute("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]


def test_wide_deep_is_a_linear_layer_plus_a_dnn():
    from dbml.core.kinds.dnn import WideDeep, wide_deep
    from dbml.zoo.inputs import Inputs
    torch.manual_seed(0)
    module = wide_deep(Inputs(kind="tabular", features=5), 3, hidden=(8, 4), activation="tanh")
    assert isinstance(module, WideDeep) and isinstance(module.wide, torch.nn.Linear)
    x = torch.randn(7, 5)
    assert torch.equal(module(x), module.wide(x) + module.deep(x))
    assert [m.out_features for m in module.deep if isinstance(m, torch.nn.Linear)] == [8, 4, 3]


@pytest.mark.slow   # trains a small wide-and-deep model
def test_dnn_linear_combined_classifier_trains_a_wide_deep_model(bq):
    summary, = rows(bq, """CREATE MODEL `mydataset.mymodel`
OPTIONS (
  MODEL_TYPE = 'DNN_LINEAR_COMBINED_CLASSIFIER',
  ACTIVATION_FN = 'RELU',
  BATCH_SIZE = 16,
  DROPOUT = 0.1,
  HIDDEN_UNITS = [16, 8],
  INPUT_LABEL_COLS = ['label'],
  LEARN_RATE = 0.01,
  MAX_ITERATIONS = 15,
  OPTIMIZER = 'ADAM')
AS SELECT column1, column2, column3, label FROM `mydataset.mytable`""")
    (arch, options), = bq.execute("SELECT arch, config FROM dbml_models WHERE name = 'mymodel'").fetchall()
    assert arch == "wide_deep" and json.loads(options)["options"]["hidden"] == [16, 8]
    evaluated, = rows(bq, "SELECT * FROM ML.EVALUATE(MODEL `mydataset.mymodel`)")
    assert evaluated["accuracy"] == pytest.approx(summary["val_metric"], abs=1e-12)
    assert evaluated["roc_auc"] > 0.75                      # it learned (the label is mostly column1's sign)


def test_dnn_linear_combined_regressor_takes_the_dnn_options(bq):
    p = plan(bq, "CREATE MODEL `mydataset.mymodel` OPTIONS (MODEL_TYPE = 'DNN_LINEAR_COMBINED_REGRESSOR', "
                 "INPUT_LABEL_COLS = ['column2'], HIDDEN_UNITS = [4], ACTIVATION_FN = 'TANH', DROPOUT = 0.2) "
                 "AS SELECT column1, column2 FROM `mydataset.mytable`")
    (args, _), = p["runs"]
    assert (args["arch"], args["task"]) == ("wide_deep", "regression")
    assert json.loads(args["options"]) == {"hidden": [4], "activation": "tanh", "dropout": 0.2}


CLASS_WEIGHTED = """CREATE MODEL `mydataset.mymodel`
OPTIONS (
  MODEL_TYPE = 'LOGISTIC_REG',
  INPUT_LABEL_COLS = ['mylabel'],
  CLASS_WEIGHTS = [STRUCT('high', 0.2), STRUCT('low', 0.8)])
AS SELECT column1, column2, mylabel FROM `mydataset.mytable`"""


def test_class_weights_repeat_each_class_in_proportion(bq):
    p = plan(bq, CLASS_WEIGHTED)
    counted = dict(bq.execute("SELECT mylabel, count(*) FROM mydataset.mytable GROUP BY ALL").fetchall())
    trained = dict(bq.execute(f"SELECT mylabel, count(*) FROM ({p['source']}) GROUP BY ALL").fetchall())
    # the lightest class (0.2) once; 'low' 0.8 / 0.2 = 4 times; 'mid', not listed, weighs 1.0: 5 times
    assert trained == {"high": counted["high"], "low": 4 * counted["low"], "mid": 5 * counted["mid"]}
    assert set(bq.execute(f"DESCRIBE {p['source']}").fetchnumpy()["column_name"]) == {"column1", "column2", "mylabel"}


@pytest.mark.parametrize("weights, message", [
    ("[STRUCT('high', 0)]", "class_weights must be an array of STRUCT\\(label, weight > 0\\), e.g. class_weights = "
                            "\\[STRUCT\\('a', 0.2\\), STRUCT\\('b', 0.8\\)\\]; got \\[\\('high', 0\\)\\]"),
    ("[STRUCT('high', 500.0)]", "weights more than 100 times apart \\(a class not listed weighs 1.0\\)"),
])
def test_class_weights_refused_before_training(bq, weights, message):
    with pytest.raises(dbml.InvalidArgument, match=message):
        plan(bq, CLASS_WEIGHTED.replace("[STRUCT('high', 0.2), STRUCT('low', 0.8)]", weights))


@pytest.fixture
def logistic(bq):
    dbml.execute(bq, "CREATE MODEL `mydataset.mymodel` OPTIONS (MODEL_TYPE = 'LOGISTIC_REG', "
                     "INPUT_LABEL_COLS = ['label'], MAX_ITERATIONS = 5) "
                     "AS SELECT column1, column2, column3, label FROM `mydataset.mytable`")
    return bq


def test_predict_over_predict_reads_the_inner_rows(logistic):
    inner = rows(logistic, "SELECT * FROM ML.PREDICT(MODEL `mydataset.mymodel`, "
                           "(SELECT column1, column2, column3 FROM `mydataset.mytable`))")
    nested = rows(logistic, """SELECT * FROM ML.PREDICT(MODEL `mydataset.mymodel`,
  (SELECT * EXCEPT (predicted_label, predicted_label_probs), predicted_label AS first_label
   FROM ML.PREDICT(MODEL `mydataset.mymodel`, (SELECT column1, column2, column3 FROM `mydataset.mytable`))))""")
    assert len(nested) == len(inner) == 600
    assert [r["predicted_label"] for r in nested] == [r["first_label"] for r in nested] == \
        [r["predicted_label"] for r in inner]


def test_weights_of_a_categorical_input_unnest_as_rows(logistic):
    weights = rows(logistic, "SELECT * FROM ML.WEIGHTS(MODEL `mydataset.mymodel`)")
    column3, = [w for w in weights if w["processed_input"] == "column3"]
    published = rows(logistic, """SELECT
  category,
  weight
FROM
  UNNEST((
    SELECT
      category_weights
    FROM
      ML.WEIGHTS(MODEL `mydataset.mymodel`)
    WHERE
      processed_input = 'column3'))""")
    assert published == column3["category_weights"] and {r["category"] for r in published} == {"red", "green", "blue"}


def test_create_model_onto_an_existing_name_says_how_to_go_on(logistic):
    with pytest.raises(dbml.InvalidArgument, match="Already exists: model mymodel; use CREATE OR REPLACE MODEL "
                                                   "mymodel to train its next version, CREATE MODEL IF NOT EXISTS "
                                                   "to keep it, or DROP MODEL mymodel first"):
        dbml.execute(logistic, "CREATE MODEL `mydataset.mymodel` OPTIONS (MODEL_TYPE = 'LOGISTIC_REG', "
                               "INPUT_LABEL_COLS = ['label']) AS SELECT * FROM `mydataset.mytable`")


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_model_functions_of_a_train_model_read_its_stored_source(bq):
    """ML.EVALUATE, ML.FEATURE_INFO and ML.GLOBAL_EXPLAIN without input rows read the source the
    catalog keeps for a model made by train() as for one made by CREATE MODEL."""
    summary = bq.execute("SELECT train('m', 'SELECT column1, column2, column3, label FROM mydataset.mytable', "
                         "label := 'label', epochs := 3, task := 'classification')").fetchall()[0][0]
    evaluated, = rows(bq, "SELECT * FROM ML.EVALUATE(MODEL m)")      # the rows train() held out
    assert evaluated["accuracy"] == pytest.approx(summary["val_metric"], abs=1e-12)
    info = rows(bq, "SELECT * FROM ML.FEATURE_INFO(MODEL m)")
    assert [(r["input"], r["category_count"]) for r in info] == [("column1", None), ("column2", None), ("column3", 3)]
    assert info[0]["mean"] == pytest.approx(bq.execute("SELECT avg(column1) FROM mydataset.mytable").fetchall()[0][0])
    explained = rows(bq, "SELECT * FROM ML.GLOBAL_EXPLAIN(MODEL m)")
    assert {r["feature"] for r in explained} == {"column1", "column2", "column3"}


def test_evaluate_of_a_train_model_holds_out_its_rows_whatever_their_types(con):
    """A DATE column train() leaves out is still part of each row's hash: ML.EVALUATE reads the
    rows train() held out (CREATE MODEL's dates are features in seconds; train()'s are not)."""
    con.execute("CREATE TABLE t AS SELECT range % 10 AS a, DATE '2024-01-01' + CAST(range AS INTEGER) AS d, "
                "CASE WHEN hash(range) % 10 < 7 THEN range % 10 > 4 ELSE range % 10 <= 4 END AS label "
                "FROM range(1000)")
    summary = con.execute("SELECT train('m', 't', label := 'label', epochs := 2, features := ['a'], "
                          "task := 'classification')").fetchall()[0][0]
    evaluated, = rows(con, "SELECT * FROM ML.EVALUATE(MODEL m)")
    assert summary["val_metric"] < 0.9 and evaluated["accuracy"] == pytest.approx(summary["val_metric"], abs=1e-12)


@pytest.mark.slow   # trains two versions, reads each with three functions
def test_model_functions_read_the_version_named_or_pinned(bq):
    """``MODEL `m@1``` is version 1 and a model ``deploy()`` pinned serves that version, to every
    ML.* function as to predict() and evaluate() (``catalog.resolve``)."""
    train = ("SELECT train('m', 'SELECT column1, column2, column3, label FROM mydataset.mytable', label := 'label', "
             "epochs := {epochs}, arch := 'linear', task := 'classification')")
    bq.execute(train.format(epochs=1))
    bq.execute(train.format(epochs=6))
    data = "(SELECT column1, column2, column3, label FROM mydataset.mytable)"

    def figures(model):
        return (rows(bq, f"SELECT * FROM ML.EVALUATE(MODEL `{model}`, {data})")[0],
                rows(bq, f"SELECT * FROM ML.WEIGHTS(MODEL `{model}`)"),
                [r["predicted_label_probs"] for r in rows(bq, f"SELECT * FROM ML.PREDICT(MODEL `{model}`, {data})")])

    first, second = figures("m@1"), figures("m@2")
    assert first[0] != second[0] and first[1] != second[1] and first[2] != second[2]
    assert figures("m") == second                               # the latest
    own = bq.execute("SELECT log_loss FROM evaluate('m@1', 'SELECT column1, column2, column3, label "
                     "FROM mydataset.mytable')").fetchall()[0][0]
    assert first[0]["log_loss"] == pytest.approx(own, rel=1e-6)
    bq.execute("SELECT deploy('m', 1)")
    assert figures("m") == first                                # the pinned version
    assert figures("m@2") == second and figures("m@latest") == second
    with pytest.raises(dbml.ModelNotFound, match="model 'm' has no version 7"):
        rows(bq, "SELECT * FROM ML.WEIGHTS(MODEL `m@7`)")


ALGORITHM = """CREATE MODEL `mydataset.mymodel`
OPTIONS (
  MODEL_TYPE = 'LOGISTIC_REG',
  INPUT_LABEL_COLS = ['label'],
  MAX_ITERATIONS = 2,
  NUM_TRIALS = {trials},
  HPARAM_TUNING_ALGORITHM = '{algorithm}'{space})
AS SELECT column1, column2, column3, label FROM `mydataset.mytable`"""
GRID = ",\n  L1_REG = HPARAM_CANDIDATES([0, 0.5]),\n  L2_REG = HPARAM_CANDIDATES([0, 1, 10])"


def test_grid_search_walks_the_grid_in_order(bq):
    planned = plan(bq, ALGORITHM.format(trials=20, algorithm="GRID_SEARCH", space=GRID))
    assert [hp for _, hp in planned["runs"]] == [{"l1_reg": a, "l2_reg": b} for a in (0, 0.5) for b in (0, 1, 10)]
    assert [args["l1_reg"] for args, _ in planned["runs"]] == [0, 0, 0, 0.5, 0.5, 0.5]   # what each trial trains with
    first = plan(bq, ALGORITHM.format(trials=2, algorithm="grid_search", space=GRID))
    assert [hp for _, hp in first["runs"]] == [{"l1_reg": 0, "l2_reg": 0}, {"l1_reg": 0, "l2_reg": 1}]


def test_random_search_draws_every_trial_and_vizier_default_starts_at_the_defaults(bq):
    randomly = [hp for _, hp in plan(bq, ALGORITHM.format(trials=4, algorithm="RANDOM_SEARCH", space=""))["runs"]]
    default = plan(bq, ALGORITHM.format(trials=4, algorithm="VIZIER_DEFAULT", space=""))
    assert [hp for _, hp in default["runs"]] == [{"l1_reg": 0.0, "l2_reg": 0.0}]   # trial 1 at the options' defaults
    assert all(0 < v for hp in randomly for v in hp.values())    # drawn from (1e-5, 10), trial 1 too
    assert len(randomly) == 4
    # the later trials' points are the sampler's, within the space whose ends were checked
    assert {"l1_reg": 10.0, "l2_reg": 0.0} in default["search"].checked
    assert plan(bq, ALGORITHM.format(trials=4, algorithm="RANDOM_SEARCH", space=""))["runs"] == \
        plan(bq, ALGORITHM.format(trials=4, algorithm="RANDOM_SEARCH", space=""))["runs"]   # the same every time


def _searched(algorithm: str, trials: int = 30) -> list[tuple[dict, float]]:
    """A search over BigQuery's default linear space told a figure that peaks at l1_reg 0.01,
    l2_reg 1 (a smooth bowl in the logs, as validation metrics are near their optimum)."""
    search = tuning.Search(tuning.DEFAULT_SPACES["linear"], trials, algorithm, True, maximize=True)
    out = []
    while (point := search.ask()) is not None:
        figure = -abs(math.log10(max(point["l1_reg"], 1e-9)) + 2) - abs(math.log10(max(point["l2_reg"], 1e-9)))
        search.tell(figure)
        out.append((point, figure))
    return out


def test_vizier_default_is_a_bayesian_search_that_learns_from_each_trials_figure():
    bayes, randomly = _searched("VIZIER_DEFAULT"), _searched("RANDOM_SEARCH")
    assert len(bayes) == len(randomly) == 30 and bayes[0][0] == {"l1_reg": 0.0, "l2_reg": 0.0}
    median = lambda run: sorted(f for _, f in run[15:])[7]   # noqa: E731 (the later half's median figure)
    # the later trials crowd the optimum (measured: median -1.5 against random's -3.6; best -0.13 vs -0.77)
    assert median(bayes) > median(randomly) + 1.0
    assert max(f for _, f in bayes) > max(f for _, f in randomly)
    assert _searched("VIZIER_DEFAULT") == bayes   # seeded: the same trials every time
    # a trial without a figure teaches nothing and the search goes on
    search = tuning.Search(tuning.DEFAULT_SPACES["linear"], 3, "VIZIER_DEFAULT", True)
    for _ in range(3):
        assert search.ask() is not None
        search.tell(None)
    assert search.ask() is None


@pytest.mark.parametrize("algorithm, space, message", [
    ("BAYESIAN", "", "hparam_tuning_algorithm 'BAYESIAN' is not BigQuery's; use one of 'VIZIER_DEFAULT', "
                     "'RANDOM_SEARCH', 'GRID_SEARCH'"),
    ("GRID_SEARCH", "", "GRID_SEARCH searches a discrete space, and l1_reg, l2_reg are a continuous range; give "
                        "l1_reg = HPARAM_CANDIDATES\\(\\[...\\]\\), or use RANDOM_SEARCH"),
])
def test_hparam_tuning_algorithm_refused_before_training(bq, algorithm, space, message):
    with pytest.raises(dbml.InvalidArgument, match=message):
        dbml.execute(bq, ALGORITHM.format(trials=3, algorithm=algorithm, space=space))
    assert bq.execute("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]


@pytest.mark.slow   # trains two trials
def test_grid_search_trains_one_trial_per_point(bq):
    created = rows(bq, ALGORITHM.format(trials=3, algorithm="GRID_SEARCH",
                                        space=",\n  L2_REG = HPARAM_CANDIDATES([0, 10])"))
    assert [r["trial_id"] for r in created] == [1, 2]                # the grid has two points
    trials = rows(bq, "SELECT trial_id, hyperparameters FROM ML.TRIAL_INFO(MODEL `mydataset.mymodel`)")
    assert [json.loads(t["hyperparameters"]) if isinstance(t["hyperparameters"], str) else t["hyperparameters"]
            for t in trials] == [{"l2_reg": 0}, {"l2_reg": 10}]
    # a trial's version named (or pinned) is that trial, its trial_id first as BigQuery's
    optimal, = [r["trial_id"] for r in created if r["is_optimal"]]
    other, = [r for r in created if not r["is_optimal"]]
    named, = rows(bq, f"SELECT trial_id FROM ML.EVALUATE(MODEL `mydataset.mymodel@{other['version']}`)")
    assert named == {"trial_id": other["trial_id"]}
    assert rows(bq, "SELECT trial_id FROM ML.EVALUATE(MODEL `mydataset.mymodel`)") == [{"trial_id": optimal}]
    # the optimal trial is what every function serves, predict() and the catalog's deployed too
    # (it is not the latest version when it is the grid's first point)
    best_version, = [r["version"] for r in created if r["is_optimal"]]
    assert rows(bq, "SELECT version FROM dbml_models WHERE model = 'mymodel' AND deployed") == \
        [{"version": best_version}]
    bq.execute(f"SELECT deploy('mymodel', {other['version']})")
    assert rows(bq, "SELECT DISTINCT trial_id FROM ML.WEIGHTS(MODEL `mydataset.mymodel`)") == \
        [{"trial_id": other["trial_id"]}]
    assert rows(bq, f"SELECT trial_id FROM ML.EVALUATE(MODEL `mydataset.mymodel`, STRUCT({optimal} AS trial_id))") \
        == [{"trial_id": optimal}]                                  # trial_id still picks one
    # a model replaced without trials is the new one, whatever was pinned before
    replaced, = rows(bq, ALGORITHM.replace("CREATE MODEL", "CREATE OR REPLACE MODEL").replace(
        "  NUM_TRIALS = {trials},\n  HPARAM_TUNING_ALGORITHM = '{algorithm}'{space})", "  L2_REG = 0)"))
    assert rows(bq, "SELECT version FROM dbml_models WHERE model = 'mymodel' AND deployed") == \
        [{"version": replaced["version"]}]


# DATA_SPLIT_METHOD (.../bigqueryml-syntax-create: CUSTOM splits by a BOOL column, TRUE the evaluation
# rows; SEQ by the column's order, the last DATA_SPLIT_EVAL_FRACTION evaluated): train() holds them out
SPLIT = """CREATE MODEL `mydataset.mymodel`
{transform}OPTIONS (
  MODEL_TYPE = 'LOGISTIC_REG',
  INPUT_LABEL_COLS = ['label'],
  MAX_ITERATIONS = 2,
  {split})
AS SELECT column1, column2, column3, label, {column} FROM `mydataset.mytable`"""


@pytest.mark.parametrize("transform", ["", "TRANSFORM (column1, column2 * 2 AS column2, column3, label)\n"])
def test_custom_split_evaluates_the_rows_the_column_marks(bq, transform):
    created, = rows(bq, SPLIT.format(transform=transform, split="DATA_SPLIT_METHOD = 'CUSTOM', "
                                     "DATA_SPLIT_COL = 'is_eval'", column="column4 < 3 AS is_eval"))
    assert created["rows"] == bq.execute("SELECT count(*) FROM mydataset.mytable WHERE column4 >= 3").fetchall()[0][0]
    assert bq.execute("SELECT features FROM dbml_models").fetchall() == [(["column1", "column2", "column3"],)]
    evaluated, = rows(bq, "SELECT * FROM ML.EVALUATE(MODEL `mydataset.mymodel`)")
    marked, = rows(bq, "SELECT * FROM ML.EVALUATE(MODEL `mydataset.mymodel`, "
                       "(SELECT * FROM `mydataset.mytable` WHERE column4 < 3))")
    assert evaluated == pytest.approx(marked, rel=1e-12)
    assert evaluated["accuracy"] == pytest.approx(created["val_metric"], abs=1e-12)


def test_seq_split_evaluates_the_last_fraction_in_the_columns_order(bq):
    created, = rows(bq, SPLIT.format(transform="", split="DATA_SPLIT_METHOD = 'SEQ', DATA_SPLIT_COL = 'timestamp', "
                                     "DATA_SPLIT_EVAL_FRACTION = 0.25", column="timestamp"))
    assert created["rows"] == 450 and bq.execute("SELECT features FROM dbml_models").fetchall() == \
        [(["column1", "column2", "column3"],)]
    evaluated, = rows(bq, "SELECT * FROM ML.EVALUATE(MODEL `mydataset.mymodel`)")
    latest, = rows(bq, "SELECT * FROM ML.EVALUATE(MODEL `mydataset.mymodel`, "
                       "(SELECT * FROM `mydataset.mytable` ORDER BY timestamp DESC LIMIT 150))")
    assert evaluated == pytest.approx(latest, rel=1e-12)
    assert evaluated["accuracy"] == pytest.approx(created["val_metric"], abs=1e-12)


def test_columns_null_in_every_row_keep_bigquerys_types(bq):
    """ML.FEATURE_INFO of numeric inputs (no category_count, no dimension) and ML.TRAINING_INFO
    without evaluation rows (no eval_loss): BigQuery's INT64 and FLOAT64, not a column typed "null"."""
    dbml.execute(bq, "CREATE MODEL `mydataset.mymodel` OPTIONS (MODEL_TYPE = 'LINEAR_REG', INPUT_LABEL_COLS = "
                     "['column2'], MAX_ITERATIONS = 2, DATA_SPLIT_METHOD = 'NO_SPLIT') "
                     "AS SELECT column1, column2 FROM `mydataset.mytable`")
    info = dbml.execute(bq, "SELECT * FROM ML.FEATURE_INFO(MODEL `mydataset.mymodel`)")
    types = {d[0]: str(d[1]) for d in info.description}
    assert info.fetchall()[0][6:] == (None, 0, None)
    assert (types["category_count"], types["dimension"]) == ("BIGINT", "BIGINT")
    training = dbml.execute(bq, "SELECT * FROM ML.TRAINING_INFO(MODEL `mydataset.mymodel`)")
    assert {d[0]: str(d[1]) for d in training.description}["eval_loss"] == "DOUBLE"
    assert [r[3] for r in training.fetchall()] == [None, None]


@pytest.mark.parametrize("split, column, message", [
    ("DATA_SPLIT_METHOD = 'CUSTOM', DATA_SPLIT_COL = 'is_eval'", "column4 AS other",
     "data_split_col 'is_eval' is not a column of the AS query; select it there"),
    ("DATA_SPLIT_METHOD = 'CUSTOM', DATA_SPLIT_COL = 'column4'", "column4",
     "data_split_method CUSTOM reads data_split_col 'column4' as a BOOL \\(TRUE: evaluation rows\\), and it is "
     "BIGINT; select a BOOL column"),
])
def test_data_split_col_refused_in_bigquerys_words(bq, split, column, message):
    with pytest.raises(dbml.InvalidArgument, match=message):
        dbml.execute(bq, SPLIT.format(transform="", split=split, column=column))
    assert bq.execute("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]
