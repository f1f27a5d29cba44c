"""Issue 10, item 8: an interrupt stops the statement's training jobs.

Ctrl-C in a script or the shell, Jupyter's interrupt button (a SIGINT to the kernel, the
same path as a script's) and ``Connection.interrupt()`` from another thread each cancel
the running statement's jobs at their next iteration boundary, store nothing and return
within seconds with a clear message; a ``wait := false`` job of an earlier statement runs
on and is stored. On f30edaf every one of these trained to the end and stored the model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import duckdb
import pytest

import dbml
from helpers import wait_until

pytestmark = pytest.mark.slow

LONG = "SELECT train('long', 't', label := 'y', epochs := 400, batch_size := 32, early_stop := false)"
BACKGROUND = "SELECT train('bg', 't', label := 'y', epochs := 30, batch_size := 32, early_stop := false, wait := false).job_id"
TABLE = "CREATE TABLE t AS SELECT i::DOUBLE AS x, (i % 7)::DOUBLE AS z, (i % 2)::INTEGER AS y FROM range(3000) r(i)"


@pytest.fixture(autouse=True)
def sigint_as_a_terminal_delivers_it():
    """Ctrl-C as a terminal delivers it: SIGINT unblocked, Python's handler installed.
    Run alone these tests pass; after the whole suite in one process (CI) the three that
    send SIGINT failed as if it never arrived, in this process and in children (which
    inherit a blocked or ignored SIGINT). Which earlier test leaves it so was not found in
    time; this restores a terminal's state for the process and its children."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


def _terminal_sigint() -> None:
    """In a child before exec: SIGINT unblocked and at its default, as a shell starts it."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _running(con, model: str) -> bool:
    return con.sql(f"SELECT count(*) FROM dbml_jobs WHERE model = '{model}' AND status = 'running' "
                   f"AND progress > 0").fetchall()[0][0] == 1


def test_connection_interrupt_cancels_the_statement_and_spares_earlier_async_jobs(tmp_path):
    con = dbml.connect(str(tmp_path / "i.duckdb"), latency_model="roofline")
    con.execute(TABLE)
    bg = con.sql(BACKGROUND).fetchall()[0][0]
    watcher = con.cursor()
    sent = {}

    def interrupt_when_running():
        wait_until(lambda: _running(watcher, "long"), timeout=60)
        sent["at"] = time.perf_counter()
        con.interrupt()

    thread = threading.Thread(target=interrupt_when_running)
    thread.start()
    with pytest.raises(duckdb.Error, match=r"interrupted|Interrupted"):
        con.sql(LONG).fetchall()
    returned = time.perf_counter() - sent["at"]
    thread.join()
    assert returned < 10, f"returned {returned:.1f} s after the interrupt"
    assert con.sql("SELECT status, error FROM dbml_jobs WHERE model = 'long'").fetchall() == [
        ("cancelled", "job 2 ('long') was cancelled: the statement was interrupted; nothing was stored")]
    assert con.sql(f"SELECT wait_job({bg}).status").fetchall()[0][0] == "finished"
    assert con.sql("SELECT name, version FROM dbml_models ORDER BY ALL").fetchall() == [("bg", 1)]
    assert con.sql("SELECT count(*) FROM dbml_weights WHERE name = 'long'").fetchall()[0][0] == 0
    # the connection works on, and the next statement is not interrupted
    assert con.sql("SELECT train('next', 't', label := 'y', epochs := 1).status").fetchall()[0][0] == "finished"
    con.close()


def test_interrupting_wait_job_ends_the_wait_not_the_job():
    con = dbml.connect(latency_model="roofline")
    con.execute(TABLE)
    bg = con.sql(BACKGROUND.replace("30", "60")).fetchall()[0][0]
    watcher = con.cursor()
    threading.Thread(target=lambda: (wait_until(lambda: _running(watcher, "bg"), timeout=60),
                                     con.interrupt())).start()
    # dbml's message, or DuckDB's own when it sees its interrupt flag first as the UDF returns
    with pytest.raises(duckdb.Error, match=r"wait_job\(\) was interrupted; the job it waited for runs on|"
                                           r"INTERRUPT Error: Interrupted!"):
        con.sql(f"SELECT wait_job({bg})").fetchall()
    assert con.sql(f"SELECT wait_job({bg}).status").fetchall()[0][0] == "finished"
    con.close()


SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    import dbml
    con = dbml.connect(sys.argv[1], latency_model="roofline")
    con.execute({table!r})
    bg = con.sql({background!r}).fetchall()[0][0]
    watcher = con.cursor()
    sent = {{}}
    def ctrl_c():   # what a terminal (or Jupyter's interrupt button) does: SIGINT to the process
        while watcher.sql("SELECT count(*) FROM dbml_jobs WHERE model = 'long' AND progress > 0").fetchall()[0][0] == 0:
            time.sleep(0.05)
        sent["at"] = time.perf_counter()
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=ctrl_c, daemon=True).start()
    try:
        con.sql({long!r}).fetchall()
        error = None
    except BaseException as e:
        error = f"{{type(e).__name__}}: {{e}}"
    returned = time.perf_counter() - sent["at"]
    bg_status = con.sql(f"SELECT wait_job({{bg}}).status").fetchall()[0][0]
    print(json.dumps(dict(error=error, returned=returned, bg=bg_status,
                          jobs=con.sql("SELECT model, status FROM dbml_jobs ORDER BY job_id").fetchall(),
                          models=con.sql("SELECT name FROM dbml_models ORDER BY ALL").fetchall())))
""")


