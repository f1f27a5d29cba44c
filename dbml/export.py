"""ONNX export of a stored model, with its preprocessing folded in where it can be.

``export_model(con, model, path)`` (SQL: ``export_model(model, path)``) writes one version
of a model as an ONNX file that runs where dbml does not (onnxruntime, DuckDB's ONNX
extensions). What the exported graph takes, per input kind:

* tabular, numeric features: ``features`` FLOAT[batch, k], the raw values in the model's
  feature order (``input_names`` of the result), NaN for NULL. The standardisation dbml
  learned at training (and NULL/non-finite → 0) is part of the graph.
* tabular with categorical features: ``features`` FLOAT[batch, width], the encoded vector
  (the one-hot encoding of strings is not an ONNX op on a float input); the SQL that builds
  it is in the file's metadata (``dbml.features_sql``).
* images: ``image`` FLOAT[batch, channels, height, width], pixels scaled to [0, 1]; the
  per-channel normalisation is in the graph, decoding and resizing PNG/JPEG are not.
* text and token ids: ``tokens`` INT64[batch, length], ids as dbml encodes them
  (``index in the vocabulary + 2``, 1 unknown, 0 padding; the vocabulary is in the
  metadata: ``dbml.vocab`` for text, ``dbml.token_ids`` for token ids). Tokenisation is
  not in the graph; ``dbml.tokenizer`` (JSON, ``inputs.tokenizer_rule``) says how dbml
  does it: ``lowercase`` (Python's ``str.lower``), ``pattern`` (a Python ``re`` pattern
  whose matches are the tokens), ``ids``, ``unknown``, ``padding``, ``no_tokens`` (the ids
  of a text without tokens) and ``max_len``. ``dbml.max_len`` is the longest sequence the
  model takes; the graph cuts longer ones (as dbml's predict does), so any length runs.
* series: ``series`` FLOAT[batch, length], NaN for NULL and for padding; the scaling
  (``dbml.series_scale``: 'global', with the training mean and std in ``dbml.series_mean``
  and ``dbml.series_std``, or 'row') and the cut at ``dbml.max_len`` steps are in the graph.

Outputs: classifiers ``logits`` and ``probabilities`` (softmax; class order in the
metadata, ``dbml.classes``); regressors ``value``, unscaled to the label's units. The batch
dimension (and the token length) are dynamic. The file is written to a temporary name
and renamed, so a failed export leaves nothing; an existing file is replaced only with
``overwrite``.
"""

from __future__ import annotations

import json
import os
import secrets
import warnings
from pathlib import Path

import torch
from torch import nn

from .core import catalog
from .errors import InvalidArgument
from .core.input_modules import Truncate
from .core.inputs import tokenizer_rule
from .zoo import fitter

__all__ = ["export_model", "ExportedModel"]

OPSET = 17


class ExportedModel(nn.Module):
    """The stored network with dbml's input scaling before it and its output mapping after:
    the same modules predict() runs (``Preprocessing.standardiser``, ``InputEncoder.normaliser``)."""

    def __init__(self, stored: catalog.StoredModel):
        super().__init__()
        prep = stored.preprocessing
        self.net = stored.module.eval()
        self.classify = prep.task == "classification"
        enc = prep.input
        self.scale = prep.standardiser() if enc is None and prep.all_numeric else nn.Identity() if enc is None \
            else enc.normaliser if enc.kind == "image" else enc.series_scale if enc.kind == "series" \
            else Truncate(enc.max_len)
        self.target_mean, self.target_std = float(prep.target_mean), float(prep.target_std)

    def forward(self, x: torch.Tensor):
        out = self.net(self.scale(x))
        if self.classify:
            return out, torch.softmax(out, dim=1)
        return out.squeeze(-1) * self.target_std + self.target_mean


def _example(stored: catalog.StoredModel) -> tuple[str, torch.Tensor, dict]:
    """The input's name, an example tensor and its dynamic axes."""
    prep = stored.preprocessing
    enc = prep.input
    if enc is None:
        return "features", torch.zeros(2, prep.width), {0: "batch"}
    if enc.kind == "image":
        return "image", torch.zeros(2, *enc.shape), {0: "batch"}
    if enc.kind == "series":
        return "series", torch.zeros(2, min(8, enc.max_len)), {0: "batch", 1: "length"}
    return "tokens", torch.ones(2, min(8, enc.max_len), dtype=torch.int64), {0: "batch", 1: "length"}


def _metadata(stored: catalog.StoredModel, input_name: str) -> dict[str, str]:
    prep = stored.preprocessing
    meta = {"dbml.model": stored.name, "dbml.version": str(stored.version), "dbml.task": prep.task,
            "dbml.input": input_name, "dbml.features": json.dumps(prep.input_names if prep.input is None
                                                                  else [prep.input.column])}
    if prep.task == "classification":
        meta["dbml.classes"] = json.dumps([c if isinstance(c, (int, float, str)) else str(c) for c in prep.classes])
    if prep.input is None and not prep.all_numeric:
        meta["dbml.features_sql"] = prep.features_sql().sql("duckdb")
    enc = prep.input
    if enc is not None and enc.kind != "image":
        meta["dbml.max_len"] = str(enc.max_len)
    if enc is not None and enc.kind == "text":
        meta["dbml.vocab"] = json.dumps(list(enc.vocab))
        meta["dbml.tokenizer"] = json.dumps(tokenizer_rule(enc))
    if enc is not None and enc.kind == "series":
        meta["dbml.series_scale"] = enc.scale
        if enc.scale == "global":
            meta["dbml.series_mean"], meta["dbml.series_std"] = repr(enc.mean[0]), repr(enc.std[0])
    if prep.input is not None and prep.input.ids:
        meta["dbml.token_ids"] = json.dumps(list(prep.input.ids))   # a token id's model id: index + 2
    return meta


