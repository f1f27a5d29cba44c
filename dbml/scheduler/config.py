"""The scheduler's switches from the environment: the only module that reads ``os.environ``.

Every function reads the variable when it is called, never at import time, so a test's
``monkeypatch.setenv`` or a user's ``os.environ[...] = ...`` before a job starts takes
effect. The dbml runtime reads the environment through this module too; dbml's own
settings (DuckDB variables) live in ``dbml/settings.py``.

===============================  ==========  =============================================
variable                         default     effect
===============================  ==========  =============================================
``DBML_NO_SCHEDULER``            off         run every job unscheduled (policy ``none``)
``DBML_DEBUG``                   off         print one summary line per plan to stderr
``DBML_NO_FASTPATH``             off         interpret every iteration, also of plans that
                                             bind nothing (no generated fast path)
``DBML_CACHE_DIR``               see below   where the latency predictor and captured
                                             graphs are cached
``DBML_GRAPH_CACHE``             1           ``0``: capture every graph afresh, neither
                                             reading nor writing ``<cache>/graphs``
``DBML_HOST_MALLOC``             keep        ``system``: leave glibc's malloc as it is (large
                                             freed blocks go back to the OS; see
                                             hostmem.py)
``DBML_COPY_BANDWIDTH``          measured    host<->device copy bandwidth, bytes/s
``DBML_SPILL_BANDWIDTH``         measured    the CPU's spill tier (disk), bytes/s each way
``DBML_UTIL_WINDOW``             0.05        seconds of the CPU-utilisation sample
``DBML_PREDICTOR_STEPS``         3000        training steps of the latency predictor
``DBML_PREDICTOR_EXTRAPOLATE``   baseline    ``baseline``: beyond calibration, use the
                                             least-squares power law; else the MLP
``DBML_PREDICTOR_RESIDUAL``      1           ``1``: the MLP learns the power law's residual
===============================  ==========  =============================================

The cache directory is ``$DBML_CACHE_DIR``, else ``$XDG_CACHE_HOME/dbml``, else
``~/.cache/dbml``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENVIRONMENT", "scheduler_disabled", "fast_path_disabled", "debug", "cache_dir", "copy_bandwidth_override", "spill_bandwidth_override",
           "util_window", "graph_cache_dir", "host_malloc_kept", "predictor_steps", "predictor_extrapolates_with_baseline",
           "predictor_residual", "env_flag"]

# name -> (default as text, one-line description): the README's table is checked against it
ENVIRONMENT = {
    "DBML_NO_SCHEDULER": ("", "run every job unscheduled (policy none)"),
    "DBML_DEBUG": ("", "print one summary line per plan to stderr"),
    "DBML_NO_FASTPATH": ("", "interpret every iteration, also of plans that bind nothing"),
    "DBML_CACHE_DIR": ("", "where the latency predictor and captured graphs are cached"),
    "DBML_GRAPH_CACHE": ("1", "0: capture every graph afresh, without the on-disk graph cache"),
    "DBML_HOST_MALLOC": ("keep", "system: leave glibc's malloc returning large freed blocks to the OS"),
    "DBML_COPY_BANDWIDTH": ("", "host-device copy bandwidth in bytes/s, instead of measuring it"),
    "DBML_SPILL_BANDWIDTH": ("", "the CPU's spill tier (disk) in bytes/s each way, instead of measuring it"),
    "DBML_UTIL_WINDOW": ("0.05", "seconds of the CPU-utilisation sample"),
    "DBML_PREDICTOR_STEPS": ("3000", "training steps of the latency predictor"),
    "DBML_PREDICTOR_EXTRAPOLATE": ("baseline", "beyond calibration, predict with the power law"),
    "DBML_PREDICTOR_RESIDUAL": ("1", "the predictor's MLP learns the power law's residual"),
}


def _get(name: str) -> str:
    return os.environ.get(name, ENVIRONMENT[name][0]).strip()


def env_flag(name: str) -> bool:
    """A switch: set to anything but empty, ``0``, ``false`` or ``no`` means on."""
    return _get(name).lower() not in ("", "0", "false", "no")


def scheduler_disabled() -> bool:
    return env_flag("DBML_NO_SCHEDULER")


def fast_path_disabled() -> bool:
    return env_flag("DBML_NO_FASTPATH")


def debug() -> bool:
    return env_flag("DBML_DEBUG")


def cache_dir() -> Path:
    if _get("DBML_CACHE_DIR"):
        return Path(_get("DBML_CACHE_DIR"))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dbml"


def graph_cache_dir() -> Path | None:
    """Where captured graphs are cached across processes, or None when switched off."""
    value = _get("DBML_GRAPH_CACHE").lower()
    return None if value in ("", "0", "false", "no") else cache_dir() / "graphs"


def host_malloc_kept() -> bool:
    """Whether dbml keeps freed host memory in the process for reuse (hostmem.py)."""
    return _get("DBML_HOST_MALLOC").lower() != "system"


def copy_bandwidth_override() -> float | None:
    value = _get("DBML_COPY_BANDWIDTH")
    return float(value) if value else None


def spill_bandwidth_override() -> float | None:
    value = _get("DBML_SPILL_BANDWIDTH")
    return float(value) if value else None


def util_window() -> float:
    return float(_get("DBML_UTIL_WINDOW"))


def predictor_steps() -> int:
    return int(_get("DBML_PREDICTOR_STEPS"))


def predictor_extrapolates_with_baseline() -> bool:
    return _get("DBML_PREDICTOR_EXTRAPOLATE") == "baseline"


def predictor_residual() -> bool:
    return _get("DBML_PREDICTOR_RESIDUAL") == "1"
