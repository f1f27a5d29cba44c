"""PyTorch's intra-op threads for one job, without changing the process's.

With PyTorch's OpenMP backend (its CPU builds' default), ``torch.set_num_threads`` sets
the calling thread's OpenMP and MKL thread counts: a job's thread uses its own count and
every other thread keeps its own. With another backend (a native thread pool) the count
is process-wide, so a job leaves it alone and runs with the process's, which the
``torch_threads`` setting then does not change (the summary of such a build says so in
``torch.__config__.parallel_info()``).
"""

from __future__ import annotations

import functools

import torch

__all__ = ["use", "per_thread"]


@functools.lru_cache(maxsize=1)
def per_thread() -> bool:
    """Whether ``torch.set_num_threads`` changes only the calling thread (OpenMP backend)."""
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


def use(threads: int) -> None:
    """Run this thread's PyTorch ops on ``threads`` intra-op threads, if that stays this thread's."""
    if per_thread() and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
