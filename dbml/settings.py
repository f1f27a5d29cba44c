"""dbml's settings: one home for reading and writing them.

DuckDB's own settings stay DuckDB's. dbml's live in the connection as DuckDB variables
named ``dbml_<setting>``, so SQL can read and change them too::

    SET VARIABLE dbml_device = 'cpu';
    SELECT getvariable('dbml_device');

The SQL macros pass them to the UDFs, which is how a setting reaches a training job.
"""

from __future__ import annotations

import duckdb

from .errors import InvalidArgument

DEFAULTS: dict[str, object] = {
    "device": "auto",          # 'auto' (cuda when available, else cpu), 'cpu' or 'cuda[:N]'
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
    for name, default in DEFAULTS.items():
        if name in settings:
            value = settings[name]
        elif con.execute("SELECT getvariable(?)", [variable(name)]).fetchall()[0][0] is None:
            value = default
        else:
            continue
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
