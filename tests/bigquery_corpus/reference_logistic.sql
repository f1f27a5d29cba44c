-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-create-glm
CREATE MODEL `mydataset.mymodel`
OPTIONS
  ( MODEL_TYPE='LOGISTIC_REG',
    AUTO_CLASS_WEIGHTS=TRUE ) AS
SELECT
  column1,
  column2,
  column3,
  label
FROM
  `mydataset.mytable`;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-evaluate
SELECT
  *
FROM
  ML.EVALUATE(MODEL `mydataset.mymodel`,
    (
    SELECT
      label,
      column1,
      column2,
      column3
    FROM
      `mydataset.mytable`),
    STRUCT(0.55 AS threshold));

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-predict
SELECT
  *
FROM
  ML.PREDICT(MODEL `mydataset.mymodel`,
    (
    SELECT
      label,
      column1,
      column2,
      column3
    FROM
      `mydataset.mytable`),
    STRUCT(0.55 AS threshold));

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-confusion
SELECT
  *
FROM
  ML.CONFUSION_MATRIX(MODEL `mydataset.mymodel`,
    (
    SELECT
      *
    FROM
      `mydataset.mytable`));

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-confusion
SELECT
  *
FROM
  ML.CONFUSION_MATRIX(MODEL `mydataset.mymodel`,
    (
    SELECT
      *
    FROM
      `mydataset.mytable`),
    STRUCT(0.6 AS threshold));

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-roc
SELECT
  *
FROM
  ML.ROC_CURVE(MODEL `mydataset.mymodel`,
    TABLE `mydataset.mytable`);

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-roc
SELECT
  recall,
  false_positive_rate
FROM
  ML.ROC_CURVE(MODEL `mydataset.mymodel`,
    TABLE `mydataset.mytable`,
    GENERATE_ARRAY(0.4,0.6,0.01));

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-weights
SELECT
  *
FROM
  ML.WEIGHTS(MODEL `mydataset.mymodel`);

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-global-explain
SELECT
  *
FROM
  ML.GLOBAL_EXPLAIN(MODEL `mydataset.mymodel`);
