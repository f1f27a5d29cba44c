"""The model catalog: tables in the user's database that hold every trained model.

They live in a schema of their own, the catalog's *home* (``dbml.core.home``: ``dbml``, unless
the user has a schema of that name; ``sql/catalog.sql``). Statements here name the tables
``dbml.models`` etc. and run through ``home.sql``, which puts the home in: ``dbml.models`` has one
row per (name, version) with everything needed to use the model and a ``uid`` no other
stored model ever has; ``dbml.weights`` holds its weights as a ``torch.save`` blob of plain
tensors, loaded with ``weights_only=True`` (never arbitrary pickles). A model is written
in one transaction, so the catalog never holds half of one. Users read them through the
TEMP views ``dbml_models`` and ``dbml_weights``; a database written by an older dbml (its
tables in ``main``) is moved here when dbml is first installed on it writable (``home.older``).
"""

from __future__ import annotations

import difflib
import functools
import io
import json
import math
import threading
from dataclasses import MISSING, dataclass, fields

import duckdb
import numpy as np
import pyarrow as pa
import torch
from sqlglot import exp

from ..errors import CatalogError, InvalidArgument, ModelNotFound, TrainingError
from . import home
from .features import TASKS, Feature, Preprocessing
from .models import ModelConfig, build
from ..zoo import arch as zoo_arch


# Writers of this process take versions one at a time (_WRITES), so two jobs finishing
# together store consecutive versions. A writer outside it (another connection's own
# transaction) can still take a version first: then the insert conflicts and the write is
# retried with the next version.
WRITE_ATTEMPTS = 10
_WRITES = threading.Lock()


MODELS, WEIGHTS = "dbml.models", "dbml.weights"   # as statements name them: home.render places them
TRIALS = "dbml.trials"   # tune()'s trials (dbml.trials), dropped with their model
DEPLOYMENTS = "dbml.deployments"   # the version each pinned model serves (deploy())

# The catalog's statements, built once as sqlglot trees and rendered where they run; values
# are bound parameters (?).
D = "duckdb"
_MODELS, _WEIGHTS, _TRIALS, _DEPLOYMENTS = (exp.to_table(t, dialect=D) for t in (MODELS, WEIGHTS, TRIALS, DEPLOYMENTS))
_BY_NAME = "name = ?"
NEXT_VERSION = exp.select("coalesce(max(version), 0) + 1", dialect=D).from_(_MODELS).where(_BY_NAME, dialect=D)
# dbml.models' columns in order: name, version and 9 more bound, created, the blob's size (bound), uid.
INSERT_MODEL = exp.insert(exp.values([(*[exp.Placeholder()] * 11, exp.func("current_localtimestamp"),
                                       exp.Placeholder(), exp.func("gen_random_uuid"))]), _MODELS)
IDENTIFY = (exp.select("version", "uid::VARCHAR", dialect=D).from_(_MODELS)
            .where("name = ? AND (? IS NULL OR version = ?)", dialect=D).order_by("version DESC", dialect=D).limit(1))
COUNT_MODELS = exp.select("count(*)").from_(_MODELS).where(_BY_NAME, dialect=D)
MODEL_NAMES = exp.select("name").distinct().from_(_MODELS).order_by("name")
VERSION_OF_UID = exp.select("version").from_(_MODELS).where("name = ? AND uid::VARCHAR = ?", dialect=D)
LOAD = (exp.select("m.config", "m.preprocessing", "w.weights", "m.uid::VARCHAR", dialect=D)
        .from_(_MODELS.as_("m")).join(_WEIGHTS.as_("w"), using=["name", "version"])
        .where("name = ? AND version = ? AND (? IS NULL OR m.uid::VARCHAR = ?)", dialect=D))
COUNT_TRIALS = exp.select("count(*)").from_(_TRIALS).where("model = ?", dialect=D)
PINNED = exp.select("version").from_(_DEPLOYMENTS).where("model = ?", dialect=D)
UNPIN = exp.delete(_DEPLOYMENTS, where="model = ?", dialect=D)
PIN = exp.insert(exp.values([(exp.Placeholder(), exp.Placeholder(), exp.func("current_localtimestamp"))]),
                 _DEPLOYMENTS)
DELETE_MODEL = (exp.delete(_TRIALS, where="model = ?", dialect=D), UNPIN,
                exp.delete(_WEIGHTS, where=_BY_NAME, dialect=D), exp.delete(_MODELS, where=_BY_NAME, dialect=D))


@dataclass
class StoredModel:
    name: str
    version: int
    config: ModelConfig
    preprocessing: Preprocessing
    module: torch.nn.Module
    uid: str = ""          # dbml.models.uid: this stored model and no other, ever

    @functools.cached_property
    def standardiser(self):
        """Its preprocessing's ``Standardise`` module, made once per loaded model."""
        return self.preprocessing.standardiser()




