"""Issue 31, trust round 3: the probes' remaining holes (items 9, 10, 17, 19), each re-tried
as the user would."""

from __future__ import annotations

import pytest

import dbml

BQ_OPTS = "OPTIONS(model_type='dnn_classifier', input_label_cols=['y'], hidden_units=[4], max_iterations=1)"


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
@pytest.mark.parametrize("name", ["__in", "__dbml_in", "__DBML_ROW", "a \"q", "ünï"])
def test_a_users_column_is_never_taken_for_dbmls_own(con, name):
    """Item 10: an input column named ``__in`` (the row's struct read from the subquery's alias:
    'Int32Array' object has no attribute 'flatten') or ``__dbml_row`` (two columns of that name)."""
    quoted = '"' + name.replace('"', '""') + '"'
    con.execute(f"CREATE TABLE t AS SELECT range::INT AS {quoted}, (range % 3)::INT AS b, (range % 2)::INT AS y "
                f"FROM range(40)")
    dbml.execute(con, f"CREATE MODEL m {BQ_OPTS} AS SELECT * FROM t").fetchall()
    assert _column(con, "SELECT * FROM ML.PREDICT(MODEL m, TABLE t)", name) == list(range(40))
    assert _column(con, "SELECT * FROM ML.EXPLAIN_PREDICT(MODEL m, TABLE t)", name) == list(range(40))
    assert len(dbml.execute(con, "SELECT * FROM ML.EVALUATE(MODEL m)").fetchall()) == 1   # the held-out rows
    # a TRANSFORM output named like the row's column
    dbml.execute(con, f"CREATE MODEL m2 TRANSFORM(b * 2 AS __dbml_row, b, y) {BQ_OPTS} "
                      f"AS SELECT * FROM t").fetchall()
    assert _column(con, "SELECT * FROM ML.PREDICT(MODEL m2, TABLE t)", name) == list(range(40))


def _column(con, query: str, name: str) -> list:
    result = dbml.execute(con, query)
    at = [d[0] for d in result.description].index(name)
    return [row[at] for row in result.fetchall()]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_class_weights_keep_a_users_columns_named_like_the_counts(con):
    """auto_class_weights counted rows in columns __dbml_n/__dbml_r/__dbml_i and dropped
    whatever held those names (a user's feature, or a binder error)."""
    con.execute("CREATE TABLE t AS SELECT range::INT AS __dbml_n, (range % 5)::INT AS __dbml_r, "
                "(range % 7)::INT AS __dbml_i, (range % 4 = 0)::INT AS y FROM range(80)")
    dbml.execute(con, "CREATE MODEL m OPTIONS(model_type='dnn_classifier', input_label_cols=['y'], hidden_units=[4], "
                      "max_iterations=1, auto_class_weights=true) AS SELECT * FROM t").fetchall()
    assert con.execute("SELECT features FROM dbml_models").fetchall() == [(["__dbml_n", "__dbml_r", "__dbml_i"],)]
    assert len(dbml.execute(con, "SELECT * FROM ML.PREDICT(MODEL m, TABLE t)").fetchall()) == 80


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_an_array_feature_named_like_the_lambdas_parameter(con):
    """An array column named ``__dbml_i`` was read as the lambda's position (a binder error)."""
    con.execute("CREATE TABLE a AS SELECT [range, range + 1]::FLOAT[2] AS __dbml_i, (range % 2)::INT AS y "
                "FROM range(50)")
    con.execute("CREATE TABLE b AS SELECT __dbml_i AS v, y FROM a")
    con.sql("SELECT train('ma', 'a', label := 'y', epochs := 1, seed := 3)").fetchall()
    con.sql("SELECT train('mb', 'b', label := 'y', epochs := 1, seed := 3)").fetchall()
    pa_ = con.sql("SELECT * EXCLUDE (__dbml_i) FROM predictions('ma', 'a')").fetchall()
    pb = con.sql("SELECT * EXCLUDE (v) FROM predictions('mb', 'b')").fetchall()
    assert pa_ == pb and len(pa_) == 50


