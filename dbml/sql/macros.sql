-- The SQL surface's named parameters and defaults. TEMP: macros live beside the UDFs
-- they call, which are registered per connection by dbml.install().
-- The train() macro is not here: dbml.install() generates it from dbml.spec.TRAIN_PARAMS
-- and dbml.settings.SETTINGS (dbml.spec.train_macro_sql), the one home of its signature.
-- Nor is tune(), a table macro over dbml_tune generated the same way from
-- dbml.tunespec.TUNE_PARAMS (tune_macro_sql), or the view of its trials, dbml_trials
-- (dbml.trials.view_sql: dbml.trials with each model's best trial marked; an older database
-- opened read-only has no dbml.trials, and the view is then empty).

-- The catalog as users read it, dbml_models, dbml_weights and dbml_leaderboard, is made by
-- dbml.core.catalog_views (in the catalog's home, dbml.core.home, which is not always the schema
-- dbml; an older database opened read-only has no deployments table).

-- Calibrate this machine and train the latency predictor (as python -m dbml install).
CREATE OR REPLACE TEMP MACRO calibrate(quick := false) AS
    dbml_calibrate(quick, getvariable('dbml_device'), getvariable('dbml_torch_threads'));

-- The TEMP tables and views of the calling connection: dbml runs sources on its own
-- connection, which cannot see them, so a source naming one is refused (even when the
-- database has an object of that name, which dbml would otherwise read instead).
CREATE OR REPLACE TEMP MACRO dbml_temp_names() AS (
    SELECT coalesce(list(name), []) FROM (
        SELECT table_name AS name FROM duckdb_tables() WHERE temporary
        UNION ALL SELECT view_name FROM duckdb_views() WHERE temporary AND NOT internal));

-- Metrics of a model on a table or SELECT that holds its label.
-- on_error := 'skip': image/text rows that do not decode are left out, each named in a warning.
CREATE OR REPLACE TEMP MACRO evaluate(model, source, on_error := 'raise') AS
    dbml_evaluate(model, source, getvariable('dbml_sources'), dbml_temp_names(), on_error);
-- The same as a table: SELECT * FROM evaluate(...), one column per metric. DuckDB cannot
-- unnest(evaluate(...)): expanding a STRUCT copies its bound expression, and the subquery
-- of dbml_temp_names() cannot be copied; reading the STRUCT's fields from a derived table
-- (e.*) copies a column reference instead.
CREATE OR REPLACE TEMP MACRO evaluate(model, source, on_error := 'raise') AS TABLE
    SELECT e.* FROM (SELECT evaluate(model, source, on_error := on_error) AS e);

-- Block until a job started with wait := false ends; the connection id lets its
-- interrupt() end the wait (not the job).
CREATE OR REPLACE TEMP MACRO wait_job(job_id) AS dbml_wait_job(job_id, current_connection_id()::BIGINT);

-- Pin the version a model's name serves (catalog.deploy); without a version, serve the latest again.
CREATE OR REPLACE TEMP MACRO deploy(model, version := NULL) AS dbml_deploy(model, version);

-- The model (its latest version, or `version`) as an ONNX file with its preprocessing folded in.
CREATE OR REPLACE TEMP MACRO export_model(model, path, version := NULL, overwrite := false) AS
    dbml_export_model(model, path, version, overwrite);

-- Every row of a table or SELECT with the model's prediction appended as `prediction`.
-- query() runs the source on the calling connection (a table function takes no subquery,
-- so dbml_temp_names() cannot be passed: a TEMP object shadowing a table is read as the
-- caller sees it; its columns are checked against the database's object of that name).
-- on_error := 'skip': an image/text row that does not decode gets a NULL prediction, named in a warning.
CREATE OR REPLACE TEMP MACRO predictions(model, source, on_error := 'raise') AS TABLE
    SELECT * FROM query(dbml_predictions_sql(model, source, getvariable('dbml_sources'), on_error));

-- Every row of a table or SELECT with the model's prediction and each input column's
-- attribution to it (dbml/explain.py), run on the calling connection as predictions is.
CREATE OR REPLACE TEMP MACRO explain(model, source) AS TABLE
    SELECT * FROM query(dbml_explain_sql(model, source, getvariable('dbml_sources')));

-- Training jobs of this database, live: one row per job started since the process began.
CREATE OR REPLACE TEMP VIEW dbml_jobs AS
    SELECT unnest(dbml_job_rows(), recursive := true);

-- Per-epoch metrics of every stored model (like BigQuery ML's TRAINING_INFO).
CREATE OR REPLACE TEMP VIEW dbml_epochs AS
    SELECT name AS model, version, (e->>'epoch')::INTEGER AS epoch, (e->>'loss')::DOUBLE AS loss,
           (e->>'val_loss')::DOUBLE AS val_loss, (e->>'val_metric')::DOUBLE AS val_metric,
           (e->>'epoch')::INTEGER = (metrics->>'best_epoch')::INTEGER AS best,
           (e->>'seconds')::DOUBLE AS seconds, (e->>'wait_seconds')::DOUBLE AS data_wait_seconds
    FROM dbml_models, unnest(CAST(metrics->'history' AS JSON[])) AS h(e);

-- The installed latency predictor, one row per op kind, with its held-out accuracy.
CREATE OR REPLACE TEMP VIEW dbml_predictor AS
    SELECT unnest(dbml_predictor_rows(getvariable('dbml_device'), getvariable('dbml_torch_threads')),
                  recursive := true);

-- The device budget shared by training jobs, and each running or waiting job's share.
CREATE OR REPLACE TEMP VIEW dbml_memory AS
    SELECT unnest(dbml_memory_rows(getvariable('dbml_device')), recursive := true);
