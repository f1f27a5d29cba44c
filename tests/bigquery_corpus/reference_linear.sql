-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-create-glm
CREATE MODEL `mydataset.mymodel`
OPTIONS
  ( MODEL_TYPE='LINEAR_REG',
    LS_INIT_LEARN_RATE=0.15,
    L1_REG=1,
    MAX_ITERATIONS=5 ) AS
SELECT
  column1,
  column2,
  column3,
  label
FROM
  `mydataset.mytable`
WHERE
  column4 < 10;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-train
SELECT
  *
FROM
  ML.TRAINING_INFO(MODEL `mydataset.mymodel`);

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-evaluate
SELECT
  *
FROM
  ML.EVALUATE(MODEL `mydataset.mymodel`,
    TABLE `mydataset.mytable`);

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-weights
SELECT
  *
FROM
  ML.WEIGHTS(MODEL `mydataset.mymodel`,
    STRUCT(true AS standardize));

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-weights
SELECT
  *
FROM
  ML.WEIGHTS(MODEL `mydataset.mymodel`);

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-feature
SELECT
  *
FROM
  ML.FEATURE_INFO(MODEL `mydataset.mymodel`);

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-explain-predict
SELECT
  *
FROM
  ML.EXPLAIN_PREDICT(MODEL `mydataset.mymodel`,
    (
    SELECT
      label,
      column1,
      column2,
      column3
    FROM
      `mydataset.mytable`),
    STRUCT(3 AS top_k_features));

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-drop-model
DROP MODEL `mydataset.mymodel`;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-drop-model
DROP MODEL IF EXISTS `mydataset.mymodel`;
