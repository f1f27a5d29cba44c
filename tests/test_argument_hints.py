"""A dbml SQL function called with an argument it does not take: the error names the argument
and the nearest valid one (``dbml.udfs.arguments``), on a dbml connection and in the shell."""

import io

import duckdb
import pyarrow as pa
import pytest

from dbml.shell import run
from dbml.udfs import FUNCTIONS, SQL_FUNCTIONS, macro_signatures
from dbml.udfs.arguments import nearest


def fails(con, sql: str, match: str) -> str:
    for call in (con.execute, con.sql):
        with pytest.raises(duckdb.BinderException, match=match) as info:
            call(sql).fetchall()
    return str(info.value)


@pytest.mark.parametrize("sql,match", [
    ("SELECT train('m', 't', lable := 'y')", r"^Binder Error: train\(\): no argument 'lable'; did you mean 'label'\?\n"
                                             r"train\(\) takes model, source; by name: label, features, "),
    ("SELECT train('m', 't', label := 'y', learning_rate := 0.01)",
     r"^Binder Error: train\(\): no argument 'learning_rate'; did you mean 'lr'\?"),
    ("SELECT train('m', 't', lable := 'y', num_epochs := 3)",
     r"no argument 'lable'; did you mean 'label'\? no argument 'num_epochs'; did you mean 'epochs'\?"),
    ("SELECT * FROM tune('m', 't', label := 'y', trails := 3)", r"^Binder Error: tune\(\): no argument 'trails'; "
                                                                 r"did you mean 'trials'\?"),
    ("SELECT evaluate('m', 't', version := 2)",
     r"^Binder Error: evaluate\(\): no argument 'version'; name the version with the model, e\.g\. 'churn@2' "
     r"\(SELECT model, version FROM dbml_models lists them\)\nevaluate\(\) takes model, source; by name: on_error"),
    ("SELECT evaluate('m')", r"^Binder Error: evaluate\(\): missing argument 'source'\."),
    ("SELECT * FROM predictions('m', 't', on_eror := 'skip')", r"predictions\(\): no argument 'on_eror'; "
                                                                r"did you mean 'on_error'\?"),
    ("SELECT * FROM explain('m', 't', baseline := 0)", r"explain\(\): no argument 'baseline'\n"
                                                        r"explain\(\) takes model, source$"),
    ("SELECT export_model('m', 'f.onnx', overwrit := true)", r"export_model\(\): no argument 'overwrit'; "
                                                              r"did you mean 'overwrite'\?"),
    ("SELECT calibrate(quik := true)", r"calibrate\(\): no argument 'quik'; did you mean 'quick'\?"),
    ("SELECT wait_job(1, 2)", r"wait_job\(\): 2 arguments given in order; it takes at most 1\."),
    ("SELECT drop_model('m', force := true)", r"drop_model\(\): no argument by name \('force'\); pass them in "
                                              r"order: drop_model\(model\)"),
    ("SELECT predict('m', [1.0, 2.0], version := 2)", r"predict\(\): no argument by name \('version'\); pass them "
                                                       r"in order: predict\(model, "),
    ("CREATE TABLE r AS SELECT \"train\"('m', 't', lable := 'y') -- a comment", r"train\(\): no argument 'lable'"),
])
def test_each_function_family_names_the_argument_and_the_nearest(con, sql, match):
    fails(con, sql, match)


def test_every_dbml_function_names_an_argument_it_does_not_take(con):
    """Every function of the SQL surface, macro or UDF, given an argument it has not."""
    for name in SQL_FUNCTIONS:
        signature = macro_signatures().get(name)
        positional = ["'x'"] * (len(signature.positional) if signature else 1)
        call = f"{name}({', '.join(positional + ['bogus_argument := 1'])})"
        sql = f"SELECT * FROM {call}" if name in ("tune", "predictions", "explain") else f"SELECT {call}"
        fails(con, sql, rf"^Binder Error: {name}\(\): no argument (by name \()?'bogus_argument'")


def test_the_signatures_read_are_what_duckdb_binds(con):
    """macro_signatures (read from the macros' definitions) lists the parameters DuckDB has."""
    rows = con.execute("SELECT function_name, parameters FROM duckdb_functions() "
                       "WHERE function_type IN ('macro', 'table_macro') AND database_name = 'temp'").fetchall()
    duck = {name: tuple(params) for name, params in rows}
    ours = {name: s.positional + s.named for name, s in macro_signatures().items()}
    assert ours == {name: duck[name] for name in ours}
    assert {name for name in SQL_FUNCTIONS if name not in ours} == {f.name for f in FUNCTIONS if f.name in SQL_FUNCTIONS}


def test_duckdbs_pointer_to_the_call_is_kept(con):
    with pytest.raises(duckdb.BinderException, match=r"on_error\n\nLINE 1: SELECT evaluate\('m', 't', version := 2\)\n"):
        con.execute("SELECT evaluate('m', 't', version := 2)")


def test_an_error_that_is_not_about_a_name_stays_duckdbs(con):
    with pytest.raises(duckdb.BinderException, match=r"No function matches the given name and argument types "
                                                     r"'predict\(STRING_LITERAL, INTEGER\)'"):
        con.execute("SELECT predict('m', 1::INTEGER)")
    con.execute("CREATE MACRO mine(a) AS a")
    with pytest.raises(duckdb.BinderException, match=r"Macro mine\(\) does not support the supplied arguments"):
        con.execute("SELECT mine(b := 1)")


