"""A dbml function's one-row STRUCT (train(), evaluate()) is shown in the shell as its fields,
one column each, as ``SELECT unnest(train(...))`` shows them; what SQL returns (``_``) stays
the STRUCT (dbml/shell/output.py)."""

import io

import pytest

from dbml.shell import run


def shell(con, text):
    out, err = io.StringIO(), io.StringIO()
    status = run(con, io.StringIO(text), out, err)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.slow   # trains a model (~3 s with torch's first import)
def test_train_and_evaluate_show_their_fields_as_columns_and_sql_still_returns_the_struct(con):
    con.execute("CREATE TABLE pts AS SELECT range::DOUBLE AS x, range % 2 AS y FROM range(200)")
    status, out, err = shell(con, ".mode csv\nSELECT train('m', 'pts', label := 'y', epochs := 1);\n"
                                  "SELECT typeof(#1) AS t FROM _;\n"
                                  "SELECT evaluate('m', 'pts');\n"
                                  "SELECT evaluate('m', 'pts') AS e FROM range(2);\n")
    assert status == 0, err
    lines = out.splitlines()
    header = lines[0].split(",")
    assert header[:3] == ["model", "version", "status"] and lines[1].startswith("m,1,finished,"), out
    assert lines[2] == "t" and lines[3].startswith('"STRUCT(model VARCHAR'), out   # _ is what SQL returned
    assert lines[4].split(",")[:2] == ["rows", "accuracy"] and lines[5].startswith("200,"), out
    assert lines[6] == "e" and len(lines) == 9, out   # two rows: the STRUCT as it is


def test_a_struct_of_plain_sql_or_of_several_rows_is_shown_as_it_is(con):
    _, out, _ = shell(con, ".mode csv\nSELECT {'a': 1, 'b': 'x'} AS s;\n")
    assert out.splitlines() == ["s", "\"{'a': 1, 'b': x}\""]
    _, out, _ = shell(con, ".mode csv\nSELECT {'a': 1} AS train FROM range(1) WHERE 'evaluate(' <> '';\n")
    assert out.splitlines() == ["train", "\"{'a': 1}\""]
