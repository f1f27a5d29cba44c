"""train(), predict(), evaluate() and the catalog, end to end through SQL."""

import dataclasses
import json

import duckdb
import numpy as np
import pyarrow as pa
import pytest
import torch

import dbml
from dbml.core.spec import TrainSpec

from helpers import job_of, linear, load, moons

TRAIN_MOONS = "SELECT x1, x2, label FROM moons WHERE split = ''train''"
TEST_MOONS = "SELECT * FROM moons WHERE split = ''test''"
# For tests of the catalog, not of learning: 10 full batches, one epoch (one graph to capture).
TINY = "'SELECT x1, x2, label FROM moons LIMIT 640', label := 'label', epochs := 1, validation := 0"


def train(con, sql_args: str) -> dict:
    """The job's result and its row of dbml_jobs (best_epoch, estimated_seconds, the memory figures)."""
    return job_of(con, con.sql(f"SELECT train({sql_args})").fetchall()[0][0])


@pytest.mark.slow   # trains to a quality bar: many epochs
def test_mlp_learns_two_moons(moons_con):
    r = train(moons_con, f"'moons_mlp', '{TRAIN_MOONS}', label := 'label', epochs := 15")
    assert r["status"] == "finished" and r["version"] == 1 and r["model"] == "moons_mlp"
    assert r["rows"] + 0 > 2048  # more than one DuckDB vector, many batches of 64
    # Adam keeps parameters, gradients and two moments alive: at least 4x the parameters
    param_bytes = 4 * (2 * 64 + 64 + 64 * 64 + 64 + 64 * 2 + 2)
    assert 4 * param_bytes < r["measured_peak_bytes"] < 40 * param_bytes
    metrics = moons_con.sql(f"SELECT evaluate('moons_mlp', '{TEST_MOONS}')").fetchall()[0][0]
    assert metrics["accuracy"] >= 0.95, metrics
    assert metrics["macro_f1"] >= 0.95 and metrics["log_loss"] < 0.2
    acc = moons_con.sql("SELECT avg((predict('moons_mlp', [x1, x2]) = label)::INT) FROM moons "
                        "WHERE split = 'test'").fetchall()[0][0]
    assert acc == pytest.approx(metrics["accuracy"])


@pytest.mark.slow   # trains to a quality bar: many epochs
def test_linear_regression_reaches_r2(con):
    load(con, "lin", linear(4000))
    r = train(con, "'lin', 'SELECT a, b, c, y FROM lin WHERE split = ''train''', label := 'y', "
                   "arch := 'linear', epochs := 10")
    assert r["val_metric"] >= 0.99
    m = con.sql("SELECT evaluate('lin', 'SELECT * FROM lin WHERE split = ''test''')").fetchall()[0][0]
    assert m["r2"] >= 0.99 and m["rmse"] < 0.1 and m["accuracy"] is None
    # predictions come back on the label's own scale
    got = con.sql("SELECT predict('lin', [a, b, c]) AS p, y FROM lin LIMIT 50").fetchnumpy()
    assert np.abs(got["p"] - got["y"]).max() < 0.5


@pytest.mark.slow   # trains to a quality bar: many epochs
def test_categorical_features_and_nulls(con):
    rng = np.random.default_rng(1)
    n = 3000
    color = rng.choice(["red", "green", "blue"], n)
    x = rng.normal(size=n)
    label = np.where(color == "red", x > 0, x < 0)     # learnable only with the colour
    x_with_nulls = pa.array(np.where(rng.uniform(size=n) < 0.05, np.nan, x), from_pandas=True)
    color_with_nulls = pa.array([None if i % 37 == 0 else c for i, c in enumerate(color)])
    load(con, "t", pa.table({"x": x_with_nulls, "color": color_with_nulls, "flag": rng.uniform(size=n) < 0.5,
                             "label": label}))
    r = train(con, "'cat', 't', label := 'label', epochs := 15")
    assert r["val_metric"] > 0.85
    prep = json.loads(con.sql("SELECT preprocessing FROM dbml_models WHERE name = 'cat'").fetchall()[0][0])
    assert [f["kind"] for f in prep["features"]] == ["numeric", "categorical", "categorical"]
    assert prep["features"][1]["categories"] == ["blue", "green", "red"]
    assert prep["classes"] == [False, True]
    rows = con.sql("SELECT prediction, label FROM predictions('cat', 't')").fetchall()
    assert len(rows) == n and all(isinstance(p, bool) for p, _ in rows)
    assert np.mean([p == l for p, l in rows]) > 0.85
    # a row whose features are all NULL still gets a prediction (NULL -> mean / all-zero one-hot)
    assert con.sql("SELECT count(prediction) FROM predictions('cat', "
                   "'SELECT NULL::DOUBLE AS x, NULL AS color, NULL::BOOLEAN AS flag')").fetchall() == [(1,)]


