"""Inputs that are not a row of numbers: images, text, token sequences and series.

A source column of one of these kinds becomes a model's whole input (``zoo.Inputs``);
an :class:`InputEncoder` is fitted on the training rows, stored with the model (JSON,
validated on load) and turns an Arrow column of a batch into the model's tensor:

* **image** — a BLOB of PNG/JPEG (decoded with Pillow on a thread pool, off the training
  thread; Pillow releases the GIL), or a numeric array column with ``shape := [c, h, w]``.
  Blobs are converted to grey ('L') if every training image is grey, else RGB, and resized
  to ``image_size := [h, w]`` (or one number for a square) when given; without it every
  training image must have the same size. At predict time an image of another size is
  resized to the model's by the same rule (``InputEncoder._pixels``). Each channel is standardised with its mean and std over
  (a sample of up to ``STATS_SAMPLE`` of) the training images.
* **text** — a VARCHAR column named in ``text := [...]``, or inferred as text when its
  values average at least ``TEXT_MIN_WORDS`` words. Tokeniser: lower-cased, split into
  words and single punctuation marks (``\\w+|[^\\w\\s]``); the vocabulary is the
  ``MAX_VOCAB`` most frequent training tokens (id 0 pads, 1 is an unknown token); texts
  are cut at ``max_len``, the longest training text up to ``MAX_LEN`` tokens.
* **tokens** — an ``INTEGER[]``/``BIGINT[]`` column of token ids >= 0. Its vocabulary is
  the ``MAX_VOCAB`` most frequent training ids (``ids``), as for text: the model sees an
  id's index + 2 (0 pads, 1 is any other id), so the embedding's size follows how many
  ids there are, never how large one is. (Models stored before ``ids`` existed see id + 1
  and refuse ids beyond the largest training id.)
* **series** — a ``FLOAT[]``/``DOUBLE[]`` column of variable length, cut at ``max_len``
  (the longest training series up to ``MAX_LEN``) and standardised
  (``input_modules.SeriesScale``) with the mean and std of all training values, or under ``series_scale := 'row'`` each series with
  the mean and (population) std of its own values (a std of 0 counts as 1); the model sees
  ``[value, present]`` per step. NULL, NaN, ±Inf and values beyond FLOAT's range are
  missing (``present`` 0) and count in no statistic.

Sequences are padded per batch to the batch's longest, rounded up to a power of two
(at least 8), so that a job captures a handful of graph shapes rather than one per length.
"""

from __future__ import annotations

import io
import json
import math
import re
import secrets
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import torch
from sqlglot import exp

from ..errors import CatalogError, InvalidArgument, SourceError
from .runtime import runtime
from .input_modules import FLOAT_MAX, ChannelNormalise, SeriesScale
from .source import Column, column, value_sql
from .spec import SERIES_SCALES
from ..zoo import Inputs

KINDS = ("image", "text", "tokens", "series")
MAX_VOCAB = 20000
MAX_LEN = 512
TEXT_MIN_WORDS = 4.0
STATS_SAMPLE = 2000
DECODE_WORKERS = 4
IMAGE_FORMATS = ("PNG", "JPEG")     # the only decoders Pillow may use on a BLOB
MAX_IMAGE_PIXELS = 40_000_000       # a source image's pixels, checked before decoding (a 48 MP photo: downscale)
MAX_SIDE = 4096                     # a model's input height or width (image_size, shape)
# dbml_decode_image produces c*h*w bytes a row, as the encoder it is given says: only SQL
# dbml writes (scratch_sql) may call it, which alone knows this process's token.
DECODE_TOKEN = secrets.token_hex(16)
MAX_CHANNELS = 64                   # an array image's channels (shape := [c, h, w])
_TOKEN = re.compile(r"\w+|[^\w\s]")
PAD_ID, UNKNOWN_ID, FIRST_ID = 0, 1, 2   # text and token ids: padding, a token not in the vocabulary, the first known


