"""One function per SQL function: convert the arguments, call dbml once, shape the result.

Each takes the ``Context`` of the database instance it is registered in, then the SQL
arguments (Arrow arrays for the vectorised ones). ``dbml.udfs.FUNCTIONS`` pairs them with
their SQL names and types.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlglot import exp

from ..core import jobs, placement, progress, views
from ..errors import InvalidArgument
from ..notebook import renderer_for
from ..core.instance import Instance
from ..core.settings import SOURCES, resolve, resolve_device
from ..core.source import check_not_temp, check_tables_only, select_tree
from ..core.spec import calls_from_sql_rows
from ..search.tunespec import request_from_sql_row


if TYPE_CHECKING:
    import pyarrow as pa

    from ..core.inference import ModelCache
    from ..core.inputs import InputEncoder

# Torch comes with the modules that use a model (dbml.core.inference, catalog, inputs, explain,
# latency, the scheduler): each UDF that needs one imports it in its body, so that the views,
# job control and train()'s argument checks run without torch (tests/test_first_statement.py).
# DuckDB imports pyarrow itself for the Arrow UDFs it calls; train() builds its result with it.


@dataclass(frozen=True)
class Context:
    """What the UDFs of one database instance share: the instance and its loaded models
    (``models``: the cache is made, with torch, when a UDF first asks for a model)."""
    instance: Instance
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @functools.cached_property
    def models(self) -> ModelCache:
        with self._lock:
            if "models" not in self.__dict__:   # another thread may have made it meanwhile
                from ..core.inference import ModelCache
                self.__dict__["models"] = ModelCache(self.instance.cursor)
            return self.__dict__["models"]


def instance_id(ctx: Context) -> str:
    return ctx.instance.id


def _writable(ctx: Context, fn: str) -> None:
    """Refuse a function that writes the database (or the machine's calibration) on a read-only one."""
    if ctx.instance.read_only:
        raise InvalidArgument(f"{fn}(): the database is open read-only, and {fn} writes to it; "
                              f"open it without read_only (dbml.connect(path)) to use {fn}")


def train(ctx: Context, *columns: pa.Array) -> pa.Array:
    """Vectorised: every row of the vector is a job; they all start at once. The last
    columns are the calling connection's id (``current_connection_id()``), whose
    ``interrupt()`` cancels the statement's jobs, and its TEMP tables and views."""
    since = time.perf_counter()   # the jobs' estimates count the statement's start-up from here
    *columns, connection, temp_names = columns
    _writable(ctx, "train")
    calls = calls_from_sql_rows(zip(*(c.to_pylist() for c in columns)))  # all validated first
    for call in calls:
        if call.spec is not None:
            check_not_temp(select_tree(call.spec.source, fn="train"), temp_names[0].as_py(), fn="train")
            placement.check_access(call.spec, ctx.instance.cursor())
    waiting = [c.spec.settings.progress for c in calls if c.spec is not None and c.wait]
    statement = connection[0].as_py()
    with progress.watching(ctx.instance, renderer_for(waiting[0]) if waiting else None, connection=statement):
        summaries = jobs.train_all(ctx.instance.jobs, calls, statement, since=since)
    import pyarrow as pa

    from .types import TRAIN_RESULT_ARROW
    return pa.array(summaries, type=TRAIN_RESULT_ARROW)


def tune(ctx: Context, *args) -> list[dict]:
    """One tune() call: its arguments (``dbml.search.tunespec.TUNE_PARAMS``, the settings), then the
    calling connection's id and its TEMP objects, as for train; the rows of its trials."""
    since = time.perf_counter()   # a Ctrl-C from here on interrupts the search
    from ..search import engine as search  # Optuna, imported when a search runs
    *args, connection, temp_names = args
    _writable(ctx, "tune")
    request = request_from_sql_row(tuple(args))
    check_not_temp(select_tree(request.base.source, fn="tune"), temp_names, fn="tune")
    placement.check_access(request.base, ctx.instance.cursor())
    with progress.watching(ctx.instance, renderer_for(request.base.settings.progress), connection=connection):
        return search.run(ctx.instance, request, connection, since)


def wait_job(ctx: Context, job_id: int, connection: int) -> dict:
    return ctx.instance.jobs.wait(job_id, connection)


def cancel_job(ctx: Context, job_id: int) -> str:
    return ctx.instance.jobs.cancel(job_id)


def job_rows(ctx: Context) -> list[dict]:
    return views.job_rows(ctx.instance.jobs)


def memory_rows(ctx: Context, device: str | None) -> list[dict]:
    from ..scheduler.multijob.registry import device_ledger, existing_scheduler
    device = resolve_device(device)
    return views.memory_rows(ctx.instance.jobs, existing_scheduler(device), device_ledger(device))


def calibrate(ctx: Context, quick: bool | None, device: str | None, threads: int | None) -> dict:
    from ..core import latency
    from ..scheduler.latency.predictor import predictor_path
    _writable(ctx, "calibrate")
    if not ctx.instance.cursor().execute("SELECT current_setting('enable_external_access')").fetchall()[0][0]:
        raise InvalidArgument("calibrate(): DuckDB's enable_external_access is false here (safe mode), and "
                              "calibrating writes the latency predictor and the graph cache to this machine's "
                              "dbml cache folder; run python -m dbml install outside safe mode instead")
    threads = resolve("torch_threads", threads)
    predictor = latency.calibrate(resolve_device(device), bool(quick), threads)
    report = predictor.report()
    return {"device": str(predictor.device), "op_kinds": len(report.rows),
            "samples": sum(r.samples for r in report.rows), "model_bytes": report.model_bytes,
            "seconds": report.calibration_seconds, "path": str(predictor_path(predictor.device, threads))}


def predictor_rows(ctx: Context, device: str | None, threads: int | None) -> list[dict]:
    return views.predictor_rows(resolve_device(device), resolve("torch_threads", threads))


def _predict(ctx: Context, models: pa.Array, features: pa.Array, kind: str, fn: str) -> pa.Array:
    from ..core import inference
    return inference.per_model(models, lambda name, rows: inference.predict_values(
        ctx.models.get(name, fn=fn), features.take(rows), fn=fn, kind=kind))


def predict(ctx: Context, models: pa.Array, features: pa.Array) -> pa.Array:
    return _predict(ctx, models, features, "value", "predict")


def predict_label(ctx: Context, models: pa.Array, features: pa.Array) -> pa.Array:
    return _predict(ctx, models, features, "label", "predict_label")


def predict_proba(ctx: Context, models: pa.Array, features: pa.Array) -> pa.Array:
    return _predict(ctx, models, features, "proba", "predict_proba")


def infer(ctx: Context, models: pa.Array, uids: pa.Array, x: pa.Array, on_error: pa.Array,
          names: pa.Array) -> pa.Array:
    """The table form's forward pass (``predictions``): rows already encoded by SQL (or an
    image, text or sequence column), for the stored model (its catalog uid) the statement
    was built for; ``on_error`` and the rows' ``names`` as ``predictions_sql`` wrote them."""
    from ..core import inference
    return inference.per_model(models, lambda name, rows: inference.infer_encoded(
        ctx.models.get(name, fn="predictions", uid=uids[rows[0]].as_py()), x.take(rows),
        on_error=on_error[0].as_py(), names=names.take(rows)))


def decode_image(ctx: Context, images: pa.Array, encoders: pa.Array, tokens: pa.Array) -> pa.Array:
    """PNG/JPEG BLOBs -> raw pixels, as a job's scratch table stores them (``InputEncoder.scratch_sql``);
    only for the SQL dbml writes, which passes this process's ``DECODE_TOKEN``."""
    from ..core.inputs import DECODE_TOKEN
    if set(tokens.to_pylist()) - {DECODE_TOKEN}:
        raise InvalidArgument("dbml_decode_image() is dbml's own, for the SQL train() writes; "
                              "call train() or predict() instead")
    encoder = _encoder(encoders[0].as_py())
    return encoder.decode(images)


@functools.lru_cache(maxsize=16)
def _encoder(text: str) -> InputEncoder:
    from ..core.inputs import InputEncoder
    return InputEncoder.from_dict(json.loads(text))


def _with_cursor(ctx: Context, work):
    cur = ctx.instance.cursor()
    try:
        return work(cur)
    finally:
        cur.close()


def _checked(cur, source: str, sources: str | None, temp_names: list[str], fn: str) -> exp.Query:
    """The source as one SELECT (a tree), under the ``sources`` setting, naming none of the caller's TEMP objects."""
    if sources not in SOURCES:
        raise InvalidArgument(f"{fn}(): setting sources is {sources!r}; SET VARIABLE dbml_sources = 'any' or 'tables'")
    select_sql = select_tree(source, fn=fn)
    check_not_temp(select_sql, temp_names, fn=fn)
    if sources == "tables":
        check_tables_only(cur, select_sql, fn=fn)
    return select_sql


def evaluate(ctx: Context, model: str, source: str, sources: str | None, temp_names: list[str],
             on_error: str | None) -> dict:
    from ..core import inference
    return _with_cursor(ctx, lambda cur: inference.evaluate(
        cur, ctx.models, model, _checked(cur, source, sources, temp_names, "evaluate"), on_error))


def predictions_sql(ctx: Context, model: str, source: str, sources: str | None, on_error: str | None) -> str:
    from ..core import inference
    return _with_cursor(ctx, lambda cur: inference.predictions_sql(
        cur, ctx.models, model, _checked(cur, source, sources, [], "predictions"), on_error))


def explain(ctx: Context, models: pa.Array, uids: pa.Array, x: pa.Array) -> pa.Array:
    """``explain``'s attributions for rows encoded by SQL, for the stored model the statement was built for."""
    from ..core import inference
    from ..explain import explanations
    return inference.per_model(models, lambda name, rows: explanations(
        ctx.models.get(name, fn="explain", uid=uids[rows[0]].as_py()), x.take(rows)))


def explain_sql(ctx: Context, model: str, source: str, sources: str | None) -> str:
    from ..explain import explain_sql as explain_query
    return _with_cursor(ctx, lambda cur: explain_query(cur, ctx.models, model,
                                                       _checked(cur, source, sources, [], "explain")))


def export_model(ctx: Context, model: str, path: str, version: int | None, overwrite: bool | None) -> dict:
    if model is None or path is None:
        raise InvalidArgument("export_model(): model and path must not be NULL, e.g. export_model('churn', 'churn.onnx')")
    try:
        from ..export import export_model as export
    except ImportError as e:   # onnx is an extra
        raise InvalidArgument(f"export_model(): needs the onnx package ({e.name}); pip install 'dbml[onnx]'") from e
    return _with_cursor(ctx, lambda cur: export(cur, model, path, version, bool(overwrite)))


def deploy(ctx: Context, model: str, version: int | None) -> dict:
    from ..core.catalog import deploy as pin
    _writable(ctx, "deploy")
    if model is None:
        raise InvalidArgument("deploy(): model must not be NULL, e.g. deploy('churn', version := 2)")
    return _with_cursor(ctx, lambda cur: pin(cur, model, version))


def drop_model(ctx: Context, model: str) -> int:
    from ..core.catalog import drop
    _writable(ctx, "drop_model")
    return _with_cursor(ctx, lambda cur: drop(cur, model))
