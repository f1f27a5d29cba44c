"""The shell's output is DuckDB CLI's, byte for byte: each mode, the duckbox's cut and footer,
the CLI's number formatting, DESCRIBE, .tables, .databases, .schema and .dump.

The expected texts are what DuckDB's released CLI (v1.5.6, ``duckdb --batch --no-init``)
printed for the same input (its colours, which it writes to a pipe too, taken out).
``NULL::INTEGER`` and the other casts keep the engines' types alike: DuckDB 2 types an
untyped NULL column as "NULL" where 1.5 said int32.
"""

import io

import pytest

from dbml.shell import run

QUERY = ("SELECT 1 AS i, 'a|b' AS s, NULL::INTEGER AS n, 2.5 AS d, [1, 2] AS l, 'x\"y' AS q, true AS b "
         "UNION ALL SELECT 22, 'c,d é', NULL, -1.25, [], 'it''s', false;\n")

MODES = {
    'ascii': ('i\n'
        's\n'
        'n\n'
        'd\n'
        'l\n'
        'q\n'
        'b\n'
        '1\n'
        'a|b\n'
        'NULL\n'
        '2.50\n'
        '[1, 2]\n'
        'x"y\n'
        'true\n'
        '22\n'
        'c,d é\n'
        'NULL\n'
        '-1.25\n'
        '[]\n'
        "it's\n"
        'false\n'),
    'box': ('┌────┬───────┬──────┬───────┬────────┬──────┬───────┐\n'
        '│ i  │   s   │  n   │   d   │   l    │  q   │   b   │\n'
        '├────┼───────┼──────┼───────┼────────┼──────┼───────┤\n'
        '│ 1  │ a|b   │ NULL │ 2.50  │ [1, 2] │ x"y  │ true  │\n'
        "│ 22 │ c,d é │ NULL │ -1.25 │ []     │ it's │ false │\n"
        '└────┴───────┴──────┴───────┴────────┴──────┴───────┘\n'),
    'column': ('i   s      n     d      l       q     b    \n'
        '--  -----  ----  -----  ------  ----  -----\n'
        '1   a|b    NULL  2.50   [1, 2]  x"y   true \n'
        "22  c,d é  NULL  -1.25  []      it's  false\n"),
    'csv': ('i,s,n,d,l,q,b\r\n'
        '1,a|b,NULL,2.50,"[1, 2]","x""y",true\r\n'
        '22,"c,d é",NULL,-1.25,[],"it\'s",false\r\n'),
    'duckbox': ('┌───────┬─────────┬───────┬──────────────┬─────────┬─────────┬─────────┐\n'
        '│   i   │    s    │   n   │      d       │    l    │    q    │    b    │\n'
        '│ int32 │ varchar │ int32 │ decimal(3,2) │ int32[] │ varchar │ boolean │\n'
        '├───────┼─────────┼───────┼──────────────┼─────────┼─────────┼─────────┤\n'
        '│     1 │ a|b     │  NULL │         2.50 │ [1, 2]  │ x"y     │ true    │\n'
        "│    22 │ c,d é   │  NULL │        -1.25 │ []      │ it's    │ false   │\n"
        '└───────┴─────────┴───────┴──────────────┴─────────┴─────────┴─────────┘\n'),
    'html': ('<tr><th>i</th>\n'
        '<th>s</th>\n'
        '<th>n</th>\n'
        '<th>d</th>\n'
        '<th>l</th>\n'
        '<th>q</th>\n'
        '<th>b</th>\n'
        '</tr>\n'
        '<tr><td>1</td>\n'
        '<td>a|b</td>\n'
        '<td>NULL</td>\n'
        '<td>2.50</td>\n'
        '<td>[1, 2]</td>\n'
        '<td>x&quot;y</td>\n'
        '<td>true</td>\n'
        '</tr>\n'
        '<tr><td>22</td>\n'
        '<td>c,d é</td>\n'
        '<td>NULL</td>\n'
        '<td>-1.25</td>\n'
        '<td>[]</td>\n'
        '<td>it&#39;s</td>\n'
        '<td>false</td>\n'
        '</tr>\n'),
    'insert': ('INSERT INTO "table"(i,s,n,d,l,q,b) VALUES(1,\'a|b\',NULL,2.50,\'[1, 2]\',\'x"y\',\'true\');\n'
        'INSERT INTO "table"(i,s,n,d,l,q,b) VALUES(22,\'c,d é\',NULL,-1.25,\'[]\',\'it\'\'s\',\'false\');\n'),
    'json': ('[{"i":1,"s":"a|b","n":null,"d":"2.50","l":[1,2],"q":"x\\"y","b":true},\n'
        '{"i":22,"s":"c,d é","n":null,"d":"-1.25","l":[],"q":"it\'s","b":false}]\n'),
    'jsonlines': ('{"i":1,"s":"a|b","n":null,"d":"2.50","l":[1,2],"q":"x\\"y","b":true}\n'
        '{"i":22,"s":"c,d é","n":null,"d":"-1.25","l":[],"q":"it\'s","b":false}\n'),
    'latex': ('\\begin{tabular}{|rlrrlll|}\n'
        '\\hline\n'
        'i  &   s   &  n   &   d   &   l    &  q   &   b   \\\\\n'
        '\\hline\n'
        '1  & a|b   & NULL & 2.50  & [1, 2] & x"y  & true  \\\\\n'
        "22 & c,d é & NULL & -1.25 & []     & it's & false \\\\\n"
        '\\hline\n'
        '\\end{tabular}\n'),
    'line': ('    i = 1\n'
        '    s = a|b\n'
        '    n = NULL\n'
        '    d = 2.50\n'
        '    l = [1, 2]\n'
        '    q = x"y\n'
        '    b = true\n'
        '\n'
        '    i = 22\n'
        '    s = c,d é\n'
        '    n = NULL\n'
        '    d = -1.25\n'
        '    l = []\n'
        "    q = it's\n"
        '    b = false\n'),
    'list': ('i|s|n|d|l|q|b\n'
        '1|a|b|NULL|2.50|[1, 2]|x"y|true\n'
        "22|c,d é|NULL|-1.25|[]|it's|false\n"),
    'markdown': ('| i  |   s   |  n   |   d   |   l    |  q   |   b   |\n'
        '|---:|-------|-----:|------:|--------|------|-------|\n'
        '| 1  | a\\|b  | NULL | 2.50  | [1, 2] | x"y  | true  |\n'
        "| 22 | c,d é | NULL | -1.25 | []     | it's | false |\n"),
    'quote': ("'i','s','n','d','l','q','b'\n"
        '1,\'a|b\',NULL,2.50,\'[1, 2]\',\'x"y\',true\n'
        "22,'c,d é',NULL,-1.25,'[]','it''s',false\n"),
    'table': ('+----+-------+------+-------+--------+------+-------+\n'
        '| i  |   s   |  n   |   d   |   l    |  q   |   b   |\n'
        '+----+-------+------+-------+--------+------+-------+\n'
        '| 1  | a|b   | NULL | 2.50  | [1, 2] | x"y  | true  |\n'
        "| 22 | c,d é | NULL | -1.25 | []     | it's | false |\n"
        '+----+-------+------+-------+--------+------+-------+\n'),
    'tabs': ('i\ts\tn\td\tl\tq\tb\n'
        '1\ta|b\tNULL\t2.50\t[1, 2]\tx"y\ttrue\n'
        "22\tc,d é\tNULL\t-1.25\t[]\tit's\tfalse\n"),
    'tcl': ('"i" "s" "n" "d" "l" "q" "b"\n'
        '"1" "a|b" "NULL" "2.50" "[1, 2]" "x\\"y" "true"\n'
        '"22" "c,d \\303\\251" "NULL" "-1.25" "[]" "it\'s" "false"\n'),
}

