"""The interactive shell through a pseudo-terminal: Ctrl-C and Ctrl-D at the prompts, and
the history file across two sessions, a statement typed over several lines kept as one
entry (Ctrl-C during a long train: test_interrupts.py)."""

from __future__ import annotations

import os
import sys

import pytest

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.slow   # a Python process with torch per shell


def spawn(tmp_path, database="sh.duckdb"):
    env = {**os.environ, "DBML_HISTORY": str(tmp_path / "history")}
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