def test_ctrl_c_in_a_script_cancels_the_statement(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(table=TABLE, background=BACKGROUND, long=LONG))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "s.duckdb")], capture_output=True,
                          preexec_fn=_terminal_sigint,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # the UDF waits on the main thread (KeyboardInterrupt there: dbml's message), or DuckDB
    # runs it on a worker thread while the main thread polls for signals ("Query interrupted")
    assert ("train() was interrupted: job 2 ('long') was cancelled; nothing was stored" in out["error"]
            or out["error"] == "RuntimeError: Query interrupted"), out["error"]
    assert out["returned"] < 10
    assert out["bg"] == "finished"
    assert out["jobs"] == [["bg", "finished"], ["long", "cancelled"]]
    assert out["models"] == [["bg"]]
    assert done.stderr == ""


def test_ctrl_c_reaches_a_statement_whose_udf_runs_off_the_main_thread():
    """Ctrl-C raises KeyboardInterrupt only on the main thread; a train statement waiting on
    another thread (a DuckDB worker, or here a thread of the program) is interrupted by
    dbml's SIGINT hook, its job cancelled."""
    con = dbml.connect(latency_model="roofline")
    con.execute(TABLE)
    worker, outcome = con.cursor(), {}

    def run():
        try:
            worker.sql(LONG).fetchall()
        except duckdb.Error as e:
            outcome["error"] = str(e)

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: _running(con, "long"), timeout=60)
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    thread.join(30)
    assert not thread.is_alive()
    assert "train() was interrupted: job 1 ('long') was cancelled; nothing was stored" in outcome["error"]
    assert con.sql("SELECT count(*) FROM dbml_models").fetchall()[0][0] == 0
    con.close()


def test_ctrl_c_in_the_shell_returns_to_the_prompt(tmp_path):
    pexpect = pytest.importorskip("pexpect")
    shell = _shell(tmp_path)
    shell.sendline("SET VARIABLE dbml_latency_model = 'roofline';")
    shell.expect_exact("dbml> ")
    shell.sendline(TABLE + ";")
    shell.expect_exact("dbml> ")
    shell.sendline(LONG + ";")
    shell.expect(r"job \d+ long  epoch [1-9]")   # the job is training (its progress line says so)
    sent = time.perf_counter()
    shell.sendintr()
    shell.expect(r"interrupted.*\r\n")
    print(shell.after)
    shell.expect_exact("dbml> ")
    to_prompt = time.perf_counter() - sent
    shell.sendline("SELECT model, status FROM dbml_jobs;")
    shell.expect_exact("dbml> ")
    assert "cancelled" in shell.before
    shell.sendline("SELECT count(*) AS stored FROM dbml_models;")
    shell.expect_exact("dbml> ")
    assert "│      0 │" in shell.before or " 0 " in shell.before
    shell.sendline(".quit")
    shell.expect(pexpect.EOF)
    print(f"Ctrl-C to prompt in the shell: {to_prompt:.2f} s")
    assert to_prompt < 10


def _shell(tmp_path):
    pexpect = pytest.importorskip("pexpect")
    shell = pexpect.spawn(sys.executable, ["-m", "dbml", "shell", str(tmp_path / "sh.duckdb")],
                          encoding="utf-8", timeout=120, dimensions=(50, 400), preexec_fn=_terminal_sigint,
                          # Ctrl-C can cut the progress bar mid-character ('█' is three bytes)
                          codec_errors="replace")
    shell.expect_exact("dbml> ")
    return shell


@pytest.mark.parametrize("after_s", [0.2, 1.0])
def test_ctrl_c_in_the_shell_while_its_first_train_starts_stops_it(tmp_path, after_s):
    """The shell runs a statement with its main thread inside DuckDB, where Python's own
    SIGINT handler runs only once the statement has ended; DuckDB ran train() on one of its
    threads, and a Ctrl-C while the first statement was still starting (the shell's preload
    importing torch) was seen only after the job had trained to its end (about 30 s here):
    the shell's Ctrl-C test failed so in loaded suites."""
    pexpect = pytest.importorskip("pexpect")
    shell = _shell(tmp_path)
    shell.sendline("SET VARIABLE dbml_latency_model = 'roofline';")
    shell.expect_exact("dbml> ")
    shell.sendline(TABLE + ";")
    shell.expect_exact("dbml> ")
    shell.sendline(LONG + ";")
    time.sleep(after_s)
    sent = time.perf_counter()
    shell.sendintr()
    shell.expect(r"interrupted.*\r\n")
    shell.expect_exact("dbml> ")
    to_prompt = time.perf_counter() - sent
    shell.sendline("SELECT count(*) AS trained FROM dbml_jobs WHERE status <> 'cancelled';")
    shell.expect_exact("dbml> ")
    assert "│       0 │" in shell.before, shell.before
    shell.sendline(".quit")
    shell.expect(pexpect.EOF)
    assert to_prompt < 15, to_prompt    # the preload's import of torch, then at once


