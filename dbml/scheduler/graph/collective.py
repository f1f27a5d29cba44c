"""Collectives in the captured step: a data-parallel worker's gradient all-reduce in its graph.

A worker of a ``workers := N`` job trains on its own share of each global batch (rows
``[n*r/N, n*(r+1)/N)`` of ``n``) and averages the gradients with the other workers, as
DistributedDataParallel does in its autograd hooks. Hooks are invisible to the captured
graph, so with a :class:`Collective` the traced step (``capture(..., collective=...)``)
does the same in the graph itself:

* the batch is the global one (every worker streams the same batches); the graph slices
  its share, and weights its mean loss by ``share * N / n`` (a worker with no rows
  contributes ``out.sum() * 0``), so the averaged gradient is the global batch's mean
  loss's, also for a last batch that does not divide evenly (``ddp.DDPStep``'s rule);
* the gradients are divided by ``N`` (as DDP's reducer does while copying them into its
  buckets), flattened into buckets by DDP's own assignment
  (``dist._compute_bucket_assignment_by_size``: reverse parameter order, a first bucket of
  ``dist._DEFAULT_FIRST_BUCKET_BYTES``, then ``bucket_bytes``, DDP's 25 MiB), each bucket summed by
  ``_c10d_functional.all_reduce`` and waited for by ``wait_tensor`` before the optimizer
  reads it.

The planner sees each ``all_reduce`` as an op, issued asynchronously, whose
``wait_tensor`` takes the communication time (the bucket's bytes over the measured
bandwidth of the process group: :func:`measure_bandwidth`), and its output as a buffer
written by the collective until that wait (``plan/gaps.py``'s ``in_flight``): it is never
moved, freed or recomputed before then, and a collective is never re-run
(:func:`is_collective`: every worker must take part in each, in the same order).

The job's cancel flag and the global batch's loss travel in one more all-reduce after
the step (``execute/dataparallel.py``), as ``DDPStep`` does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.fx as fx

__all__ = ["Collective", "BUCKET_BYTES", "share", "weighted_loss", "all_reduce_gradients", "bucket_indices",
           "is_collective", "is_wait", "measure_bandwidth"]

# DDP's default bucket_cap_mb (its first bucket is smaller: dist._DEFAULT_FIRST_BUCKET_BYTES)
BUCKET_BYTES = 25 * 1024 * 1024


@dataclass(frozen=True)
class Collective:
    """A worker of a data-parallel job as the captured step needs it: its rank among
    ``world`` workers, the process group's name, the bucket size. Part of the graph's
    key: a worker's graph is its own (its share of the batch)."""

    rank: int
    world: int
    group: str
    bucket_bytes: int = BUCKET_BYTES

    @classmethod
    def current(cls, bucket_bytes: int = BUCKET_BYTES) -> Collective:
        """This process's place in the default process group (initialised by the caller)."""
        group = dist.distributed_c10d._get_default_group()
        return cls(dist.get_rank(), dist.get_world_size(), group.group_name, bucket_bytes)


def share(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of a global batch of ``n`` that worker ``rank`` trains on."""
    return n * rank // world, n * (rank + 1) // world


def weighted_loss(forward, loss_fn, x: torch.Tensor, y: torch.Tensor, c: Collective):
    """(the loss the gradient is taken of, the worker's own mean loss): ``loss_fn`` of
    ``forward`` on the worker's rows, weighted by ``share * N / n``; with no rows,
    ``out.sum() * 0`` (still in every all-reduce, with zero gradients), whose loss is 0."""
    n = len(y)
    lo, hi = share(n, c.rank, c.world)
    out = forward(x[lo:hi])
    if hi > lo:
        loss = loss_fn(out, y[lo:hi])
        return loss * ((hi - lo) * c.world / n), loss
    zero = out.sum() * 0.0
    return zero, zero


def bucket_indices(grads: list[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """DDP's buckets of ``grads`` (their positions), in the order they are reduced, as its
    reducer rebuilds them after the first iteration: in the order gradients become ready
    (reverse parameter order), the first bucket small, one dtype per bucket."""
    if not grads:
        return []
    meta = [torch.empty(g.shape, dtype=g.dtype, device="meta") for g in grads]
    # DDP's first bucket: small by default, the given size when one is given (bucket_cap_mb)
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES if bucket_bytes == BUCKET_BYTES else bucket_bytes, bucket_bytes]
    indices, _ = dist._compute_bucket_assignment_by_size(meta, limits, [False] * len(grads),
                                                         list(reversed(range(len(grads)))))
    return [list(b) for b in indices]


def all_reduce_gradients(grads: list[torch.Tensor], c: Collective) -> list[torch.Tensor]:
    """The workers' mean of ``grads``, bucket by bucket: each bucket's gradients divided by
    the world size, flattened, summed across the group; read back after its wait."""
    out: list[torch.Tensor | None] = [None] * len(grads)
    pending = []
    for bucket in bucket_indices(grads, c.bucket_bytes):
        flat = torch.cat([(grads[i] * (1.0 / c.world)).reshape(-1) for i in bucket])
        pending.append((bucket, torch.ops._c10d_functional.all_reduce(flat, "sum", c.group)))
    for bucket, reduced in pending:   # issued all, then waited for in order
        reduced = torch.ops._c10d_functional.wait_tensor(reduced)
        for i, piece in zip(bucket, reduced.split([grads[i].numel() for i in bucket])):
            out[i] = piece.view(grads[i].shape)
    return out


# -- what the planner reads --------------------------------------------------------

def is_collective(node: fx.Node) -> bool:
    """Whether ``node`` issues a collective (an op of ``_c10d_functional`` other than
    ``wait_tensor``): every worker must run it, once, in the same order, so it is never
    recomputed, and its output is written until its wait."""
    target = node.target
    return node.op == "call_function" and isinstance(target, torch._ops.OpOverload) \
        and target.namespace == "_c10d_functional" and not is_wait(node)


def is_wait(node: fx.Node) -> bool:
    """Whether ``node`` waits for a collective: it returns the collective's output itself
    (the same storage, written until then)."""
    return node.op == "call_function" and node.target is torch.ops._c10d_functional.wait_tensor.default


def measure_bandwidth(nbytes: int = 4 << 20, repeats: int = 3) -> float:
    """Bytes per second of an all-reduce over the default process group, timed on a
    float32 buffer of ``nbytes`` (the slowest worker's time, so every worker plans with
    the same figure). A collective: every worker of the group must call it."""
    buf = torch.zeros(nbytes // 4, dtype=torch.float32)
    dist.all_reduce(buf)   # the first one sets up the pairs
    seconds = torch.zeros((), dtype=torch.float64)
    for _ in range(repeats):
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        seconds += time.perf_counter() - t0
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return nbytes * repeats / max(float(seconds), 1e-9)
