"""Bad SQL input: a DuckDB error naming the argument and the fix, and nothing changed."""

import duckdb
import pytest

from helpers import linear, load, moons


@pytest.fixture
def db(con):
    load(con, "moons", moons(400))
    load(con, "lin", linear(400))
    con.sql("SELECT train('existing', 'SELECT x1, x2, label FROM moons', label := 'label', epochs := 1)").fetchall()
    return con


def state(con):
    """Everything a failed call must leave alone."""
    return (con.sql("SELECT name, version, bytes FROM dbml_models ORDER BY ALL").fetchall(),
            con.sql("SELECT name, version FROM dbml_weights ORDER BY ALL").fetchall(),
            con.sql("SELECT table_name FROM duckdb_tables() ORDER BY ALL").fetchall(),
            con.sql("SELECT count(*) FROM moons").fetchall())


def fails(con, sql: str, match: str) -> None:
    before = state(con)
    with pytest.raises(duckdb.Error, match=match):
        con.sql(sql).fetchall()
    assert state(con) == before


@pytest.mark.slow   # ~0.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_unknown_table(db):
    fails(db, "SELECT train('m', 'no_such_table', label := 'label')",
          r"train\(\): source refers to something that does not exist: .*no_such_table.*; check the table name")


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_unknown_feature_column(db):
    fails(db, "SELECT train('m', 'moons', label := 'label', features := ['x1', 'x3'])",
          r"train\(\): source has no column 'x3'; pass features := \['<column>', \.\.\.\] with columns from: x1, x2, label, split")


def test_missing_label(db):
    fails(db, "SELECT train('m', 'moons')",
          r"train\(\): label is missing; pass label := '<column>'")


def test_unknown_label(db):
    fails(db, "SELECT train('m', 'moons', label := 'lable')",
          r"train\(\): source has no column 'lable' \(did you mean 'label'\?\); pass label := '<column>'")


def test_label_with_one_class(db):
    fails(db, "SELECT train('m', 'SELECT x1, x2, label FROM moons WHERE label = 1', label := 'label', "
              "task := 'classification')",
          r"train\(\): label 'label' has only one class \(1\) in the source; pass a source with at least two")


@pytest.mark.slow   # ~0.9 s: out of the -m 'not slow' inner loop (under a minute)
def test_empty_source(db):
    fails(db, "SELECT train('m', 'SELECT x1, x2, label FROM moons WHERE false', label := 'label')",
          r"train\(\): source has no rows with a non-NULL label 'label'")
    fails(db, "SELECT train('m', '   ', label := 'label')",
          r"train\(\): source is empty; pass a table name or one SELECT statement")


@pytest.mark.slow   # ~0.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_source_that_is_not_one_select(db):
    fails(db, "SELECT train('m', 'moons; DROP TABLE moons', label := 'label')",
          r"train\(\): source holds 2 statements; pass a table name or exactly one SELECT")
    fails(db, "SELECT train('m', 'DROP TABLE moons', label := 'label')",
          r"train\(\): source must be a table name or one SELECT statement, not DROP")
    fails(db, "SELECT train('m', 'INSERT INTO moons SELECT * FROM moons', label := 'label')",
          r"train\(\): source must be a table name or one SELECT statement, not INSERT")
    fails(db, "SELECT train('m', 'SELEC x FROM', label := 'label')",
          r"train\(\): source is not valid SQL")


def test_unknown_arch(db):
    fails(db, "SELECT train('m', 'moons', label := 'label', arch := 'transfomer')",
          r"train\(\): unknown arch 'transfomer' \(did you mean 'transformer'\?\); pass arch := one of 'auto', "
          r"'linear', 'mlp', .*, or register your own with dbml.register_model\(name, factory\)")


def test_arch_for_another_input_kind(db):
    fails(db, "SELECT train('m', 'moons', label := 'label', arch := 'transformer')",
          r"train\(\): arch 'transformer' takes tokens or series inputs; the source gives tabular columns; "
          r"pass arch := 'auto' or one of 'linear', 'mlp', 'resnet_tabular', 'ft_transformer'")


def test_bad_options(db):
    fails(db, "SELECT train('m', 'moons', label := 'label', options := 'width=3')",
          r"train\(\): options must be a JSON object")
    fails(db, "SELECT train('m', 'moons', label := 'label', arch := 'resnet_tabular', options := '{\"widht\": 8}')",
          r"train\(\): unknown option 'widht' \(did you mean 'width'\?\) for arch 'resnet_tabular'")


