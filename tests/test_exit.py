"""Exiting Python and closing connections while jobs run: nothing hangs, aborts or leaks.

At exit a running job is cancelled (one line on stderr), its thread joined and dbml's
DuckDB objects closed, so the exit code is the script's and nothing else is printed. The
last ``close()`` of an installed connection cancels its running jobs ("the connection was
closed"), waits for them and closes dbml's owner connection: the file is released at once.
"""

import subprocess
import sys
import textwrap
import time

import duckdb
import pytest

import dbml
from dbml.core.runtime import runtime

TABLE = ("CREATE OR REPLACE TABLE t AS SELECT random() AS x1, random() AS x2, "
         "(random() > 0.5)::INT AS y FROM range(2000)")
ASYNC = "SELECT train('m', 't', label := 'y', epochs := 100000, early_stop := false, wait := false)"
RUNNING = "SELECT count(*) FROM dbml_jobs WHERE status = 'running' AND progress > 0"


def script(body: str, path, *args: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import dbml, duckdb, sys, time
        con = dbml.connect({str(path)!r}, latency_model='roofline')
        # DuckDB's own bar (stdout) draws under a statement past 2 s: on a loaded machine, a
        # query run while the first job imports torch on its thread (connect no longer does)
        con.execute("SET enable_progress_bar = false")
        con.execute({TABLE!r})
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=180)


@pytest.mark.slow   # five Python processes, each mid-training at exit
def test_exit_with_a_running_job_cancels_it_in_one_line(tmp_path):
    body = f"""
        con.execute({ASYNC!r}).fetchall()
        end = time.monotonic() + 60
        while con.execute({RUNNING!r}).fetchall()[0][0] == 0 and time.monotonic() < end:
            time.sleep(0.05)   # until the job is mid-training
        with open(sys.argv[1], "w") as seen:   # what the job was doing at exit, for a failure's message
            seen.write(repr(con.execute("SELECT status, progress, error FROM dbml_jobs").fetchall()))
        print("exiting")
    """
    for run in range(5):
        seen = tmp_path / f"exit{run}.jobs"
        result = script(body, tmp_path / f"exit{run}.duckdb", str(seen))
        assert result.returncode == 0, (run, result.returncode, result.stderr[-2000:])
        assert result.stdout == "exiting\n"
        lines = result.stderr.splitlines()
        assert len(lines) == 1, (run, result.stderr[-2000:], seen.read_text())
        assert "cancelled" in lines[0] and "'m'" in lines[0], lines
        assert "terminate called" not in result.stderr and "leaked" not in result.stderr


@pytest.mark.slow   # a Python process that trains
def test_a_script_that_trains_and_exits_prints_nothing_else(tmp_path):
    result = script("""
        con.execute("SELECT train('m', 't', label := 'y', epochs := 2)").fetchall()
        con.execute("SELECT predict('m', [x1, x2]) FROM t").fetchall()
        sys.exit(3)
    """, tmp_path / "plain.duckdb")
    assert (result.returncode, result.stderr) == (3, "")


@pytest.mark.slow   # trains until it is closed; a second process opens the file
def test_close_cancels_running_jobs_and_releases_the_file(tmp_path):
    path = str(tmp_path / "closed.duckdb")
    con = dbml.connect(path, latency_model="roofline")
    con.execute(TABLE)
    job_id = con.execute(ASYNC).fetchall()[0][0]["job_id"]
    jobs = runtime().instances[con.execute("SELECT dbml_instance_id()").fetchall()[0][0]].jobs
    end = time.monotonic() + 60   # until the job is mid-training (no helpers: also runs on f30edaf)
    while not con.execute(RUNNING).fetchall()[0][0]:
        assert time.monotonic() < end, "the job never started training"
        time.sleep(0.05)
    con.close()

    job = jobs.get(job_id, fn="test")   # close() waited for it: it has ended, cancelled
    assert job.status == "cancelled" and "the connection was closed" in job.error, (job.status, job.error)
    fresh = duckdb.connect(path)   # read-write, a new database instance: dbml's owner closed
    assert fresh.execute("SELECT count(*) FROM duckdb_functions() "
                         "WHERE function_name LIKE 'dbml%'").fetchall() == [(0,)]
    assert fresh.execute("SELECT count(*) FROM dbml.models").fetchall() == [(0,)]
    assert fresh.execute("SELECT count(*) FROM dbml.weights").fetchall() == [(0,)]
    fresh.execute("CREATE TABLE written AS SELECT 1 AS i")
    fresh.close()
    other = subprocess.run([sys.executable, "-c", f"import duckdb; duckdb.connect({path!r}).close()"],
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr[-2000:]
