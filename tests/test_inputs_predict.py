"""Issue 24 part 3: image, text and series models at predict time. Images of another size
are resized by training's own rule; undecodable files are skipped under on_error := 'skip'
and named; per-row scaling of series. Small tables, one epoch each."""

from __future__ import annotations

import io

import duckdb
import numpy as np
import pytest
from PIL import Image

from dbml.core import inputs
from dbml.errors import RowSkipped

CNN = "arch := 'cnn', options := '{\"width\": 4, \"depth\": 2}', epochs := 1, policy := 'eager'"


def _png(a: np.ndarray | Image.Image) -> bytes:
    out = io.BytesIO()
    (a if isinstance(a, Image.Image) else Image.fromarray(a)).save(out, format="PNG")
    return out.getvalue()


def _grey(n: int, side=(8, 8), seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, side, dtype=np.uint8) for _ in range(n)]


def _images(con, name: str, blobs: list, files: bool = False) -> None:
    con.execute(f"CREATE TABLE {name} (img BLOB, y INTEGER{', filename VARCHAR' if files else ''})")
    con.executemany(f"INSERT INTO {name} VALUES (?, ?{', ?' if files else ''})",
                    [(b, i % 2, f"photos/{i:02d}.png")[:3 if files else 2] for i, b in enumerate(blobs)])


def _proba(con, model: str, blobs: list[bytes]) -> np.ndarray:
    return np.array([con.execute(f"SELECT map_values(predict_proba('{model}', ?::BLOB))", [b]).fetchall()[0][0] for b in blobs])


@pytest.mark.slow   # ~1.3 s: out of the -m 'not slow' inner loop (under a minute)
def test_images_of_another_size_are_resized_as_training_resized(con):
    _images(con, "small", [_png(a) for a in _grey(12)])
    con.execute(f"SELECT train('i', 'small', label := 'y', {CNN})").fetchall()
    larger = [Image.fromarray(a).resize((16, 12)) for a in _grey(6, seed=1)]     # 16x12: not the model's 8x8
    got = _proba(con, "i", [_png(im) for im in larger])
    want = _proba(con, "i", [_png(im.resize((8, 8))) for im in larger])          # Pillow's resize, as training
    assert np.array_equal(got, want)
    _images(con, "large", [_png(im) for im in larger])
    rows = con.execute("SELECT prediction FROM predictions('i', 'large')").fetchall()
    assert len(rows) == 6 and all(r[0] in (0, 1) for r in rows)
    assert con.execute("SELECT evaluate('i', 'large')").fetchall()[0][0]["rows"] == 6


def test_a_resized_image_still_obeys_the_pixel_limit(con, monkeypatch):
    _images(con, "small", [_png(a) for a in _grey(8)])
    con.execute(f"SELECT train('i', 'small', label := 'y', {CNN})").fetchall()
    monkeypatch.setattr(inputs, "MAX_IMAGE_PIXELS", 100)    # 16x12 = 192 pixels: over it, checked on the header
    with pytest.raises(duckdb.Error, match=r"is a 16x12 image \(0 megapixels\), more than dbml decodes"):
        _proba(con, "i", [_png(np.zeros((12, 16), np.uint8))])


def _series(con, n: int = 40) -> None:
    """Rising or falling series of 6 to 12 steps, each at its own level and amplitude."""
    con.execute(f"""CREATE TABLE s AS SELECT range AS id, list_transform(range(6 + range % 7),
        lambda i: (100.0 * (range % 5) + (1 + range % 3) * CASE WHEN range % 2 = 0 THEN i ELSE -i END
                   + ((i * 7 + range) % 3) * 0.1)::FLOAT)::DOUBLE[] AS xs, (range % 2)::INTEGER AS y FROM range({n})""")


TCN = "arch := 'tcn', options := '{\"width\": 8, \"depth\": 2}', epochs := 1, policy := 'eager'"


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_series_scaled_per_row_predict_the_same_for_any_level_and_unit(con):
    _series(con)
    con.execute(f"SELECT train('row', 's', label := 'y', features := ['xs'], series_scale := 'row', {TCN})").fetchall()
    con.execute(f"SELECT train('glob', 's', label := 'y', features := ['xs'], {TCN})").fetchall()
    xs = [1.0, 4.0, 2.0, None, 8.0, 3.0, 5.0]
    moved = [None if v is None else 250.0 + 3.5 * v for v in xs]    # another level and unit
    p = [con.execute("SELECT map_values(predict_proba(?, ?::DOUBLE[]))", [m, v]).fetchall()[0][0]
         for m in ("row", "glob") for v in (xs, moved)]
    assert np.allclose(p[0], p[1], atol=1e-6)         # per row: the same series, whatever its level
    assert not np.allclose(p[2], p[3], atol=1e-3)     # the default (one global mean/std) is unchanged
    rows = con.execute("SELECT count(prediction) FROM predictions('row', 's')").fetchall()[0][0]
    assert rows == 40 and con.execute("SELECT evaluate('row', 's')").fetchall()[0][0]["rows"] == 40


