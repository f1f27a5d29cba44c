"""Where a job runs: the seam between the core and the backends that run jobs elsewhere.

The core trains a job on this process's threads (the ``cluster`` setting ``'local'``, the
default). A job for a cluster (``SET VARIABLE dbml_cluster = 'ray'``, or ``workers := N``)
goes through a *placement backend*, found here by name and imported on its first use, the
way joblib's ``register_parallel_backend`` lets Ray plug in: the core never imports a
backend, and a process that trains locally never imports one.

A backend is a module with three functions:

* ``check_job(spec)``: the backend's rules for one job, when its parameters are checked
  (raises ``InvalidArgument``);
* ``fit_model(cur, table, prep, spec, n_train, n_val, progress, fit)``: train the job
  there, ``fit`` being the core's own loop (``training._fit_model``) that each worker runs;
  returns what ``fit`` returns, the module on this machine's CPU;
* ``step(model, loss_fn, optimizer, job)``: one worker's training step of a data-parallel
  job (``workers > 1``).

``dbml.cluster`` (Ray) is the one built in; every cluster setting other than ``'local'``
names a Ray cluster today.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from urllib.parse import urlsplit, urlunsplit

from ..errors import InvalidArgument

__all__ = ["BACKENDS", "LOCAL", "backend", "check_access", "register", "is_local"]

LOCAL = "local"
# registry of built-ins: backend name -> the module that implements it (imported on use)
BACKENDS: dict[str, str] = {"ray": "dbml.cluster.backend"}


def register(name: str, module: str) -> None:
    """Make ``module`` (a dotted path) the placement backend called ``name``."""
    BACKENDS[name] = module


def is_local(spec) -> bool:
    """Whether the job trains on this process's threads, with no backend."""
    return spec.settings.cluster == LOCAL and spec.workers <= 1


def shown(address: str) -> str:
    """A cluster address as messages show it: a password in it is never repeated."""
    parts = urlsplit(address or "")
    if parts.password is None:
        return address
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def check_access(spec, cur) -> None:
    """A job for a cluster opens a network connection: refused where DuckDB's
    ``enable_external_access`` is false (the shell's ``-safe``), as DuckDB refuses its own
    network and file access there."""
    if is_local(spec):
        return
    allowed = cur.execute("SELECT current_setting('enable_external_access')").fetchall()[0][0]
    if not allowed:
        raise InvalidArgument(f"the cluster setting names a Ray cluster ({shown(spec.settings.cluster)!r}), but DuckDB's "
                              f"enable_external_access is false here (safe mode), which refuses network access; "
                              f"SET VARIABLE dbml_cluster = 'local' to train on this machine")


def backend(spec) -> ModuleType:
    """The placement backend of a job that does not train locally (see the module docstring)."""
    return importlib.import_module(BACKENDS["ray"])
