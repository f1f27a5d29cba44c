"""Plots for notebooks (matplotlib, from ``pip install 'dbml[notebook]'``).

* :func:`history` — a model's training and validation loss per epoch (``dbml_epochs``), its
  validation metric per epoch, and the epoch kept.
* :func:`memory` — one iteration of a training job as its plan lays it out: device memory
  over time, the budget, the peak measured while it ran, and its swap-out, swap-in and
  recompute events.
* :func:`jobs` — the running jobs' shares of the device budget over a few seconds
  (``dbml_memory``, sampled).
* :func:`trials` — a tune() search: each trial's objective against its number (pruned and
  failed ones marked), the best so far, and Optuna's importance of each searched parameter.

Each returns the matplotlib ``Figure``; the data drawn is also on it as ``fig.dbml`` (a
dict), for a notebook to print or a test to check.
"""

from __future__ import annotations

import math
import time

from .errors import InvalidArgument

__all__ = ["history", "memory", "jobs", "trials"]

MIB = 2 ** 20


def _pyplot():
    try:
        import matplotlib
        if matplotlib.get_backend().lower() in ("", "agg") or not _interactive():
            matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise InvalidArgument("dbml.plot needs matplotlib, which is not installed; "
                              "pip install 'dbml[notebook]'") from e
    return plt


def _interactive() -> bool:
    from .notebook import in_notebook
    return in_notebook()


def history(con, model: str):
    """Training and validation loss per epoch of the latest version of ``model``
    (``dbml_epochs``), its validation metric per epoch on a second axis, and the epoch whose
    weights were kept; the legend below the axes, clear of the curves."""
    rows = con.execute("SELECT e.epoch, e.loss, e.val_loss, e.val_metric, e.best FROM dbml_epochs e WHERE e.model = ? "
                       "AND e.version = (SELECT max(version) FROM dbml_models WHERE name = ?) ORDER BY e.epoch",
                       [model, model]).fetchall()
    if not rows:
        raise InvalidArgument(f"dbml.plot.history(): no model named {model!r}; SELECT name FROM dbml_models "
                              f"lists them")
    (name, value), = con.execute("SELECT metrics->>'val_metric_name', (metrics->>'val_metric')::DOUBLE FROM "
                                 "dbml_models WHERE name = ? ORDER BY version DESC LIMIT 1", [model]).fetchall()
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    epochs, losses = [r[0] for r in rows], [r[1] for r in rows]
    val_losses, val_metrics = [r[2] for r in rows], [r[3] for r in rows]
    ax.plot(epochs, losses, marker="o", label="training loss")
    if any(v is not None for v in val_losses):
        ax.plot(epochs, [math.nan if v is None else v for v in val_losses], marker="o", label="validation loss")
    best = [r[0] for r in rows if r[4]]
    if best:
        ax.axvline(best[0], color="grey", linestyle=":", label=f"kept (epoch {best[0]})")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.set_title(f"{model}: training")
    handles, labels = ax.get_legend_handles_labels()
    if any(v is not None for v in val_metrics):
        right = ax.twinx()
        right.plot(epochs, [math.nan if v is None else v for v in val_metrics], marker="s", linestyle="--",
                   color="tab:green", label=f"validation {name}")
        right.set_ylabel(f"validation {name}")
        more = right.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    fig.legend(handles, labels, loc="lower center", ncol=min(len(handles), 4), frameon=False, fontsize="small")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.dbml = {"epoch": epochs, "loss": losses, "val_loss": val_losses, "val_metric_by_epoch": val_metrics,
                "val_metric_name": name, "val_metric": value, "best_epoch": best[0] if best else None}
    return fig


def memory(con, job_id: int):
    """One iteration of job ``job_id``'s plan: planned device memory over time (its ops'
    estimated times, planned waits included), the budget, the measured peak, and the
    plan's swap-out, swap-in and recompute events."""
    from .scheduler.graph.sequence import EventKind
    from .scheduler.plan.peak import build_timeline

    job = _job(con, job_id)
    if job.schedule is None:
        raise InvalidArgument(f"dbml.plot.memory(): job {job_id} ran no plan (policy 'eager', or it ended before "
                              f"its first epoch); train with policy := 'tensile'")
    plan, seq = job.schedule
    tl = build_timeline(seq, plan.events)
    ends = {op.index: float(tl.op_end[op.index]) for op in seq.ops}
    marks = {kind: [ends.get(e.trigger, 0.0) + e.delay for e in plan.events if e.kind is kind]
             for kind in (EventKind.SWAP_OUT, EventKind.SWAP_IN, EventKind.RECOMPUTE)}
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    times, usage = list(map(float, tl.times)), [int(u) for u in tl.usage]
    ax.step(times, [u / MIB for u in usage], where="post", label="planned")
    if job.measured_peak_bytes:
        ax.axhline(job.measured_peak_bytes / MIB, color="tab:red", linestyle="--", label="measured peak")
    budget = _budget(con, job)
    if budget:
        ax.axhline(budget / MIB, color="black", linestyle=":", label="budget")
    top = max(usage, default=0) / MIB
    for (kind, at), colour in zip(marks.items(), ("tab:orange", "tab:purple", "tab:green")):
        if at:
            ax.plot(at, [top * 1.02] * len(at), "|", color=colour, markersize=10,
                    label=f"{kind.value.replace('_', '-')} ({len(at)})")
    ax.set_xlabel("seconds into the iteration (planned)")
    ax.set_ylabel("device memory (MiB)")
    ax.set_title(f"job {job_id} ({job.model}): one iteration")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.dbml = {"times": times, "planned_bytes": usage, "planned_peak_bytes": plan.peak_bytes,
                "measured_peak_bytes": job.measured_peak_bytes, "budget_bytes": budget,
                "events": {k.value: len(v) for k, v in marks.items()}}
    return fig


