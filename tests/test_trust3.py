"""Issue 31, trust round 3: each hole a user found, re-tried as the user would."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import dbml


@pytest.mark.slow   # ~6 s: a fresh interpreter, as a user's first session
def test_a_users_first_predictions_print_no_torch_warning():
    """Item 6: torch's 'The given NumPy array is not writable' with a path into dbml's source."""
    script = textwrap.dedent("""
        import dbml
        con = dbml.connect(latency_model="roofline")
        con.execute("CREATE TABLE t AS SELECT range::DOUBLE a, (range % 2)::INT y FROM range(200)")
        con.sql("SELECT train('m', 't', label := 'y', epochs := 1)").fetchall()
        con.sql("SELECT * FROM predictions('m', 't')").fetchall()
        con.sql("SELECT * FROM explain('m', 't')").fetchall()
    """)
    r = subprocess.run([sys.executable, "-W", "default", "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "not writable" not in r.stderr, r.stderr[-2000:]
