"""What a first ``train()`` or ``predict()`` would import, imported while an interactive
shell waits for its first statement (issue 32, item 1).

A job's first statement in a fresh process imports torch, the scheduler's graph capture
(torch.fx, FakeTensor, ShapeEnv: its translation validator imports torch._dynamo) and the
zoo: seconds on a laptop, before any row is read. None of it can be cached across
processes, so an interactive shell does it on a thread as soon as it shows its prompt (and
traces one step of a tiny network, which fills torch's caches), and the user's typing hides it. A shell reading a script does not (it has no idle time to
hide it in, and its first statements that need no model must stay light). A Ray device
worker (``dbml.cluster.worker.DeviceWorker``) starts it when it starts, and its jobs wait for it.

Imports of one module tree from two threads at once can meet in a cycle, where Python hands
one of them a half-initialised module: so no dbml function runs beside it. :func:`wait`,
called by every dbml UDF before it runs (``dbml.udfs``), joins the thread when it is still
running; a statement of DuckDB's alone (``CREATE TABLE ... FROM 'data.csv'``) imports nothing
and runs at once.
``DBML_NO_PRELOAD=1`` turns it off.
"""

from __future__ import annotations

import importlib
import os
import signal
import threading

from .runtime import runtime

# the modules a job and an inference import first (dbml.core.training pulls the scheduler in)
MODULES = ("dbml.core.training", "dbml.core.inference")


def start() -> bool:
    """Start importing :data:`MODULES` on a daemon thread (once per process: the runtime's
    ``preload``); whether it started."""
    if os.environ.get("DBML_NO_PRELOAD") == "1":
        return False
    rt = runtime()
    with rt.lock:
        if rt.preload is not None:
            return False
        rt.preload = threading.Thread(target=_load, name="dbml-preload", daemon=True)
        rt.preload.start()
        return True


def _load() -> None:
    # Ctrl-C is the main thread's: a SIGINT the kernel handed to this thread would leave the
    # shell's readline waiting in select() (no EINTR there), the keypress lost; torch's own
    # threads started from here inherit the mask
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the statement that needs it imports it again and says why
            return
    try:
        _trace_once()
    except Exception:  # noqa: BLE001 - a first job then pays for its first trace itself
        pass
    # pyarrow imports pandas, where it is installed, the first time it converts Python
    # values (pa.array, pa.scalar): as a job's stored row and its result do (0.4-0.5 s)
    import pyarrow as pa
    pa.array([0])


def _trace_once() -> None:
    """Capture one step of a tiny network: the first trace of a process fills torch's
    dispatch and FakeTensor caches (about a second, the rest of a first job's extra time)."""
    import torch
    from ..scheduler.graph.capture import capture
    from ..scheduler.graph.optim import OptimizerSpec
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    capture(net, torch.nn.functional.cross_entropy, OptimizerSpec(),
            (torch.zeros(8, 3), torch.zeros(8, dtype=torch.long)), job="preload")


def wait() -> None:
    """Before a statement runs: let a preload still under way finish first."""
    thread = runtime().preload
    if thread is not None and thread.is_alive():
        thread.join()