def _target(cur, path: str, overwrite: bool) -> Path:
    """Where the file goes, or InvalidArgument naming why not. The same rules as DuckDB's
    own ``COPY ... TO``: nothing is written while ``enable_external_access`` is false (but
    under its ``allowed_directories`` / ``allowed_paths``), and never over a database file
    attached to the instance (or its WAL), from a read-only connection neither."""
    if not isinstance(path, str) or not path.strip():
        raise InvalidArgument("export_model(): path must be a file name, e.g. export_model('m', 'm.onnx')")
    if "\0" in path:   # no file system names a file so (os.path's ValueError: embedded null byte)
        raise InvalidArgument(f"export_model(): path {path!r} holds a NUL byte (chr(0)), which no file name can "
                              f"hold; pass the path without it")
    target = Path(path).expanduser()
    resolved = Path(os.path.realpath(target))
    _allowed(cur, path, resolved)
    for db in _database_files(cur):
        if resolved in (db, Path(f"{db}.wal")):
            raise InvalidArgument(f"export_model(): {path!r} is the file of the attached database "
                                  f"{db.name!r}; writing there would destroy it; choose another path")
    if target.exists() and target.is_dir():
        raise InvalidArgument(f"export_model(): {path!r} is a folder; give a file name such as {path}/model.onnx")
    if target.exists() and not overwrite:
        raise InvalidArgument(f"export_model(): {path!r} exists; pass overwrite := true to replace it, "
                              f"or choose another path")
    if not target.parent.is_dir():
        raise InvalidArgument(f"export_model(): the folder {str(target.parent)!r} does not exist; create it "
                              f"or choose another path")
    return target


def _database_files(cur) -> list[Path]:
    rows = cur.execute("SELECT path FROM duckdb_databases() WHERE path IS NOT NULL AND path <> ''").fetchall()
    return [Path(os.path.realpath(r[0])) for r in rows]


def _allowed(cur, path: str, resolved: Path) -> None:
    external, dirs, paths = cur.execute(
        "SELECT current_setting('enable_external_access'), current_setting('allowed_directories'), "
        "current_setting('allowed_paths')").fetchall()[0]
    if external:
        return
    inside = any(resolved == Path(os.path.realpath(d)) or Path(os.path.realpath(d)) in resolved.parents
                 for d in dirs or ())
    if not inside and resolved not in {Path(os.path.realpath(p)) for p in paths or ()}:
        raise InvalidArgument(f"export_model(): cannot write {path!r}: enable_external_access is false, so DuckDB "
                              f"writes no files outside allowed_directories and allowed_paths, and neither does dbml")


def _temporary(folder: Path) -> str:
    """A new empty file beside the target, created with mode 0666 less the umask (as any
    file the user writes; mkstemp's 0600 would not be), to rename over it once complete."""
    while True:
        name = folder / f".{secrets.token_hex(8)}.onnx.tmp"
        try:
            os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return str(name)
        except FileExistsError:
            continue


def export_model(cur, model: str, path: str, version: int | None = None, overwrite: bool = False) -> dict:
    """Write ``model`` (its latest version, or ``version``) to ``path`` as ONNX; what was written."""
    import onnx   # noqa: F401 - the onnx extra (pip install 'dbml[onnx]'): missing, an ImportError here, before anything is written

    try:
        target = _target(cur, path, overwrite)
    except OSError as e:
        raise InvalidArgument(f"export_model(): cannot write {path!r} ({e.strerror or e}); choose another "
                              f"path") from None
    model, version, _ = catalog.resolve(cur, model, version, fn="export_model")
    stored = catalog.load(cur, model, version)
    if fitter(stored.config.arch) is not None:   # LightGBM's trees run outside torch; k-means outputs a centroid id
        raise InvalidArgument(f"export_model(): model {model!r} is a {stored.config.arch} model, which the ONNX "
                              f"export does not cover (networks are exported: linear, mlp, dnn, ...)")
    wrapper = ExportedModel(stored)
    input_name, example, axes = _example(stored)
    outputs = ["logits", "probabilities"] if wrapper.classify else ["value"]
    try:
        _write(wrapper, stored, target, input_name, example, axes, outputs)
    except OSError as e:
        raise InvalidArgument(f"export_model(): cannot write {path!r} ({e.strerror or e}); choose another "
                              f"path") from None
    return {"path": str(target), "bytes": target.stat().st_size, "version": version, "input": input_name,
            "outputs": outputs, "features": json.loads(_metadata(stored, input_name)["dbml.features"])}


def _write(wrapper, stored, target: Path, input_name: str, example, axes, outputs) -> None:
    """The ONNX file, written to a temporary name beside ``target`` and renamed over it."""
    import onnx

    tmp = _temporary(target.parent)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")   # the TorchScript exporter's deprecation notice
            torch.onnx.export(wrapper, (example,), tmp, dynamo=False, opset_version=OPSET,
                              input_names=[input_name], output_names=outputs,
                              dynamic_axes={input_name: axes, **{o: {0: "batch"} for o in outputs}})
        proto = onnx.load(tmp)
        onnx.helper.set_model_props(proto, _metadata(stored, input_name))
        onnx.checker.check_model(proto)
        onnx.save(proto, tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
