"""Module-level mutable state has an owner: per-database state lives on the database's
``Instance``, per-process state on the one runtime (``dbml.core.runtime``), and what is left at
module level is a registry of built-ins or a cache of a pure fact, each named below with
the reason it may stay (``docs/architecture.md`` is to name the same).

A holder is found by reading the modules (``ast``), not by running them: a module-level
name rebound with ``global``, or mutated by the module's own functions (item assignment,
``del``, or a mutating method: ``append``, ``add``, ``update``, ``setdefault``, ...); a
module-level lock, thread-local, counter, weak map or ordered dict; a function memoised
with ``functools.cache``/``lru_cache``. Writes to the process outside Python's objects
(the SIGINT handler, ``os.environ``, ``mallopt``) have one place each.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("dbml",)

# "module:name" -> why it may stay at module level. Two kinds only: a registry of built-ins
# (filled at import, or by dbml's own modules, never by a job or a connection), and a cache
# of a pure fact (a probe, a file read, an analysis: recomputing it gives the same answer).
ALLOWED = {
    # --- the one runtime objects --------------------------------------------------------------
    "dbml/core/runtime.py:_RUNTIME": "the process's one Runtime: runtime() returns it, reset() empties it",
    "dbml/scheduler/multijob/registry.py:DEVICES":
        "the scheduler's device schedulers and ledgers (it imports nothing of dbml); the runtime resets it",
    "dbml/udfs/__init__.py:f": "no state: f.<name> is a proxy that imports udfs.functions at the first call",
    "dbml/scheduler/procmem.py:_SAMPLER": "the process's one RSS sampler thread (per process by nature)",
    # --- registries of built-ins --------------------------------------------------------------
    "dbml/zoo/registry.py:_CUSTOM": "architectures registered beside the zoo's: dbml/core/kinds' at import, and Python "
                               "factories a user registers (dbml.register_model: code lives in the process)",
    "dbml/zoo/registry.py:_LOCK": "guards the registry _CUSTOM",
    "dbml/core/source.py:_REFUSED": "functions a source may not call: DuckDB's, and dbml's (dbml.udfs at import)",
    "dbml/core/source.py:_REFUSED_CALL": "the regex over plan text compiled from _REFUSED (the same registry)",
    "dbml/core/placement.py:BACKENDS": "placement backends by name (dbml.cluster.backend for Ray); register() adds one",
    "dbml/zoo/registry.py:_KINDS_LOADED": "whether the built-in kinds (dbml.core.kinds) are in _CUSTOM yet (the registry)",
    "dbml/zoo/registry.py:_KINDS_LOCK": "guards _KINDS_LOADED",
    # --- caches of pure facts -----------------------------------------------------------------
    "dbml/search/stacking.py:_BMM_PROBE_CACHE": "probe: whether batched matmuls give each member the single model's bits",
    "dbml/core/latency.py:_PREDICTOR_CACHE": "the latency predictor loaded from the cache folder, per (device, threads)",
    "dbml/core/latency.py:_LOCK": "guards _PREDICTOR_CACHE",
    "dbml/core/duckmem.py:default_limit": "functools.cache: DuckDB's default memory_limit on this machine",
    "dbml/core/forward_memory.py:forward_bytes": "lru_cache: a forward pass's measured bytes for an architecture and shape",
    "dbml/core/forward_memory.py:rows_within": "lru_cache: the rows that fit a budget, from forward_bytes",
    "dbml/shell/render.py:_keywords": "lru_cache: DuckDB's keyword list",
    "dbml/core/threads.py:per_thread": "lru_cache: the thread-local holder of per-thread torch settings (one object)",
    "dbml/udfs/functions.py:_encoder": "lru_cache: a model's input encoder decoded from its catalog JSON",
    "dbml/udfs/types.py:sql": "functools.cache: a DuckDB type parsed from its name",
    "dbml/udfs/__init__.py:macro_definitions": "functools.cache: what dbml's own macros' definitions say (sql/macros.sql, "
                                               "the generated train and tune), and the generated ones' SQL",
    "dbml/udfs/__init__.py:macro_signatures": "functools.cache: each of dbml's own macros' parameters, from its definition",
    "dbml/scheduler/graph/graphkey.py:_file_hash": "lru_cache: a source file's hash",
    "dbml/scheduler/graph/graphs.py:_SHARED_GRAPHS": "captured graphs by architecture and shapes (LRU)",
    "dbml/scheduler/graph/graphs.py:_SHARED_KEY_LOCKS": "one capture at a time per _SHARED_GRAPHS key",
    "dbml/scheduler/graph/graphs.py:_SHARED_LOCK": "guards _SHARED_GRAPHS",
    "dbml/scheduler/plan/liveness.py:_CACHE": "a sequence's liveness analysis, kept while the sequence lives",
    "dbml/scheduler/plan/liveness.py:_CACHE_LOCK": "guards the liveness _CACHE",
    "dbml/scheduler/latency/estimate.py:_MACHINES": "probe: the roofline's measured machine per device",
    "dbml/scheduler/execute/spill.py:_tiers": "probe: a file system's measured write/read speed, by st_dev",
    "dbml/scheduler/execute/spill.py:_tiers_lock": "guards _tiers",
    "dbml/scheduler/hostmem.py:_state": "probe and mode of glibc's malloc (mallopt applies process-wide, once)",
    "dbml/scheduler/hostmem.py:_lock": "guards hostmem._state",
    "dbml/scheduler/latency/utilisation.py:_warned": "warnings said once per process (no job reads it)",
    # --- locks and counters with no other state -----------------------------------------------
    "dbml/core/catalog.py:_WRITES": "lock: the process's writers take catalog versions one at a time (no state)",
    "dbml/scheduler/execute/rng.py:_LOCK": "lock: torch's default generators are the process's; one swap at a time",
    "dbml/scheduler/execute/rng.py:_LOCAL": "thread-local: the job generators in use on this thread (scoped by using())",
    "dbml/scheduler/graph/capture.py:_TRACE_LOCK": "lock: one trace at a time (make_fx patches torch process-wide)",
    "dbml/scheduler/execute/spill.py:_serial": "counter: unique spill file names in the process",
    "dbml/core/sqltext.py:_TOKENIZERS": "thread-local: a sqlglot tokenizer per thread and dialect (it holds its "
                                        "state while it reads)",
}

MUTATING = {"append", "add", "update", "setdefault", "pop", "popitem", "clear", "discard", "remove", "extend",
            "insert", "appendleft", "move_to_end", "__setitem__"}
STATEFUL_CALLS = {"Lock", "RLock", "local", "count", "WeakKeyDictionary", "WeakValueDictionary", "WeakSet",
                  "OrderedDict", "defaultdict", "deque", "Event", "Condition", "Semaphore", "ThreadPoolExecutor"}
CACHES = {"cache", "lru_cache"}


def _modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), str(path))


def _module_names(tree) -> dict[str, ast.AST]:
    names = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        for t in targets:
            if isinstance(t, ast.Name):
                names[t.id] = node.value
    return names


def _call_name(node) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    return None


def holders(module: str, tree) -> set[str]:
    """The module-level mutable holders of one module (see the module docstring)."""
    names = _module_names(tree)
    found = {n for n, v in names.items() if _call_name(v) in STATEFUL_CALLS}
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    found |= {n for n, v in names.items() if isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
              and v.func.id in classes}   # an instance of the module's own class
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                d = d.func if isinstance(d, ast.Call) else d
                if (d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", None)) in CACHES:
                    found.add(node.name)
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                found.update(node.names)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                for t in node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]:
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in names:
                        found.add(t.value.id)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in MUTATING and isinstance(node.func.value, ast.Name)
                  and node.func.value.id in names and _is_global(fn, node.func.value.id)):
                found.add(node.func.value.id)
    return {f"{module}:{n}" for n in found}


def _is_global(fn, name: str) -> bool:
    """``name`` is not a local of ``fn`` (a parameter or an assignment inside it)."""
    if not isinstance(fn, ast.Lambda):
        args = fn.args
        if name in {a.arg for a in args.args + args.kwonlyargs + args.posonlyargs}:
            return False
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return False
    return True


def test_module_level_state_is_a_registry_or_a_cache():
    found = set()
    for module, tree in _modules():
        found |= holders(module, tree)
    unowned = sorted(found - ALLOWED.keys())
    assert not unowned, (f"module-level mutable state without an owner: {unowned}; put per-database state on "
                         f"dbml.instance.Instance, per-process state on dbml.core.runtime.Runtime, or (a registry of "
                         f"built-ins, a cache of a pure fact) name it in tests/test_state.py's ALLOWED with a reason")
    stale = sorted(ALLOWED.keys() - found)
    assert not stale, f"ALLOWED names holders that are gone: {stale}"


def _process_writes(tree) -> set[str]:
    """What a module writes of the process beyond its objects: "signal" (a handler set),
    "environ" (os.environ or os.putenv written), "mallopt" (malloc's parameters)."""
    writes = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            for t in node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]:
                if isinstance(t, ast.Subscript) and ast.unparse(t.value).endswith("environ"):
                    writes.add("environ")
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name.endswith(("signal.signal", "signal.siginterrupt")):
                writes.add("signal")
            elif name.endswith(("environ.setdefault", "environ.update", "environ.pop", "environ.clear", "putenv",
                                "unsetenv")):
                writes.add("environ")
            elif name.endswith("mallopt"):
                writes.add("mallopt")
    return writes


