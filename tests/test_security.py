"""A SELECT is a SELECT (issue 10, items 1-4): a source never writes, never calls a
function with effects, the catalog never injects SQL, and files are read only as allowed.

Each test reproduces an attack that worked on f30edaf. The property test at the end
generates sources from a grammar of SELECTs and checks that every one dbml accepts leaves
every table as it was.
"""

import hashlib
import json
import re

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dbml
from dbml.core import source as src

# issue 10 reliability tests: whole databases and subprocesses; in the full suite, not the fast loop
pytestmark = pytest.mark.slow


def table_rows(con, name="t"):
    return con.execute(f"SELECT count(*) FROM {name}").fetchall()[0][0]


def models(con):
    return con.execute("SELECT name, version FROM dbml_models ORDER BY ALL").fetchall()


def make_table(con, n=100):
    con.execute(f"CREATE TABLE t AS SELECT range::INTEGER AS i, (range / 10.0)::DOUBLE AS x1, "
                f"((range * 7) % 13 / 2.0)::DOUBLE AS x2, (range % 2)::INTEGER AS y FROM range({n})")


def train(con, model, source="t", **args):
    extra = "".join(f", {k} := {v!r}" for k, v in args.items())
    return con.execute(f"SELECT train('{model}', '{source}', label := 'y', epochs := 1{extra})").fetchall()


@pytest.fixture(params=["memory", "file"])
def db(request, tmp_path):
    """A database with table t (100 rows) and a trained model 'm', in memory or in a file."""
    path = ":memory:" if request.param == "memory" else str(tmp_path / "db.duckdb")
    con = dbml.connect(path, latency_model="roofline")
    make_table(con)
    train(con, "m")
    yield con
    con.close()


DELETE_CTE = "WITH d AS (DELETE FROM t WHERE i < 50 RETURNING *) SELECT * FROM d"
CALLS = {
    "train": "SELECT train('{model}', '{source}', label := 'y', epochs := 1)",
    "evaluate": "SELECT evaluate('m', '{source}')",
    "predictions": "SELECT * FROM predictions('m', '{source}')",
}


def error_of(con, sql):
    """The message of the duckdb.Error that ``sql`` raises (checked after what must survive)."""
    with pytest.raises(duckdb.Error) as info:
        con.execute(sql).fetchall()
    return str(info.value)


def sql_string(text):
    return text.replace("'", "''")


# -- item 1: a data-modifying CTE ----------------------------------------------------------------

@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("write", [DELETE_CTE] + [pytest.param(w, marks=pytest.mark.slow) for w in [
    "WITH d AS (UPDATE t SET y = 1 - y RETURNING *) SELECT * FROM d",
    "WITH d AS (INSERT INTO t SELECT * FROM t RETURNING *) SELECT * FROM d",
    "SELECT * FROM t WHERE i IN (SELECT i FROM (WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d))"]])
def test_data_modifying_cte_is_refused_and_rows_survive(db, call, write):
    before = db.execute("SELECT * FROM t ORDER BY i").fetchall()
    message = error_of(db, CALLS[call].format(model="n", source=sql_string(write)))
    assert db.execute("SELECT * FROM t ORDER BY i").fetchall() == before
    assert models(db) == [("m", 1)]
    assert re.search(rf"{call}\(\): source contains an? (DELETE|UPDATE|INSERT) .*a source must only read", message)


def test_plan_check_refuses_writes_parsing_missed(con):
    """Defence in depth: check_plan alone (as describe runs it) refuses a write in the plan."""
    make_table(con)
    with pytest.raises(dbml.errors.SourceError, match=r"train\(\): source would write \(DELETE in its plan\)"):
        src.check_plan(con, DELETE_CTE, fn="train")
    with pytest.raises(dbml.errors.SourceError, match=r"would write"):
        src.describe(con, DELETE_CTE, fn="train")
    assert table_rows(con) == 100
    src.check_plan(con, "WITH d AS (SELECT * FROM t) SELECT * FROM d", fn="train")   # reads pass


