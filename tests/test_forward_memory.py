"""Issue 22 part 8: inference within the budget. The forward pass's memory is planned on
the meta device (no compute) and equals what eager no_grad holds; predict runs a large
batch in chunks that fit instead of holding it whole."""

from __future__ import annotations

import pytest
import torch

from dbml.core.forward_memory import forward_bytes, rows_within
from dbml.core.models import ModelConfig, build
from dbml.scheduler.execute.measure import PeakMeter, live_tensors
from dbml.zoo import Inputs


def _cfg() -> ModelConfig:
    from dbml.core.models import config
    return config("cnn", Inputs("image", shape=(3, 32, 32)), 10, {"width": 16})


def test_the_meta_forward_holds_what_eager_no_grad_holds():
    cfg = _cfg()
    torch.manual_seed(0)
    module = build(cfg).eval()
    for rows in (1, 37):
        x = cfg.inputs.sample(rows)
        with PeakMeter(live_tensors(module, None, x)) as meter, torch.no_grad():
            module(x)
        # never below what eager holds; above by a few bytes of scalars the meta kernels keep
        assert 0 <= forward_bytes(cfg, rows) - meter.peak_bytes <= 1024


def test_rows_within_a_budget_keep_it_and_one_row_too_many_does_not():
    cfg = _cfg()
    budget = forward_bytes(cfg, 100)
    rows = rows_within(cfg, budget)
    assert forward_bytes(cfg, rows) <= budget and rows >= 99
    from dbml.errors import InvalidArgument
    with pytest.raises(InvalidArgument, match=r"predict\(\): the model needs .* MB \([0-9]+ bytes\) for its weights, one "
                                              r"row and the outputs of the rows DuckDB passed at once, over the memory "
                                              r"budget of .* MB \([0-9]+ bytes\); SET VARIABLE dbml_memory_budget = "
                                              r"'[0-9.]+[KM]B' or more") as info:
        rows_within(cfg, forward_bytes(cfg, 1) - 1)
    assert "'0MB'" not in str(info.value) and "'0KB'" not in str(info.value)


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_a_vector_of_rows_is_chunked_to_what_the_budget_holds(con, monkeypatch):
    """Issue 31, item 1: predict() over 4,000 rows (DuckDB passes 2,048 at once) under a
    budget that holds the model, one row and every row's outputs, but not every row's
    encoded input beside them: the vector runs in chunks instead of failing."""
    from dbml.core import inference
    con.execute("CREATE TABLE d AS SELECT (x % 97) / 97.0 AS a, (x % 89) / 89.0 AS b, (x % 83) / 83.0 AS c, "
                "(x % 2)::INT AS y FROM range(4000) t(x)")
    con.execute("SELECT train('m', 'SELECT a, b, c, y FROM d', label := 'y', arch := 'mlp', epochs := 1, "
                "batch_size := 64, policy := 'eager')").fetchall()
    want = con.sql("SELECT sum(predict('m', [a, b, c])) FROM d").fetchall()[0][0]
    from dbml.core.catalog import identify, load
    cur = con.cursor()
    version, uid = identify(cur, "m", None, fn="predict")
    cfg = load(cur, "m", version, uid).config
    vector = 2048
    budget = forward_bytes(cfg, 1) + vector * cfg.outputs * 4 + 16 * (forward_bytes(cfg, 2) - forward_bytes(cfg, 1))
    assert budget < forward_bytes(cfg, 1) + vector * (3 + cfg.outputs) * 4   # the whole vector's input does not fit
    monkeypatch.setattr(inference, "inference_budget", lambda: budget)
    got = con.sql("SELECT sum(predict('m', [a, b, c])) FROM d").fetchall()[0][0]
    assert got == pytest.approx(want)


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_predict_on_a_large_batch_runs_in_chunks_within_the_budget(con, monkeypatch):
    import numpy as np
    from dbml.core import inference
    con.execute("CREATE TABLE img AS SELECT list_transform(range(192), lambda i: ((i * x) % 7)::FLOAT)::FLOAT[192] "
                "AS p, (x % 3)::INTEGER AS y FROM range(300) t(x)")
    con.execute("SELECT train('c', 'img', label := 'y', shape := [3, 8, 8], arch := 'cnn', epochs := 1, "
                "policy := 'eager')")
    whole = con.execute("SELECT prediction FROM predictions('c', 'img')").fetchall()
    model = inference.ModelCache(con.duckdb.cursor).get("c", fn="test")
    small = forward_bytes(model.config, 40)
    monkeypatch.setattr(inference, "inference_budget", lambda: small)
    calls = []
    original = model.module.forward
    monkeypatch.setattr(model.module, "forward", lambda x: calls.append(len(x)) or original(x))
    out = inference.forward(model, torch.from_numpy(np.zeros((300, 3, 8, 8), np.float32)))
    assert len(out) == 300 and max(calls) <= rows_within(model.config, small) and len(calls) > 1
    assert con.execute("SELECT prediction FROM predictions('c', 'img')").fetchall() == whole
