-- source: https://cloud.google.com/bigquery/docs/logistic-regression-prediction
SELECT
age,
workclass,
marital_status,
education_num,
occupation,
hours_per_week,
income_bracket,
functional_weight
FROM
`bigquery-public-data.ml_datasets.census_adult_income`
LIMIT
100;

-- source: https://cloud.google.com/bigquery/docs/logistic-regression-prediction
CREATE OR REPLACE VIEW
`census.input_data` AS
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

-- source: https://cloud.google.com/bigquery/docs/logistic-regression-prediction
SELECT * FROM `census.input_data`;

-- source: https://cloud.google.com/bigquery/docs/logistic-regression-prediction
CREATE OR REPLACE MODEL
`census.census_model`
OPTIONS
( model_type='LOGISTIC_REG',
  auto_class_weights=TRUE,
  enable_global_explain=TRUE,
  data_split_method='NO_SPLIT',
  input_label_cols=['income_bracket'],
  max_iterations=15) AS
SELECT * EXCEPT(dataframe)
FROM
`census.input_data`
WHERE
dataframe = 'training';

-- source: https://cloud.google.com/bigquery/docs/logistic-regression-prediction
SELECT
*
FROM
ML.EVALUATE (MODEL `census.census_model`,
  (
  SELECT
    *
  FROM
    `census.input_data`
  WHERE
    dataframe = 'evaluation'
  )
);

-- source: https://cloud.google.com/bigquery/docs/logistic-regression-prediction
SELECT
*
FROM
ML.PREDICT (MODEL `census.census_model`,
  (
  SELECT
    *
  FROM
    `census.input_data`
  WHERE
    dataframe = 'prediction'
  )
);

-- source: https://cloud.google.com/bigquery/docs/logistic-regression-prediction
SELECT
*
FROM
ML.EXPLAIN_PREDICT(MODEL `census.census_model`,
  (
  SELECT
    *
  FROM
    `census.input_data`
  WHERE
    dataframe = 'evaluation'),
  STRUCT(3 as top_k_features));

-- source: https://cloud.google.com/bigquery/docs/logistic-regression-prediction
SELECT
  *
FROM
  ML.GLOBAL_EXPLAIN(MODEL `census.census_model`);