@pytest.mark.slow   # trains to a quality bar: many epochs
def test_text_labels_predict_label_and_proba(con):
    tbl = moons(2000)
    names = np.where(tbl["label"].to_numpy() == 1, "upper", "lower")
    load(con, "m", tbl.set_column(2, "label", pa.array(names)))
    r = train(con, "'moons_txt', 'SELECT x1, x2, label FROM m', label := 'label', epochs := 10")
    assert r["val_metric"] > 0.9
    out = con.sql("SELECT predict_label('moons_txt', [x1, x2]) AS l, predict_proba('moons_txt', [x1, x2]) AS p, "
                  "label FROM m").fetchall()
    assert np.mean([l == y for l, _, y in out]) > 0.9
    # each class by its label, as predict_label names it
    assert all(set(p) == {"lower", "upper"} and abs(sum(p.values()) - 1) < 1e-6 for _, p, _ in out)
    with pytest.raises(duckdb.Error, match=r"predict\(\): model 'moons_txt' predicts text labels; use predict_label"):
        con.sql("SELECT predict('moons_txt', [x1, x2]) FROM m").fetchall()


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_training_is_deterministic_for_a_seed_and_versions_increment(moons_con):
    src = "SELECT x1, x2, label FROM moons LIMIT 640"   # 10 full batches: one graph to capture
    args = "label := 'label', epochs := 2, validation := 0"
    a = train(moons_con, f"'m', '{src}', {args}, seed := 7")
    b = train(moons_con, f"'m', '{src}', {args}, seed := 7")
    c = train(moons_con, f"'m', '{src}', {args}, seed := 8")
    assert (a["version"], b["version"], c["version"]) == (1, 2, 3)
    w = dict(moons_con.sql("SELECT version, weights FROM dbml_weights WHERE name = 'm'").fetchall())
    assert w[1] == w[2] and w[1] != w[3]
    assert a["final_loss"] == b["final_loss"]


def test_shuffle_windows_emit_every_row_once_in_a_seeded_order():
    from dbml.core.data import shuffle_windows
    batches = [(torch.arange(i, min(i + 100, 1050)),) for i in range(0, 1050, 100)]

    def run(seed, window=300):
        out = list(shuffle_windows(iter(batches), 64, window, np.random.default_rng(seed)))
        return out, torch.cat([b[0] for b in out])

    out, rows = run(1)
    assert sorted(rows.tolist()) == list(range(1050))            # every row exactly once
    assert [len(b[0]) for b in out[:-1]] == [64] * (len(out) - 1)  # full batches but the last
    assert torch.equal(rows, run(1)[1]) and not torch.equal(rows, run(2)[1])
    assert not torch.equal(rows, torch.arange(1050))


def test_epochs_see_different_batches_and_the_same_ones_for_a_seed(con):
    """Two epochs stream different orders; a rerun with the same seed repeats them exactly."""
    from dbml.core.data import BatchStream
    load(con, "t", moons(3000))
    def epoch(start, seed):
        sql = [f"SELECT x1, x2 FROM t WHERE rowid >= {start}", f"SELECT x1, x2 FROM t WHERE rowid < {start}"]
        return torch.cat([x for x, _ in BatchStream(con, sql, 64, shuffle=seed, window_rows=512)])
    a, b, again = epoch(100, 5), epoch(2000, 6), epoch(100, 5)
    assert torch.equal(a, again) and not torch.equal(a, b)
    assert sorted(a.tolist()) == sorted(b.tolist())               # the same rows, another order


