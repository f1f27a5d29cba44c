"""Start-up: ``import dbml`` and ``dbml.install(con, preload=False)`` (the shell's) import neither
torch, the scheduler nor the zoo; they come when a statement first needs them (issue 25: a
shell that runs plain SQL never imports torch). By default install preloads the UDFs' module,
which imports torch only in the UDFs that use a model (tests/test_first_statement.py)."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "dbml.scheduler", "dbml.zoo", "dbml.core.training", "dbml.core.catalog", "dbml.core.inference",
         "dbml.udfs.functions", "pyarrow")
# the scheduler's lazy package (PEP 562) and its environment switches, which the runtime reads
# (the cache folder: dbml.core.startcache), are not the scheduler: any other module of it is
LIGHT = ("dbml.scheduler", "dbml.scheduler.config")
PROBE = ("import sys\n"
         "print({m: any(n == m or n.startswith(m + '.') for n in sys.modules if n not in LIGHT) for m in HEAVY})")


def imported_after(code: str, env: dict | None = None) -> dict:
    """Which of HEAVY (or a module under it) a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nHEAVY, LIGHT = {HEAVY!r}, {LIGHT!r}\n{PROBE}"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return eval(r.stdout.strip().splitlines()[-1])


LAZY = "import dbml, duckdb\ncon = dbml.install(duckdb.connect(), preload=False)\n"


@pytest.mark.slow   # ~0.6 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_lazy_install_and_plain_sql_import_none_of_torch_the_scheduler_or_the_zoo():
    loaded = imported_after(LAZY + "con.execute('CREATE TABLE t AS SELECT 1 AS x')\n"
                                   "assert con.execute('SELECT sum(x) FROM t').fetchall() == [(1,)]")
    assert not any(loaded.values()), loaded


@pytest.mark.slow   # ~1 s: out of the -m 'not slow' inner loop (under a minute)
def test_import_dbml_is_light_and_install_preloads_the_udfs_module_without_torch():
    assert not any(imported_after("import dbml").values())
    loaded = imported_after("import dbml\ncon = dbml.connect()")
    # torch: at the first statement using a model; pyarrow: at the first Arrow UDF DuckDB calls
    assert loaded["dbml.udfs.functions"] and not loaded["torch"] and not loaded["pyarrow"]


@pytest.mark.slow   # ~3.0 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_udf_imports_its_implementation_at_its_first_call():
    loaded = imported_after(LAZY + "try:\n"
                            "    con.execute(\"SELECT drop_model('nope')\")\n"
                            "except duckdb.Error as e:\n    assert \"no model named 'nope'\" in str(e)\n"
                            "else:\n    raise AssertionError('no error')")
    assert loaded["dbml.udfs.functions"] and loaded["torch"]


@pytest.mark.slow   # ~1.9 s: out of the -m 'not slow' inner loop (under a minute)
def test_register_model_is_still_dbml_register_model():
    loaded = imported_after("import dbml\nassert callable(dbml.register_model) and callable(dbml.unregister_model)")
    assert loaded["dbml.zoo"]


SHELL = ("import sys\nfrom dbml.shell import main\nsys.stdin = open(sys.argv[1])\n"
         "assert main(['-batch']) == 0\n")


@pytest.mark.slow   # ~1.5 s: two shell starts
def test_a_shell_start_reads_dbmls_macros_from_the_start_up_cache(tmp_path):
    """The second start of a shell (the same macros) reads what they take and call, and the generated
    train and tune SQL, from the cache folder: it neither renders nor tokenizes them, and imports none
    of HEAVY."""
    import os
    (tmp_path / "in.sql").write_text(".quit\n")
    env = {**os.environ, "DBML_CACHE_DIR": str(tmp_path / "cache")}
    run = f"import sys\nsys.argv[1:] = [{str(tmp_path / 'in.sql')!r}]\n" + SHELL
    assert not any(imported_after(run, env).values())
    assert len(list((tmp_path / "cache" / "startup").glob("macros-*.json"))) == 1
    never = ("import dbml.udfs as u\n"
             "def refuse(*a):\n    raise AssertionError('the macros were read again')\n"
             "u._read_definitions = refuse\n")
    loaded = imported_after(never + run, env)
    assert not any(loaded.values()), loaded