def test_ctrl_c_in_the_shell_stops_a_long_plain_query_at_once(tmp_path):
    """The same for plain SQL: DuckDB's CLI stops a query at a Ctrl-C; the shell's main thread,
    inside DuckDB, saw it only when DuckDB next looked for Python's signals (7.8 s here)."""
    pexpect = pytest.importorskip("pexpect")
    shell = _shell(tmp_path)
    shell.sendline("SELECT count(*) FROM range(100000000000) a, range(1000) b;")
    time.sleep(1.0)
    sent = time.perf_counter()
    shell.sendintr()
    shell.expect(r"interrupted.*\r\n")
    shell.expect_exact("dbml> ")
    to_prompt = time.perf_counter() - sent
    shell.sendline(".quit")
    shell.expect(pexpect.EOF)
    assert to_prompt < 3, to_prompt


def test_ctrl_c_off_the_main_thread_before_the_statements_wait_began_cancels_its_job(tmp_path, monkeypatch):
    """The shell's Ctrl-C test failed so in a loaded suite: DuckDB ran train() on a thread
    other than the main one, and the Ctrl-C came while the UDF was still starting (torch
    loading), before its wait was registered; the SIGINT hook found no statement to
    interrupt, the shell said 'interrupted', and the job trained on to the end."""
    import dbml.core.jobs as jobs
    from dbml.core.runtime import runtime

    submit = jobs.JobManager.submit

    def ctrl_c_first(self, *args, **kwargs):   # what the SIGINT hook does, as the job starts
        runtime().sigint_at = time.perf_counter()
        jobs.interrupt_off_main_thread()
        return submit(self, *args, **kwargs)

    con = dbml.connect(str(tmp_path / "o.duckdb"), latency_model="roofline", progress="off")
    con.execute(TABLE)
    monkeypatch.setattr(jobs.JobManager, "submit", ctrl_c_first)
    raised: list[BaseException] = []

    def statement():
        try:
            con.cursor().execute(LONG).fetchall()
        except BaseException as e:
            raised.append(e)

    t = threading.Thread(target=statement)
    t.start()
    t.join(120)
    monkeypatch.undo()
    assert not t.is_alive() and raised and "interrupted" in str(raised[0]), raised
    assert con.sql("SELECT status FROM dbml_jobs WHERE model = 'long'").fetchall() == [("cancelled",)]
    assert con.sql("SELECT count(*) FROM dbml_models").fetchall()[0][0] == 0
    con.close()


def test_ctrl_c_before_the_statements_wait_began_cancels_its_job(tmp_path, monkeypatch):
    """Ctrl-C can land after a job started and before its statement waits on it (on a loaded
    machine, while the job's thread starts): the job was nobody's, and ran on to the end
    (the shell's Ctrl-C test failed so once in a loaded suite)."""
    import dbml.core.jobs as jobs

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(jobs.JobManager, "wait_statement", interrupted)
    con = dbml.connect(str(tmp_path / "k.duckdb"), latency_model="roofline", progress="off")
    con.execute(TABLE)
    with pytest.raises((KeyboardInterrupt, duckdb.Error)):
        con.execute(LONG).fetchall()
    monkeypatch.undo()
    wait_until(lambda: con.sql("SELECT status FROM dbml_jobs WHERE model = 'long'").fetchall() == [("cancelled",)],
               timeout=60)
    assert con.sql("SELECT count(*) FROM dbml_models").fetchall()[0][0] == 0
    con.close()


def test_a_forked_child_keeps_its_ctrl_c_to_itself(tmp_path):
    """The wake-up fd dbml reads is the process's; a child forked from it (multiprocessing's
    'fork', a user's DataLoader) gets it back as it was, so a SIGINT to the child alone
    interrupts nothing of the parent's statements."""
    from dbml.core.runtime import runtime
    con = dbml.connect(str(tmp_path / "f.duckdb"), progress="off")
    hooked = runtime().sigint_previous
    if hooked is None or hooked[2] is None:
        pytest.skip("no wake-up fd here (SIGINT not Python's, or not the main thread)")
    ours = hooked[2][1].fileno()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: report its wake-up fd, then SIGINT itself
        current = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(current)
        os.write(w, str(current).encode())
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os._exit(0)
    os.close(w)
    child_fd = int(os.read(r, 32))
    os.close(r)
    os.waitpid(pid, 0)
    assert child_fd != ours
    con.close()
