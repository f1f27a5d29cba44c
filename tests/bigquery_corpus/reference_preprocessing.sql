-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-standard-scaler
SELECT f, ML.STANDARD_SCALER(f) OVER () AS output
FROM
  UNNEST([1,2,3,4,5]) AS f;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-min-max-scaler
SELECT f, ML.MIN_MAX_SCALER(f) OVER () AS output
FROM
  UNNEST([1,2,3,4,5]) AS f;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-max-abs-scaler
SELECT f, ML.MAX_ABS_SCALER(f) OVER () AS output
FROM
  UNNEST([NULL, -3, 1, 2, 3, 4, 5]) AS f
ORDER BY f;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-bucketize
SELECT
  ML.BUCKETIZE(2.5, [1, 2, 3]) AS bucket,
  ML.BUCKETIZE(2.5, [1, 2, 3], TRUE) AS bucket_without_edge;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-quantile-bucketize
SELECT
  f, ML.QUANTILE_BUCKETIZE(f, 3) OVER() AS bucket
FROM
  UNNEST([1,2,3,4,5]) AS f;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-feature-cross
SELECT
  ML.FEATURE_CROSS(STRUCT('a' AS f1, 'b' AS f2, 'c' AS f3)) AS output;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-polynomial-expand
SELECT
  ML.POLYNOMIAL_EXPAND(STRUCT(2 AS a, 3 AS b)) AS output;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-imputer
SELECT f, ML.IMPUTER(f, 'mean') OVER () AS output
FROM
  UNNEST([NULL, -3, -3, -3, 1, 2, 3, 4, 5]) AS f
ORDER BY f;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-robust-scaler
SELECT f, ML.ROBUST_SCALER(f) OVER () AS output
FROM
  UNNEST([NULL, -3, 1, 2, 3, 4, 5]) AS f
ORDER BY f;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-transform
CREATE MODEL `mydataset.mymodel`
TRANSFORM(
  ML.STANDARD_SCALER(column1) OVER() AS f1,
  ML.MIN_MAX_SCALER(column2) OVER() AS f2,
  ML.BUCKETIZE(column4, [3, 6, 9]) AS f4,
  column3,
  label)
OPTIONS(MODEL_TYPE='LOGISTIC_REG')
AS SELECT column1, column2, column3, column4, label FROM `mydataset.mytable`;

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-transform
SELECT
  *
FROM
  ML.PREDICT(MODEL `mydataset.mymodel`, TABLE `mydataset.mytable`);

-- source: https://cloud.google.com/bigquery/docs/reference/standard-sql/bigqueryml-syntax-feature
SELECT
  *
FROM
  ML.FEATURE_INFO(MODEL `mydataset.mymodel`);
