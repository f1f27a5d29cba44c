"""Random numbers per job: a job's random ops (dropout masks) draw from a generator of its
own, never from another job's or the process's.

:class:`JobRandom` holds a job's ``torch.Generator`` (one for the CPU and, on CUDA, one
for its device), seeded as ``torch.manual_seed(seed)`` seeds the default ones, so a job
draws exactly the numbers eager PyTorch draws after ``torch.manual_seed(seed)`` (results
stay bit-identical) whatever else runs at the same time.

A captured program's random ops are wrapped once (:class:`RandomOp`) and shared by every
job running that graph; the compute thread's current job is thread-local (:func:`using`).
An op whose schema takes a ``generator`` (``bernoulli_``, ``uniform_``, ``normal``, ...:
dropout on the CPU) is given the job's generator: nothing process-wide is touched. An op
without one (CUDA's fused ``native_dropout``) runs with the job's state put into the
default generator and taken back after, under one process-wide lock (:meth:`JobRandom.call`);
so does a whole plain-PyTorch step whose modules draw inside (``EagerStep``). With no job
current, random ops draw from the default generator as before.

>>> import torch
>>> _ = torch.manual_seed(7); expected = torch.rand(3)
>>> with using(JobRandom(7)):
...     first = RandomOp(torch.ops.aten.rand.default)([3])
>>> torch.equal(first, expected)
True
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

__all__ = ["JobRandom", "RandomOp", "using", "current"]

_LOCK = threading.Lock()           # the default generators are the process's: one swap at a time
_LOCAL = threading.local()


class JobRandom:
    """One job's generators: the CPU's and, on CUDA, the device's."""

    def __init__(self, seed: int, device: str | torch.device = "cpu"):
        device = torch.device(device)
        self.cpu = torch.Generator().manual_seed(int(seed))
        self.cuda: torch.Generator | None = None
        self._index: int | None = None
        if device.type == "cuda":
            self._index = device.index if device.index is not None else torch.cuda.current_device()
            self.cuda = torch.Generator(device=f"cuda:{self._index}").manual_seed(int(seed))

    def generator(self, device: torch.device | str | None) -> torch.Generator:
        """The job's generator for tensors on ``device``."""
        if self.cuda is not None and torch.device(device or "cpu").type == "cuda":
            return self.cuda
        return self.cpu

    def call(self, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)`` drawing from the default generators with this job's states
        put in (and taken back, advanced, after), under the process-wide lock."""
        with _LOCK:
            saved = torch.get_rng_state()
            saved_cuda = torch.cuda.get_rng_state(self._index) if self.cuda is not None else None
            torch.set_rng_state(self.cpu.get_state())
            if self.cuda is not None:
                torch.cuda.set_rng_state(self.cuda.get_state(), self._index)
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu.set_state(torch.get_rng_state())
                torch.set_rng_state(saved)
                if self.cuda is not None:
                    self.cuda.set_state(torch.cuda.get_rng_state(self._index))
                    torch.cuda.set_rng_state(saved_cuda, self._index)


def current() -> JobRandom | None:
    """The job running on this thread (``using``), or None."""
    return getattr(_LOCAL, "job", None)


@contextmanager
def using(job: JobRandom | None) -> Iterator[None]:
    """Random ops run on this thread inside the block draw from ``job``'s generators."""
    previous, _LOCAL.job = current(), job
    try:
        yield
    finally:
        _LOCAL.job = previous


def _takes_generator(op) -> bool:
    schema = getattr(op, "_schema", None)
    return schema is not None and any(a.name == "generator" and a.kwarg_only is not None
                                      for a in schema.arguments)


class RandomOp:
    """A random op of a captured program: drawn from the current job's generator, if any."""

    def __init__(self, op: Callable):
        self.op = op
        self.takes_generator = _takes_generator(op)

    def __call__(self, *args, **kwargs):
        job = current()
        if job is None:
            return self.op(*args, **kwargs)
        if self.takes_generator and kwargs.get("generator") is None:
            return self.op(*args, **{**kwargs, "generator": job.generator(_device(args, kwargs))})
        return job.call(self.op, *args, **kwargs)

    def __repr__(self) -> str:
        return f"RandomOp({self.op!r})"


def _device(args, kwargs) -> torch.device | None:
    """Where the op's result lives: its first tensor argument's device, or ``device=``."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return kwargs.get("device")