CASES = {   # name: (the shell's input, the CLI's output)
    'maxrows': (('.maxrows 4\n'
         'SELECT range AS r FROM range(100);\n'),
        ('┌───────────┐\n'
         '│     r     │\n'
         '│   int64   │\n'
         '├───────────┤\n'
         '│         0 │\n'
         '│         1 │\n'
         '│         · │\n'
         '│         · │\n'
         '│         · │\n'
         '│        98 │\n'
         '│        99 │\n'
         '└───────────┘\n'
         '  100 rows \n'
         '  (4 shown) \n')),
    'maxrows_slightly_over': (('.maxrows 2\n'
         'SELECT * FROM range(4);\n'),
        ('┌───────┐\n'
         '│ range │\n'
         '│ int64 │\n'
         '├───────┤\n'
         '│     0 │\n'
         '│     1 │\n'
         '│     2 │\n'
         '│     3 │\n'
         '└───────┘\n')),
    'empty': ('SELECT 42 empty_result WHERE 1 = 0;\n',
        ('┌──────────────┐\n'
         '│ empty_result │\n'
         '│    int32     │\n'
         '└──────────────┘\n'
         '     0 rows   \n')),
    'footer_numbers': (('.large_number_rendering footer\n'
         'SELECT 59986052 AS count, 123456789 AS count2, 9999999999 count3, -9999999999 count4;\n'),
        ('┌─────────────────┬──────────────────┬─────────────────┬──────────────────┐\n'
         '│      count      │      count2      │     count3      │      count4      │\n'
         '│      int32      │      int32       │      int64      │      int64       │\n'
         '├─────────────────┼──────────────────┼─────────────────┼──────────────────┤\n'
         '│    59986052     │    123456789     │   9999999999    │   -9999999999    │\n'
         '│ (59.99 million) │ (123.46 million) │ (10.00 billion) │ (-10.00 billion) │\n'
         '└─────────────────┴──────────────────┴─────────────────┴──────────────────┘\n')),
    'all_numbers': (('.large_number_rendering all\n'
         'SELECT 59986052 AS a, 1005000 AS b, 994999 AS c, 123456789 AS d FROM range(3);\n'),
        ('┌───────────────┬──────────────┬────────┬────────────────┐\n'
         '│       a       │      b       │   c    │       d        │\n'
         '│     int32     │    int32     │ int32  │     int32      │\n'
         '├───────────────┼──────────────┼────────┼────────────────┤\n'
         '│ 59.99 million │ 1.01 million │ 994999 │ 123.46 million │\n'
         '│ 59.99 million │ 1.01 million │ 994999 │ 123.46 million │\n'
         '│ 59.99 million │ 1.01 million │ 994999 │ 123.46 million │\n'
         '└───────────────┴──────────────┴────────┴────────────────┘\n')),
    'separators': (('.thousand_sep ,\n'
         '.decimal_sep ,\n'
         'SELECT 1234567.891 AS a, 1234567 AS b, [1234567] AS l;\n'),
        ('┌───────────────┬───────────┬───────────┐\n'
         '│       a       │     b     │     l     │\n'
         '│ decimal(10,3) │   int32   │  int32[]  │\n'
         '├───────────────┼───────────┼───────────┤\n'
         '│ 1,234,567,891 │ 1,234,567 │ [1234567] │\n'
         '└───────────────┴───────────┴───────────┘\n')),
    'width_box': (('.mode box\n'
         '.width 5 -6\n'
         'SELECT 100 AS r, 7 AS s;\n'),
        ('┌───────┬────────┐\n'
         '│   r   │   s    │\n'
         '├───────┼────────┤\n'
         '│ 100   │      7 │\n'
         '└───────┴────────┘\n')),
    'describe': (("CREATE TABLE t(a INT PRIMARY KEY, b VARCHAR NOT NULL DEFAULT 'x', c DECIMAL(10, 2) UNIQUE);\n"
         'DESCRIBE t;\n'
         'DESCRIBE SELECT 1 AS x;\n'),
        ('┌────────────────────────────────┐\n'
         '│               t                │\n'
         '│                                │\n'
         '│ a integer not null             │\n'
         "│ b varchar not null default 'x' │\n"
         '│ c decimal unique               │\n'
         '└────────────────────────────────┘\n'
         '┌───────────┐\n'
         '│ Describe  │\n'
         '│           │\n'
         '│ x integer │\n'
         '└───────────┘\n')),
    'tables': (('CREATE SCHEMA s1;\n'
         "ATTACH ':memory:' AS mydb;\n"
         'CREATE TABLE s1.my_tbl(i INTEGER);\n'
         'CREATE TABLE mydb.other_tbl(i INTEGER, j VARCHAR);\n'
         'CREATE TABLE t(a INT);\n'
         'CREATE VIEW v AS SELECT 1 AS one;\n'
         '.tables\n'),
        (' ───────── memory ───────── \n'
         ' ────────── main ────────── \n'
         '┌───────────┐┌─────────────┐\n'
         '│     t     ││      v      │\n'
         '│           ││             │\n'
         '│ a integer ││ one integer │\n'
         '│           │└─────────────┘\n'
         '│  0 rows   │\n'
         '└───────────┘\n'
         ' ─────────── s1 ─────────── \n'
         '┌───────────┐\n'
         '│  my_tbl   │\n'
         '│           │\n'
         '│ i integer │\n'
         '│           │\n'
         '│  0 rows   │\n'
         '└───────────┘\n'
         ' ────────── mydb ────────── \n'
         ' ────────── main ────────── \n'
         '┌───────────┐\n'
         '│ other_tbl │\n'
         '│           │\n'
         '│ i integer │\n'
         '│ j varchar │\n'
         '│           │\n'
         '│  0 rows   │\n'
         '└───────────┘\n')),
    'databases': (("ATTACH ':memory:' AS xx;\n"
         '.databases\n'),
        ('┌─────────────────┐\n'
         '│    databases    │\n'
         '│                 │\n'
         '│ memory (memory) │\n'
         '│ xx     (memory) │\n'
         '└─────────────────┘\n')),
    'schema_indent': (('CREATE TABLE test(a INTEGER, b VARCHAR, c INTEGER, d INTEGER, k INTEGER, PRIMARY KEY(a, b));\n'
         'CREATE VIEW v AS SELECT 42 AS x;\n'
         '.schema\n'
         '.schema --indent\n'),
        ('CREATE TABLE test(a INTEGER, b VARCHAR, c INTEGER, d INTEGER, k INTEGER, PRIMARY KEY(a, b));\n'
         'CREATE VIEW v AS SELECT 42 AS x;\n'
         'CREATE TABLE test(\n'
         '  a INTEGER,\n'
         '  b VARCHAR,\n'
         '  c INTEGER,\n'
         '  d INTEGER,\n'
         '  k INTEGER,\n'
         '  PRIMARY KEY(a, b)\n'
         ');;\n'
         'CREATE VIEW v AS SELECT 42 AS x;;\n')),
    'dump': (('CREATE SCHEMA other;\n'
         'CREATE TABLE other.t(a INT);\n'
         'INSERT INTO other.t VALUES (1);\n'
         'CREATE TABLE b(x BLOB, s VARCHAR, d DATE);\n'
         "INSERT INTO b VALUES ('\\x07\\x08'::BLOB, concat('a', chr(10), 'b'), DATE '2020-01-01');\n"
         'CREATE VIEW v AS SELECT 42 AS x;\n'
         '.dump\n'),
        ('BEGIN TRANSACTION;\n'
         'CREATE SCHEMA IF NOT EXISTS other;;\n'
         'CREATE TABLE b(x BLOB, s VARCHAR, d DATE);;\n'
         "INSERT INTO main.b VALUES('\\x07\\x08',concat('a', chr(10), 'b'),'2020-01-01');\n"
         'CREATE TABLE other.t(a INTEGER);;\n'
         'INSERT INTO other.t VALUES(1);\n'
         'CREATE VIEW v AS SELECT 42 AS x;;\n'
         'COMMIT;\n')),
}


