"""The interactive shell through a pseudo-terminal: Ctrl-C and Ctrl-D at the prompts, and
the history file across two sessions, a statement typed over several lines kept as one
entry (Ctrl-C during a long train: test_interrupts.py)."""

from __future__ import annotations

import os
import sys

import pytest

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.slow   # a Python process with torch per shell


def spawn(tmp_path, database="sh.duckdb", preload=False):
    # Without the preload (dbml.core.preload) unless asked: these tests send Ctrl-C the moment a
    # prompt appears, and CPython's readline loses a SIGINT that lands between drawing its
    # prompt and waiting in select(); a busy preload thread on a loaded machine widens that
    # window (1 of 8 runs at load 5). A person pressing Ctrl-C at a prompt is not in it.
    env = {**os.environ, "DBML_HISTORY": str(tmp_path / "history")}
    if not preload:
        env["DBML_NO_PRELOAD"] = "1"
    sh = pexpect.spawn(sys.executable, ["-m", "dbml", "shell", str(tmp_path / database)], env=env,
                       encoding="utf-8", timeout=60)
    sh.expect_exact("dbml> ")
    return sh


def ask(sh, line: str) -> str:
    """Send a line at the main prompt; what was printed before the next one."""
    sh.sendline(line)
    sh.expect_exact("dbml> ")
    return sh.before


def test_ctrl_c_at_a_continuation_prompt_drops_the_typed_text(tmp_path):
    sh = spawn(tmp_path)
    ask(sh, "CREATE TABLE keep AS SELECT 1 AS x;")
    sh.sendline("DROP TABLE keep")          # no ';': the shell waits for more
    sh.expect_exact("...> ")
    sh.sendintr()                            # Ctrl-C: the unfinished statement is dropped
    sh.expect_exact("dbml> ")
    out = ask(sh, "SELECT 'fresh' AS word, count(*) AS kept FROM keep;")
    assert "fresh" in out and "Error" not in out, out   # nothing glued onto the new statement
    sh.sendline(".quit")
    sh.expect(pexpect.EOF)


def test_ctrl_d_at_a_continuation_prompt_discards_and_at_the_prompt_leaves(tmp_path):
    sh = spawn(tmp_path)
    ask(sh, "CREATE TABLE keep AS SELECT 1 AS x;")
    sh.sendline("DROP TABLE keep")
    sh.expect_exact("...> ")
    sh.sendeof()                             # Ctrl-D: discarded, never run
    sh.expect_exact("dbml> ")
    assert "│     1 │" in ask(sh, "SELECT count(*) AS n FROM keep;")
    sh.sendeof()                             # Ctrl-D at the prompt: the shell ends
    sh.expect(pexpect.EOF)
    sh.close()
    assert sh.exitstatus == 0


def test_history_is_kept_across_two_sessions(tmp_path):
    sh = spawn(tmp_path)
    sh.sendline("SELECT 4242")
    sh.expect_exact("...> ")
    ask(sh, "  AS remembered;")
    sh.sendline(".quit")
    sh.expect(pexpect.EOF)
    assert "SELECT 4242 AS remembered;\n" in (tmp_path / "history").read_text()   # one entry, both lines
    sh = spawn(tmp_path)
    sh.send("\x1b[A\x1b[A")                 # up twice: the statement before the last session's .quit
    sh.sendline("")
    sh.expect_exact("dbml> ")
    assert "4242" in sh.before
    sh.sendline(".quit")
    sh.expect(pexpect.EOF)


def _maps_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return "libtorch_cpu" in f.read()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/PID/maps")
def test_the_shell_imports_torch_while_the_user_types_and_the_first_train_runs(tmp_path):
    """Issue 32, item 1: a fresh shell's first train() waited seconds for torch and the
    scheduler; the interactive shell imports them while it waits at its first prompt
    (dbml.core.preload), seen from outside the process: libtorch is mapped before any
    statement is typed. The statement then runs as usual."""
    import time
    sh = spawn(tmp_path, preload=True)
    try:
        deadline = time.monotonic() + 120
        while not _maps_torch(sh.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _maps_torch(sh.pid), "torch was not imported while the shell waited"
        ask(sh, "CREATE TABLE t AS SELECT range::DOUBLE AS x, range % 2 AS y FROM range(64);")
        out = ask(sh, "SELECT (train('m', 't', label := 'y', epochs := 1)).status;")
        assert "finished" in out
    finally:
        sh.sendline(".quit")
        sh.expect(pexpect.EOF)


def test_no_preload_keeps_a_waiting_shell_without_torch(tmp_path, monkeypatch):
    """DBML_NO_PRELOAD=1: the shell imports nothing heavy until a statement needs it."""
    import time
    monkeypatch.setenv("DBML_NO_PRELOAD", "1")
    sh = spawn(tmp_path)
    try:
        time.sleep(3)
        assert not _maps_torch(sh.pid)
        ask(sh, "SELECT 42;")
        assert not _maps_torch(sh.pid)
    finally:
        sh.sendline(".quit")
        sh.expect(pexpect.EOF)