def test_unknown_optimizer(db):
    fails(db, "SELECT train('m', 'moons', label := 'label', optimizer := 'lbfgs')",
          r"train\(\): unknown optimizer 'lbfgs'; pass optimizer := one of 'sgd', 'adam', 'adamw'")


@pytest.mark.parametrize("value", [0, -3])
def test_epochs_not_positive(db, value):
    fails(db, f"SELECT train('m', 'moons', label := 'label', epochs := {value})",
          rf"train\(\): epochs must be a positive integer, got {value}; pass e.g. epochs := 10")


@pytest.mark.parametrize("value", [0, -1])
@pytest.mark.slow   # ~0.8 s: out of the -m 'not slow' inner loop (under a minute)
def test_batch_size_not_positive(db, value):
    fails(db, f"SELECT train('m', 'moons', label := 'label', batch_size := {value})",
          rf"train\(\): batch_size must be a positive integer, got {value}; pass e.g. batch_size := 64")


def test_predict_unknown_model(db):
    fails(db, "SELECT predict('nope', [x1, x2]) FROM moons",
          r"predict\(\): no model named 'nope'; train it first with train\('nope', \.\.\.\)")


def test_evaluate_unknown_model(db):
    fails(db, "SELECT evaluate('nope', 'moons')",
          r"evaluate\(\): no model named 'nope'; train it first")


def test_predictions_unknown_model(db):
    fails(db, "SELECT * FROM predictions('nope', 'moons')", r"predictions\(\): no model named 'nope'")


@pytest.mark.slow   # ~0.9 s: out of the -m 'not slow' inner loop (under a minute)
def test_predict_wrong_number_of_features(db):
    fails(db, "SELECT predict('existing', [x1]) FROM moons",
          r"predict\(\): model 'existing' takes 2 features \(x1, x2\), got a list of 1; pass \[x1, x2\] in that order")


def test_evaluate_on_source_without_label(db):
    fails(db, "SELECT evaluate('existing', 'SELECT x1, x2 FROM moons')",
          r"evaluate\(\): source has no column 'label', the label of model 'existing'; include it in the SELECT")


def test_predictions_on_source_without_a_feature(db):
    fails(db, "SELECT * FROM predictions('existing', 'SELECT x1 FROM moons')",
          r"predictions\(\): source has no column 'x2'; include it in the SELECT")


def test_lr_not_positive_and_validation_out_of_range(db):
    fails(db, "SELECT train('m', 'moons', label := 'label', lr := 0)",
          r"train\(\): lr must be a positive number up to 1e\+06, got 0.0; pass e.g. lr := 0.01")
    fails(db, "SELECT train('m', 'moons', label := 'label', validation := 1.5)",
          r"train\(\): validation must be a fraction in \[0, 1\), got 1.5")


def test_unusable_feature_type(db):
    db.execute("CREATE TABLE dated AS SELECT x1, label, DATE '2024-01-01' + (x1 * 10)::INT AS day FROM moons")
    fails(db, "SELECT train('m', 'dated', label := 'label')",
          r"train\(\): feature column 'day' has type DATE, which dbml cannot use; cast it in the SELECT "
          r"or leave it out with features := \[\.\.\.\]")


def test_diverging_training_stores_nothing(db):
    fails(db, "SELECT train('boom', 'SELECT a, b, c, y FROM lin', label := 'y', optimizer := 'sgd', "
              "lr := 1e5, arch := 'linear')",
          r"train\(\): loss became (nan|inf) in epoch 1; nothing was stored; pass a smaller lr :=")


def test_drop_unknown_model(db):
    """No advice to train what was to be dropped: there is no such model, and where to look."""
    fails(db, "SELECT drop_model('nope')", r"drop_model\(\): there is no model named 'nope' to drop; nothing was "
                                           r"dropped\. SELECT name FROM dbml_models lists the models \(1 now\)$")
    fails(db, "SELECT drop_model('existin')", r"drop_model\(\): there is no model named 'existin' to drop \(did you "
                                              r"mean 'existing'\?\)")


def test_unknown_setting(con):
    import dbml
    with pytest.raises(dbml.InvalidArgument, match=r"dbml.connect\(\): unknown setting 'budget'; known settings:"):
        dbml.connect(budget=5)
