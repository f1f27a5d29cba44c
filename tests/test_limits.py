"""Issue 21, memory and hangs before any check: images (formats, pixels, sizes), the reach of
dbml's internal image decoder, model options and token ids are bounded before anything large
is allocated or decoded, each with an error naming the argument. Each test failed on 360a75c."""

from __future__ import annotations

import io
import json
import time

import duckdb
import numpy as np
import pytest
from PIL import EpsImagePlugin, Image


def _png(a: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(a).save(out, format="PNG")
    return out.getvalue()


def _images(con, name: str, blobs: list[bytes]) -> None:
    con.execute(f"CREATE TABLE {name} (img BLOB, y INTEGER)")
    con.executemany(f"INSERT INTO {name} VALUES (?, ?)", [(b, i % 2) for i, b in enumerate(blobs)])


def _models(con) -> int:
    return con.execute("SELECT count(*) FROM dbml_models").fetchall()[0][0]


def test_a_16_bit_png_is_scaled_not_clipped(con):
    rng = np.random.default_rng(0)
    _images(con, "wide", [_png((rng.random((8, 8)) * 65535).astype(np.uint16)) for _ in range(20)])
    con.execute("SELECT train('p', 'wide', label := 'y', epochs := 1, arch := 'cnn', policy := 'eager')")
    mean, std = con.execute("SELECT preprocessing->'input'->'mean'->>0, preprocessing->'input'->'std'->>0 "
                            "FROM dbml_models").fetchall()[0]
    assert float(mean) == pytest.approx(0.5, abs=0.05)            # clipped to {0, 255} it was ~1.0
    assert float(std) == pytest.approx(1 / 12 ** 0.5, abs=0.03)   # uniform on [0, 1]


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_only_png_and_jpeg_are_decoded_and_eps_never_reaches_ghostscript(con, monkeypatch):
    started = []
    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", lambda *a, **k: started.append(a))
    monkeypatch.setattr(EpsImagePlugin, "gs_binary", "gs", raising=False)
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n0 0 moveto showpage\n"
    gif = io.BytesIO()
    Image.new("L", (8, 8)).save(gif, format="GIF")
    for name, blob in (("eps", eps), ("gif", gif.getvalue())):
        _images(con, name, [blob, blob])
        with pytest.raises(duckdb.Error, match=r"row 1 of column 'img' is not a PNG or JPEG image"):
            con.execute(f"SELECT train('{name}', '{name}', label := 'y', epochs := 1)")
    _images(con, "ok", [_png(np.zeros((8, 8), np.uint8))] * 4)
    con.execute("SELECT train('p', 'ok', label := 'y', epochs := 1, arch := 'cnn', policy := 'eager')")
    with pytest.raises(duckdb.Error, match=r"predict\(\): row 1 of column 'img' is not a PNG or JPEG"):
        con.execute("SELECT predict('p', img) FROM eps").fetchall()
    assert not started and _models(con) == 1


def test_images_over_the_pixel_limit_are_refused_before_decoding(con):
    big = _png(np.zeros((7000, 7000), np.uint8))     # 49 MP, under Pillow's own bomb limit
    assert len(big) < 100_000
    _images(con, "bombs", [big, big])
    started = time.perf_counter()
    with pytest.raises(duckdb.Error, match=r"row 1 of column 'img' is a 7000x7000 image \(49 megapixels\), more "
                                           r"than dbml decodes \(40\)"):
        con.execute("SELECT train('b', 'bombs', label := 'y', epochs := 1)")
    assert time.perf_counter() - started < 5 and _models(con) == 0


@pytest.mark.parametrize("args", ["image_size := [100000]", "image_size := [64, 0]", "image_size := [1, 2, 3]"])
def test_image_sizes_are_bounded(con, args):
    _images(con, "ok", [_png(np.zeros((8, 8), np.uint8))] * 4)
    with pytest.raises(duckdb.Error, match=r"image_size"):
        con.execute(f"SELECT train('p', 'ok', label := 'y', epochs := 1, {args})")


def test_the_internal_image_decoder_takes_only_dbmls_own_sql(con):
    _images(con, "ok", [_png(np.zeros((8, 8), np.uint8))] * 4)
    encoder = json.dumps({"kind": "image", "column": "img", "blob": True, "shape": [3, 4096, 4096], "resize": True,
                          "mean": [0, 0, 0], "std": [1, 1, 1]})
    with pytest.raises(duckdb.Error, match=r"dbml_decode_image\(\) is dbml's own"):
        con.execute("SELECT dbml_decode_image(img, ?, 'guess') FROM ok", [encoder]).fetchall()
    huge = encoder.replace("4096, 4096", "20000, 20000")
    from dbml.core.inputs import DECODE_TOKEN, InputEncoder
    from dbml.errors import CatalogError
    with pytest.raises(CatalogError):
        InputEncoder.from_dict(json.loads(huge))
    assert DECODE_TOKEN not in str(con.execute("SELECT * FROM duckdb_variables()").fetchall())


@pytest.mark.parametrize("args, message", [
    ("arch := 'resnet_tabular', options := '{\"depth\": 1000000}'", r"option 'depth' of arch 'resnet_tabular' must "
                                                                     r"be at most 256"),
    ("arch := 'ft_transformer', options := '{\"depth\": 1000000}'", r"option 'depth' .* must be at most 256"),
    ("hidden := range(1, 200001)::INTEGER[]", r"option 'hidden' of arch 'mlp' may list at most 256 layers"),
    ("options := '{\"hidden\": {\"a\": 1}}'", r"option 'hidden' of arch 'mlp' must be a non-empty list of positive "
                                              r"integers"),    # one layer of 10^15 units (torch's "Storage size ... overflowed" before the bound)
    ("options := '{\"hidden\": [1000000000000000]}'", r"option 'hidden' of arch 'mlp' may list at most 256 layers of at most 1048576 "
                                     r"units"),
])
@pytest.mark.slow   # ~0.6 s: out of the -m 'not slow' inner loop (under a minute)
def test_model_options_are_bounded_before_the_model_is_built(con, args, message):
    con.execute("CREATE TABLE a AS SELECT x / 100 AS x, (x % 2)::INTEGER AS y FROM range(100) t(x)")
    started = time.perf_counter()
    with pytest.raises(duckdb.Error, match=message):
        con.execute(f"SELECT train('m', 'a', label := 'y', {args})")
    assert time.perf_counter() - started < 5


def test_sequence_options_are_bounded(con):
    con.execute("CREATE TABLE s AS SELECT [x, x + 1]::DOUBLE[] AS s, (x % 2)::INTEGER AS y FROM range(40) t(x)")
    for arch in ("transformer", "tcn"):
        with pytest.raises(duckdb.Error, match=rf"option 'depth' of arch '{arch}' must be at most 256"):
            con.execute(f"SELECT train('m', 's', label := 'y', arch := '{arch}', options := '{{\"depth\": 1000000}}')")


def test_one_huge_token_id_does_not_make_a_huge_embedding(con):
    con.execute("CREATE TABLE tk AS SELECT [x % 7, 10000000 * (x % 2)]::INTEGER[] AS ids, (x % 2)::INTEGER AS y "
                "FROM range(100) t(x)")
    con.execute("SELECT train('t', 'tk', label := 'y', epochs := 1, arch := 'tcn', policy := 'eager')")
    enc = json.loads(con.execute("SELECT preprocessing FROM dbml_models").fetchall()[0][0])["input"]
    assert enc["vocab_size"] == 10 and enc["ids"] == [0, 1, 2, 3, 4, 5, 6, 10000000]
    weights = con.execute("SELECT bytes FROM dbml_models").fetchall()[0][0]
    assert weights < 2_000_000      # an embedding row per id up to 10^7 was 640 MB


# -- dbml's own errors, never raw internal ones ----------------------------------------------------

def test_predict_of_null_on_a_text_model_is_null(con):
    con.execute("CREATE TABLE tx AS SELECT 'a text with several words number ' || x AS body, (x % 2)::INTEGER AS y "
                "FROM range(60) t(x)")
    con.execute("SELECT train('t', 'tx', label := 'y', epochs := 1, policy := 'eager')")
    assert con.execute("SELECT predict('t', NULL::VARCHAR), predict_label('t', NULL::VARCHAR), "
                       "predict_proba('t', NULL::VARCHAR)").fetchall() == [(None, None, None)]


@pytest.mark.parametrize("call", ["train('m', 'SELECT ''abc', label := 'y')", "evaluate('m', 'SELECT ''abc')"])
def test_an_unterminated_string_in_a_source_is_a_source_error(con, call):
    with pytest.raises(duckdb.Error, match=r"SourceError: \w+\(\): source is not valid SQL \(Error tokenizing"):
        con.execute(f"SELECT {call}")


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_lazy_modules_are_sized_by_a_first_batch(con):
    import torch
    import dbml

    def lazy(inputs, outputs):
        return torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.ReLU(), torch.nn.Linear(8, outputs))
    dbml.register_model("lazy_mlp", lazy, kinds="tabular")
    try:
        con.execute("CREATE TABLE a AS SELECT x / 100 AS x, x % 7 AS z, (x % 2)::INTEGER AS y FROM range(100) t(x)")
        row = con.execute("SELECT train('lz', 'a', label := 'y', arch := 'lazy_mlp', epochs := 2)").fetchall()[0][0]
        assert row["status"] == "finished"
        assert con.execute("SELECT predict('lz', [0.5, 3])").fetchall()[0][0] in (0.0, 1.0)
    finally:
        dbml.unregister_model("lazy_mlp")


@pytest.mark.parametrize("shape, message", [
    ("[65, 2, 2]", r"shape := \[c, h, w\] takes at most 64 channels, got 65"),
    ("[1, 1, 5000]", r"shape sizes must be whole numbers from 1 to 4096, got 5000"),
])
def test_array_image_shapes_are_bounded(con, shape, message):
    con.execute("CREATE TABLE arr AS SELECT [x, x, x, x]::FLOAT[] AS px, (x % 2)::INTEGER AS y FROM range(20) t(x)")
    with pytest.raises(duckdb.Error, match=message):
        con.execute(f"SELECT train('m', 'arr', label := 'y', shape := {shape})")
    assert con.execute("SELECT count(*) FROM dbml_models").fetchall() == [(0,)]