def test_plan_check_falls_back_to_the_physical_plan_for_files(con, tmp_path):
    """A file scan's logical plan cannot be serialized: EXPLAIN's physical plan is checked instead."""
    make_table(con)
    path = tmp_path / "t.parquet"
    con.execute(f"COPY t TO '{path}'")
    src.check_plan(con, f"SELECT * FROM read_parquet('{path}')", fn="train")
    with pytest.raises(dbml.errors.SourceError, match=r"would write \(DELETE in its plan\)"):
        src.check_plan(con, f"{DELETE_CTE.replace('FROM d', 'FROM d, ')} read_parquet('{path}')", fn="train")
    with pytest.raises(dbml.errors.SourceError, match=r"calls drop_model\(\) \(seen in its plan"):
        src.check_plan(con, f"SELECT *, drop_model('m') FROM read_parquet('{path}')", fn="train")
    assert table_rows(con) == 100


# -- item 2: dbml's functions with effects -------------------------------------------------------

def test_source_cannot_drop_another_model(con):
    make_table(con)
    train(con, "victim")
    for source in ["SELECT *, drop_model(''victim'') FROM t",
                   "SELECT * FROM t WHERE (SELECT drop_model(''victim'')) > 0",
                   "WITH d AS (SELECT drop_model(''victim'') AS n) SELECT t.* FROM t, d"]:
        message = error_of(con, f"SELECT train('m', '{source}', label := 'y', epochs := 1)")
        assert models(con) == [("victim", 1)]
        assert re.search(r"train\(\): source calls drop_model\(\), which has effects", message)
        message = error_of(con, f"SELECT evaluate('victim', '{source}')")
        assert models(con) == [("victim", 1)]
        assert re.search(r"evaluate\(\): source calls drop_model\(\)", message)


def test_view_that_calls_drop_model_is_refused_by_the_plan_check(con):
    make_table(con)
    train(con, "victim")
    con.execute("CREATE VIEW v AS SELECT *, drop_model('victim') AS gone FROM t")
    message = error_of(con, "SELECT train('m', 'v', label := 'y', epochs := 1)")
    assert models(con) == [("victim", 1)]
    assert re.search(r"train\(\): source calls drop_model\(\) \(seen in its plan", message)
    message = error_of(con, "SELECT * FROM predictions('victim', 'v')")
    assert models(con) == [("victim", 1)]
    assert re.search(r"predictions\(\): source calls drop_model\(\) \(seen in its plan", message)


@pytest.mark.parametrize("call", ["train(''x'', ''t'', label := ''y'')", "cancel_job(1)", "wait_job(1)",
                                  "calibrate(quick := true)", "dbml_calibrate(true, ''cpu'', 1)",
                                  "nextval(''s'')", "setseed(0.5)", "evaluate(''m'', ''t'')"])
def test_functions_with_effects_are_refused_before_anything_runs(con, call):
    make_table(con)
    with pytest.raises(duckdb.Error, match=r"train\(\): source calls \w+\(\), which has effects"):
        con.execute(f"SELECT train('m', 'SELECT *, {call} AS c FROM t', label := 'y')").fetchall()
    assert models(con) == []


def test_which_functions_have_effects_has_one_owner():
    """udfs.FUNCTIONS says which functions have effects or run SQL text; sources refuse
    exactly those (and DuckDB's), with every macro that calls one; con.sql's once-only
    relations and DuckDB's side-effect flags follow the same table."""
    from dbml.api import has_effects
    from dbml.udfs import FUNCTIONS, names_with_effects, refused_names
    effects = {f.name for f in FUNCTIONS if f.effects}
    assert refused_names() | set(src.DUCKDB_EFFECTFUL) == src.refused()
    assert {"train", "calibrate", "wait_job", "export_model"} <= names_with_effects()       # macros, derived
    assert {"evaluate", "predictions"} <= refused_names() - names_with_effects()            # run SQL text
    assert all(f.options().get("side_effects") for f in FUNCTIONS if f.effects or f.volatile or f.runs_sql)
    assert not any(f.options().get("side_effects") for f in FUNCTIONS
                   if not (f.effects or f.volatile or f.runs_sql))
    for name in names_with_effects():
        assert has_effects(f"SELECT {name}(1)") and not has_effects(f"SELECT '{name}(1)' AS text")
    assert not has_effects("SELECT * FROM dbml_jobs") and "dbml_job_rows" not in effects


# -- item 3: SQL injection from the catalog ------------------------------------------------------

def tamper(con, path, value):
    prep = json.loads(con.execute("SELECT preprocessing FROM dbml_models WHERE name = 'm'").fetchall()[0][0])
    node = prep
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    con.execute("UPDATE dbml.models SET preprocessing = ? WHERE name = 'm'", [json.dumps(prep)])


