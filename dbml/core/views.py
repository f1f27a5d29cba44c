"""The rows behind dbml's live views: ``dbml_jobs``, ``dbml_memory`` and ``dbml_predictor``.

Each builder reads its owners' public state (the JobManager's jobs, the memory
scheduler's and the device ledger's snapshots, the loaded or installed latency
predictor) and returns plain dicts, one per row, with the view's columns.
"""

from __future__ import annotations

from .columns import JOB_COLUMNS, JOB_LIVE, MEMORY_COLUMNS
from .jobs import Job, JobManager

def job_row(job: Job) -> dict:
    """One ``dbml_jobs`` row: the job's live figures, then, once it has finished, its summary
    (the version stored, the metrics, every memory figure of its run) over them."""
    live = {k: getattr(job, k) for k in JOB_LIVE if k != "job_id"}
    summary = {k: v for k, v in (job.result or {}).items() if k in JOB_COLUMNS and v is not None}
    return {**dict.fromkeys(JOB_COLUMNS), **live, **summary, "job_id": job.id, "status": job.shown_status}


def job_rows(manager: JobManager) -> list[dict]:
    """``dbml_jobs``: every job of this database, oldest first."""
    return [job_row(j) for j in manager.jobs()]


def memory_rows(manager: JobManager, scheduler, ledger=None) -> list[dict]:
    """``dbml_memory``: the shared device budget and each of this database's jobs in it.

    One row per job the scheduler holds (planned or waiting), with the global figures
    repeated; one row with no job when it holds none. ``in_effect_bytes`` is what the
    job's current plan may use (a new, larger plan takes effect only once the other jobs
    have shrunk); ``held_bytes`` what its executors hold now and ``measured_peak_bytes``
    its own peak so far. ``global_held_bytes`` and ``global_measured_peak_bytes`` come
    from the device's ledger (``ledger``), where every scheduled job's executors report
    their memory as it changes: what all jobs hold together now, and the most they held
    at one moment since the process started.
    """
    snap = scheduler.snapshot() if scheduler is not None else {
        "budget_bytes": None, "planned_peak_bytes": 0, "running_bytes": 0, "jobs": {}, "waiting": []}
    overall = {"budget_bytes": snap["budget_bytes"], "global_planned_peak_bytes": snap["planned_peak_bytes"],
               "global_in_effect_bytes": snap["running_bytes"], "waiting_jobs": len(snap["waiting"])}
    held = ledger.snapshot() if ledger is not None else {"current_bytes": None, "peak_bytes": None, "jobs": {}}
    overall.update(global_held_bytes=held["current_bytes"], global_measured_peak_bytes=held["peak_bytes"])
    by_name = {job.name: job for job in manager.jobs()}
    rows = []
    for name in list(snap["jobs"]) + [w for w in snap["waiting"] if w not in snap["jobs"]]:
        job, plan = by_name.get(name), snap["jobs"].get(name, {})
        if job is None:
            continue   # a job of another database on the same device
        rows.append({"job_id": job.id, "model": job.model, "status": job.shown_status,
                     "planned_peak_bytes": plan.get("planned_peak_bytes"),
                     "in_effect_bytes": plan.get("in_effect_bytes"), "share": plan.get("share"),
                     "held_bytes": held["jobs"].get(name),
                     "measured_peak_bytes": job.measured_peak_bytes, **overall})
    return rows or [{**dict.fromkeys(MEMORY_COLUMNS), **overall}]


def predictor_rows(device: str, threads: int) -> list[dict]:
    """``dbml_predictor``: one row per op kind of the installed predictor (none if there is none)."""
    from .latency import loaded_predictor   # the scheduler and torch: not for dbml_jobs
    predictor = loaded_predictor(device, threads)
    if predictor is None:
        return []
    report = predictor.report()
    fingerprint = ", ".join(f"{k}={v}" for k, v in sorted(report.fingerprint.items()))
    return [{"op": r.op, "samples": r.samples, "r2": _finite(r.r2), "baseline_r2": _finite(r.baseline_r2),
             "median_rel_error": _finite(r.median_rel_error), "fingerprint": fingerprint,
             "model_bytes": report.model_bytes, "calibration_seconds": report.calibration_seconds}
            for r in report.rows]


def _finite(x):
    return x if x is not None and x == x and abs(x) != float("inf") else None