def tokenize(text: str) -> list[str]:
    """The text tokeniser: lower-cased words and single punctuation marks."""
    return _TOKEN.findall(text.lower())


def tokenizer_rule(enc: "InputEncoder") -> dict:
    """How a text becomes the ids a text model takes (``tokenize``, then ``InputEncoder._ids``),
    said for another program: the ONNX export's ``dbml.tokenizer`` metadata."""
    return {"lowercase": "str.lower", "pattern": _TOKEN.pattern, "pattern_syntax": "python re, unicode",
            "ids": f"vocab index + {FIRST_ID}", "unknown": UNKNOWN_ID, "padding": PAD_ID,
            "no_tokens": [UNKNOWN_ID], "max_len": enc.max_len, "longer": "cut at max_len"}


def row_name(row: int | str) -> str:
    """How an error names a row: its 0-based number in the batch ("row 3"), or the name the
    caller gave it (``names``: "file 'photos/e.png'", "row 5" of the whole source)."""
    return row if isinstance(row, str) else f"row {row + 1}"


def _pool() -> ThreadPoolExecutor:
    rt = runtime()   # the process's pool, started at the first use
    if rt.decode_pool is None:
        rt.decode_pool = ThreadPoolExecutor(DECODE_WORKERS, thread_name_prefix="dbml-decode")
    return rt.decode_pool


