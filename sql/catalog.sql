-- The model catalog (dbml/catalog.py reads and writes it). Persistent: it lives in the
-- user's database, in a schema of its own (out of SHOW TABLES and the shell's .tables),
-- so every connection to the same file sees the same models. dbml.install() moves the
-- tables of an older dbml (main.dbml_models, main.dbml_weights) here first
-- (catalog.migrate). The TEMP views dbml_models and dbml_weights (sql/views.sql) read them.
CREATE SCHEMA IF NOT EXISTS dbml;
CREATE TABLE IF NOT EXISTS dbml.models (
    name VARCHAR NOT NULL,
    version INTEGER NOT NULL,
    arch VARCHAR NOT NULL,
    task VARCHAR NOT NULL,
    features VARCHAR[] NOT NULL,
    label VARCHAR NOT NULL,
    config JSON NOT NULL,          -- the architecture, to rebuild the module
    preprocessing JSON NOT NULL,   -- standardisation statistics, categories, classes
    params JSON NOT NULL,          -- the training arguments
    metrics JSON NOT NULL,         -- final loss, validation metric, per-epoch history
    rows BIGINT NOT NULL,          -- training rows
    trained_at TIMESTAMP NOT NULL,
    bytes BIGINT NOT NULL,         -- size of the weights blob
    -- this stored model, unlike any other ever stored: (name, version) is not, since
    -- versions start again at 1 after drop_model (loaded models are cached by uid)
    uid UUID NOT NULL DEFAULT gen_random_uuid(),
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS dbml.weights (
    name VARCHAR NOT NULL,
    version INTEGER NOT NULL,
    weights BLOB NOT NULL,         -- torch.save of plain tensors, loaded with weights_only=True
    PRIMARY KEY (name, version)
);
CREATE SEQUENCE IF NOT EXISTS dbml.job_ids;