@pytest.mark.slow   # ~0.8 s: out of the -m 'not slow' inner loop (under a minute)
def test_sql_defaults_equal_trainspec_defaults(moons_con):
    """Every TrainSpec field a SQL call leaves out (argument or setting) is stored as TrainSpec's
    default; lr and validation left NULL are stored as what the job chose (the arch family's lr,
    a validation share for the rows)."""
    from dbml.core.spec import JobSettings, default_lr, default_validation, stored_key
    train(moons_con, "'d', 'SELECT x1, x2, label FROM moons LIMIT 300', label := 'label', epochs := 1")
    params = json.loads(moons_con.sql("SELECT params FROM dbml_models WHERE name = 'd'").fetchall()[0][0])
    given = {"label": "label", "epochs": 1, "latency_model": "roofline",   # the last one by the fixture
             "lr": default_lr("mlp", "adam"), "validation": default_validation(300)}
    defaults = {f.name: f.default for f in dataclasses.fields(TrainSpec) if f.name not in ("model", "source", "settings")}
    defaults |= {stored_key(f.name): f.default for f in dataclasses.fields(JobSettings)}
    bucket = params.pop("held_out_bucket")   # the split's exact bucket (issue 31), beside the parameters
    assert isinstance(bucket, int) and 0 < bucket < 1_000_000
    assert params.pop("source") == "SELECT x1, x2, label FROM moons LIMIT 300"   # what BigQuery ML's functions read
    assert params == {k: given.get(k, v) for k, v in defaults.items()}


def test_trainspec_fields_are_train_params_then_settings():
    """TrainSpec has one field per train() parameter (but wait and on_error), then its settings, a
    JobSettings with one field per setting, named as the setting; all with their defaults."""
    from dbml.core.settings import SETTINGS
    from dbml.core.spec import TRAIN_PARAMS, JobSettings
    want = [(p.name, dataclasses.MISSING if p.required else p.default) for p in TRAIN_PARAMS if p.in_spec]
    got = [(f.name, f.default) for f in dataclasses.fields(TrainSpec)]
    assert got[:-1] == want and got[-1][0] == "settings"
    assert [(f.name, f.default) for f in dataclasses.fields(JobSettings)] == [(s.name, s.default) for s in SETTINGS]
    assert TrainSpec(model="m", source="t").settings == JobSettings()


def test_null_settings_take_their_defaults(con):
    """A setting set to NULL (or unset by RESET VARIABLE) reaches the job as its default."""
    from dbml.core.settings import SETTINGS
    from dbml.core.spec import stored_key
    load(con, "t", moons(300))
    for s in SETTINGS:
        con.execute(f"RESET VARIABLE dbml_{s.name}")
    train(con, "'n', 't', label := 'label', epochs := 1, policy := 'eager'")   # eager: no predictor to calibrate
    params = json.loads(con.sql("SELECT params FROM dbml_models WHERE name = 'n'").fetchall()[0][0])
    assert {s.name: params[stored_key(s.name)] for s in SETTINGS} \
        == {s.name: s.default for s in SETTINGS}


@pytest.mark.slow   # trains to a quality bar: many epochs
def test_optimizers_and_hidden_sizes(moons_con):
    for opt in ("sgd", "adam", "adamw"):
        r = train(moons_con, f"'o_{opt}', '{TRAIN_MOONS}', label := 'label', optimizer := '{opt}', "
                             f"hidden := [16, 8], epochs := 8, lr := 0.05")
        assert r["val_metric"] > 0.8, opt
    cfg = json.loads(moons_con.sql("SELECT config FROM dbml_models WHERE name = 'o_sgd'").fetchall()[0][0])
    assert cfg["options"]["hidden"] == [16, 8] and cfg["arch"] == "mlp"