def shell(con, text):
    out, err = io.StringIO(), io.StringIO()
    status = run(con, io.StringIO(text), out, err)
    assert status == 0 and err.getvalue() == "", err.getvalue()
    return out.getvalue()


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.slow   # ~1.2 s: out of the -m 'not slow' inner loop (under a minute)
def test_every_mode_prints_what_duckdbs_cli_prints(con, mode):
    assert shell(con, f".mode {mode}\n{QUERY}") == MODES[mode]


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow   # ~0.9 s: out of the -m 'not slow' inner loop (under a minute)
def test_boxes_numbers_and_catalog_listings_are_the_clis(con, name):
    text, want = CASES[name]
    assert shell(con, text) == want


def test_headers_separators_and_null_text(con):
    out = shell(con, ".mode csv\n.headers off\n.separator XX\n.nullvalue none\nSELECT 42, NULL;\n"
                     ".mode list\n.headers on\nSELECT 'a' AS x, 'b' AS y;\n")
    assert out == "42XXnone\r\nx|y\na|b\n"


def test_insert_mode_quotes_the_table_name_as_duckdb_does(con):
    out = shell(con, ".mode insert MyTab\nSELECT 1 AS a;\n.mode insert name\nSELECT 'x''y' AS \"A b\";\n")
    assert out == "INSERT INTO MyTab(a) VALUES(1);\nINSERT INTO \"name\"(\"A b\") VALUES('x''y');\n"


