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
        _step_once()
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
    # skip_init: no draw from the process's generator, which is the user's (this may run beside their code)
    net = torch.nn.Sequential(torch.nn.utils.skip_init(torch.nn.Linear, 3, 4), torch.nn.ReLU(),
                              torch.nn.utils.skip_init(torch.nn.Linear, 4, 2))
    capture(net, torch.nn.functional.cross_entropy, OptimizerSpec(),
            (torch.zeros(8, 3), torch.zeros(8, dtype=torch.long)), job="preload")


def _step_once() -> None:
    """One real training step of a small network: the machine code of the kernels a job's
    first iteration runs (products, activations, losses, the optimizer's updates; torch's
    thread pool started) is paged in now, once per process. A process's first budgeted job
    measured 10-12 MB of such file-backed pages (RssFile) as its own, over its budget."""
    import torch
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(0)   # the process's generator is the user's: not drawn from
    x = torch.randn(256, 64, generator=gen)
    shapes = ((256, 64), (256,), (256, 256), (256,), (2, 256), (2,))
    params = [(torch.randn(s, generator=gen) * 0.05).requires_grad_() for s in shapes]
    for opt in (torch.optim.Adam(params), torch.optim.SGD(params, lr=0.1, momentum=0.9)):
        h = F.relu(F.linear(F.relu(F.linear(x, params[0], params[1])), params[2], params[3]))
        out = F.linear(h, params[4], params[5])
        loss = F.cross_entropy(out, torch.zeros(256, dtype=torch.long)) + F.mse_loss(out[:, 0], x[:, 0])
        loss.backward()
        opt.step()
        opt.zero_grad()


def ready(warm: bool = True) -> None:
    """Before a job starts measuring what it adds to the process (``procmem.watch``): the
    process's one-off set-up for jobs done once, the first trace and a first real step, here
    if no preload ran (a script's first job), else by waiting for the preload. A job's
    ``real_peak_bytes`` is then its own: the compiler stack torch imports on a first capture
    (about 25 MB) and the pages its code faults in are the process's, once, as its imports
    are, not the first job's (benchmarks/results/2026-11-28-vm-2c-issue33-realmem.md).
    Only that: the preload's other imports (inference, pyarrow's pandas: about 40 MB) are
    left to when they are used, after the job's steps, not under its peak.
    ``DBML_NO_PRELOAD=1``: the first job does it itself, inside its figures.

    ``warm=False`` (a job no budget of the user's bounds): only the wait. Its real memory is
    reported, never planned, and the set-up would cost its statement 0.2 s (a script's first
    ``train()``: 3.25 s against 3.05 s; its own first trace fills the same caches)."""
    wait()
    if not warm:
        return
    rt = runtime()
    if rt.preload is not None or os.environ.get("DBML_NO_PRELOAD") == "1" or not rt.jobs_warmed.acquire(blocking=False):
        return
    # on a thread of its own, as the preload does it: the caller's thread keeps no state of a trace
    thread = threading.Thread(target=_warm, name="dbml-warm-up", daemon=True)
    thread.start()
    thread.join()


def _warm() -> None:
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        _trace_once()
        _step_once()
    except Exception:  # noqa: BLE001 - the job then pays for its first trace itself
        pass


def wait() -> None:
    """Before a statement runs: let a preload still under way finish first."""
    thread = runtime().preload
    if thread is not None and thread.is_alive():
        thread.join()
