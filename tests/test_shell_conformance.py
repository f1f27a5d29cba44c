"""The adapter that runs DuckDB's shell tests against the shell (benchmarks/duckdb_shell_conformance.py):
its wrapper is ``python -m dbml shell``, and it counts per file against the released CLI."""

import subprocess

from dbml.bench.duckdb_shell_conformance import per_file, wrapper


def test_the_wrapper_is_the_dbml_shell_with_the_arguments_the_tests_pass(tmp_path):
    binary = wrapper(tmp_path)
    r = subprocess.run([str(binary), "--batch", "--no-init", "-csv"], input="SELECT 42 AS answer;\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "answer\n42\n", r.stderr


def test_counts_are_of_the_tests_the_reference_passes():
    ours = {"t.test_a::x": "passed", "t.test_a::y": "failed", "t.test_a::z": "passed", "t.test_b::w": "skipped"}
    reference = {"t.test_a::x": "passed", "t.test_a::y": "passed", "t.test_a::z": "failed", "t.test_b::w": "passed"}
    assert per_file(ours, reference) == [("test_a", 2, 1, ["y"]), ("test_b", 1, 0, ["w"])]
    assert per_file(ours, None) == [("test_a", 3, 2, ["y"])]
