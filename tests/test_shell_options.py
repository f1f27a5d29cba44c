"""``python -m dbml shell``'s command line: DuckDB CLI's options, their order and exit statuses.

Each test starts the shell as a user does (a subprocess, about 0.4 s: torch is not imported).
"""

import subprocess
import sys
from pathlib import Path

import pytest

# the options DuckDB's CLI (v1.5.6) lists in its -help
CLI_OPTIONS = """ascii bail batch box column cmd csv c dark-mode echo f init header h help html interactive json jsonlines
light-mode line list markdown newline no-init no-stdin noheader nullvalue quote readonly s safe separator
storage-version table ui unredacted unsigned version""".split()


def dbml_shell(*args, stdin="", env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "dbml", "shell", *args], input=stdin, capture_output=True,
                          text=True, timeout=120, env=env, cwd=cwd)


def test_every_option_of_duckdbs_cli_is_accepted_and_listed():
    from dbml.shell.options import OPTIONS
    assert [o.name for o in OPTIONS] == CLI_OPTIONS
    r = dbml_shell("--help")
    assert r.returncode == 0 and "OPTIONS:" in r.stdout
    assert all(f"  -{name}" in r.stdout for name in CLI_OPTIONS)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert [n for n in CLI_OPTIONS if f"-{n}" not in readme] == []


def test_the_test_harness_flags_batch_and_no_init_with_one_dash_or_two():
    r = dbml_shell("--batch", "--no-init", "--no-init", "-batch", stdin="SELECT 42 AS x;\n")
    assert r.returncode == 0 and "42" in r.stdout, r.stderr


@pytest.mark.slow   # ~1.1 s: out of the -m 'not slow' inner loop (under a minute)
def test_c_f_and_cmd_run_in_their_order_and_sql_may_follow_the_database(tmp_path):
    script = tmp_path / "ins.sql"
    script.write_text("INSERT INTO tbl VALUES (42);\n")
    r = dbml_shell("-c", "CREATE TABLE tbl(i INT)", "-f", str(script), "-f", str(script), "-csv",
                   "-c", "SELECT sum(i) AS s FROM tbl")
    assert r.returncode == 0 and r.stdout == "s\n84\n", r.stderr
    db = str(tmp_path / "x.duckdb")
    r = dbml_shell(db, "-list", "CREATE TABLE t AS SELECT 7 AS seven", "SELECT * FROM t", ".print done")
    assert r.stdout == "seven\n7\ndone\n", r.stderr


@pytest.mark.slow   # ~1.0 s: out of the -m 'not slow' inner loop (under a minute)
def test_modes_headers_separators_and_null_text_from_the_command_line():
    r = dbml_shell("-csv", "-noheader", "-nullvalue", "MYNULL", "-separator", "MYSEP", "-c", "SELECT 42 AS a, NULL AS b")
    assert r.stdout == "42MYSEPMYNULL\n"
    r = dbml_shell("-json", "-c", "SELECT 42 AS a")
    assert r.stdout == '[{"a":42}]\n'


@pytest.mark.slow   # ~0.9 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_failing_c_stops_with_status_1_and_exit_takes_a_code():
    r = dbml_shell("-c", "SELECT nope", "-c", "SELECT 'not reached'")
    assert r.returncode == 1 and "not reached" not in r.stdout and r.stderr.startswith("Binder Error: ")
    r = dbml_shell(stdin=".exit 17\nSELECT 1;\n")
    assert r.returncode == 17 and r.stdout == ""


def test_unknown_options_and_missing_arguments_are_errors():
    r = dbml_shell("-xyz", stdin="SELECT 42;\n")
    assert r.returncode == 1 and "Unknown Option Error: Unrecognized option '-xyz'" in r.stderr
    r = dbml_shell("-c")
    assert r.returncode == 1 and "Missing Argument Error: Argument '-c' needs 1 arguments" in r.stderr


def test_version_prints_duckdbs_version():
    import duckdb
    r = dbml_shell("-version")
    assert r.returncode == 0 and r.stdout.startswith(f"v{duckdb.__version__} (")


@pytest.mark.slow   # ~3.0 s: out of the -m 'not slow' inner loop (under a minute)
def test_an_init_file_runs_first_and_stops_at_its_error(tmp_path):
    good, bad = tmp_path / "good.sql", tmp_path / "bad.sql"
    good.write_text("CREATE TABLE greet AS SELECT 'hello' AS word;\n.mode csv\n")
    bad.write_text("selec 42;\n")
    r = dbml_shell("-init", str(good), "-c", "SELECT word FROM greet")
    assert r.returncode == 0 and r.stdout == "word\nhello\n", r.stderr
    r = dbml_shell("-init", str(bad), stdin="SELECT 'reached here';\n")
    assert r.returncode == 1 and "selec" in r.stderr and "reached here" not in r.stdout
    r = dbml_shell("-init", str(tmp_path / "missing.sql"), stdin="SELECT 'reached here';\n")
    assert r.returncode == 1 and "missing.sql" in r.stderr and "reached here" not in r.stdout


@pytest.mark.slow   # ~0.9 s: out of the -m 'not slow' inner loop (under a minute)
def test_the_default_init_file_is_duckdbs_and_no_init_skips_it(tmp_path):
    (tmp_path / ".duckdbrc").write_text(".mode csv\n")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    assert dbml_shell("-c", "SELECT 1 AS one", env=env).stdout == "one\n1\n"
    assert dbml_shell("-no-init", "-c", "SELECT 1 AS one", env=env).stdout.startswith("┌")


@pytest.mark.slow   # ~2.6 s: out of the -m 'not slow' inner loop (under a minute)
def test_safe_and_readonly(tmp_path):
    db = str(tmp_path / "s.duckdb")
    r = dbml_shell(db, "-safe", stdin="CREATE TABLE t(i INT);\nINSERT INTO t VALUES (1), (2), (3);\n"
                                     "SELECT sum(i) AS s FROM t;\n.read x.sql\nCOPY (SELECT 42) TO 'x.csv';\n")
    assert "6" in r.stdout and ".read cannot be used in -safe mode" in r.stderr and "disabled" in r.stderr
    r = dbml_shell(db, "-readonly", "-c", "INSERT INTO t VALUES (4)")
    assert r.returncode == 1 and "read-only" in r.stderr


def test_an_unopenable_database_is_duckdbs_error_and_status_1(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_text("blablabla")
    r = dbml_shell(str(garbage), "-c", "SELECT 1")
    assert r.returncode == 1 and "not a valid DuckDB database file" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow   # two processes, one holding the lock
def test_a_locked_database_is_one_error(tmp_path):
    db = str(tmp_path / "locked.duckdb")
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, sys; c = duckdb.connect({db!r}); "
                               "print('open', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        r = dbml_shell(db, "-c", "SELECT 1;")
    finally:
        holder.communicate("", timeout=30)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "lock" in r.stderr.lower()


@pytest.mark.slow   # ~0.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_shell_running_plain_sql_never_imports_torch():
    # the scheduler's lazy package and its environment switches (the cache folder, read by
    # dbml.core.startcache) are not the scheduler: any other module of it is
    probe = ("import sys\nfrom dbml.cli import main\nassert main(['shell', '-c', 'SELECT 42']) == 0\n"
             "scheduler = [m for m in sys.modules if m.startswith('dbml.scheduler.') and m != 'dbml.scheduler.config']\n"
             "print('torch' in sys.modules, bool(scheduler), 'dbml.zoo' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "False False False"