def _job(con, job_id: int):
    instance = getattr(con, "_instance", None)
    if instance is None:
        raise InvalidArgument("dbml.plot.memory(): con must be a dbml connection (dbml.connect(...))")
    for job in instance.jobs.jobs():
        if job.id == job_id:
            return job
    raise InvalidArgument(f"dbml.plot.memory(): no job {job_id} in this process; SELECT job_id FROM dbml_jobs lists them")


def _budget(con, job) -> int | None:
    """The job's budget: from dbml_memory while it runs, else as its model's summary stored it."""
    rows = con.execute("SELECT budget_bytes FROM dbml_memory WHERE job_id = ?", [job.id]).fetchall()
    if not rows:
        version = (job.result or {}).get("version")
        rows = con.execute("SELECT (metrics->'memory'->>'budget_bytes')::BIGINT FROM dbml_models "
                           "WHERE name = ? AND version = ?", [job.model, version]).fetchall()
    return rows[0][0] if rows else None


def jobs(con, seconds: float = 5.0, interval: float = 0.25):
    """The running jobs' shares of the device budget (``dbml_memory``), sampled every
    ``interval`` s for ``seconds`` s or until no job runs, as stacked areas."""
    samples, t0, seen = [], time.monotonic(), False
    while True:
        rows = con.execute("SELECT job_id, model, held_bytes FROM dbml_memory WHERE job_id IS NOT NULL").fetchall()
        samples.append((time.monotonic() - t0, {f"{r[1]} (job {r[0]})": r[2] or 0 for r in rows}))
        seen = seen or bool(rows)
        if (seen and not rows) or time.monotonic() - t0 >= seconds:
            break
        time.sleep(interval)
    names = sorted({n for _, shares in samples for n in shares})
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = [t for t, _ in samples]
    if names:
        ax.stackplot(x, [[shares.get(n, 0) / MIB for _, shares in samples] for n in names], labels=names)
        ax.legend(loc="upper right", fontsize="small")
    ax.set_xlabel("seconds")
    ax.set_ylabel("device memory held (MiB)")
    ax.set_title("running training jobs")
    fig.tight_layout()
    fig.dbml = {"seconds": x, "jobs": {n: [shares.get(n, 0) for _, shares in samples] for n in names}}
    return fig


def trials(con, model: str):
    """``model``'s tune() trials (``dbml_trials``): the objective of each finished trial
    against its number, the last epoch's objective of pruned ones, the best so far; and,
    beside it, each searched parameter's importance (Optuna's default evaluator; none
    before two trials have finished)."""
    from .tuning import importances

    rows = con.execute("SELECT trial, status, objective, objectives[-1], objective_name, best FROM dbml_trials "
                       "WHERE model = ? ORDER BY trial", [model]).fetchall()
    if not rows:
        raise InvalidArgument(f"dbml.plot.trials(): model {model!r} has no trials; run SELECT * FROM "
                              f"tune({model!r}, ...) first (SELECT DISTINCT model FROM dbml_trials lists them)")
    name = rows[0][4]
    weights = importances(con, model)
    plt = _pyplot()
    fig, (ax, right) = plt.subplots(1, 2, figsize=(10, 3.5), gridspec_kw={"width_ratios": [3, 2]})
    done = [(r[0], r[2]) for r in rows if r[1] == "finished"]
    pruned = [(r[0], r[3]) for r in rows if r[1] == "pruned" and r[3] is not None]
    for points, style, label in ((done, "o", "finished"), (pruned, "x", "pruned (last epoch)")):
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
    best_so_far = _best_so_far(done, maximize=name == "val_metric")
    if best_so_far:
        ax.step([p[0] for p in best_so_far], [p[1] for p in best_so_far], where="post", color="tab:green",
                label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(name)
    ax.set_title(f"{model}: {len(rows)} trials")
    ax.legend(loc="best", fontsize="small")
    right.barh(list(weights), list(weights.values()))
    right.set_xlabel("importance")
    right.set_title("parameters" if weights else "importance: too few finished trials")
    fig.tight_layout()
    fig.dbml = {"objective": name, "finished": done, "pruned": pruned, "best_so_far": best_so_far,
                "failed": [r[0] for r in rows if r[1] in ("failed", "infeasible", "interrupted")],
                "best": [r[0] for r in rows if r[5]], "importance": weights}
    return fig


def _best_so_far(points: list[tuple[int, float]], maximize: bool) -> list[tuple[int, float]]:
    out = []
    for trial, value in points:
        if not out or (value > out[-1][1] if maximize else value < out[-1][1]):
            out.append((trial, value))
        else:
            out.append((trial, out[-1][1]))
    return out
