"""dbml's settings: the one table of them, with their defaults, and reading and writing them.

DuckDB's own settings stay DuckDB's. dbml's live in the connection as DuckDB variables
named ``dbml_<setting>``, so SQL can read and change them too::

    SET VARIABLE dbml_device = 'cpu';
    SELECT getvariable('dbml_device');

``SETTINGS`` is their single home: ``apply`` writes their defaults, the ``train`` macro
(``dbml.core.spec.train_macro_sql``) passes every one of them to ``dbml_train`` with
``getvariable``, the UDFs fill a NULL with the default (``resolve``), and a test checks
the README's table against it. The environment variables are not settings: they are
read in ``dbml.scheduler.config`` alone.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import duckdb
from sqlglot import exp

from ..errors import InvalidArgument

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
# On the CPU, training shares the database's memory_limit with DuckDB's queries
# (dbml.core.duckmem): a job without a budget of its own gets this share of it. Half, because
# both sides degrade rather than fail below what they would like, and neither may go near
# zero: DuckDB's ORDER BY and hash joins spill to temp_directory with a few blocks per
# thread, a job's own data (its scratch table's scan) runs through DuckDB while it trains,
# and the scheduler trains below a model's eager peak by swapping and recomputing, at a
# cost that grows as the budget shrinks. With DuckDB's default limit (80 % of RAM) that is
# 40 % of RAM for training, 40 % for queries.
CPU_LIMIT_SHARE = 0.5
CPU_DEFAULT_BUDGET = 2 * 2**30   # with no database to ask (a job on a Ray worker): 2 GiB, documented


@dataclass(frozen=True)
class Setting:
    name: str          # the DuckDB variable is dbml_<name>
    sql_type: str      # the type dbml_train takes it as
    default: object    # None: unset (see doc)
    doc: str           # one line; the README's table has the same
    size: bool = False  # bytes or a size such as '512MB': parsed by parse_bytes


SETTINGS = (
    Setting("device", "VARCHAR", "auto", "'auto' (CUDA when available, else CPU), 'cpu' or 'cuda[:N]'"),
    Setting("memory_budget", "VARCHAR", None,
            "device memory the training jobs share, bytes or a size such as '512MB'; "
            "unset: the device's free memory on CUDA, half of DuckDB's memory_limit on the CPU", size=True),
    Setting("latency_model", "VARCHAR", "predictor",
            "op latencies for planning: 'predictor' (the installed latency predictor) or 'roofline'"),
    Setting("replan_beta", "DOUBLE", 0.9, "plan updating: weight of a new latency measurement in the EWMA"),
    Setting("replan_threshold", "DOUBLE", 0.3,
            "plan updating: relative drift of the summed latency that replans"),
    Setting("slow_train_seconds", "DOUBLE", 60.0,
            "a train() whose estimated time (estimated_seconds: predicted before training, then from its first "
            "steps) passes this says so in its warnings, with cheaper choices"),
    Setting("torch_threads", "INTEGER", 1, "PyTorch intra-op threads of each training job's thread"),
    Setting("prefetch_batches", "INTEGER", 4, "record batches fetched ahead of training"),
    Setting("shuffle_window", "INTEGER", 65536, "rows of the shuffle buffer each epoch draws batches from"),
    Setting("progress", "VARCHAR", "auto",
            "progress of a running train(): 'auto' (a bar per job in Jupyter or on a terminal), 'bars' (always) or "
            "'off'"),
    Setting("sources", "VARCHAR", "any",
            "what train(), evaluate() and predictions() sources may read: 'any' (tables, views, files such as read_parquet(...) and "
            "attached databases, as DuckDB's enable_external_access allows) or 'tables' (only this database's "
            "tables and views)"),
    Setting("cluster", "VARCHAR", "local",
            "where training jobs run: 'local' (threads of this process), 'ray' (the Ray cluster this process is "
            "connected to, else RAY_ADDRESS, else one started on this machine with ray start --head) or "
            "'ray://host:port' (a remote Ray cluster through Ray Client)"),
    Setting("max_retries", "INTEGER", 0,
            "on a Ray cluster: how many times a job whose worker died restarts from its last finished epoch"),
    Setting("cluster_parquet_bytes", "VARCHAR", 10**9,
            "on a Ray cluster: a job's encoded rows above this size go to its workers as Parquet files in "
            "cluster_storage (when set) instead of through Ray's object store", size=True),
    Setting("cluster_storage", "VARCHAR", None,
            "on a Ray cluster: a directory every node reads and writes (a shared mount), for large jobs' "
            "Parquet files; unset: a temporary directory here, which serves a cluster of one node"),
)
SOURCES = ("any", "tables")      # the values of the sources setting
SETTING = {s.name: s for s in SETTINGS}
DEFAULTS: dict[str, object] = {s.name: s.default for s in SETTINGS}


def variable(name: str) -> str:
    return f"dbml_{name}"


def resolve(name: str, value):
    """The value a job uses for a setting read from SQL: its default where ``value`` is NULL.

    Where the default is a text or an integer, an empty text or a 0 means the default too
    (an empty device is 'auto', 0 threads is 1). A DOUBLE's 0.0 stays, for validation to
    refuse, and so does an empty memory_budget, for parse_bytes to refuse.
    """
    setting = SETTING[name]
    falsy_is_unset = setting.sql_type != "DOUBLE" and setting.default is not None
    return setting.default if value is None or (falsy_is_unset and not value) else value


def apply(con: duckdb.DuckDBPyConnection, **settings) -> None:
    """Set dbml settings on a connection; unset ones get their defaults unless already set."""
    unknown = sorted(set(settings) - set(DEFAULTS))
    if unknown:
        raise InvalidArgument(f"dbml.connect(): unknown setting {unknown[0]!r}; "
                              f"known settings: {', '.join(sorted(DEFAULTS))}")
    for setting in SETTINGS:
        if setting.size and settings.get(setting.name) is not None:
            parse_bytes(settings[setting.name], name=f"dbml.connect(): {setting.name}")
    for name, default in DEFAULTS.items():
        if name in settings:
            value = settings[name]
        elif con.execute("SELECT getvariable(?)", [variable(name)]).fetchall()[0][0] is None:
            value = default
        else:
            continue
        if value is not None:
            assign = exp.EQ(this=exp.column(variable(name)), expression=exp.Placeholder())
            con.execute(exp.Set(expressions=[exp.SetItem(this=assign, kind="VARIABLE")]).sql("duckdb"), [value])


def resolve_device(device: str | None) -> str:
    import torch
    device = resolve("device", device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" or (device.startswith("cuda") and torch.cuda.is_available()):
        return device
    raise InvalidArgument(f"device {device!r} is not available here; "
                          f"SET VARIABLE dbml_device = 'cpu' (or 'auto')")


MAX_BYTES = 1 << 60   # an exbibyte: a size past it is a typo, not a machine


def parse_bytes(value, *, name: str = "memory_budget") -> int:
    """``512MB``, ``1.5GiB``, ``1000000`` or a number of bytes -> bytes."""
    if isinstance(value, (int, float)) and value > 0:
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).upper() not in UNITS or float(m.group(1)) <= 0:
        raise InvalidArgument(f"{name} {value!r} is not a size; pass bytes or a size such as '512MB' or '2GiB'")
    n = float(m.group(1)) * UNITS[m.group(2).upper()]
    if n >= MAX_BYTES:
        raise InvalidArgument(f"{name} {value!r} is larger than any machine's memory; "
                              f"pass a size such as '512MB' or '2GiB'")
    return int(n)


def default_budget(device: str, memory_limit: int | None = None) -> int:
    """The device's free memory on CUDA. On the CPU, ``CPU_LIMIT_SHARE`` of the database's
    ``memory_limit`` as the user set it (``memory_limit``, from ``dbml.core.duckmem``; a limit
    beyond the machine's RAM, such as DuckDB's '-1', counts as the RAM), leaving DuckDB at
    least ``duckmem.MIN_DUCKDB_BYTES`` of it (a limit of 200 MB gives 66 MB), or
    ``CPU_DEFAULT_BUDGET`` where the job has no database (None)."""
    if device.startswith("cuda"):
        import torch
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    if memory_limit is None:
        return CPU_DEFAULT_BUDGET
    from .duckmem import MIN_DUCKDB_BYTES
    limit = min(memory_limit, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return max(1, min(int(CPU_LIMIT_SHARE * limit), limit - MIN_DUCKDB_BYTES))
