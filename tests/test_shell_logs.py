"""The shell prints DuckDB's log entries as DuckDB's CLI prints them (dbml/shell/logs.py):
warnings at start, the query log when enabled, and the warning that logging moved away."""

import io
import os

import duckdb
import pytest

from dbml.shell import run
from dbml.shell.logs import ShellLog, elapsed, sanitized


def shell(text, con=None):
    out, err = io.StringIO(), io.StringIO()
    status = run(con or duckdb.connect(), io.StringIO(text), out, err)
    return status, out.getvalue(), err.getvalue()


def test_a_warning_is_printed_once_and_an_error_each_time():
    status, out, err = shell(".mode list\nSELECT write_log('dup', level := 'WARNING');\n"
                             "SELECT write_log('dup', level := 'WARNING');\n"
                             "SELECT write_log('bad', level := 'ERROR');\nSELECT write_log('bad', level := 'ERROR');\n")
    assert status == 0, err
    lines = out.splitlines()
    assert lines.count("WARNING:") == 1 and lines.count("dup") == 1
    assert lines.count("ERROR:") == 2 and lines.count("bad") == 2


def test_the_query_log_is_one_line_per_statement_before_its_result():
    _, out, err = shell(".mode list\nCALL enable_logging('QueryLog');\nSELECT\n  1 AS a,\n  2 AS b;\n")
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("INFO:QueryLog"))
    assert lines[at].endswith("  SELECT 1 AS a, 2 AS b;") and lines[at + 1:at + 3] == ["a|b", "1|2"], out
    assert not any("FROM" in line for line in lines if line.startswith("INFO:")), out   # not the shell's own queries


def test_moving_the_log_elsewhere_prints_duckdbs_warning(tmp_path):
    path = tmp_path / "elsewhere"
    _, out, err = shell(f"CALL enable_logging(storage = 'file', storage_config = {{'path': '{path}'}});\n")
    assert "WARNING:\nThe logging settings have been changed" in out, out + err


def test_the_clis_storage_name_is_the_shells_file():
    con = duckdb.connect()
    _, out, err = shell(".mode list\nCALL enable_logging('QueryLog', storage = 'shell_log_storage');\nSELECT 42;\n", con)
    assert err == "" and any(line.startswith("INFO:QueryLog") and line.endswith("SELECT 42;")
                             for line in out.splitlines()), out + err
    log = ShellLog(con)
    try:
        rewritten = log.statement("CALL enable_logging(level => 'trace', storage => 'shell_log_storage')")
        assert "shell_log_storage" not in rewritten and log.path in rewritten
        assert log.statement("SELECT 'shell_log_storage'") == "SELECT 'shell_log_storage'"
    finally:
        log.close()
    assert not os.path.exists(log.directory)


@pytest.mark.parametrize("micros,text", [(0, "0.00"), (123_456, "0.12"), (59_999_999, "1'00.00"),
                                         (132_120_000, "2'12.12"), (3_732_000_000, "01h02'12")])
def test_elapsed_is_written_as_the_cli_writes_it(micros, text):
    assert elapsed(micros) == text.rjust(8)


def test_a_message_is_put_on_one_line():
    assert sanitized("SELECT\n  1,\t2;\n") == "SELECT 1, 2;"
