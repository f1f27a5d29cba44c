"""dbml's settings: one home for reading and writing them.

DuckDB's own settings stay DuckDB's. dbml's live in the connection as DuckDB variables
named ``dbml_<setting>``, so SQL can read and change them too::

    SET VARIABLE dbml_device = 'cpu';
    SELECT getvariable('dbml_device');

The SQL macros pass them to the UDFs, which is how a setting reaches a training job.
"""

from __future__ import annotations

import re

import duckdb

from .errors import InvalidArgument

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
CPU_DEFAULT_BUDGET = 2 * 2**30   # the CPU has no device memory to ask; 2 GiB, documented

DEFAULTS: dict[str, object] = {
    "device": "auto",          # 'auto' (cuda when available, else cpu), 'cpu' or 'cuda[:N]'
    "memory_budget": None,     # bytes or '512MB' for a training job; NULL: default_budget(device)
    "latency_model": "predictor",  # op latencies for planning: 'predictor' (installed) or 'roofline'
    "replan_beta": 0.9,        # plan updating: weight of a new latency measurement in the EWMA
    "replan_threshold": 0.3,   # plan updating: relative drift of the summed latency that replans
    "torch_threads": 1,        # PyTorch intra-op threads while training (process-wide); see README
    "prefetch_batches": 4,     # record batches fetched ahead of training
    "shuffle_window": 65536,   # rows of the shuffle buffer each epoch draws batches from
}


def variable(name: str) -> str:
    return f"dbml_{name}"


def apply(con: duckdb.DuckDBPyConnection, **settings) -> None:
    """Set dbml settings on a connection; unset ones get their defaults unless already set."""
    unknown = sorted(set(settings) - set(DEFAULTS))
    if unknown:
        raise InvalidArgument(f"dbml.connect(): unknown setting {unknown[0]!r}; "
                              f"known settings: {', '.join(sorted(DEFAULTS))}")
    if settings.get("memory_budget") is not None:
        parse_bytes(settings["memory_budget"], name="dbml.connect(): memory_budget")
    for name, default in DEFAULTS.items():
        if name in settings:
            value = settings[name]
        elif con.execute("SELECT getvariable(?)", [variable(name)]).fetchall()[0][0] is None:
            value = default
        else:
            continue
        if value is not None:
            con.execute(f"SET VARIABLE {variable(name)} = ?", [value])


def resolve_device(device: str | None) -> str:
    import torch
    device = device or "auto"
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" or (device.startswith("cuda") and torch.cuda.is_available()):
        return device
    raise InvalidArgument(f"device {device!r} is not available here; "
                          f"SET VARIABLE dbml_device = 'cpu' (or 'auto')")


def parse_bytes(value, *, name: str = "memory_budget") -> int:
    """``512MB``, ``1.5GiB``, ``1000000`` or a number of bytes -> bytes."""
    if isinstance(value, (int, float)) and value > 0:
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).upper() not in UNITS or float(m.group(1)) <= 0:
        raise InvalidArgument(f"{name} {value!r} is not a size; pass bytes or a size such as '512MB' or '2GiB'")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def default_budget(device: str) -> int:
    """The device's free memory on CUDA; ``CPU_DEFAULT_BUDGET`` on the CPU."""
    if device.startswith("cuda"):
        import torch
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    return CPU_DEFAULT_BUDGET
