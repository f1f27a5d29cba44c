"""A name is a name: BigQuery ML text whose labels, columns and model names hold quotes,
semicolons, comments and whole calls (``y", export_model('keep', '/some/file', overwrite :=
true) AS "z``) runs the statement it spells, or is refused, and nothing else: no file is
written, no other model dropped, no table touched. Every name reaches SQL through sqlglot's
trees (dbml/bigquery/), so a generated name that became code would show here.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st
from sqlglot import exp

import dbml

pytestmark = pytest.mark.slow   # trains a model per example

OUT = tempfile.mkdtemp(prefix="dbml-bq-injection-")
FRAGMENTS = ['"', "'", "`", ";", "--", "/*", "*/", "\\", "#", "$$", " AS ", "), ", "(", ",", "y", "z", " ",
             f"export_model('keep', '{OUT}/f.onnx', overwrite := true)", "drop_model('keep')",
             "DROP TABLE t", "COPY t TO 'x.csv'"]
names = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8).map("".join).filter(lambda s: s.strip())

_CON: list = []


def connection():
    """One connection for the test's examples, with a model 'keep' that must survive them all."""
    if not _CON:
        con = dbml.connect(latency_model="roofline")
        con.execute("CREATE TABLE base AS SELECT range / 50.0 AS x, (range % 2)::INTEGER AS y FROM range(200)")
        con.execute("SELECT train('keep', 'base', label := 'y', epochs := 1)")
        _CON.append(con)
    return _CON[0]


def bigquery_string(text: str) -> str:
    """``text`` as a BigQuery string literal: '...' or "..." where one fits, else with escapes
    (which dbml refuses in a script, as ambiguous with DuckDB's rules: also a safe outcome)."""
    if "'" not in text and "\\" not in text:
        return f"'{text}'"
    if '"' not in text and "\\" not in text:
        return f'"{text}"'
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def untouched(con, before) -> None:
    assert con.execute("SELECT uid FROM dbml.models WHERE name = 'keep'").fetchall() == before
    assert os.listdir(OUT) == []
    assert con.execute("SELECT count(*) FROM base").fetchall() == [(200,)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(label=names, feature=names)
def test_labels_and_columns_with_quotes_name_columns_and_nothing_runs_but_the_statement(label, feature):
    if label.lower() == feature.lower():
        return
    con = connection()
    before = con.execute("SELECT uid FROM dbml.models WHERE name = 'keep'").fetchall()
    q = lambda name: exp.to_identifier(name, quoted=True).sql("duckdb")  # noqa: E731
    con.execute(f"CREATE OR REPLACE TABLE t AS SELECT x AS {q(feature)}, y AS {q(label)} FROM base")
    script = (f"CREATE OR REPLACE MODEL m OPTIONS(model_type='logistic_reg', max_iterations=1, "
              f"input_label_cols=[{bigquery_string(label)}]) AS SELECT * FROM t;\n"
              f"SELECT * FROM ML.PREDICT(MODEL m, TABLE t);\n"
              f"SELECT * FROM ML.EVALUATE(MODEL m);\n"
              f"SELECT * FROM ML.EXPLAIN_PREDICT(MODEL m, TABLE t, STRUCT(1 AS top_k_features));\n"
              f"SELECT * FROM ML.WEIGHTS(MODEL m);\n"
              f"SELECT * FROM ML.FEATURE_INFO(MODEL m)")
    try:
        result = dbml.execute(con, script)
    except dbml.DbmlError as e:
        assert "ambiguous" in str(e) or "different places" in str(e), e   # refused: only as a whole script
        untouched(con, before)
        event("refused as ambiguous")
        return
    event("ran")
    assert [d[0] for d in result.description][0] == "input"
    assert [r[0] for r in result.fetchall()] == [feature]
    (got_label, features), = con.execute("SELECT label, features FROM dbml_models WHERE name = 'm' "
                                         "ORDER BY version DESC LIMIT 1").fetchall()
    assert (got_label, features) == (label, [feature])
    predicted = dbml.execute(con, "SELECT * FROM ML.PREDICT(MODEL m, TABLE t) LIMIT 1")
    assert [d[0] for d in predicted.description][:2] == [f"predicted_{label}", f"predicted_{label}_probs"]
    untouched(con, before)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=names)
def test_model_names_with_quotes_are_names(model):
    con = connection()
    before = con.execute("SELECT uid FROM dbml.models WHERE name = 'keep'").fetchall()
    quoted = "`" + model.replace("\\", "\\\\").replace("`", "\\`") + "`"
    try:
        dbml.execute(con, f"CREATE OR REPLACE MODEL {quoted} OPTIONS(model_type='logistic_reg', max_iterations=1, "
                          f"input_label_cols=['y']) AS SELECT * FROM base")
        dbml.execute(con, f"SELECT * FROM ML.PREDICT(MODEL {quoted}, TABLE base)").fetchall()
        dbml.execute(con, f"DROP MODEL {quoted}")
    except dbml.DbmlError as e:
        untouched(con, before)
        assert "ambiguous" in str(e) or "different places" in str(e) or "cannot read" in str(e), e
        event("refused")
        return
    event("ran")
    untouched(con, before)
    assert con.execute("SELECT count(*) FROM dbml.models WHERE name NOT IN ('keep', 'm')").fetchall() == [(0,)]