@pytest.mark.slow   # three jobs; test_jobs covers concurrent jobs in the fast loop
def test_one_statement_trains_several_models(moons_con):
    rows = moons_con.sql("SELECT train(name, 'SELECT x1, x2, label FROM moons LIMIT 640', label := 'label', "
                         "lr := lr, epochs := 2, validation := 0) "
                         "FROM (VALUES ('slow', 0.01), ('mid', 0.05), ('fast', 0.1)) v(name, lr)").fetchall()
    assert sorted(r[0]["model"] for r in rows) == ["fast", "mid", "slow"]
    assert moons_con.sql("SELECT count(*) FROM dbml_models").fetchall() == [(3,)]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_second_connection_to_the_same_file_predicts(tmp_path):
    path = str(tmp_path / "shared.duckdb")
    first = dbml.connect(path, latency_model="roofline")
    load(first, "moons", moons(640))
    train(first, "'shared', 'SELECT x1, x2, label FROM moons', label := 'label', epochs := 1, validation := 0")
    expected = first.sql("SELECT predict('shared', [x1, x2]) FROM moons ORDER BY ALL").fetchall()
    second = dbml.connect(path, latency_model="roofline")
    assert second.sql("SELECT predict('shared', [x1, x2]) FROM moons ORDER BY ALL").fetchall() == expected
    first.close(), second.close()
    reopened = dbml.connect(path, latency_model="roofline")
    assert reopened.sql("SELECT name, version FROM dbml_models").fetchall() == [("shared", 1)]
    assert reopened.sql("SELECT predict('shared', [x1, x2]) FROM moons ORDER BY ALL").fetchall() == expected
    reopened.close()


@pytest.mark.slow   # ~1.1 s: out of the -m 'not slow' inner loop (under a minute)
def test_drop_model_removes_weights_and_catalog_rows(moons_con):
    train(moons_con, f"'gone', {TINY}")
    train(moons_con, f"'gone', {TINY}")
    train(moons_con, f"'kept', {TINY}")
    assert moons_con.sql("SELECT drop_model('gone')").fetchall() == [(2,)]
    assert moons_con.sql("SELECT DISTINCT name FROM dbml_models").fetchall() == [("kept",)]
    assert moons_con.sql("SELECT DISTINCT name FROM dbml_weights").fetchall() == [("kept",)]
    with pytest.raises(duckdb.Error, match=r"predict\(\): no model named 'gone'"):
        moons_con.sql("SELECT predict('gone', [x1, x2]) FROM moons").fetchall()


def test_install_is_idempotent_and_keeps_models(moons_con):
    train(moons_con, f"'keep', {TINY}")
    dbml.install(moons_con)
    dbml.install(moons_con)
    assert moons_con.sql("SELECT count(*) FROM dbml_models").fetchall() == [(1,)]
    assert moons_con.sql("SELECT predict('keep', [0.0, 0.0])").fetchall()[0][0] in (0.0, 1.0)


def test_weights_load_without_pickle(moons_con):
    """Stored weights are plain tensors: torch.load with weights_only=True reads them."""
    import io
    train(moons_con, f"'w', {TINY}")
    blob = moons_con.sql("SELECT weights FROM dbml_weights WHERE name = 'w'").fetchall()[0][0]
    state = torch.load(io.BytesIO(blob), weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in state.values())


def test_stored_weights_are_torch_saves_bytes_written_in_place():
    """catalog.weights_blob sizes torch.save's output, then writes it into one buffer: the
    bytes are torch.save's own, whatever the model (a parameter larger than any write)."""
    import io
    from dbml.core import catalog
    for module in (torch.nn.Linear(3, 2), torch.nn.Sequential(torch.nn.Linear(1000, 700), torch.nn.BatchNorm1d(700))):
        plain = io.BytesIO()
        torch.save({k: v.detach().contiguous() for k, v in module.state_dict().items()}, plain)
        assert bytes(catalog.weights_blob(module)) == plain.getvalue()


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_closing_the_installing_connection_leaves_others_working(tmp_path):
    path = str(tmp_path / "two.duckdb")
    first, second = dbml.connect(path, latency_model="roofline"), dbml.connect(path, latency_model="roofline")
    load(first, "moons", moons(600))
    first.close()
    r = second.sql("SELECT train('after_close', 'SELECT x1, x2, label FROM moons', label := 'label', epochs := 1)").fetchall()[0][0]
    assert r["version"] == 1
    assert len(second.sql("SELECT predict('after_close', [x1, x2]) FROM moons").fetchall()) == 600
    second.close()
