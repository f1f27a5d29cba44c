"""The columns of dbml's SQL results and views: name -> SQL type, one table each.

These tables are the one definition of each result's shape. ``dbml.udfs.types`` derives
the DuckDB STRUCT (and Arrow) types from them; the code that fills a row takes its keys
from them (``jobs.JOB_COLUMNS``, ``jobs.MEMORY_COLUMNS``, ``training.MEMORY_FIELDS``).
The README describes each column.
"""

from __future__ import annotations

# The job's summary (job.result): the job (error: why a row failed, under on_error :=
# 'continue'), its validation metric by name (val_metric_name), then its memory figures
# (TRAIN_MEMORY, the runner's stats). dbml_jobs shows all of it.
TRAIN_JOB = {
    "job_id": "BIGINT", "model": "VARCHAR", "version": "INTEGER", "status": "VARCHAR", "error": "VARCHAR",
    "epochs": "INTEGER", "best_epoch": "INTEGER", "rows": "BIGINT", "skipped_rows": "BIGINT", "final_loss": "DOUBLE",
    "metric": "VARCHAR", "val_metric": "DOUBLE", "val_loss": "DOUBLE", "warnings": "VARCHAR",
    "estimated_seconds": "DOUBLE", "seconds": "DOUBLE",
}
TRAIN_MEMORY = {
    "measured_peak_bytes": "BIGINT", "vanilla_peak_bytes": "BIGINT", "vanilla_source": "VARCHAR",
    "planned_peak_bytes": "BIGINT", "msr": "DOUBLE", "swaps": "BIGINT", "recomputes": "BIGINT",
    "passive_swaps": "BIGINT", "replans": "BIGINT",
    "plan_seconds": "DOUBLE", "latency_model": "VARCHAR", "budget_bytes": "BIGINT",
    "real_peak_bytes": "BIGINT", "spilled_peak_bytes": "BIGINT",
}
TRAIN_SUMMARY = {**TRAIN_JOB, **TRAIN_MEMORY}
MEMORY_FIELDS = tuple(TRAIN_MEMORY)

# What train(), wait_job() and CREATE MODEL return (one owner: ``train_result``): the model and
# version stored, how it went and its main figures. The scheduler's figures stay in dbml_jobs
# (``SELECT * FROM dbml_jobs WHERE job_id = ...``).
TRAIN_RESULT = {name: TRAIN_SUMMARY[name] for name in (
    "model", "version", "status", "rows", "epochs", "final_loss", "val_loss", "metric", "val_metric", "seconds",
    "job_id", "warnings", "error")}


def train_result(summary: dict) -> dict:
    """The train() row of a job's summary (or of a failed row's status and error): TRAIN_RESULT's columns."""
    return {k: summary.get(k) for k in TRAIN_RESULT}


# dbml_jobs: one row per job, live (jobs.Job's figures) until it ends, then its whole summary
# (TRAIN_SUMMARY) beside them (views.job_row)
JOB_LIVE = {
    "job_id": "BIGINT", "model": "VARCHAR", "status": "VARCHAR", "progress": "DOUBLE", "epoch": "INTEGER",
    "epochs": "INTEGER", "loss": "DOUBLE", "rows_per_s": "DOUBLE", "planned_peak_bytes": "BIGINT",
    "measured_peak_bytes": "BIGINT", "swaps": "BIGINT", "recomputes": "BIGINT", "passive_swaps": "BIGINT",
    "replans": "BIGINT", "estimated_seconds": "DOUBLE", "warnings": "VARCHAR", "started": "TIMESTAMP",
    "finished": "TIMESTAMP", "error": "VARCHAR", "node": "VARCHAR", "device": "VARCHAR", "queued_for": "VARCHAR",
}
JOB_ROW = {**JOB_LIVE, **{k: v for k, v in TRAIN_SUMMARY.items() if k not in JOB_LIVE}}
JOB_COLUMNS = tuple(JOB_ROW)

# dbml_memory: one row per job in the device's shared scheduler (jobs.memory_rows)
MEMORY_ROW = {
    "job_id": "BIGINT", "model": "VARCHAR", "status": "VARCHAR", "planned_peak_bytes": "BIGINT",
    "in_effect_bytes": "BIGINT", "share": "DOUBLE", "held_bytes": "BIGINT", "measured_peak_bytes": "BIGINT",
    "budget_bytes": "BIGINT", "global_planned_peak_bytes": "BIGINT", "global_in_effect_bytes": "BIGINT",
    "global_held_bytes": "BIGINT", "global_measured_peak_bytes": "BIGINT", "waiting_jobs": "INTEGER",
}
MEMORY_COLUMNS = tuple(MEMORY_ROW)

# tune(): one row per trial it ran; the dbml_trials view: every stored trial (dbml.search.trials.ROWS)
TRIAL_ROW = {
    "model": "VARCHAR", "trial": "INTEGER", "status": "VARCHAR", "objective_name": "VARCHAR",
    "objective": "DOUBLE", "best": "BOOLEAN", "params": "JSON", "objectives": "DOUBLE[]", "epochs": "INTEGER",
    "seconds": "DOUBLE", "peak_bytes": "BIGINT", "error": "VARCHAR", "version": "INTEGER", "job_id": "BIGINT",
    "started_at": "TIMESTAMP",
}

# deploy(): the version the model serves now, and whether it is pinned (else its latest)
DEPLOY_RESULT = {"model": "VARCHAR", "version": "INTEGER", "pinned": "BOOLEAN"}

# calibrate()
CALIBRATE_RESULT = {
    "device": "VARCHAR", "op_kinds": "INTEGER", "samples": "BIGINT", "model_bytes": "BIGINT",
    "seconds": "DOUBLE", "path": "VARCHAR",
}

# dbml_predictor: one row per op kind of the installed predictor (latency.report_rows)
PREDICTOR_ROW = {
    "op": "VARCHAR", "samples": "BIGINT", "r2": "DOUBLE", "baseline_r2": "DOUBLE", "median_rel_error": "DOUBLE",
    "fingerprint": "VARCHAR", "model_bytes": "BIGINT", "calibration_seconds": "DOUBLE",
}

# evaluate(): classification fills the first three metrics, regression the last three
EVALUATE_RESULT = {
    "rows": "BIGINT", "accuracy": "DOUBLE", "macro_f1": "DOUBLE", "log_loss": "DOUBLE",
    "rmse": "DOUBLE", "mae": "DOUBLE", "r2": "DOUBLE",
}

# explain(model, source): per row, after the source's columns and `prediction` (as
# predictions): one attribution per input column, in the model's feature order, and the
# explained output (dbml/explain.py) at the baseline row and at this row
EXPLAIN_RESULT = {
    "attributions": "STRUCT(feature VARCHAR, attribution DOUBLE)[]", "baseline_value": "DOUBLE",
    "prediction_value": "DOUBLE", "approximation_error": "DOUBLE",
}