def test_the_process_is_written_in_one_place():
    """The SIGINT chain and the environment are the runtime's; malloc's mode is hostmem's."""
    owners = {"signal": "dbml/core/runtime.py", "environ": "dbml/core/runtime.py", "mallopt": "dbml/scheduler/hostmem.py"}
    writers = {(write, module) for module, tree in _modules() for write in _process_writes(tree)}
    assert writers == {(write, module) for write, module in owners.items()}, writers


def test_the_runtime_resets_to_a_fresh_process(monkeypatch):
    """A fresh runtime and device registry (the process's may hold another test's open
    database): a reset touches nothing while a database is open, and after it is closed
    empties the views, the devices and the SIGINT chain."""
    import dbml
    from dbml.core import runtime as runtimes
    from dbml.scheduler.multijob import registry
    monkeypatch.setattr(runtimes, "_RUNTIME", runtimes.Runtime())
    monkeypatch.setattr(registry, "DEVICES", registry.Devices())
    rt = runtimes.runtime()
    con = dbml.connect()
    assert rt.instances and rt.sigint_previous is not None
    assert not runtimes.reset(), "a reset with a database open touches nothing"
    con.close()
    registry.shared_scheduler("cpu", 1000)
    rt.views[1] = ["__dbml_ml_1"]
    assert runtimes.reset()
    assert not rt.views and registry.existing_scheduler("cpu") is None and rt.sigint_previous is None
