"""Start-up: ``import dbml`` and ``dbml.install(con, preload=False)`` (the shell's) import neither
torch, the scheduler nor the zoo; they come when a statement first needs them (issue 25: a
shell that runs plain SQL never imports torch). By default install preloads the UDFs' module,
which imports torch only in the UDFs that use a model (tests/test_first_statement.py)."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "dbml.scheduler", "dbml.zoo", "dbml.core.training", "dbml.core.catalog", "dbml.core.inference",
         "dbml.udfs.functions", "pyarrow")


def imported_after(code: str) -> dict:
    """Which of HEAVY a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nimport sys\nprint({{m: m in sys.modules for m in {HEAVY!r}}})"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
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
