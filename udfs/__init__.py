"""The SQL surface of dbml: thin UDFs that parse SQL arguments, call dbml, shape results.

``register(con)`` puts them on one connection (DuckDB's Python UDFs are per connection);
``sql/macros.sql`` wraps some of them in macros with named parameters. ``SQL_FUNCTIONS``
is the public surface with its help text: the shell's ``.help`` prints it and a test
checks that the README documents every entry.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
from duckdb import sqltypes as t

from ..inference import ModelCache
from ..settings import parse_bytes

SQL_FUNCTIONS: dict[str, str] = {
    "train": "train(model, source, label := ..., features, arch, epochs, batch_size, lr, optimizer, seed, "
             "validation, hidden, dropout, task, weight_decay, momentum, policy, memory_budget) -> STRUCT: "
             "train a model on a table or one SELECT under the memory scheduler and store it as the next "
             "version of `model`",
    "predict": "predict(model, [x1, x2, ...]) -> DOUBLE: the prediction for raw numeric features in training "
               "order (regression value, or class for numeric labels)",
    "predict_label": "predict_label(model, [x1, ...]) -> VARCHAR: the predicted class as text",
    "predict_proba": "predict_proba(model, [x1, ...]) -> DOUBLE[]: class probabilities, in class order",
    "predictions": "SELECT * FROM predictions(model, source): every row of a table or SELECT plus a "
                   "`prediction` column; takes the model's features by name (categorical ones too)",
    "evaluate": "evaluate(model, source) -> STRUCT: accuracy, macro_f1, log_loss (classification) or "
                "rmse, mae, r2 (regression) on a table or SELECT that holds the label",
    "drop_model": "drop_model(model) -> BIGINT: delete every version of a model and its weights; "
                  "returns how many versions were dropped",
    "wait_job": "wait_job(job_id) -> STRUCT: block until a training job started with wait := false ends; "
                "its summary (the job's error if it failed or was cancelled)",
    "cancel_job": "cancel_job(job_id) -> VARCHAR: stop a training job at its next iteration boundary; "
                  "nothing of it is stored; returns its status when asked",
    "calibrate": "calibrate(quick := false) -> STRUCT: measure this machine's op latencies and copy bandwidth "
                 "and train the latency predictor the scheduler plans with (as python -m dbml install)",
}

# Internal functions the macros call; not part of the documented surface.
INTERNAL_FUNCTIONS = ("dbml_instance_id", "dbml_train", "dbml_predictions_sql", "dbml_infer", "dbml_job_rows",
                      "dbml_calibrate", "dbml_predictor_rows", "dbml_memory_rows")

TRAIN_FIELDS = {
    "job_id": (t.BIGINT, pa.int64()), "model": (t.VARCHAR, pa.string()), "version": (t.INTEGER, pa.int32()),
    "status": (t.VARCHAR, pa.string()), "epochs": (t.INTEGER, pa.int32()), "rows": (t.BIGINT, pa.int64()),
    "final_loss": (t.DOUBLE, pa.float64()), "val_metric": (t.DOUBLE, pa.float64()),
    "seconds": (t.DOUBLE, pa.float64()), "measured_peak_bytes": (t.BIGINT, pa.int64()),
    "vanilla_peak_bytes": (t.BIGINT, pa.int64()), "planned_peak_bytes": (t.BIGINT, pa.int64()),
    "msr": (t.DOUBLE, pa.float64()), "swaps": (t.BIGINT, pa.int64()), "recomputes": (t.BIGINT, pa.int64()),
    "passive_swaps": (t.BIGINT, pa.int64()), "replans": (t.BIGINT, pa.int64()),
    "plan_seconds": (t.DOUBLE, pa.float64()),
    "latency_model": (t.VARCHAR, pa.string()),
}
TRAIN_RESULT = duckdb.struct_type({k: v[0] for k, v in TRAIN_FIELDS.items()})
TRAIN_RESULT_ARROW = pa.struct([(k, v[1]) for k, v in TRAIN_FIELDS.items()])
TRAIN_WAIT_ARG = 19   # position of `wait` among dbml_train's arguments
MEMORY_ROW = duckdb.struct_type({
    "job_id": t.BIGINT, "model": t.VARCHAR, "status": t.VARCHAR, "planned_peak_bytes": t.BIGINT,
    "in_effect_bytes": t.BIGINT, "share": t.DOUBLE, "held_bytes": t.BIGINT, "measured_peak_bytes": t.BIGINT,
    "budget_bytes": t.BIGINT, "global_planned_peak_bytes": t.BIGINT, "global_in_effect_bytes": t.BIGINT,
    "global_held_bytes": t.BIGINT, "global_measured_peak_bytes": t.BIGINT, "waiting_jobs": t.INTEGER,
})
CALIBRATE_RESULT = duckdb.struct_type({
    "device": t.VARCHAR, "op_kinds": t.INTEGER, "samples": t.BIGINT, "model_bytes": t.BIGINT,
    "seconds": t.DOUBLE, "path": t.VARCHAR,
})
PREDICTOR_ROW = duckdb.struct_type({
    "op": t.VARCHAR, "samples": t.BIGINT, "r2": t.DOUBLE, "baseline_r2": t.DOUBLE, "median_rel_error": t.DOUBLE,
    "fingerprint": t.VARCHAR, "model_bytes": t.BIGINT, "calibration_seconds": t.DOUBLE,
})
JOB_ROW = duckdb.struct_type({
    "id": t.BIGINT, "model": t.VARCHAR, "status": t.VARCHAR, "progress": t.DOUBLE, "epoch": t.INTEGER,
    "epochs": t.INTEGER, "loss": t.DOUBLE, "rows_per_s": t.DOUBLE, "planned_peak_bytes": t.BIGINT,
    "measured_peak_bytes": t.BIGINT, "swaps": t.BIGINT, "recomputes": t.BIGINT, "passive_swaps": t.BIGINT,
    "replans": t.BIGINT, "started": t.TIMESTAMP, "finished": t.TIMESTAMP, "error": t.VARCHAR,
})
EVALUATE_RESULT = duckdb.struct_type({
    "rows": t.BIGINT, "accuracy": t.DOUBLE, "macro_f1": t.DOUBLE, "log_loss": t.DOUBLE,
    "rmse": t.DOUBLE, "mae": t.DOUBLE, "r2": t.DOUBLE,
})
DOUBLES = duckdb.list_type(t.DOUBLE)


def register(instance) -> None:
    """Register every dbml UDF in a database instance (a ``dbml.instance.Instance``).

    UDFs are instance-wide in DuckDB; they are registered through the instance's owner
    connection and take their cursors from it.
    """
    from .. import inference, jobs, latency, training, views
    from ..scheduler.latency.predictor import predictor_path
    from ..scheduler.multijob.scheduler import device_ledger, existing_scheduler
    from ..settings import resolve_device
    from ..catalog import drop

    cache = ModelCache(instance.cursor)

    def with_cursor(work):
        cur = instance.cursor()
        try:
            return work(cur)
        finally:
            cur.close()

    def train_spec(model, source, label, features, arch, epochs, batch_size, lr, optimizer, seed, validation,
                   hidden, dropout, task, weight_decay, momentum, policy, memory_budget, device_budget, wait,
                   device, prefetch, window, threads, latency, beta, threshold):
        return training.TrainSpec(
            model=model, source=source, label=label,
            features=None if features is None else tuple(features), arch=arch, epochs=epochs,
            batch_size=batch_size, lr=lr, optimizer=optimizer, seed=seed, validation=validation,
            hidden=None if hidden is None else tuple(hidden), dropout=dropout, task=task,
            weight_decay=weight_decay, momentum=momentum, policy=policy,
            memory_budget=None if memory_budget is None else parse_bytes(memory_budget, name="train(): memory_budget"),
            device_budget=None if device_budget is None else parse_bytes(device_budget, name="setting memory_budget"),
            device=device or "auto",
            prefetch_batches=prefetch or 4, shuffle_window=window or 65536, torch_threads=threads or 1,
            latency_model=latency or "predictor", replan_beta=0.9 if beta is None else beta,
            replan_threshold=0.3 if threshold is None else threshold)

    def dbml_train(model, source, label, features, arch, epochs, batch_size, lr, optimizer, seed, validation,
                   hidden, dropout, task, weight_decay, momentum, policy, memory_budget, device_budget, wait,
                   device, prefetch, window, threads, latency, beta, threshold):
        """Vectorised: every row of the vector is a job; they all start at once."""
        columns = (model, source, label, features, arch, epochs, batch_size, lr, optimizer, seed, validation,
                   hidden, dropout, task, weight_decay, momentum, policy, memory_budget, device_budget, wait,
                   device, prefetch, window, threads, latency, beta, threshold)
        rows = list(zip(*(c.to_pylist() for c in columns)))
        specs = [train_spec(*row) for row in rows]          # all validated before any starts
        waits = {row[TRAIN_WAIT_ARG] is not False for row in rows}
        results = jobs.train_all(instance.jobs, specs, wait=waits != {False})
        return pa.array(results, type=TRAIN_RESULT_ARROW)

    def predictor(kind: str, fn: str):
        def udf(models, features):
            return inference.per_model(models, lambda name, rows: inference.predict_values(
                cache.get(name, fn=fn), features.take(rows), fn=fn, kind=kind))
        return udf

    def dbml_infer(models, versions, x):
        return inference.per_model(models, lambda name, rows: inference.infer_encoded(
            cache.get(name, versions[rows[0]].as_py(), fn="predictions"), x.take(rows)))

    def evaluate(model, source):
        return with_cursor(lambda cur: inference.evaluate(cur, cache, model, source))

    def dbml_predictions_sql(model, source):
        return with_cursor(lambda cur: inference.predictions_sql(cur, cache, model, source))

    def drop_model(model):
        return with_cursor(lambda cur: drop(cur, model))

    def wait_job(job_id):
        return instance.jobs.wait(job_id)

    def cancel_job(job_id):
        return instance.jobs.cancel(job_id)

    def dbml_job_rows():
        return views.job_rows(instance.jobs)

    def dbml_calibrate(quick, device, threads):
        predictor = latency.calibrate(resolve_device(device), bool(quick), threads or 1)
        report = predictor.report()
        return {"device": str(predictor.device), "op_kinds": len(report.rows),
                "samples": sum(r.samples for r in report.rows), "model_bytes": report.model_bytes,
                "seconds": report.calibration_seconds, "path": str(predictor_path(predictor.device, threads or 1))}

    def dbml_memory_rows(device):
        device = resolve_device(device)
        return views.memory_rows(instance.jobs, existing_scheduler(device), device_ledger(device))

    def dbml_predictor_rows(device, threads):
        return views.predictor_rows(resolve_device(device), threads or 1)

    effects = dict(null_handling="special", side_effects=True)
    functions = [
        ("dbml_instance_id", lambda: instance.id, [], t.VARCHAR, {}),
        ("dbml_train", dbml_train, [t.VARCHAR, t.VARCHAR, t.VARCHAR, duckdb.list_type(t.VARCHAR), t.VARCHAR,
                                    t.INTEGER, t.INTEGER, t.DOUBLE, t.VARCHAR, t.BIGINT, t.DOUBLE,
                                    duckdb.list_type(t.INTEGER), t.DOUBLE, t.VARCHAR, t.DOUBLE, t.DOUBLE,
                                    t.VARCHAR, t.VARCHAR, t.VARCHAR, t.BOOLEAN, t.VARCHAR, t.INTEGER, t.INTEGER,
                                    t.INTEGER, t.VARCHAR, t.DOUBLE, t.DOUBLE],
         TRAIN_RESULT, dict(type="arrow", **effects)),
        ("wait_job", wait_job, [t.BIGINT], TRAIN_RESULT, effects),
        ("cancel_job", cancel_job, [t.BIGINT], t.VARCHAR, effects),
        ("dbml_job_rows", dbml_job_rows, [], duckdb.list_type(JOB_ROW), effects),
        ("dbml_memory_rows", dbml_memory_rows, [t.VARCHAR], duckdb.list_type(MEMORY_ROW), effects),
        ("dbml_calibrate", dbml_calibrate, [t.BOOLEAN, t.VARCHAR, t.INTEGER], CALIBRATE_RESULT, effects),
        ("dbml_predictor_rows", dbml_predictor_rows, [t.VARCHAR, t.INTEGER], duckdb.list_type(PREDICTOR_ROW),
         effects),
        ("predict", predictor("value", "predict"), [t.VARCHAR, DOUBLES], t.DOUBLE, dict(type="arrow")),
        ("predict_label", predictor("label", "predict_label"), [t.VARCHAR, DOUBLES], t.VARCHAR, dict(type="arrow")),
        ("predict_proba", predictor("proba", "predict_proba"), [t.VARCHAR, DOUBLES], DOUBLES, dict(type="arrow")),
        ("dbml_infer", dbml_infer, [t.VARCHAR, t.INTEGER, duckdb.list_type(t.FLOAT)], t.DOUBLE, dict(type="arrow")),
        ("evaluate", evaluate, [t.VARCHAR, t.VARCHAR], EVALUATE_RESULT, effects),
        ("dbml_predictions_sql", dbml_predictions_sql, [t.VARCHAR, t.VARCHAR], t.VARCHAR, effects),
        ("drop_model", drop_model, [t.VARCHAR], t.BIGINT, effects),
    ]
    for name, fn, params, returns, options in functions:
        instance.owner.create_function(name, fn, params, returns, **options)
        instance.functions.append(name)