@dataclass(frozen=True)
class InputEncoder:
    kind: str                          # one of KINDS
    column: str
    blob: bool = False                 # image: decoded from PNG/JPEG bytes (else a numeric array)
    shape: tuple[int, ...] = ()        # image: (channels, height, width)
    resize: bool = False               # image blob: trained with image_size (every image is resized to
                                       # shape[1:] when its size differs, at training and at predict)
    mean: tuple[float, ...] = ()       # image: per channel; series: one value
    std: tuple[float, ...] = ()
    vocab: tuple[str, ...] = ()        # text: id = index + 2
    vocab_size: int = 0                # text / tokens: ids < vocab_size (0 pads)
    max_len: int = 0                   # text / tokens / series
    ids: tuple[int, ...] = ()          # tokens: the training ids the model knows, id = index + 2
    scale: str = "global"              # series: SERIES_SCALES (train()'s series_scale)

    # -- what the model sees ----------------------------------------------------------------
    def inputs(self) -> Inputs:
        if self.kind == "image":
            return Inputs("image", shape=self.shape)
        if self.kind == "series":
            return Inputs("series", max_len=self.max_len)
        return Inputs("tokens", vocab=self.vocab_size, max_len=self.max_len)

    def raw_sql(self) -> str:
        """:meth:`raw_expression` rendered for DuckDB."""
        return self.raw_expression().sql("duckdb")

    def raw_expression(self) -> exp.Expression:
        """The column as the encoder reads it (a tree)."""
        col = column(self.column)
        if self.kind == "image" and self.blob:
            return col
        to = {"image": "FLOAT[]", "text": "VARCHAR", "tokens": "BIGINT[]", "series": "DOUBLE[]"}[self.kind]
        return exp.cast(col, exp.DataType.build(to, dialect="duckdb"))

    def scratch_sql(self) -> str:
        """:meth:`scratch_expression` rendered for DuckDB."""
        return self.scratch_expression().sql("duckdb")

    def scratch_expression(self) -> exp.Expression:
        """The column as a job's scratch table stores it (a tree): PNG/JPEG images decoded once,
        as raw channel-height-width bytes (the ``dbml_decode_image`` UDF), so that epochs stream
        pixels instead of decoding every image again; other kinds as ``raw_sql``."""
        if self.kind == "image" and self.blob:
            return exp.func("dbml_decode_image", column(self.column), value_sql(json.dumps(self.to_dict())),
                            value_sql(DECODE_TOKEN))
        return self.raw_expression()

    def decode(self, col: pa.Array, *, fn: str = "train", names=None) -> pa.Array:
        """PNG/JPEG BLOBs -> raw uint8 CHW bytes per row, decoded on the pool in slices
        (one task per slice, not per image: fewer hand-offs of the GIL)."""
        rows = list(zip(names or range(len(col)), _flat(col).to_pylist()))
        step = max(1, -(-len(rows) // DECODE_WORKERS))
        slices = [rows[i:i + step] for i in range(0, len(rows), step)]
        done = _pool().map(lambda part: [self._decode(i, data, fn=fn).tobytes() for i, data in part], slices)
        return pa.array([b for part in done for b in part], type=pa.binary())

    def to_tensor(self, col: pa.Array, *, fn: str = "train", decoded: bool = False, names=None) -> torch.Tensor:
        """A batch's column as the model's input tensor (``decoded``: images already raw
        bytes, as ``scratch_sql`` stores them). An error names the row by ``names`` (one
        string a row, ``row_name``), else by its number in the batch."""
        col = _flat(col)
        if self.kind == "image":
            return self._images(col, fn, decoded, names)
        if self.kind == "series":
            return self._series(col)
        return _pad([self._ids(v, i, fn) for i, v in zip(names or range(len(col)), col.to_pylist())], self.max_len)

    def encode(self, col: pa.Array, *, fn: str, names, on_error: str = "raise"):
        """``to_tensor`` of the rows that encode: (tensor or None, mask of those rows, the
        errors of the others). Under ``on_error := 'raise'`` the first error is raised; under
        'skip' the rows that do not decode (an unreadable image, an empty text...) are
        left out and their errors returned, each naming its row."""
        col = _flat(col)
        names = [row_name(i) for i in range(len(col))] if names is None else list(names)
        try:
            return self.to_tensor(col, fn=fn, names=names), np.ones(len(col), bool), []
        except InvalidArgument:
            if on_error == "raise":
                raise
        ok, errors = np.ones(len(col), bool), []
        for i in range(len(col)):   # the batch failed: find its bad rows, one by one
            try:
                self.to_tensor(col.slice(i, 1), fn=fn, names=names[i:i + 1])
            except InvalidArgument as e:
                ok[i] = False
                errors.append(str(e))
        kept = [n for n, keep in zip(names, ok) if keep]
        return (self.to_tensor(col.filter(pa.array(ok)), fn=fn, names=kept) if ok.any() else None), ok, errors

    # -- images ------------------------------------------------------------------------------
    def _images(self, col: pa.Array, fn: str, decoded: bool, names) -> torch.Tensor:
        c, h, w = self.shape
        if self.blob:
            x = _binary_bytes(col if decoded else self.decode(col, fn=fn, names=names)).astype(np.float32) / 255.0
        else:
            x = np.stack([_array(v, c * h * w, i, self.column, fn)
                          for i, v in zip(names or range(len(col)), col.to_pylist())])
        x = torch.from_numpy(np.ascontiguousarray(x.reshape(len(col), c, h, w), dtype=np.float32))
        with torch.no_grad():
            return self.normaliser(x)

    @cached_property
    def normaliser(self) -> torch.nn.Module:
        """Pixels in [0, 1] (channels, height, width) -> the model's input; the ONNX export runs it too."""
        return ChannelNormalise(self.mean, self.std)

    def _decode(self, row: int | str, data: bytes | None, *, fn: str) -> np.ndarray:
        return self._pixels(open_image(data, row, self.column, fn))

    def _pixels(self, image) -> np.ndarray:
        """A Pillow image as the model's channels: grey or RGB, then resized to the model's
        height and width if it has another size, (c, h, w) uint8. The one resize rule: training
        with ``image_size`` and predicting on images of any other size both go through it.
        16-bit grey (mode I;16, or I) is scaled to 8 bits, not clipped as Pillow's convert does."""
        if image.mode.startswith("I"):
            wide = np.asarray(image, dtype=np.float64)
            top = 65535.0 if image.mode.startswith("I;16") or wide.max(initial=0) > 255 else 255.0
            image = _pil_image(np.clip(np.rint(wide * (255.0 / top)), 0, 255).astype(np.uint8))
        image = image.convert("L" if self.shape[0] == 1 else "RGB")
        if image.size != (self.shape[2], self.shape[1]):
            image = image.resize((self.shape[2], self.shape[1]))   # Pillow's default filter (bicubic)
        a = np.asarray(image, dtype=np.uint8)
        return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)

    # -- sequences ---------------------------------------------------------------------------
    def _ids(self, value, row: int | str, fn: str) -> list[int]:
        if self.kind == "text":
            if value is None or not value.strip():
                raise InvalidArgument(f"{fn}(): {row_name(row)} of text column {self.column!r} is empty; "
                                      f"filter such rows out (WHERE length(trim({self.column})) > 0)")
            index = self._index
            return [index.get(t, UNKNOWN_ID) for t in tokenize(value)][:self.max_len] or [UNKNOWN_ID]
        ids = [v for v in (value or []) if v is not None][:self.max_len]
        if self.ids:
            index = self._id_index
            return [index.get(v, 1) for v in ids] or [0]
        bad = [v for v in ids if not 0 <= v < self.vocab_size - 1]
        if bad:
            raise InvalidArgument(f"{fn}(): {row_name(row)} of column {self.column!r} holds token id {bad[0]}, "
                                  f"outside the model's range 0..{self.vocab_size - 2} (the largest training id); "
                                  f"map unseen ids to a known one, or retrain on data that has them")
        return [v + 1 for v in ids] or [0]

    @cached_property
    def _id_index(self) -> dict[int, int]:
        """training token id -> the model's id, built once per loaded encoder."""
        return {t: i + 2 for i, t in enumerate(self.ids)}

    @cached_property
    def _index(self) -> dict[str, int]:
        """token -> id, built once per loaded encoder."""
        return {t: i + FIRST_ID for i, t in enumerate(self.vocab)}

    def _series(self, col: pa.Array) -> torch.Tensor:
        rows = [[np.nan if v is None else v for v in (r or [])][:self.max_len] for r in col.to_pylist()]
        length = _bucket(max((len(r) for r in rows), default=1), self.max_len)
        raw = np.full((len(rows), length), np.nan)              # NaN: missing, and the padding
        for i, r in enumerate(rows):
            raw[i, :len(r)] = r
        with torch.no_grad():
            return self.series_scale(torch.from_numpy(raw))

    @cached_property
    def series_scale(self) -> torch.nn.Module:
        """Raw series -> the model's input; the ONNX export runs it too."""
        return SeriesScale(self.mean[0], self.std[0], per_row=self.scale == "row", max_len=self.max_len)

    # -- the catalog -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "InputEncoder":
        """Validated: a tampered or foreign encoder is a CatalogError, never code or SQL."""
        try:
            enc = cls(**{**d, **{k: tuple(d[k]) for k in ("shape", "mean", "std", "vocab", "ids") if k in d}})
            assert enc.kind in KINDS and isinstance(enc.column, str)
            assert all(isinstance(v, int) and 0 < v <= MAX_SIDE for v in enc.shape)
            assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in enc.mean + enc.std)
            assert all(isinstance(t, str) for t in enc.vocab)
            assert isinstance(enc.vocab_size, int) and isinstance(enc.max_len, int)
            if enc.kind == "image":
                assert len(enc.shape) == 3 and len(enc.mean) == len(enc.std) == enc.shape[0]
                assert enc.shape[0] in ((1, 3) if enc.blob else range(1, MAX_CHANNELS + 1))
            assert all(isinstance(t, int) and not isinstance(t, bool) for t in enc.ids)
            assert enc.scale in SERIES_SCALES and (enc.scale == "global" or enc.kind == "series")
            if enc.kind == "series":
                assert len(enc.mean) == len(enc.std) == 1
            assert 0 <= enc.max_len <= MAX_LEN and enc.vocab_size >= 0
            if enc.kind == "text" or enc.ids:
                assert enc.vocab_size == len(enc.vocab or enc.ids) + 2 <= MAX_VOCAB + 2
        except (TypeError, AssertionError) as e:
            raise CatalogError(f"the stored input encoder is not valid ({e or 'a field has a wrong value'})") from None
        return enc