def weights_blob(module: torch.nn.Module) -> bytearray:
    """The module's weights as a ``torch.save`` blob, in one buffer of exactly its size.

    ``torch.save`` runs twice, sizing then filling (it writes the same bytes every time):
    into a ``BytesIO`` the blob grew by copies and ``getvalue`` copied it once more, up to
    three model-sized buffers at once where one is needed (issue 29)."""
    state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    size = _Sink()
    torch.save(state, size)
    blob = bytearray(size.written)
    filled = _Sink(memoryview(blob))
    torch.save(state, filled)
    if filled.written != len(blob):
        raise AssertionError(f"torch.save wrote {filled.written} bytes, then {len(blob)}")
    return blob


class _Sink:
    """A file ``torch.save`` writes to: it counts the bytes, and copies them into ``into``
    when given (sized by a counting pass before)."""

    def __init__(self, into: memoryview | None = None):
        self.into, self.written = into, 0

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        if self.into is not None:
            self.into[self.written:self.written + n] = memoryview(data).cast("B")
        self.written += n
        return n

    def flush(self) -> None:
        pass


def _weights_row(name: str, version: int, blob: bytearray) -> pa.Table:
    """The weights row as an Arrow table over ``blob``, not a copy of it: DuckDB copies a
    blob passed as a parameter into a value, then that into its storage (and more), where
    an Arrow scan reads it in place."""
    offsets = pa.py_buffer(np.array([0, len(blob)], dtype=np.int64))
    weights = pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(blob)])
    return pa.table({"name": [name], "version": pa.array([version], pa.int32()), "weights": weights})


def write(cur: duckdb.DuckDBPyConnection, *, name: str, config: ModelConfig, prep: Preprocessing,
          params: dict, metrics: dict, rows: int, module: torch.nn.Module) -> int:
    """Store a new version of ``name`` in one transaction; return its version.

    The version is taken inside the transaction (the latest + 1), under ``_WRITES``; on a
    conflict with another writer (a duplicate key or a write-write conflict) the transaction
    is rolled back and retried with the version then next. Model row and weights are
    committed together or not at all.
    """
    stored = prep.to_json()
    load_preprocessing(stored, name, 0, writing=True)   # what load would refuse is never written
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


def _insert(cur: duckdb.DuckDBPyConnection, name: str, row: list, blob: bytearray) -> int:
    cur.execute("BEGIN TRANSACTION")
    try:
        version = cur.execute(home.sql(cur, NEXT_VERSION), [name]).fetchall()[0][0]
        cur.execute(home.sql(cur, INSERT_MODEL), [name, version, *row, len(blob)])
        cur.from_arrow(_weights_row(name, version, blob)).insert_into(home.of(cur).name("weights"))
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


# How every dbml function names a model: 'churn' (the version it serves: the one deploy() pinned,
# else its latest), 'churn@2' (version 2), 'churn@latest' (its latest, pinned or not).
VERSION_MARK, LATEST = "@", "latest"


def model_ref(name: str, version: int | None = None, *, fn: str) -> tuple[str, int | str | None]:
    """(model, version) that ``name`` (and a function's own ``version`` argument) names: version
    an int, LATEST, or None (the version the model serves)."""
    base, mark, suffix = name.rpartition(VERSION_MARK) if isinstance(name, str) else ("", "", "")
    if not mark or not base or not (suffix.isdigit() or suffix == LATEST):
        return name, version
    named = LATEST if suffix == LATEST else int(suffix)
    if version is not None and version != named:
        raise InvalidArgument(f"{fn}(): {name!r} names version {suffix} and version := {version} another; "
                              f"pass one of them")
    return base, named


def pinned_version(cur: duckdb.DuckDBPyConnection, name: str, where: home.Home | None = None) -> int | None:
    """The version deploy() pinned ``name`` to, if any (an older catalog opened read-only has no pins);
    ``where``: the catalog's home, if the caller has it."""
    try:
        rows = cur.execute(home.render(PINNED, where or home.of(cur)), [name]).fetchall()
    except duckdb.CatalogException:   # no dbml.deployments
        return None
    return rows[0][0] if rows else None


def latest_version(cur: duckdb.DuckDBPyConnection, name: str, *, fn: str) -> int:
    return identify(cur, model_ref(name, fn=fn)[0], LATEST, fn=fn)[0]


def resolve(cur: duckdb.DuckDBPyConnection, name: str, version: int | str | None, *, fn: str) -> tuple[str, int, str]:
    """(model, version, uid) that ``name`` and ``version`` name (``model_ref``): the one place that
    turns what a user passed into a stored model; ModelNotFound naming the fix."""
    name, version = model_ref(name, version, fn=fn)
    where = home.of(cur)   # once: every predict() call resolves its model
    if version is None:
        version = pinned_version(cur, name, where)
    latest = version is None or version == LATEST
    rows = cur.execute(home.render(IDENTIFY, where), [name, None if latest else version,
                                                      None if latest else version]).fetchall()
    if not rows and not latest and identify_any(cur, name):
        quoted = exp.Literal.string(name).sql(D)   # the suggested statement can be pasted
        raise ModelNotFound(f"{fn}(): model {name!r} has no version {version}; pass one of "
                            f"SELECT version FROM dbml_models WHERE model = {quoted}, e.g. "
                            f"{exp.Literal.string(name + '@1').sql(D)}, or leave the version out")
    if not rows:
        raise ModelNotFound(f"{fn}(): no model named {name!r}; train it first with train({name!r}, ...) "
                            f"or pick one from SELECT name FROM dbml_models")
    return name, rows[0][0], rows[0][1]