def test_a_plain_duckdb_connection_keeps_duckdbs_message(con):
    with pytest.raises(duckdb.BinderException, match=r"Macro evaluate\(\) does not support the supplied arguments"):
        con.duckdb.execute("SELECT evaluate('m', 't', version := 2)")


def test_the_shell_names_the_argument(con):
    out, err = io.StringIO(), io.StringIO()
    status = run(con, io.StringIO("SELECT train('m', 't', lable := 'y');\n"), out, err)
    assert status == 1
    assert err.getvalue().startswith("Binder Error: train(): no argument 'lable'; did you mean 'label'?\n")


def test_python_variables_are_still_found_through_a_dbml_connection(con):
    """execute and sql run the statement from a frame with the caller's variables, as DuckDB's
    replacement scans need (a wrapper's own frame would hide them)."""
    local_rows = pa.table({"b": [3, 4]})
    assert con.execute("SELECT sum(b) FROM local_rows").fetchall() == [(7,)]
    assert con.sql("SELECT sum(b) FROM local_rows WHERE b > ?", params=[3]).fetchall() == [(4,)]
    assert con.execute("SELECT sum(b) FROM local_rows WHERE b > ?", [0]).fetchall() == [(7,)]


@pytest.mark.parametrize("name,known,expected", [
    ("lable", ("label", "lr"), "label"), ("learning_rate", ("label", "lr"), "lr"),
    ("wd", ("weight_decay", "lr"), "weight_decay"), ("target", ("label", "lr"), None),
    # whole words first: difflib preferred split_col for split_method, and split for data_split_col
    ("split_method", ("split", "split_col", "seed"), "split"), ("data_split_col", ("split", "split_col"), "split_col"),
    ("max_epochs", ("epochs", "lr"), "epochs"),
])
def test_nearest(name, known, expected):
    assert nearest(name, known) == expected


def test_unnest_of_a_table_macros_struct_names_its_table_form(con):
    """DuckDB cannot expand evaluate()'s STRUCT with unnest (it copies the macro's subquery):
    the error says to read it as a table, from a dbml connection and in the shell."""
    con.execute("CREATE TABLE t AS SELECT 1.0 AS x, 2.0 AS y")
    want = r"^Serialization Error: unnest\(evaluate\(\.\.\.\)\) cannot expand .* SELECT \* FROM evaluate\(\.\.\.\)"
    for call in (con.execute, con.sql):
        with pytest.raises(duckdb.SerializationException, match=want):
            call("SELECT unnest(evaluate('m', 't'))").fetchall()
    out, err = io.StringIO(), io.StringIO()
    assert run(con, io.StringIO("SELECT unnest(evaluate('m', 't'));\n"), out, err) == 1
    assert "SELECT * FROM evaluate(...)" in err.getvalue(), err.getvalue()
    with pytest.raises(duckdb.SerializationException, match=r"^Serialization Error: Cannot copy"):
        con.duckdb.execute("SELECT unnest(evaluate('m', 't'))").fetchall()   # DuckDB's own message


def test_unnest_of_trains_struct_names_the_subquery_that_expands_it_and_trains_nothing(con):
    """train() is a scalar macro: its STRUCT expands once it is a subquery's column, as the
    error says; the statement DuckDB could not plan trained nothing."""
    con.execute("CREATE TABLE t AS SELECT range % 3 / 3.0 AS x, range % 2 AS y FROM range(40)")
    want = (r"^Serialization Error: unnest\(train\(\.\.\.\)\) cannot expand train\(\)'s STRUCT .* "
            r"SELECT unnest\(r\) FROM \(SELECT train\(\.\.\.\) AS r\)")
    with pytest.raises(duckdb.SerializationException, match=want):
        con.execute("SELECT unnest(train('m', 't', label := 'y', epochs := 1))").fetchall()
    assert con.execute("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]
    fixed = con.execute("SELECT unnest(r) FROM (SELECT train('m', 't', label := 'y', epochs := 1) AS r)")
    assert dict(zip([d[0] for d in fixed.description], fixed.fetchall()[0]))["status"] == "finished"


@pytest.mark.parametrize("statement", [
    "SELECT count(*) FROM predictions('churn', (SELECT * FROM t))",       # DuckDB: no subquery in a table function
    "SELECT * FROM evaluate('churn', (FROM t))",                          # DuckDB: the subquery's columns
    "SELECT prediction FROM explain('churn', (SELECT x FROM t LIMIT 2))",
])
def test_a_subquery_as_a_table_macros_source_names_the_text_form(con, statement):
    """A new user's natural spelling of 'these rows': DuckDB binds no subquery as a table
    function's argument, and said so in its own words; dbml's table macros take a table's name
    or the query's text, and the error says so with the user's model."""
    con.execute("CREATE TABLE t AS SELECT 1.0 AS x, 2.0 AS y")
    function = statement.split(" FROM ")[1].split("(")[0]
    want = (rf"^Binder Error: {function}\(\): pass its source as a table's name or as a query's text, not a "
            rf"subquery .* SELECT \* FROM {function}\('churn', 'SELECT \* FROM t WHERE \.\.\.'\)")
    with pytest.raises(duckdb.BinderException, match=want):
        con.execute(statement).fetchall()
    with pytest.raises(duckdb.BinderException, match=r"^Binder Error: (Table function cannot|Subquery returns)"):
        con.duckdb.execute(statement).fetchall()   # DuckDB's own message
    # the same error of a statement without dbml's functions keeps DuckDB's message
    with pytest.raises(duckdb.BinderException, match=r"^Binder Error: Subquery returns 2 columns"):
        con.execute("SELECT count(*) FROM t WHERE 1 = (SELECT 1, 2)").fetchall()
