"""A data-parallel worker set's process group, as each member's device worker holds it.

``dbml.cluster.parallel`` forms the group on the driver; here is what a member does
(``worker.DeviceWorker.rendezvous``, ``join_group``, ``run_collective``): torch.distributed's
default process group, one per process, joined once per worker set and left when the worker
joins another set or a collective failed.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field, replace
from datetime import timedelta

from ..errors import DbmlError

# A collective that waits longer than this raises (torch's default for gloo is 30 min; a
# worker can wait that long for memory on its device while its peers wait in the all-reduce).
COLLECTIVE_TIMEOUT = timedelta(hours=1)


@dataclass(frozen=True)
class Group:
    """One member's view of a worker set's process group."""
    id: str
    rank: int
    world: int
    address: str
    port: int
    backend: str
    # the group's all-reduce bandwidth (bytes/s), measured once when this member joined
    # (``join``); the same figure on every member, which the planners of its jobs use
    bandwidth: float | None = field(default=None, compare=False)


# -- on a device worker --------------------------------------------------------------------

def free_port() -> int:
    """A TCP port free on this node now (rank 0's process group listens on it)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def join(current: Group | None, group: Group) -> Group:
    """This process in ``group`` as torch.distributed's default process group: at once if it is
    in it already; else it leaves ``current`` first. Blocks until every member has joined.
    A new member measures the group's bandwidth with the others (a collective, once per
    group: its buffers, gloo's pairs and their memory are the group's, not its first job's,
    and each job starts that much sooner); the Group returned carries it."""
    import torch
    import torch.distributed as dist
    from ..scheduler.graph.collective import measure_bandwidth
    if current == group and dist.is_initialized():
        return current
    leave()
    if group.backend == "nccl":
        torch.cuda.set_device(0)   # Ray shows the worker its one GPU
    dist.init_process_group(group.backend, init_method=f"tcp://{group.address}:{group.port}", rank=group.rank,
                            world_size=group.world, timeout=COLLECTIVE_TIMEOUT)
    return replace(group, bandwidth=measure_bandwidth())


def leave() -> None:
    """This process out of its process group, if it is in one (a broken group's too)."""
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


def failed_in_collective(outcome: tuple) -> bool:
    """An outcome that leaves the group broken: an error that is not dbml's own."""
    return outcome[0] == "error" and not issubclass(outcome[1][0], DbmlError)
