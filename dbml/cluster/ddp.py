"""One worker's step of a data-parallel job with policy 'eager': plain PyTorch under DistributedDataParallel.

Every other policy runs ``dbml.core.dataparallel.DataParallelStep`` instead: the same
semantics (share, weighting, the zero-row worker, the cancel flag and the global loss in
one more all-reduce) with the gradient all-reduce captured in the scheduled graph
(``dbml.scheduler.graph.collective``), under the device's memory budget.

Every worker of a ``workers := N`` job streams the same global batches (the job's rows,
in the order and shuffle one worker would use: ``training._run_epochs`` on a copy of the
scratch table) and trains on its own contiguous share of each: rows ``[n*r/N, n*(r+1)/N)``
of a batch of ``n``. DDP averages the gradients over the workers, so each worker's mean
loss is weighted by its share (``share * N / n``): the averaged gradient is then the
gradient of the global batch's mean loss, as one worker with the whole batch computes it,
also for a last batch that does not divide evenly (a worker with no rows contributes zero).
What differs from one worker is the order floating-point sums are taken in: the stored
model equals one worker's within float32 rounding (tests/test_cluster.py states the bound).

The step's collective also carries the job's cancel flag, so every worker stops at the
same step (a worker that left alone would leave the others waiting in a collective), and
the global batch's loss, which each worker returns as the step's loss.

BatchNorm's statistics are each worker's share's (DDP broadcasts rank 0's buffers), and
dropout masks are drawn per worker: models with them equal one worker's only in
distribution. DDP's gradient hooks are outside any captured graph: this step is plain
PyTorch, unplanned (the summary's policy says 'eager').
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..errors import JobCancelled
from ..scheduler.execute.step import EagerStep


class DDPStep(EagerStep):
    """EagerStep with DDP across the worker set's process group (``parallel``); ``job``: the job's
    progress (its ``cancelled()`` joins every step's collective)."""

    def __init__(self, model: torch.nn.Module, loss_fn, spec, job):
        super().__init__(model, loss_fn, spec)
        self.job = job
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        cuda = next(model.parameters()).is_cuda
        self.ddp = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if cuda else None)

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        n = len(y)
        lo, hi = n * self.rank // self.world, n * (self.rank + 1) // self.world
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        out = self.ddp(x[lo:hi])
        if hi > lo:
            loss = self.loss_fn(out, y[lo:hi])
            (loss * ((hi - lo) * self.world / n)).backward()
        else:   # no rows here: still in DDP's gradient all-reduce, with zeros
            loss = out.sum() * 0.0
            loss.backward()
        shared = torch.tensor([float(loss.detach()) * (hi - lo), float(self.job.cancelled())], dtype=torch.float64)
        dist.all_reduce(shared)
        if shared[1] > 0:
            self.job.check()   # the worker whose job was cancelled raises its own message
            raise JobCancelled(f"job {self.job.id} was cancelled on another of its workers; nothing was stored")
        self.optimizer.step()
        return (shared[0] / n).to(torch.float32).to(out.device)