def _pil_image(a: np.ndarray):
    from PIL import Image
    return Image.fromarray(a)


def _binary_bytes(raw: pa.Array) -> np.ndarray:
    """The bytes of a BINARY column without NULLs, end to end, as a view of Arrow's buffer."""
    offsets = np.frombuffer(raw.buffers()[1], dtype=np.int64 if pa.types.is_large_binary(raw.type) else np.int32)
    start, stop = offsets[raw.offset], offsets[raw.offset + len(raw)]
    return np.frombuffer(raw.buffers()[2], dtype=np.uint8)[start:stop]


def _flat(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def open_image(data: bytes | None, row: int | str, column: str, fn: str):
    """A BLOB as a Pillow image; an error naming the row and column if it is not a PNG or
    JPEG (``IMAGE_FORMATS``: no other decoder ever sees the bytes, so no EPS reaches
    Ghostscript) or holds more than ``MAX_IMAGE_PIXELS`` (checked on the header, before
    the pixels are decoded)."""
    from PIL import Image, UnidentifiedImageError

    if data is None:
        raise InvalidArgument(f"{fn}(): {row_name(row)} of image column {column!r} is NULL; filter such rows out")
    try:
        image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
        w, h = image.size
        if w * h > MAX_IMAGE_PIXELS:
            raise InvalidArgument(f"{fn}(): {row_name(row)} of column {column!r} is a {w}x{h} image "
                                  f"({w * h / 1e6:.0f} megapixels), more than dbml decodes "
                                  f"({MAX_IMAGE_PIXELS / 1e6:.0f}); downscale such images before training on them")
        image.load()
        return image
    except InvalidArgument:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise InvalidArgument(f"{fn}(): {row_name(row)} of column {column!r} is not a PNG or JPEG image dbml can "
                              f"decode ({type(e).__name__}); pass only PNG or JPEG files, e.g. "
                              f"read_blob('photos/*.png')") from None


def image_side(value, arg: str, fn: str) -> int:
    """A height or width a model takes: a positive integer up to ``MAX_SIDE``."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_SIDE:
        raise InvalidArgument(f"{fn}(): {arg} sizes must be whole numbers from 1 to {MAX_SIDE}, got {value!r}; "
                              f"pass e.g. {arg} := [64, 64]")
    return value


def _array(value, size: int, row: int | str, column: str, fn: str) -> np.ndarray:
    if value is None or len(value) != size:
        n = "NULL" if value is None else f"{len(value)} numbers"
        raise InvalidArgument(f"{fn}(): {row_name(row)} of column {column!r} holds {n}, but shape := [c, h, w] "
                              f"needs c*h*w = {size}; fix shape := or the arrays")
    return np.asarray([np.nan if v is None else v for v in value], dtype=np.float32)


def _bucket(n: int, cap: int) -> int:
    return min(max(8, 1 << max(0, n - 1).bit_length()), max(cap, 1))


def _pad(rows: list[list[int]], cap: int) -> torch.Tensor:
    length = _bucket(max(len(r) for r in rows), cap)
    x = np.zeros((len(rows), length), dtype=np.int64)
    for i, r in enumerate(rows):
        x[i, :len(r)] = r
    return torch.from_numpy(x)


# -- recognising and fitting -----------------------------------------------------------------
def kind_of(cur, src: exp.Subquery, col: Column, *, text: bool | None, shape) -> str | None:
    """The input kind of a feature column, or None for a tabular one. ``text``: the column is text
    (True), is not (False), or is when its values average many words (None)."""
    t = col.type.strip().upper()
    if t in ("BLOB", "BYTEA"):
        return "image"
    if shape is not None and (t.endswith("]") and Column(col.name, t.rsplit("[", 1)[0]).is_numeric):
        return "image"
    if t.endswith("[]"):
        base = Column(col.name, t[:-2])
        if base.is_integer:
            return "tokens"
        if base.is_numeric:
            return "series"
        return None
    if t == "VARCHAR" and (text or text is None and _looks_like_text(cur, src, col)):
        return "text"
    return None


def _looks_like_text(cur, src: exp.Subquery, col: Column) -> bool:
    split = exp.func("string_split", exp.func("trim", column(col.name)), exp.Literal.string(" "), dialect="duckdb")
    sample = exp.select("*").from_(src).limit(1000).subquery()
    words = cur.execute(exp.select(exp.func("avg", exp.func("len", split))).from_(sample).sql("duckdb")).fetchall()[0][0]
    return words is not None and words >= TEXT_MIN_WORDS


def fit(cur, src: exp.Subquery, col: Column, kind: str, *, image_size, shape, series_scale: str = "global",
        fn: str = "train") -> InputEncoder:
    """Fit the encoder of ``col`` on the training rows ``src`` (a subquery)."""
    if kind == "image":
        return _fit_array_image(cur, src, col, shape, fn) if shape is not None else \
            _fit_blob_image(cur, src, col, image_size, fn)
    values = _column_values(cur, src, col)
    if kind == "text":
        return _fit_text(values, col, fn)
    flat = [v for r in values if r for v in r if v is not None]
    if kind == "tokens":
        if not flat:
            raise SourceError(f"{fn}(): column {col.name!r} has no token ids; pass a column of INTEGER[] token lists")
        if min(flat) < 0:
            raise InvalidArgument(f"{fn}(): column {col.name!r} holds a negative token id ({min(flat)}); "
                                  f"token ids must be >= 0")
        counts = Counter(int(v) for v in flat)
        ids = tuple(sorted(t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_VOCAB]))
        return InputEncoder("tokens", col.name, vocab_size=len(ids) + 2, max_len=_max_len(values), ids=ids)
    if series_scale == "row":    # each series scaled by its own statistics: none kept
        return InputEncoder("series", col.name, mean=(0.0,), std=(1.0,), max_len=_max_len(values), scale="row")
    finite = np.asarray([v for v in flat if math.isfinite(v) and abs(v) <= FLOAT_MAX], dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):   # values near DOUBLE's range overflow a sum
        mean = float(finite.mean()) if finite.size else 0.0
        std = float(finite.std()) if finite.size else 1.0
    mean = mean if math.isfinite(mean) else 0.0
    std = std if math.isfinite(std) and std > 0 else 1.0
    return InputEncoder("series", col.name, mean=(mean,), std=(std,), max_len=_max_len(values))


def _column_values(cur, src: exp.Subquery, col: Column) -> list:
    return cur.sql(exp.select(column(col.name)).from_(src).sql("duckdb")).to_arrow_table().column(0).to_pylist()


def _max_len(values: list) -> int:
    return max(1, min(MAX_LEN, max((len(v) for v in values if v), default=1)))


def _fit_text(values: list, col: Column, fn: str) -> InputEncoder:
    counts, longest = Counter(), 1
    for row, v in enumerate(values):
        if v is None or not v.strip():
            raise InvalidArgument(f"{fn}(): {row_name(row)} of text column {col.name!r} is empty; "
                                  f"filter such rows out (WHERE length(trim({col.name})) > 0)")
        tokens = tokenize(v)
        counts.update(tokens)
        longest = max(longest, len(tokens))
    vocab = tuple(t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_VOCAB])
    return InputEncoder("text", col.name, vocab=vocab, vocab_size=len(vocab) + 2, max_len=min(MAX_LEN, longest))


def _fit_array_image(cur, src: exp.Subquery, col: Column, shape, fn: str) -> InputEncoder:
    if len(shape) != 3 or any(s is None or s <= 0 for s in shape):
        raise InvalidArgument(f"{fn}(): shape must be [channels, height, width] of positive sizes, got {list(shape)}")
    c, h, w = shape
    if c > MAX_CHANNELS:
        raise InvalidArgument(f"{fn}(): shape := [c, h, w] takes at most {MAX_CHANNELS} channels, got {c}")
    image_side(h, "shape", fn), image_side(w, "shape", fn)
    rows = _column_values(cur, src, col)
    x = np.stack([_array(v, c * h * w, i, col.name, fn) for i, v in enumerate(rows)]).reshape(len(rows), c, -1)
    mean, std = np.nanmean(x, axis=(0, 2)), np.nanstd(x, axis=(0, 2))
    return InputEncoder("image", col.name, shape=(c, h, w), mean=tuple(map(float, mean)),
                        std=tuple(float(s) if s > 0 else 1.0 for s in std))


def _blobs(cur, src: exp.Subquery, col: Column, limit: int | None = None):
    """The column's rows (the first ``limit``), streamed: (row number, bytes)."""
    query = exp.select(column(col.name)).from_(src)
    reader = cur.sql((query if limit is None else query.limit(limit)).sql("duckdb")).to_arrow_reader(1024)
    row = 0
    for batch in reader:
        for data in batch.column(0).to_pylist():
            yield row, data
            row += 1


def _fit_blob_image(cur, src: exp.Subquery, col: Column, image_size, fn: str) -> InputEncoder:
    """Every training image checked (an image, its size and mode), then the channel
    statistics over the first STATS_SAMPLE, summed as they are decoded: memory stays that
    of one image whatever the table's size."""
    if image_size is not None:
        if len(image_size) not in (1, 2):
            raise InvalidArgument(f"{fn}(): image_size must be [height, width] or one positive number")
        hw = tuple(image_side(s, "image_size", fn) for s in image_size) * (2 if len(image_size) == 1 else 1)
    sizes, grey = set(), True
    for row, data in _blobs(cur, src, col):
        image = open_image(data, row, col.name, fn)
        sizes.add(image.size)
        grey &= image.mode in ("L", "1", "I", "I;16", "F")
    if image_size is None and len(sizes) > 1:
        some = ", ".join(f"{w}x{h}" for w, h in sorted(sizes)[:3])
        raise InvalidArgument(f"{fn}(): images in column {col.name!r} have different sizes ({some}, ...); "
                              f"pass image_size := [height, width] (or one number) to resize them")
    if image_size is None:
        w, h = next(iter(sizes))
        hw = (image_side(h, "image_size", fn), image_side(w, "image_size", fn))
    c = 1 if grey else 3
    enc = InputEncoder("image", col.name, blob=True, shape=(c, *hw), resize=image_size is not None,
                       mean=(0.0,) * c, std=(1.0,) * c)
    total, squares, n = np.zeros(c), np.zeros(c), 0
    for row, data in _blobs(cur, src, col, STATS_SAMPLE):
        x = enc._pixels(open_image(data, row, col.name, fn)).reshape(c, -1).astype(np.float64) / 255.0
        total, squares, n = total + x.sum(1), squares + (x * x).sum(1), n + x.shape[1]
    mean = total / n
    std = np.sqrt(np.maximum(squares / n - mean * mean, 0.0))
    return InputEncoder(**{**enc.to_dict(), "mean": tuple(map(float, mean)),
                           "std": tuple(float(s) if s > 0 else 1.0 for s in std)})