def injection(target):
    """A mean of feature ``i`` that, pasted with Python's repr (as f30edaf did), closes the
    expression and runs COPY ... TO ``target`` as a statement of its own."""
    return (f"1'.length()), 0)]::FLOAT[1] AS x FROM (SELECT 1 AS i); "
            f"COPY (SELECT 42 AS v) TO $${target}$$; SELECT 1 --\"")


@pytest.mark.parametrize("call", ["SELECT evaluate('m', 't')", "SELECT * FROM predictions('m', 't')"])
def test_tampered_preprocessing_runs_nothing(con, tmp_path, call):
    make_table(con)
    train(con, "m")
    target = tmp_path / "pwned.csv"
    tamper(con, ["features", 0, "mean"], injection(target))
    message = error_of(con, call)
    assert not target.exists()
    assert table_rows(con) == 100
    assert re.search(r"model 'm' version 1: dbml_models.preprocessing is invalid: "
                     r"features\[0\].mean is .*, not a valid float; .*retrain it", message)


@pytest.mark.parametrize("path, value, problem", [
    (["features", 0, "std"], 0, r"features\[0\].std is 0, not positive"),
    (["features", 0, "std"], "1", r"features\[0\].std is \"1\", not a valid float"),
    (["features", 0, "kind"], "sql", r"features\[0\].kind is 'sql'"),
    (["features", 0, "extra"], 1, r"features\[0\].extra is unknown"),
    (["target_mean"], [1], r"target_mean is \[1\], not a valid float"),
    (["classes"], [{"a": 1}], r"classes is .*, not a valid tuple"),
    (["task"], "DROP", r"task is 'DROP'"),
])
def test_tampered_preprocessing_gets_a_clear_error(con, path, value, problem):
    make_table(con)
    train(con, "m")
    tamper(con, path, value)
    with pytest.raises(duckdb.Error, match=rf"model 'm' version 1: dbml_models.preprocessing is invalid: {problem}"):
        con.execute("SELECT evaluate('m', 't')").fetchall()


def test_schema_has_a_check_for_every_stored_field():
    from dataclasses import fields
    from dbml.core import catalog, features
    for cls in (features.Preprocessing, features.Feature):
        assert {str(f.type) for f in fields(cls)} <= set(catalog._FIELD_CHECKS)


def test_numbers_reach_sql_only_as_finite_literals():
    assert src.number(0.5) == "0.5" and src.number(-2) == "-2.0" and src.number(1e-300) == "1e-300"
    for bad in ["1) ; DROP TABLE t; --", float("nan"), float("inf"), True, None, [1]]:
        with pytest.raises(ValueError, match="expected a finite number"):
            src.number(bad)


# -- item 4: files and attached databases --------------------------------------------------------

@pytest.fixture
def parquet(con, tmp_path):
    make_table(con)
    path = tmp_path / "t.parquet"
    con.execute(f"COPY t TO '{path}'")
    return str(path)


def test_enable_external_access_false_refuses_files(con, parquet):
    con.execute("SET enable_external_access = false")
    with pytest.raises(duckdb.Error, match=r"train\(\): source failed in DuckDB: Permission Error: .*"
                                           r"file system operations are disabled"):
        train(con, "m", f"SELECT * FROM read_parquet(''{parquet}'')")
    assert models(con) == []


@pytest.mark.parametrize("source", ["SELECT * FROM read_parquet(''{p}'')", "SELECT * FROM ''{p}''",
                                    "SELECT * FROM other.t", "other.main.t",
                                    "SELECT * FROM t WHERE i IN (SELECT i FROM read_csv(''{p}''))"])
def test_sources_setting_tables_refuses_files_and_attached_databases(con, parquet, tmp_path, source):
    con.execute(f"ATTACH '{tmp_path / 'other.duckdb'}' AS other")
    con.execute("CREATE TABLE other.t AS SELECT * FROM t")
    con.execute("SET VARIABLE dbml_sources = 'tables'")
    with pytest.raises(duckdb.Error, match=r"train\(\): source reads .* but sources are restricted to the "
                                           r"database's tables and views; SET VARIABLE dbml_sources = 'any'"):
        train(con, "m", source.format(p=parquet))
    assert models(con) == []


