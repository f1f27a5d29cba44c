-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-create-glm
CREATE MODEL `mydataset.mymodel`
OPTIONS
  ( MODEL_TYPE='LOGISTIC_REG',
    DATA_SPLIT_METHOD='SEQ',
    DATA_SPLIT_EVAL_FRACTION=0.3,
    DATA_SPLIT_COL='timestamp' ) AS
SELECT
  column1,
  column2,
  timestamp,
  label
FROM
  `mydataset.mytable`;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-create-glm
CREATE OR REPLACE MODEL `mydataset.mymodel`
OPTIONS
  ( MODEL_TYPE='LOGISTIC_REG',
    EARLY_STOP=TRUE,
    MIN_REL_PROGRESS=0.01,
    L2_REG=0.1,
    MAX_ITERATIONS=10 ) AS
SELECT
  column1,
  column2,
  column3,
  label
FROM
  `mydataset.mytable`;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-create-dnn-models
CREATE MODEL `mydataset.mymodel_dnn`
OPTIONS(MODEL_TYPE='DNN_CLASSIFIER',
        ACTIVATION_FN = 'RELU',
        BATCH_SIZE = 16,
        DROPOUT = 0.1,
        EARLY_STOP = FALSE,
        HIDDEN_UNITS = [128, 128, 128],
        INPUT_LABEL_COLS = ['mylabel'],
        LEARN_RATE=0.001,
        MAX_ITERATIONS = 50,
        OPTIMIZER = 'ADAGRAD')
AS SELECT column1, column2, column3, mylabel FROM mydataset.mytable;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-create-dnn-models
CREATE OR REPLACE MODEL `mydataset.mymodel_dnn`
OPTIONS(MODEL_TYPE='DNN_REGRESSOR',
        ACTIVATION_FN = 'TANH',
        HIDDEN_UNITS = [16, 8],
        INPUT_LABEL_COLS = ['column2'],
        MAX_ITERATIONS = 5,
        ENABLE_GLOBAL_EXPLAIN = TRUE)
AS SELECT column1, column2, column3 FROM mydataset.mytable;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-explain-predict
SELECT
  *
FROM
  ML.EXPLAIN_PREDICT(MODEL `mydataset.mymodel_dnn`,
    (
    SELECT
      column1,
      column3
    FROM
      `mydataset.mytable`),
    STRUCT(3 AS top_k_features));

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-global-explain
SELECT
  *
FROM
  ML.GLOBAL_EXPLAIN(MODEL `mydataset.mymodel_dnn`);

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-create-boosted-tree
CREATE MODEL `mydataset.mymodel_tree`
OPTIONS(MODEL_TYPE='BOOSTED_TREE_REGRESSOR',
        BOOSTER_TYPE = 'GBTREE',
        MAX_ITERATIONS = 10,
        MAX_TREE_DEPTH = 6,
        L1_REG = 0.1,
        L2_REG = 1.0,
        LEARN_RATE = 0.3,
        ENABLE_GLOBAL_EXPLAIN = TRUE,
        INPUT_LABEL_COLS = ['column2'])
AS SELECT column1, column2, column3, column4 FROM `mydataset.mytable`;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-xai-overview
SELECT
  *
FROM
  ML.GLOBAL_EXPLAIN(MODEL `mydataset.mymodel_tree`, STRUCT(TRUE AS class_level_explain));

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-create-random-forest
CREATE MODEL `mydataset.mymodel_forest`
OPTIONS(MODEL_TYPE='RANDOM_FOREST_REGRESSOR',
        NUM_PARALLEL_TREE = 20,
        MAX_TREE_DEPTH = 8,
        SUBSAMPLE = 0.8,
        INPUT_LABEL_COLS = ['column2'])
AS SELECT column1, column2, column3, column4 FROM `mydataset.mytable`;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-evaluate
SELECT
  *
FROM
  ML.EVALUATE(MODEL `mydataset.mymodel_forest`,
    TABLE `mydataset.mytable`);

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-create-kmeans
CREATE MODEL `mydataset.mymodel_kmeans`
OPTIONS(MODEL_TYPE='KMEANS',
        NUM_CLUSTERS = 3,
        KMEANS_INIT_METHOD = 'KMEANS++',
        STANDARDIZE_FEATURES = TRUE)
AS SELECT column1, column2, column4 FROM `mydataset.mytable`;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-predict
SELECT
  *
FROM
  ML.PREDICT(MODEL `mydataset.mymodel_kmeans`,
    TABLE `mydataset.mytable`);
