"""The model catalog: tables in the user's database that hold every trained model.

``dbml_models`` has one row per (name, version) with everything needed to use the
model; ``dbml_weights`` holds its weights as a ``torch.save`` blob of plain tensors,
loaded with ``weights_only=True`` (never arbitrary pickles). A model is written in one
transaction, so the catalog never holds half of one.
"""

from __future__ import annotations

import io
import json
import threading
from dataclasses import dataclass

import duckdb
import torch

from .errors import CatalogError, ModelNotFound
from .features import Preprocessing
from .models import ModelConfig, build


# Writers of this process take versions one at a time (_WRITES), so two jobs finishing
# together store consecutive versions. A writer outside it (another connection's own
# transaction) can still take a version first: then the insert conflicts and the write is
# retried with the next version.
WRITE_ATTEMPTS = 10
_WRITES = threading.Lock()


@dataclass
class StoredModel:
    name: str
    version: int
    config: ModelConfig
    preprocessing: Preprocessing
    module: torch.nn.Module


def next_job_id(cur: duckdb.DuckDBPyConnection) -> int:
    return cur.execute("SELECT nextval('dbml_job_ids')").fetchall()[0][0]


def weights_blob(module: torch.nn.Module) -> bytes:
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}, buf)
    return buf.getvalue()


def write(cur: duckdb.DuckDBPyConnection, *, name: str, config: ModelConfig, prep: Preprocessing,
          params: dict, metrics: dict, rows: int, module: torch.nn.Module) -> int:
    """Store a new version of ``name`` in one transaction; return its version.

    The version is taken inside the transaction (the latest + 1), under ``_WRITES``; on a
    conflict with another writer (a duplicate key or a write-write conflict) the transaction
    is rolled back and retried with the version then next. Model row and weights are
    committed together or not at all.
    """
    blob = weights_blob(module)
    row = [config.arch, prep.task, prep.feature_names, prep.label, config.to_json(), prep.to_json(),
           json.dumps(params), json.dumps(metrics), rows]
    for attempt in range(WRITE_ATTEMPTS):
        try:
            with _WRITES:
                return _insert(cur, name, row, blob)
        except (duckdb.TransactionException, duckdb.ConstraintException):
            if attempt == WRITE_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _insert(cur: duckdb.DuckDBPyConnection, name: str, row: list, blob: bytes) -> int:
    cur.execute("BEGIN TRANSACTION")
    try:
        version = cur.execute("SELECT coalesce(max(version), 0) + 1 FROM dbml_models WHERE name = ?",
                              [name]).fetchall()[0][0]
        cur.execute("INSERT INTO dbml_models VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, current_localtimestamp(), ?)",
                    [name, version, *row, len(blob)])
        cur.execute("INSERT INTO dbml_weights VALUES (?, ?, ?)", [name, version, blob])
        cur.execute("COMMIT")
        return version
    except BaseException:
        _rollback(cur)
        raise


def _rollback(cur: duckdb.DuckDBPyConnection) -> None:
    """Roll back the open transaction, if a failed COMMIT has not already ended it."""
    try:
        cur.execute("ROLLBACK")
    except duckdb.TransactionException:
        pass


def latest_version(cur: duckdb.DuckDBPyConnection, name: str, *, fn: str) -> int:
    row = cur.execute("SELECT max(version) FROM dbml_models WHERE name = ?", [name]).fetchall()[0]
    if row[0] is None:
        raise ModelNotFound(f"{fn}(): no model named {name!r}; train it first with train({name!r}, ...) "
                            f"or pick one from SELECT name FROM dbml_models")
    return row[0]


def load(cur: duckdb.DuckDBPyConnection, name: str, version: int) -> StoredModel:
    rows = cur.execute("""SELECT m.config, m.preprocessing, w.weights
                         FROM dbml_models m JOIN dbml_weights w USING (name, version)
                         WHERE name = ? AND version = ?""", [name, version]).fetchall()
    if not rows:
        raise CatalogError(f"model {name!r} version {version} has no weights in dbml_weights")
    row = rows[0]
    config = ModelConfig.from_json(row[0])
    module = build(config)
    module.load_state_dict(torch.load(io.BytesIO(row[2]), weights_only=True))
    module.eval()
    return StoredModel(name, version, config, Preprocessing.from_json(row[1]), module)


def drop(cur: duckdb.DuckDBPyConnection, name: str, *, fn: str = "drop_model") -> int:
    """Delete every version of ``name``; return how many there were."""
    latest_version(cur, name, fn=fn)
    with _WRITES:
        return _delete(cur, name)


def _delete(cur: duckdb.DuckDBPyConnection, name: str) -> int:
    cur.execute("BEGIN TRANSACTION")
    try:
        n = cur.execute("SELECT count(*) FROM dbml_models WHERE name = ?", [name]).fetchall()[0][0]
        cur.execute("DELETE FROM dbml_weights WHERE name = ?", [name])
        cur.execute("DELETE FROM dbml_models WHERE name = ?", [name])
        cur.execute("COMMIT")
        return n
    except BaseException:
        _rollback(cur)
        raise
