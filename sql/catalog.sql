-- The model catalog (dbml/catalog.py reads and writes it). Persistent: it lives in the
-- user's database, so every connection to the same file sees the same models.
CREATE TABLE IF NOT EXISTS dbml_models (
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
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS dbml_weights (
    name VARCHAR NOT NULL,
    version INTEGER NOT NULL,
    weights BLOB NOT NULL,         -- torch.save of plain tensors, loaded with weights_only=True
    PRIMARY KEY (name, version)
);
CREATE SEQUENCE IF NOT EXISTS dbml_job_ids;