@pytest.mark.slow   # ~10 s: a transformer trained, then explained twice
def test_explain_keeps_its_integrated_gradients_within_the_budget(con, monkeypatch):
    """Item 17: explain() ran integrated gradients over rows x IG_STEPS points in one pass (an
    ft_transformer over 40 features x 2,048 rows allocated 4.1 GB). Its passes now hold what the
    budget holds (measured on the storages, as the scheduler's meter counts them), and the
    attributions are one pass's."""
    import numpy as np
    from dbml import explain
    from dbml.core import catalog, forward_memory, inference
    from dbml.scheduler.execute.measure import PeakMeter
    cols = ", ".join(f"sin(range * {i + 1})::DOUBLE AS f{i}" for i in range(8))
    con.execute(f"CREATE TABLE t AS SELECT {cols}, (range % 2)::INT AS y FROM range(200)")
    con.sql("SELECT train('m', 't', label := 'y', arch := 'ft_transformer', epochs := 1, seed := 1)").fetchall()
    model = catalog.load(con.duckdb, "m", 1)
    x = np.random.default_rng(0).standard_normal((96, 8)).astype(np.float32)
    budget = 16 * 2**20
    # one pass over every row's points would not fit: the test says something
    assert forward_memory.forward_bytes(model.config, len(x) * explain.IG_STEPS, grad=True) > 4 * budget
    whole = explain.explain_rows(model, x)["attributions"]
    monkeypatch.setattr(inference, "inference_budget", lambda: budget)
    with PeakMeter(device="cpu") as meter:
        chunked = explain.explain_rows(model, x)["attributions"]
    assert meter.peak_bytes <= budget, meter.peak_bytes
    np.testing.assert_allclose(chunked, whole, rtol=1e-4, atol=1e-6)


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_an_export_path_with_a_nul_byte_is_refused_by_name(con, tmp_path):
    """Item 19: a NUL byte in an export path (os.path's raw 'ValueError: embedded null byte')."""
    con.execute("CREATE TABLE t AS SELECT range::DOUBLE AS a, (range % 2)::INT AS y FROM range(50)")
    con.sql("SELECT train('m', 't', label := 'y', epochs := 1)").fetchall()
    message = r"export_model\(\): path '.*a\\x00b.onnx' holds a NUL byte \(chr\(0\)\), .*pass the path without it"
    with pytest.raises(Exception, match=message):
        con.sql("SELECT export_model('m', $p)", params={"p": str(tmp_path / "a\0b.onnx")}).fetchall()
    with pytest.raises(dbml.DbmlError, match=message):
        dbml.export_model(con, "m", str(tmp_path / "a\0b.onnx"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
@pytest.mark.parametrize("ids, shown", [("[9223372036854775807]", "9223372036854775808"),
                                        ("[3, -1]", "-1"), ("['inf'::DOUBLE]", "inf")])
def test_a_token_id_past_the_range_is_an_error_naming_the_input(con, ids, shown):
    """Item 19: predict(tok, [9223372036854775807]) failed in Arrow's cast (ArrowInvalid); a
    negative id gave an answer although train() refuses one."""
    con.execute("CREATE TABLE t AS SELECT [range % 7, range % 5, 3]::BIGINT[] AS ids, (range % 2)::INT AS y "
                "FROM range(60)")
    con.sql("SELECT train('tok', 't', label := 'y', epochs := 1)").fetchall()
    with pytest.raises(Exception, match=r"predict\(\): model 'tok' takes token ids in 0\.\.9007199254740992 "
                                        r"\(predict\(\) passes them as DOUBLE; its vocabulary is 7 training ids up "
                                        rf"to 6, any other id counts as unknown\); the input x holds {shown} "
                                        r"\(as DOUBLE\); pass ids in that range"):
        con.sql(f"SELECT predict('tok', {ids})").fetchall()
    assert len(con.sql("SELECT predict('tok', [3, 100])").fetchall()) == 1


@pytest.mark.slow   # ~5 s: the shell in a subprocess, as a pipe feeds it
def test_the_shell_reports_a_byte_that_is_not_utf8_and_goes_on():
    """Item 19: one invalid UTF-8 byte piped into the shell gave a TypeError traceback and
    the rest of the input was not run. Its statement fails, as DuckDB's parser refuses it, and
    the next runs (whatever the locale's error handler for stdin)."""
    import subprocess
    import sys
    script = b"SELECT 1 AS one;\nSELECT '\xff' AS x;\nSELECT 2 AS two;\n"
    for env in ({}, {"PYTHONIOENCODING": "utf-8:strict"}):
        import os
        r = subprocess.run([sys.executable, "-m", "dbml", "shell"], input=script, capture_output=True, timeout=120,
                           env={**os.environ, **env})
        err = r.stderr.decode("utf-8", "replace")
        assert "Traceback" not in err, err
        assert "Error: the statement holds the byte 0xff, which is not UTF-8" in err, err
        out = r.stdout.decode()
        assert "one" in out and "two" in out and r.returncode == 1, (out, err)


def test_sql_text_with_characters_past_ascii_splits_where_duckdb_does():
    """DuckDB's tokenizer counts UTF-8 bytes: a statement after 'é' was read as unterminated."""
    from dbml.core import sqltext
    assert sqltext.split_statements("SELECT 'é'; SELECT 'ü;x'; SELECT 2") == ["SELECT 'é'", "SELECT 'ü;x'", "SELECT 2"]
    assert sqltext.ending("SELECT 'é';") == "end"
    assert sqltext.split_statements("SELECT '\udcff'; SELECT 2") == ["SELECT '\udcff'", "SELECT 2"]


def test_a_huge_duckdb_expression_gets_duckdbs_answer_without_a_second_reading(con, monkeypatch):
    """Item 17: a 3 MB one-line expression cost 2.9 GB in the shell before DuckDB's depth error:
    the text DuckDB refused was split and tokenized again (sqlglot's tokens) to look for
    BigQuery, although it has nothing BigQuery's markers need."""
    import io
    from dbml.core import sqltext
    from dbml.shell import session

    def refuse(*args, **kwargs):
        raise AssertionError("DuckDB's text was read again")
    monkeypatch.setattr(sqltext, "split_statements", refuse)
    monkeypatch.setattr(sqltext, "_bigquery_code", refuse)
    out, err = io.StringIO(), io.StringIO()
    text = "SELECT " + "+".join(["1"] * 20000) + ";\nSELECT 42 AS after;\n"
    status = session.Shell(con, out=out, err=err).process(session.read_lines(io.StringIO(text)))
    assert status == 1 and "Max expression depth limit of 1000 exceeded" in err.getvalue(), err.getvalue()
    assert "42" in out.getvalue()


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray cluster of two CPUs, as tests/test_cluster.py starts it (or the one running)."""
    ray = pytest.importorskip("ray", reason="Ray is an extra: pip install 'dbml[ray]'")
    pytest.importorskip("ray.train.torch")
    from dbml.cluster import placement
    started = not ray.is_initialized()
    if started:
        # address="local": a cluster of the session's own, never one another process left
        # (/tmp/ray/ray_current_cluster names the last one started on the machine, even a dead one)
        ray.init(address="local", num_cpus=2, object_store_memory=200 * 1024**2, include_dashboard=False)
    yield ray
    if started:
        placement.disconnect()
        ray.shutdown()


@pytest.fixture
def ray_con(ray_local):
    con = dbml.connect(latency_model="roofline", progress="off", cluster="ray")
    con.execute("CREATE TABLE t AS SELECT range::DOUBLE AS a, (range % 2)::INT AS y FROM range(200)")
    yield con
    con.close()


@pytest.mark.slow   # a local Ray cluster (two CPUs)
def test_a_data_parallel_job_larger_than_the_cluster_fails_with_the_reason(ray_con):
    """Items 9 and 17: workers := 3 on a cluster of 2 CPUs stayed 'queued' for ever with no
    word; it fails at once saying what it asked and what the cluster has."""
    with pytest.raises(Exception, match=r"train\(\): workers := 3 needs 3 CPU slots on the Ray cluster \(one per "
                                        r"worker\), and the cluster has 2 CPU in all; the job can never be placed: "
                                        r"pass workers := 2 or fewer"):
        ray_con.sql("SELECT train('m', 't', label := 'y', epochs := 1, workers := 3, policy := 'eager')").fetchall()
    assert ray_con.sql("SELECT status FROM dbml_jobs").fetchall() == [("failed",)]


@pytest.mark.slow   # a local Ray cluster (two CPUs)
def test_cancel_job_cancels_a_job_queued_for_a_device(ray_local, ray_con):
    """Item 17: cancel_job of a job queued for a device changed nothing (the wait for its
    worker to start did not look at the cancel): it ends cancelled, its worker not left queued."""
    from helpers import wait_until

    @ray_local.remote(num_cpus=1)
    class Hold:
        def ping(self):
            return 1
    from dbml.cluster import placement
    placement.disconnect()   # idle device workers of earlier tests keep their CPU slots for IDLE_S
    holders = [Hold.remote() for _ in range(2)]   # every CPU of the cluster taken
    try:
        ray_local.get([h.ping.remote() for h in holders], timeout=120)
        job = ray_con.sql("SELECT train('m', 't', label := 'y', epochs := 1, wait := false)").fetchall()[0][0]["job_id"]
        row = "SELECT status, queued_for FROM dbml_jobs WHERE job_id = $id"
        wait_until(lambda: ray_con.sql(row, params={"id": job}).fetchall() == [("queued", "a device")], timeout=60,
                   what="the job queued for a device")
        ray_con.sql("SELECT cancel_job($id)", params={"id": job}).fetchall()
        wait_until(lambda: ray_con.sql(row, params={"id": job}).fetchall()[0][0] == "cancelled", timeout=30,
                   what="the queued job cancelled")
        assert ray_con.sql("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]
    finally:
        for h in holders:
            ray_local.kill(h)
