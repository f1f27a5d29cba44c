"""Progress bars for training jobs, in a notebook or a terminal (tqdm).

While a ``train()`` statement waits for its jobs (``udfs/functions.py``), it shows them
through ``dbml.core.progress.watching`` with the renderer :func:`renderer_for` picks from the
``progress`` setting: ``'auto'`` draws a bar per job in a Jupyter kernel (a widget, via
``tqdm.auto``) or on a terminal (a line on stderr) and nothing elsewhere (a pipe, a test,
the dbml shell, which draws its own line and connects with ``progress='off'``); ``'bars'``
always; ``'off'`` never. Without tqdm (``pip install 'dbml[notebook]'``) nothing is drawn.
"""

from __future__ import annotations

import sys

from .core.progress import JobView

__all__ = ["BarsRenderer", "renderer_for", "in_notebook"]

STEPS = 1000   # a bar's resolution: progress is a fraction of the job's iterations


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell)."""
    shell = sys.modules.get("IPython")
    get = getattr(shell, "get_ipython", None) if shell is not None else None
    ip = get() if get is not None else None
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def renderer_for(setting: str | None):
    """The renderer the ``progress`` setting asks for here, or None."""
    setting = (setting or "auto").lower()
    if setting == "off":
        return None
    if setting == "auto" and not (in_notebook() or getattr(sys.stderr, "isatty", lambda: False)()):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return BarsRenderer(tqdm)


class BarsRenderer:
    """One tqdm bar per job: its share of its epochs done (``Job.progress``, which agrees with
    the epoch it shows), epoch, loss and rows/s."""

    def __init__(self, tqdm):
        self.tqdm = tqdm
        self.bars: dict[int, object] = {}

    def _bar(self, job: JobView):
        if job.id not in self.bars:
            self.bars[job.id] = self.tqdm(total=STEPS, desc=f"{job.model} (job {job.id})", unit="‰",
                                          leave=True, bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}")
        return self.bars[job.id]

    def update(self, jobs: list[JobView]) -> None:
        for job in jobs:
            bar = self._bar(job)
            done = int(round(job.progress * STEPS))
            if done > bar.n:
                bar.update(done - bar.n)
            post = {"epoch": f"{job.epoch}/{job.epochs}"}
            if job.loss is not None:
                post["loss"] = f"{job.loss:.4g}"
            if job.rows_per_s is not None:
                post["rows/s"] = f"{job.rows_per_s:,.0f}"
            if job.status not in ("running", "finished"):
                post["status"] = job.status
            elif job.status == "finished" and job.epoch < job.epochs:   # the bar stays at epoch / epochs
                post["stopped"] = "early"
            bar.set_postfix(post, refresh=True)

    def close(self, jobs: list[JobView]) -> None:
        self.update(jobs)
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()
