-- source: https://cloud.google.com/bigquery/docs/boosted-tree-classifier-tutorial
CREATE OR REPLACE TABLE `bqml_tutorial.input_data`
AS
SELECT
  age,
  workclass,
  marital_status,
  education_num,
  occupation,
  hours_per_week,
  income_bracket,
  CASE
    WHEN MOD(functional_weight, 10) < 8 THEN 'training'
    WHEN MOD(functional_weight, 10) = 8 THEN 'evaluation'
    WHEN MOD(functional_weight, 10) = 9 THEN 'prediction'
  END AS dataframe
FROM
  `bigquery-public-data.ml_datasets.census_adult_income`;

-- source: https://cloud.google.com/bigquery/docs/boosted-tree-classifier-tutorial
CREATE MODEL `bqml_tutorial.tree_model`
    OPTIONS(MODEL_TYPE='BOOSTED_TREE_CLASSIFIER',
            BOOSTER_TYPE = 'GBTREE',
            NUM_PARALLEL_TREE = 1,
            MAX_ITERATIONS = 50,
            TREE_METHOD = 'HIST',
            EARLY_STOP = FALSE,
            SUBSAMPLE = 0.85,
            INPUT_LABEL_COLS = ['income_bracket'])
    AS SELECT * EXCEPT(dataframe)
    FROM `bqml_tutorial.input_data`
    WHERE dataframe = 'training';

-- source: https://cloud.google.com/bigquery/docs/boosted-tree-classifier-tutorial
SELECT
  *
FROM
  ML.EVALUATE (MODEL `bqml_tutorial.tree_model`,
    (
    SELECT
      *
    FROM
      `bqml_tutorial.input_data`
    WHERE
      dataframe = 'evaluation'
    )
  );

-- source: https://cloud.google.com/bigquery/docs/boosted-tree-classifier-tutorial
SELECT
  *
FROM
  ML.PREDICT (MODEL `bqml_tutorial.tree_model`,
    (
    SELECT
      *
    FROM
      `bqml_tutorial.input_data`
    WHERE
      dataframe = 'prediction'
    )
  );

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-importance
SELECT
  *
FROM
  ML.FEATURE_IMPORTANCE(MODEL `bqml_tutorial.tree_model`);

-- source: https://cloud.google.com/bigquery/docs/random-forest-classifier-tutorial
CREATE MODEL `bqml_tutorial.random_forest_model`
    OPTIONS(MODEL_TYPE='RANDOM_FOREST_CLASSIFIER',
            NUM_PARALLEL_TREE = 50,
            TREE_METHOD = 'HIST',
            EARLY_STOP = FALSE,
            SUBSAMPLE = 0.85,
            INPUT_LABEL_COLS = ['income_bracket'])
    AS SELECT * EXCEPT(dataframe)
    FROM `bqml_tutorial.input_data`
    WHERE dataframe = 'training';

-- source: https://cloud.google.com/bigquery/docs/random-forest-classifier-tutorial
SELECT
  *
FROM
  ML.EVALUATE (MODEL `bqml_tutorial.random_forest_model`,
    (
    SELECT
      *
    FROM
      `bqml_tutorial.input_data`
    WHERE
      dataframe = 'evaluation'
    )
  );

-- source: https://cloud.google.com/bigquery/docs/random-forest-classifier-tutorial
SELECT
  *
FROM
  ML.PREDICT (MODEL `bqml_tutorial.random_forest_model`,
    (
    SELECT
      *
    FROM
      `bqml_tutorial.input_data`
    WHERE
      dataframe = 'prediction'
    )
  );