def identify(cur: duckdb.DuckDBPyConnection, name: str, version: int | str | None, *, fn: str) -> tuple[int, str]:
    """(version, uid) of model ``name``'s ``version`` (None: the version it serves): ``resolve``."""
    return resolve(cur, name, version, fn=fn)[1:]


def deploy(cur: duckdb.DuckDBPyConnection, name: str, version: int | None, *, fn: str = "deploy") -> dict:
    """Pin the version ``name`` serves (``version``, or 'churn@2'), or, with neither (or
    'churn@latest'), unpin it: it serves its latest again. The version it serves now."""
    model, asked = model_ref(name, version, fn=fn)
    pin = asked is not None and asked != LATEST
    served = resolve(cur, model, asked if pin else LATEST, fn=fn)[1]
    with _WRITES:
        cur.execute("BEGIN TRANSACTION")
        try:
            cur.execute(home.sql(cur, UNPIN), [model])
            if pin:
                cur.execute(home.sql(cur, PIN), [model, served])
            cur.execute("COMMIT")
        except BaseException:
            _rollback(cur)
            raise
    return {"model": model, "version": served, "pinned": pin}


def identify_any(cur: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(cur.execute(home.sql(cur, COUNT_MODELS), [name]).fetchall()[0][0])


def load_uid(cur: duckdb.DuckDBPyConnection, name: str, uid: str, *, fn: str) -> StoredModel:
    """The stored model ``uid`` of ``name``; ModelNotFound if it was dropped or replaced."""
    rows = cur.execute(home.sql(cur, VERSION_OF_UID), [name, uid]).fetchall()
    if not rows:
        raise ModelNotFound(f"{fn}(): model {name!r} was dropped or replaced while the statement ran; run it again")
    return load(cur, name, rows[0][0], uid)


def load(cur: duckdb.DuckDBPyConnection, name: str, version: int, uid: str | None = None) -> StoredModel:
    """Version ``version`` of ``name`` (and, given ``uid``, only if it is still that stored model)."""
    rows = cur.execute(home.sql(cur, LOAD), [name, version, uid, uid]).fetchall()
    if not rows and uid is not None:
        raise ModelNotFound(f"model {name!r} version {version} was dropped or replaced while the statement ran; "
                            f"run it again")
    if not rows:
        raise CatalogError(f"model {name!r} version {version} has no weights in dbml.weights")
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
    return StoredModel(name, version, config, load_preprocessing(row[1], name, version), module, row[3])


# The schema of dbml.models.preprocessing: the fields of Preprocessing and Feature, each
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


def load_preprocessing(text: str, name: str, version: int, *, writing: bool = False) -> Preprocessing:
    """A stored model's preprocessing, checked against its schema; CatalogError names what is wrong.
    ``writing``: the check before a model is stored (TrainingError: the training data gave
    statistics no model can be used with)."""
    try:
        problem = _schema_problem(json.loads(text))
        prep = None if problem else Preprocessing.from_json(text)
    except ValueError as e:
        problem = f"it is not JSON ({str(e)[:80]})"
    except CatalogError as e:   # the input encoder's own check (InputEncoder.from_dict)
        problem = f"input: {e}"
    if problem and writing:
        raise TrainingError(f"train(): the statistics fitted on the source cannot be stored ({problem}); nothing "
                            f"was stored; leave out or clip values beyond FLOAT's range (about 3.4e38)")
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
    """Delete every version of ``name`` and its tune() trials; return how many versions there were.
    A model with trials but no version (no trial finished) is dropped too."""
    model, version = model_ref(name, fn=fn)
    if version is not None:
        raise InvalidArgument(f"{fn}(): {name!r} names one version, and {fn} drops every version of a model; "
                              f"pass its name, {fn}({model!r}), or serve another version with deploy({model!r}, "
                              f"version := ...)")
    if not cur.execute(home.sql(cur, COUNT_TRIALS), [name]).fetchall()[0][0] and not identify_any(cur, name):
        names = [r[0] for r in cur.execute(home.sql(cur, MODEL_NAMES)).fetchall()]
        close = difflib.get_close_matches(name, names, n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        raise ModelNotFound(f"{fn}(): there is no model named {name!r} to drop{guess}; nothing was dropped. "
                            f"SELECT name FROM dbml_models lists the models" +
                            (f" ({len(names)} now)" if names else " (there are none)"))
    with _WRITES:
        return _delete(cur, name)


def _delete(cur: duckdb.DuckDBPyConnection, name: str) -> int:
    cur.execute("BEGIN TRANSACTION")
    try:
        n = cur.execute(home.sql(cur, COUNT_MODELS), [name]).fetchall()[0][0]
        for statement in DELETE_MODEL:
            cur.execute(home.sql(cur, statement), [name])
        cur.execute("COMMIT")
        return n
    except BaseException:
        _rollback(cur)
        raise