@pytest.mark.slow
def test_sources_setting_tables_allows_tables_views_and_ctes(con, parquet):
    con.execute("CREATE VIEW v AS SELECT * FROM t")
    con.execute("SET VARIABLE dbml_sources = 'tables'")
    train(con, "a", "WITH c AS (SELECT * FROM v) SELECT * FROM c JOIN main.t USING (i, x1, x2, y)")
    con.execute("SET VARIABLE dbml_sources = 'any'")
    train(con, "b", f"SELECT * FROM read_parquet(''{parquet}'')")
    assert models(con) == [("a", 1), ("b", 1)]


@pytest.mark.parametrize("query", ["SELECT evaluate('m', 'SELECT * FROM read_parquet(''{p}'')')",
                                   "SELECT * FROM predictions('m', 'SELECT * FROM read_parquet(''{p}'')')"])
def test_sources_setting_tables_holds_for_evaluate_and_predictions(con, parquet, query):
    train(con, "m")
    con.execute("SET VARIABLE dbml_sources = 'tables'")
    fn = query.split("(")[0].split()[-1]
    with pytest.raises(duckdb.Error, match=fn + r"\(\): source reads .* but sources are restricted to the "
                                                r"database's tables and views; SET VARIABLE dbml_sources = 'any'"):
        con.sql(query.format(p=parquet)).fetchall()
    con.execute("SET VARIABLE dbml_sources = 'any'")
    assert con.sql(query.format(p=parquet)).fetchall()


def test_sources_setting_has_known_values(con):
    make_table(con)
    con.execute("SET VARIABLE dbml_sources = 'files'")
    with pytest.raises(duckdb.Error, match=r"setting sources is 'files'; SET VARIABLE dbml_sources = 'any' or 'tables'"):
        train(con, "m")


# -- property: every accepted source leaves the database as it was -------------------------------

TABLES = {"t": ["i", "x1", "x2", "y"], "u": ["j", "z"]}
WRITES = ["DELETE FROM t WHERE i < {k} RETURNING *", "UPDATE t SET x1 = x1 + 1 RETURNING *",
          "INSERT INTO t SELECT * FROM t LIMIT {k} RETURNING *", "DELETE FROM u RETURNING j AS i, z AS x1, z AS x2, j AS y"]
EFFECTS = ["drop_model('victim')", "nextval('s')", "setseed(0.5)", "cancel_job(1)", "wait_job(1)", "evaluate('victim', 't')"]


@st.composite
def expressions(draw, depth=0):
    kind = draw(st.sampled_from(["column", "literal", "call", "effect", "subquery"] if depth < 2 else ["column", "literal"]))
    if kind == "column":
        return draw(st.sampled_from(TABLES["t"]))
    if kind == "literal":
        return str(draw(st.integers(-5, 5)))
    if kind == "call":
        fn = draw(st.sampled_from(["abs", "coalesce", "greatest", "least", "round"]))
        args = draw(st.lists(expressions(depth + 1), min_size=1, max_size=2))
        return f"{fn}({', '.join(args)})" if fn not in ("abs", "round") else f"{fn}({args[0]})"
    if kind == "effect":
        return draw(st.sampled_from(EFFECTS))
    return f"(SELECT max({draw(st.sampled_from(TABLES['u']))}) FROM u)"


@st.composite
def selects(draw, depth=0):
    """A SELECT over t with CTEs, subqueries, function calls; sometimes a write or an effect."""
    ctes, relation = [], draw(st.sampled_from(["t", "v_ok", "v_bad"]))
    if depth < 1 and draw(st.booleans()):
        body = (draw(st.sampled_from(WRITES)).format(k=draw(st.integers(0, 60))) if draw(st.integers(0, 3)) == 0
                else draw(selects(depth + 1)))
        ctes.append(f"c AS ({body})")
        relation = "c"
    elif depth < 1 and draw(st.booleans()):
        relation = f"({draw(selects(depth + 1))}) AS s"
    cols = draw(st.lists(expressions(), min_size=0, max_size=2))
    select = ", ".join(["i", "x1", "x2", "y"] + [f"{e} AS e{n}" for n, e in enumerate(cols)])
    where = draw(st.sampled_from(["", " WHERE y = 1", " WHERE i IN (SELECT j FROM u)", " WHERE x1 > 0.5"]))
    return (f"WITH {', '.join(ctes)} " if ctes else "") + f"SELECT {select} FROM {relation}{where}"


