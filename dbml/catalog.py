"""The model catalog: tables in the user's database that hold every trained model.

``dbml_models`` has one row per (name, version) with everything needed to use the
model; ``dbml_weights`` holds its weights as a ``torch.save`` blob of plain tensors,
loaded with ``weights_only=True`` (never arbitrary pickles). A model is written in one
transaction, so the catalog never holds half of one.
"""

from __future__ import annotations

import io
import json
import math
import threading
from dataclasses import MISSING, dataclass, fields

import duckdb
import torch

from .errors import CatalogError, InvalidArgument, ModelNotFound
from .features import TASKS, Feature, Preprocessing
from .models import ModelConfig, build
from .zoo import arch as zoo_arch


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


def require_catalog(con: duckdb.DuckDBPyConnection) -> None:
    """On a database opened read-only dbml cannot create its catalog (sql/catalog.sql): it must be there."""
    found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
                        "AND table_name IN ('dbml_models', 'dbml_weights') AND NOT temporary").fetchall()[0][0]
    if found < 2:
        raise CatalogError("dbml.connect(): the database is open read-only and has no dbml catalog "
                           "(dbml_models, dbml_weights) to create; open it once without read_only "
                           "(dbml.connect(path)) so dbml can create it")


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
    try:
        zoo_arch(config.arch, fn="load")
    except InvalidArgument:
        raise ModelNotFound(f"model {name!r} version {version} was trained with arch {config.arch!r}, which is not "
                            f"registered in this process; call dbml.register_model({config.arch!r}, factory) "
                            f"(the same factory it was trained with) before using it") from None
    module = build(config)
    module.load_state_dict(torch.load(io.BytesIO(row[2]), weights_only=True))
    module.eval()
    return StoredModel(name, version, config, load_preprocessing(row[1], name, version), module)


# The schema of dbml_models.preprocessing: the fields of Preprocessing and Feature, each
# with the check its stored value must pass. Statistics reach generated SQL, so a model
# whose JSON does not match is refused when it is loaded, before any SQL is built.
FEATURE_KINDS = ("numeric", "categorical", "array")
_FIELD_CHECKS = {
    "float": lambda v: _is_number(v),
    "str": lambda v: isinstance(v, str),
    "tuple[str, ...]": lambda v: isinstance(v, list) and all(isinstance(c, str) for c in v),
    "tuple[float, ...]": lambda v: isinstance(v, list) and all(_is_number(c) for c in v),
    "tuple": lambda v: isinstance(v, list) and all(isinstance(c, (str, bool)) or _is_number(c) for c in v),
    "tuple[Feature, ...]": lambda v: isinstance(v, list),
    "InputEncoder | None": lambda v: v is None or isinstance(v, dict),   # checked by InputEncoder.from_dict
}


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load_preprocessing(text: str, name: str, version: int) -> Preprocessing:
    """A stored model's preprocessing, checked against its schema; CatalogError names what is wrong."""
    try:
        problem = _schema_problem(json.loads(text))
        prep = None if problem else Preprocessing.from_json(text)
    except ValueError as e:
        problem = f"it is not JSON ({str(e)[:80]})"
    except CatalogError as e:   # the input encoder's own check (InputEncoder.from_dict)
        problem = f"input: {e}"
    if problem:
        raise CatalogError(f"model {name!r} version {version}: dbml_models.preprocessing is invalid: {problem}; "
                           f"the row was edited or damaged: retrain it with train({name!r}, ...) "
                           f"or remove it with drop_model({name!r})")
    return prep


def _schema_problem(d) -> str | None:
    problem = _record_problem(d, Preprocessing, "")
    if problem:
        return problem
    if d["task"] not in TASKS:
        return f"task is {d['task']!r}, not one of {', '.join(TASKS)}"
    if not d["target_std"] > 0:
        return f"target_std is {d['target_std']!r}, not positive"
    for i, f in enumerate(d["features"]):
        problem = _record_problem(f, Feature, f"features[{i}].")
        if problem:
            return problem
        if f["kind"] not in FEATURE_KINDS:
            return f"features[{i}].kind is {f['kind']!r}, not one of {', '.join(FEATURE_KINDS)}"
        if not f["std"] > 0:
            return f"features[{i}].std is {f['std']!r}, not positive"
        if not all(s > 0 for s in f.get("stds", ())):
            return f"features[{i}].stds has a value that is not positive"
        if f["kind"] == "array" and len(f.get("means", ())) != len(f.get("stds", ())):
            return f"features[{i}] has {len(f['means'])} means and {len(f['stds'])} stds"
    return None


def _record_problem(d, cls, where: str) -> str | None:
    """Missing, unknown or mistyped keys of one JSON object stored for dataclass ``cls``."""
    if not isinstance(d, dict):
        return f"{where or 'the value'} is {type(d).__name__}, not an object"
    expected = {f.name: str(f.type) for f in fields(cls)}
    optional = {f.name for f in fields(cls) if f.default is not MISSING or f.default_factory is not MISSING}
    unknown = sorted(set(d) - set(expected))
    missing = sorted(set(expected) - set(d) - optional)   # older models lack newer optional keys
    if unknown or missing:
        return f"{where}{(unknown or missing)[0]} is {'unknown' if unknown else 'missing'}"
    for key, annotation in expected.items():
        if key in d and not _FIELD_CHECKS[annotation](d[key]):
            return f"{where}{key} is {json.dumps(d[key])[:60]}, not a valid {annotation}"
    return None


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
