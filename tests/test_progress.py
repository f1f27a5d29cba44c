"""dbml.core.progress: a statement's jobs are shown while it runs, earlier jobs never."""

from __future__ import annotations

import io

import pytest

from dbml.core import progress


class Recorder:
    def __init__(self):
        self.updates, self.closed = [], None

    def update(self, jobs):
        self.updates.append(jobs)

    def close(self, jobs):
        self.closed = jobs


@pytest.mark.slow   # ~1.4 s: out of the -m 'not slow' inner loop (under a minute)
def test_watching_reports_the_statements_job_until_it_ends(moons_con):
    moons_con.sql("SELECT train('before', 'moons', label := 'label', epochs := 1)").fetchall()
    seen = Recorder()
    with progress.watching(moons_con, seen, interval=0.01):
        moons_con.sql("SELECT train('m', 'moons', label := 'label', epochs := 4, batch_size := 16)").fetchall()
    assert seen.updates, "no progress was drawn while the job ran"
    assert {v.model for views in seen.updates for v in views} == {"m"}
    assert [v.status for v in seen.closed] == ["finished"] and seen.closed[0].epoch == 4
    epochs = [views[0].epoch for views in seen.updates]
    assert epochs == sorted(epochs)


def test_line_renderer_draws_one_line_and_clears_it():
    out = io.StringIO()
    line = progress.LineRenderer(out, force=True)
    view = progress.JobView(3, "churn", "running", 2, 10, 0.45, 0.41234, 1234.0)
    line.update([view])
    assert out.getvalue() == "\rjob 3 churn  epoch 2/10   45%  loss 0.4123  1,234 rows/s"
    line.close([view])
    assert out.getvalue().endswith("\r") and "\n" not in out.getvalue()


def test_line_renderer_is_silent_off_a_terminal():
    out = io.StringIO()
    progress.LineRenderer(out).update([progress.JobView(1, "m", "running", 0, 1, 0.0, None, None)])
    assert out.getvalue() == ""


@pytest.mark.slow   # ~7.6 s: out of the -m 'not slow' inner loop (under a minute)
def test_another_connections_concurrent_statement_never_shows(moons_con):
    import threading
    from helpers import wait_until
    other = moons_con.cursor()
    seen = Recorder()
    with progress.watching(moons_con, seen, interval=0.01):
        t = threading.Thread(target=lambda: other.sql(
            "SELECT train('theirs', 'moons', label := 'label', epochs := 30, batch_size := 16, early_stop := false)").fetchall())
        t.start()     # started after the watch began: its job's id is above every earlier one
        wait_until(lambda: any(j.model == "theirs" for j in moons_con._instance.jobs.jobs()), timeout=30,
                   what="the other statement's job")
        moons_con.sql("SELECT train('mine', 'moons', label := 'label', epochs := 10, batch_size := 16)").fetchall()
    t.join()
    assert {v.model for views in seen.updates for v in views} | {v.model for v in seen.closed} == {"mine"}


def test_line_renderer_shows_the_estimate_while_the_job_runs():
    out = io.StringIO()
    view = progress.JobView(3, "churn", "running", 2, 10, 0.45, None, None, estimated_seconds=95.2)
    progress.LineRenderer(out, force=True).update([view])
    assert out.getvalue() == "\rjob 3 churn  epoch 2/10   45%  est. 95 s"


def test_a_jobs_progress_agrees_with_its_epochs_whatever_the_iteration_estimate():
    """progress is counted in epochs: at each epoch's end it is epoch / epochs, though the
    epoch took more or fewer iterations than estimated (it was iterations / estimated total)."""
    from dbml.core.jobs import Job
    job = Job(id=1, model="m")
    job.begin(4, 10)
    seen = []
    for epoch, iterations in enumerate((13, 7, 10, 4), start=1):   # around the estimate of 10
        for _ in range(iterations):
            job.step(32)
            seen.append(job.progress)
            assert (epoch - 1) / 4 <= job.progress < epoch / 4
        job.end_epoch({"epoch": epoch, "loss": 1.0}, {})
        assert job.progress == epoch / 4
    assert seen == sorted(seen) and job.progress == 1.0


def test_the_notebook_bar_shows_the_share_of_epochs_done(monkeypatch):
    from dbml.core.progress import JobView
    from dbml.notebook import STEPS, BarsRenderer

    class Bar:
        def __init__(self, total, **kwargs):
            self.total, self.n, self.postfix = total, 0, {}

        def update(self, k):
            self.n += k

        def set_postfix(self, post, refresh=True):
            self.postfix = post

        def close(self):
            pass

    bars = BarsRenderer(Bar)
    bars.update([JobView(1, "m", "running", 3, 10, 0.3, 0.5, 100.0)])
    bar = bars.bars[1]
    assert bar.n / bar.total == 0.3 and bar.postfix["epoch"] == "3/10"
    bars.update([JobView(1, "m", "finished", 4, 10, 0.4, 0.5, 100.0)])    # early stopping at epoch 4
    assert bar.n == 0.4 * STEPS and bar.postfix["epoch"] == "4/10" and bar.postfix["stopped"] == "early"


def test_the_notebook_extra_installs_the_widget_the_bars_are_drawn_with():
    """tqdm.auto draws a Jupyter widget with ipywidgets, else warns 'IProgress not found'."""
    import tomllib
    from pathlib import Path
    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {r.split(">")[0].split("=")[0] for r in extras["notebook"]} >= {"tqdm", "ipywidgets"}


def test_the_line_fits_the_terminal_and_cuts_no_job_in_the_middle(monkeypatch):
    """A tune() runs many trial jobs at once: the line fits the terminal's width (it was cut
    at 120 characters, mid-job), each job whole, then how many more there are."""
    monkeypatch.setenv("COLUMNS", "100")
    trials = [progress.JobView(i, f"m_trial_{i}", "running", 2, 10, 0.25, 0.5, 900.0) for i in range(1, 13)]
    out = io.StringIO()
    progress.LineRenderer(out, force=True).update(trials)
    line = out.getvalue()[1:]
    assert len(line) <= 99 and line.startswith("12 jobs: m_trial_1 2/10 25% | m_trial_2 2/10 25%")
    shown = line.split(" | ")
    assert shown[-1] == f"+{12 - (len(shown) - 1)} more" and all(s.endswith("25%") for s in shown[1:-1])
    monkeypatch.setenv("COLUMNS", "400")                # a wide terminal: every job in full
    out = io.StringIO()
    progress.LineRenderer(out, force=True).update(trials[:3])
    assert out.getvalue() == "\r" + " | ".join(t.describe() for t in trials[:3]) and len(out.getvalue()) > 120