def fingerprint(con):
    """Checksums of every table (and sequence) in the database."""
    tables = con.execute("SELECT database_name, schema_name, table_name FROM duckdb_tables() "
                         "WHERE database_name NOT IN ('dbml_scratch') ORDER BY ALL").fetchall()
    sums = {}
    for db, schema, name in tables:
        rows = con.execute(f'SELECT * FROM "{db}"."{schema}"."{name}" ORDER BY ALL').fetchall()
        sums[name] = hashlib.sha256(repr(rows).encode()).hexdigest()
    sums["sequences"] = con.execute("SELECT sequence_name, last_value FROM duckdb_sequences() ORDER BY ALL").fetchall()
    return sums


@pytest.fixture(scope="module")
def fuzz_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "fuzz.duckdb"
    con = dbml.connect(str(path), latency_model="roofline")
    make_table(con, 200)
    con.execute("CREATE TABLE u AS SELECT range::INTEGER AS j, range * 1.5 AS z FROM range(20)")
    con.execute("CREATE SEQUENCE s")
    con.execute("CREATE VIEW v_ok AS SELECT * FROM t WHERE i % 3 = 0")
    con.execute("CREATE VIEW v_bad AS SELECT i, x1, x2, y + nextval('s') * 0 AS y FROM t")
    counts = {"tried": 0, "rejected": 0}
    yield con, counts
    print(f"\nproperty test: {counts['tried']} generated sources tried, {counts['rejected']} rejected")
    con.close()


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source=selects())
def test_accepted_sources_leave_every_table_unchanged(fuzz_db, source):
    con, counts = fuzz_db
    before = fingerprint(con)
    counts["tried"] += 1
    try:
        select_sql = src.as_select(source, fn="train")
        src.describe(con, select_sql, fn="train")       # the checks every source passes first
    except dbml.errors.SourceError as e:
        counts["rejected"] += 1
        assert "a source must only read" in str(e) or "failed in DuckDB" in str(e), str(e)
        assert fingerprint(con) == before
        return
    con.execute(f"SELECT count(*) FROM ({select_sql})").fetchall()   # what train/evaluate then run
    assert fingerprint(con) == before, source


# -- property: names with quotes never become code ------------------------------------------------

NASTY = ["y\", export_model('victim', '{target}', overwrite := true) AS \"z", "a'); DROP TABLE keep; --",
         "x$$ ; DROP TABLE keep; $$", "\\' OR drop_model('victim') --", "b\"\"; SELECT 1"]


@st.composite
def column_names(draw):
    if draw(st.booleans()):
        return draw(st.sampled_from(NASTY))
    return draw(st.text(alphabet="ab'\";()-\\$ ,=:", min_size=1, max_size=12)).strip() or "c"


@pytest.fixture(scope="module")
def names_db(tmp_path_factory):
    folder = tmp_path_factory.mktemp("names")
    con = dbml.connect(str(folder / "names.duckdb"), latency_model="roofline")
    con.execute("CREATE TABLE keep AS SELECT range AS k FROM range(5)")
    con.execute("CREATE TABLE victim_data AS SELECT range / 10 AS x, range % 2 AS y FROM range(40)")
    con.execute("SELECT train('victim', 'victim_data', label := 'y', epochs := 1, policy := 'eager')")
    yield con, folder
    con.close()


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(feature=column_names(), label=column_names())
def test_quoted_label_and_column_names_never_become_code(names_db, feature, label):
    con, folder = names_db
    target = folder / "overwritten.onnx"
    feature, label = feature.format(target=target), label.format(target=target)
    if feature.lower() == label.lower():
        label = label + "_label"
    fq, lq = (src.quote(n) for n in (feature, label))
    con.execute(f"CREATE OR REPLACE TABLE named AS SELECT range / 10 AS {fq}, (range % 2)::INTEGER AS {lq} "
                f"FROM range(40)")
    con.execute("SELECT train('named', 'named', label := ?, epochs := 1, policy := 'eager')", [label])
    before = fingerprint(con)
    rows = con.execute("SELECT * FROM predictions('named', 'named')").fetchall()
    assert len(rows) == 40 and len(rows[0]) == 3
    assert con.execute("SELECT evaluate('named', 'named')").fetchall()[0][0]["rows"] == 40
    assert dbml.execute(con, "SELECT * FROM ML.PREDICT(MODEL named, TABLE named)").fetchall()
    assert fingerprint(con) == before and not target.exists()
    assert con.execute("SELECT count(*) FROM dbml_models WHERE name = 'victim'").fetchall() == [(1,)]