def test_json_writes_duckdbs_json_of_nested_values_and_infinities(con):
    out = shell(con, ".mode json\nSELECT 'inf'::DOUBLE AS inf, 'nan'::DOUBLE AS nan, {'k': [1, 2]} AS s, "
                     "1::HUGEINT AS h;\n")
    assert out == '[{"inf":Infinity,"nan":NaN,"s":{"k":[1,2]},"h":"1"}]\n'


def test_explain_prints_the_plan_under_its_title(con):
    out = shell(con, "EXPLAIN SELECT 1;\n")
    assert out.startswith("\n┌─────────────────────────────┐\n│┌───────────────────────────┐│\n"
                          "││       Physical Plan       ││\n│└───────────────────────────┘│\n")


def test_highlighted_results_colour_names_types_and_nulls(con):
    out = shell(con, ".highlight_results on\n.highlight_colors column_name red bold\nSELECT NULL::INTEGER AS r;\n")
    assert "\x1b[1m\x1b[31mr\x1b[00m" in out and "\x1b[90mNULL\x1b[00m" in out and "\x1b[90mint32\x1b[00m" in out


def test_tables_schema_and_dump_leave_dbmls_own_objects_out(con):
    out = shell(con, "CREATE TABLE mine(i INT);\n.tables\n.schema\n.dump\n")
    assert "mine" in out and "CREATE TABLE mine(i INTEGER);" in out
    assert "dbml" not in out and "models" not in out and "weights" not in out, out


def test_maxrows_analyze_sizes_columns_by_the_first_rows_and_cuts_later_values(con):
    """``.maxrows -1 1000``: widths come from the rows DuckDB reads first (whole vectors of
    2,048), a longer value after them is cut, as the CLI cuts it."""
    out = shell(con, ".maxrows -1 1000\nSELECT s FROM (SELECT 'x' AS s, i FROM range(3000) t(i) "
                     "UNION ALL SELECT 'a much longer value', 9999) ORDER BY i;\n")
    lines = out.splitlines()
    assert lines[:4] == ["┌─────────┐", "│    s    │", "│ varchar │", "├─────────┤"]
    assert lines[-3:] == ["│ x       │", "│ a much… │", "└─────────┘"] and len(lines) == 3006
