"""One worker's step of a data-parallel job under the memory scheduler.

A ``workers := N`` job's worker runs :class:`DataParallelStep`: the scheduled step
(``ScheduledStep``) with the gradient all-reduce captured in its graph
(``scheduler/graph/collective.py``: this worker's share of each global batch, its loss
weighted by ``share * N / n``, DDP's buckets as functional collectives), planned within
the device's budget like any other job. After each step one more all-reduce carries the
job's cancel flag and the global batch's loss, as ``dbml.cluster.ddp.DDPStep`` does
(policy 'eager' keeps that plain-PyTorch step): every worker stops at the same step (a
worker that left alone would leave the others waiting in a collective), and each returns
the global batch's loss. The step's update is applied before the flag is read; a
cancelled job stores nothing, so no worker's state is kept.

The only thing it needs of the backend that started the workers is the default
``torch.distributed`` process group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import JobCancelled
from ..scheduler.execute.runner import ScheduledStep
from ..scheduler.graph.collective import Collective, share

__all__ = ["DataParallelStep"]


class DataParallelStep(ScheduledStep):
    """ScheduledStep of one worker of the default process group; ``progress``: the job's
    progress (its ``cancelled()`` joins every step's extra all-reduce, ``check()`` raises
    its own message). Other keywords: ScheduledStep's."""

    def __init__(self, model: torch.nn.Module, loss_fn, spec, progress, **kwargs):
        kwargs.setdefault("collective", Collective.current())
        # the group's bandwidth, measured when the worker set formed (dbml.cluster.group.join);
        # without it every worker's runner measures it (a collective) as it is built
        kwargs.setdefault("comm_bandwidth", getattr(progress, "comm_bandwidth", None))
        super().__init__(model, loss_fn, spec, **kwargs)
        self.progress = progress

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = super().step(x, y)   # this worker's own mean loss (0 with no rows)
        n = len(y)
        lo, hi = share(n, self.collective.rank, self.collective.world)
        shared = torch.tensor([float(loss) * (hi - lo), float(self.progress.cancelled())], dtype=torch.float64)
        dist.all_reduce(shared)
        if shared[1] > 0:
            self.progress.check()   # the worker whose job was cancelled raises its own message
            raise JobCancelled(f"job {self.progress.id} was cancelled on another of its workers; nothing was stored")
        return (shared[0] / n).to(torch.float32).to(loss.device)
