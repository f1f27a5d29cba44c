"""Live progress of the training jobs a statement starts, drawn while it runs.

A statement such as ``SELECT train(...)`` blocks its caller until its jobs end; the jobs
report their epoch, loss and throughput on their :class:`dbml.core.jobs.Job` rows. ``watching``
polls those rows on a thread of its own and hands each change to a renderer: the shell's
one updating line (``LineRenderer``), or a notebook's progress bars (``dbml.notebook``).
Only jobs started after the watch began are shown, so earlier jobs never reappear.
"""

from __future__ import annotations

import shutil
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Protocol, TextIO

__all__ = ["JobView", "Renderer", "LineRenderer", "fit_line", "snapshot", "watching"]


@dataclass(frozen=True)
class JobView:
    """What a progress display shows of one job, copied at one moment."""
    id: int
    model: str
    status: str
    epoch: int
    epochs: int
    progress: float          # 0..1 of all its iterations
    loss: float | None
    rows_per_s: float | None
    estimated_seconds: float | None = None   # predicted before the first iteration, then from its first steps (dbml.core.estimate)

    @property
    def ended(self) -> bool:
        return self.status in ("finished", "failed", "cancelled")

    def describe(self) -> str:
        """``job 3 churn  epoch 2/10   45%  loss 0.4123  1,234 rows/s  est. 95 s``"""
        parts = [f"job {self.id} {self.model}", f"epoch {self.epoch}/{self.epochs}", f"{100 * self.progress:3.0f}%"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        if self.rows_per_s is not None:
            parts.append(f"{self.rows_per_s:,.0f} rows/s")
        if self.estimated_seconds is not None and not self.ended:
            parts.append(f"est. {self.estimated_seconds:,.0f} s")
        if self.status not in ("running", "finished"):
            parts.append(self.status)
        return "  ".join(parts)


class Renderer(Protocol):
    def update(self, jobs: list[JobView]) -> None: ...
    def close(self, jobs: list[JobView]) -> None: ...


def _instance(con):
    """The dbml instance behind a dbml Connection (or the instance itself)."""
    return getattr(con, "_instance", con)


def snapshot(con, after: int = 0, connection: int | None = None) -> list[JobView]:
    """Views of the jobs of ``con``'s database whose id is above ``after`` (and, given
    ``connection``, that a statement of that DuckDB connection started), oldest first."""
    return [JobView(j.id, j.model, j.shown_status, j.epoch, j.epochs, j.progress, j.loss, j.rows_per_s,
                    j.estimated_seconds)
            for j in _instance(con).jobs.jobs() if j.id > after and (connection is None or j.connection == connection)]


@contextmanager
def watching(con, renderer: Renderer | None, interval: float = 0.25, connection: int | None = None) -> Iterator[None]:
    """Show the progress of the jobs the statement running in the block starts:
    ``connection`` is its DuckDB connection id (a dbml Connection's own by default; a
    connection runs one statement at a time, so other statements' jobs never show).
    ``renderer=None`` shows nothing."""
    if renderer is None:
        yield
        return
    connection = connection if connection is not None else getattr(con, "_id", None)
    before = max((j.id for j in _instance(con).jobs.jobs()), default=0)
    stop = threading.Event()

    def poll() -> None:
        last = None
        while not stop.wait(interval):
            views = snapshot(con, before, connection)
            if views and views != last:
                renderer.update(views)
                last = views

    thread = threading.Thread(target=poll, name="dbml-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        renderer.close(snapshot(con, before, connection))


class LineRenderer:
    """One updating line on a terminal (``\\r``), cleared when the statement ends; the
    running jobs separated by `` | ``, as many as fit the terminal's width (:func:`fit_line`).
    Writes nothing when ``out`` is not a terminal unless ``force``. ``width``: the columns
    to fit, else the terminal's at each update."""

    def __init__(self, out: TextIO = sys.stderr, width: int | None = None, force: bool = False):
        self.out, self.width = out, width
        self.enabled = force or getattr(out, "isatty", lambda: False)()
        self._drawn = 0

    def update(self, jobs: list[JobView]) -> None:
        if not self.enabled:
            return
        shown = [j for j in jobs if not j.ended] or jobs[-1:]
        # one column short of the width: a line that fills it moves some terminals' cursor on
        width = self.width if self.width is not None else shutil.get_terminal_size((120, 24)).columns - 1
        text = fit_line(shown, width)
        self.out.write("\r" + text.ljust(self._drawn))
        self.out.flush()
        self._drawn = len(text)

    def close(self, jobs: list[JobView]) -> None:
        if self.enabled and self._drawn:
            self.out.write("\r" + " " * self._drawn + "\r")
            self.out.flush()
        self._drawn = 0


def fit_line(jobs: list[JobView], width: int) -> str:
    """The jobs on one line of at most ``width`` columns: each in full (``describe``) where all
    fit; else each as ``model epoch% `` (a tune()'s trials), as many as fit, then how many
    more; never a job cut in the middle."""
    full = " | ".join(j.describe() for j in jobs)
    if len(full) <= width:
        return full
    if len(jobs) == 1:
        return full[:width]
    short = [f"{j.model} {j.epoch}/{j.epochs} {100 * j.progress:.0f}%" for j in jobs]
    head = f"{len(jobs)} jobs: "
    for n in range(len(short), 0, -1):
        more = f" | +{len(short) - n} more" if n < len(short) else ""
        text = head + " | ".join(short[:n]) + more
        if len(text) <= width:
            return text
    return (head + f"+{len(short)} more")[:width]
