"""What every start would compute again from dbml's own fixed text, kept on disk.

Installing dbml reads its macros (``sql/macros.sql`` and the generated ``train`` and
``tune``) for what they take and call, and renders the generated ones as SQL; with sqlglot's
tokenizer and generator that is most of a shell's start-up. The answer depends only on
those definitions, so it is kept as JSON in the cache folder
(``dbml.scheduler.config.cache_dir``: ``$DBML_CACHE_DIR``, else ``$XDG_CACHE_HOME/dbml``,
else ``~/.cache/dbml``), under ``startup/``, named by the hash of everything it was computed
from: a changed definition, dbml version or sqlglot version computes it again.
A folder that cannot be written only costs the time.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

__all__ = ["cached", "folder"]


def folder() -> Path:
    """Where start-up answers are kept (the scheduler's config owns the cache folder)."""
    from ..scheduler import config
    return config.cache_dir() / "startup"


def cached(name: str, inputs: list[str], compute: Callable[[], dict]) -> dict:
    """``compute()``, or what it returned before for the same ``inputs`` (the texts it is
    computed from); written atomically, the answers of other inputs removed."""
    where = folder()
    digest = hashlib.sha256("\0".join(inputs).encode("utf-8", "surrogatepass")).hexdigest()[:24]
    path = where / f"{name}-{digest}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    value = compute()
    try:
        where.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(value), encoding="utf-8")
        os.replace(partial, path)
        for old in where.glob(f"{name}-*.json"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        pass
    return value