def test_series_scale_is_checked(con):
    _series(con, 8)
    with pytest.raises(duckdb.Error, match=r"unknown series_scale 'rows'; pass series_scale := one of 'global', 'row'"):
        con.execute("SELECT train('m', 's', label := 'y', series_scale := 'rows')").fetchall()
    con.execute("CREATE TABLE t AS SELECT range::DOUBLE AS a, range % 2 AS y FROM range(8)")
    with pytest.raises(duckdb.Error, match=r"series_scale := 'row' applies to a series .* this model's input is "
                                           r"tabular"):
        con.execute("SELECT train('m', 't', label := 'y', series_scale := 'row')").fetchall()


def _photos(con, tmp_path, bad: dict[int, bytes]) -> str:
    """Six 8x8 PNG files (some replaced by ``bad``), as read_blob sees them; the glob."""
    for i, a in enumerate(_grey(6, seed=2)):
        (tmp_path / f"p{i}_{i % 2}.png").write_bytes(bad.get(i, _png(a)))
    return (f"SELECT content AS img, split_part(parse_filename(filename, true), '_', 2)::INTEGER AS y, filename "
            f"FROM read_blob('{tmp_path}/*.png')")


def test_on_error_skip_names_each_undecodable_file_and_leaves_it_null(con, tmp_path):
    _images(con, "small", [_png(a) for a in _grey(12)])
    con.execute(f"SELECT train('i', 'SELECT img, y FROM small', label := 'y', {CNN})").fetchall()
    glob = _photos(con, tmp_path, {2: b"not a png", 4: b"\x89PNG\r\n\x1a\n broken"})
    with pytest.raises(duckdb.Error, match=r"predictions\(\): file '.*p2_0\.png' of column 'img' is not a PNG"):
        con.execute("SELECT * FROM predictions('i', ?)", [glob]).fetchall()
    with pytest.warns(RowSkipped) as caught:
        rows = con.execute("SELECT filename, prediction FROM predictions('i', ?, on_error := 'skip') "
                           "ORDER BY filename", [glob]).fetchall()
    assert [r[0].rsplit("/", 1)[1] for r in rows if r[1] is None] == ["p2_0.png", "p4_0.png"]
    assert all(r[1] in (0, 1) for r in rows if r[1] is not None) and len(rows) == 6
    said = sorted(str(w.message) for w in caught if "skipped" in str(w.message))
    assert len(said) == 2 and "p2_0.png' of column 'img' is not a PNG" in said[0] and "p4_0.png" in said[1]
    assert "its prediction is NULL" in said[0]
    with pytest.warns(RowSkipped) as caught:
        m = con.execute("SELECT evaluate('i', ?, on_error := 'skip')", [glob]).fetchall()[0][0]
    assert m["rows"] == 4 and len(caught) == 2 and all("left out of the metrics" in str(w.message) for w in caught)
    with pytest.raises(duckdb.Error, match=r"evaluate\(\): file '.*p2_0\.png' of column 'img'"):
        con.execute("SELECT evaluate('i', ?)", [glob]).fetchall()
    with pytest.raises(duckdb.Error, match=r"unknown on_error 'ignore'; pass on_error := one of 'raise', 'skip'"):
        con.execute("SELECT * FROM predictions('i', ?, on_error := 'ignore')", [glob]).fetchall()


def test_without_a_filename_column_the_error_names_the_source_row(con):
    blobs = [_png(a) for a in _grey(6)]
    blobs[4] = b"junk"
    _images(con, "t", blobs)
    con.execute(f"SELECT train('i', 'SELECT * FROM t WHERE octet_length(img) > 10', label := 'y', {CNN})").fetchall()
    with pytest.raises(duckdb.Error, match=r"predictions\(\): row 5 of column 'img' is not a PNG"):
        con.execute("SELECT * FROM predictions('i', 't')").fetchall()
    with pytest.warns(RowSkipped, match=r"row 5 of column 'img'"):
        rows = con.execute("SELECT prediction FROM predictions('i', 't', on_error := 'skip')").fetchall()
    assert [r[0] is None for r in rows] == [False] * 4 + [True, False]
