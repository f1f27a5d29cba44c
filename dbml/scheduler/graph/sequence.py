"""The tensor access sequence: what the planner sees of one job's training iteration.

This module is the contract between capture (which builds an :class:`AccessSequence`
from a captured graph and latency estimates) and planning (passes that read it and
return a :class:`Plan`). It holds only data; passes live in their own modules.

Terms follow TENSILE (papers/tensile-journal.txt, Section III):

* a *tensor* here is one block of device memory (a storage): views share their base's
  tensor id and allocate nothing;
* each op has a *generating access* (TGA) for every tensor it creates and a *using
  access* (TUA) for every tensor it reads;
* times are seconds from the start of the iteration, ops run one after another on the
  compute channel: ``ops[i].start == ops[i-1].end``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping


class TensorKind(str, Enum):
    PARAM = "param"          # model parameter, graph input, updated by the optimizer
    OPT_STATE = "opt_state"  # optimizer state (momentum, exp_avg, exp_avg_sq, step)
    BUFFER = "buffer"        # module buffer (BatchNorm running stats)
    BATCH = "batch"          # the iteration's input data and labels
    ACTIVATION = "activation"  # anything an op generates during the iteration


class Phase(str, Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


@dataclass(frozen=True)
class TensorInfo:
    id: int               # dense index into AccessSequence.tensors
    name: str             # fx node name of the node that owns the storage
    nbytes: int
    kind: TensorKind
    # Never recompute: the generating op is not replayable (it draws random numbers, as
    # dropout, or writes into an input besides its outputs, as BatchNorm's statistics).
    not_replayable: bool = False

    @property
    def caller_held(self) -> bool:
        """The batch: its caller holds it through the step, so moving it off the device
        (a swap, an eviction) frees nothing. No scheduler moves it."""
        return self.kind is TensorKind.BATCH


@dataclass(frozen=True)
class Op:
    index: int                 # position in execution order
    name: str                  # fx node name
    inputs: tuple[int, ...]    # tensor ids read (TUAs), in argument order, no duplicates
    outputs: tuple[int, ...]   # tensor ids generated (TGAs); empty for pure views
    start: float
    end: float
    phase: Phase
    not_replayable: bool = False   # see TensorInfo.not_replayable
    # Issues a collective (graph/collective.py): its outputs are written by the other
    # workers' contributions until their next access (the wait), so they stay put until then.
    collective: bool = False

    @property
    def latency(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class AccessSequence:
    job: str
    tensors: tuple[TensorInfo, ...]
    ops: tuple[Op, ...]
    # Resident when an iteration starts: parameters, optimizer state, buffers, the batch.
    initial: frozenset[int]
    # Cross-iteration mapping: tensor generated this iteration -> the initial tensor it
    # replaces in the next one (updated parameter -> parameter, new exp_avg -> exp_avg, ...).
    updates: Mapping[int, int] = field(default_factory=dict)
    workspace: int = 0            # bytes held for the whole iteration (allocator, libraries)
    copy_bandwidth: float = 8e9   # bytes per second, host <-> device, each direction
    # Graph outputs, never released within the iteration: the loss and whatever the
    # runtime reads after the step. Always includes the keys of ``updates``.
    outputs: frozenset[int] | None = None

    def __post_init__(self) -> None:
        outputs = frozenset(self.outputs or ()) | frozenset(self.updates)
        object.__setattr__(self, "outputs", outputs)

    @property
    def duration(self) -> float:
        return self.ops[-1].end if self.ops else 0.0

    def copy_time(self, tensor: int) -> float:
        return self.tensors[tensor].nbytes / self.copy_bandwidth


class EventKind(str, Enum):
    RELEASE = "release"        # free the tensor's device memory
    SWAP_OUT = "swap_out"      # copy to host, then free on device
    SWAP_IN = "swap_in"        # copy back from host before its next use
    RECOMPUTE = "recompute"    # re-run the generating op before a later use


@dataclass(frozen=True, order=True)
class Event:
    """One scheduling event, encoded as the executor performs it.

    ``trigger`` is the index of the op after whose completion the event is issued,
    ``-1`` meaning "at the start of the iteration"; ``delay`` is the time in seconds
    after that point. For SWAP_IN and RECOMPUTE, ``before`` is the index of the op whose
    input the tensor must be for (the TUA it serves); for RELEASE and SWAP_OUT, ``-1``.
    A RECOMPUTE's ``via``: tensors gone at that point that its generating op needs,
    regenerated first by their own generating ops, in this order, and dropped again when
    the tensor is made (a chain of recomputation from the resident tensors it starts at).
    """

    trigger: int
    delay: float
    kind: EventKind
    tensor: int
    before: int = -1
    via: tuple[int, ...] = ()

    def __repr__(self) -> str:
        via = f", via={self.via!r}" if self.via else ""
        return (f"Event(trigger={self.trigger!r}, delay={self.delay!r}, kind={self.kind!r}, tensor={self.tensor!r}, "
                f"before={self.before!r}{via})")


# The one order of simultaneous events. Events issued at the same (trigger, delay) are
# performed by the executor, and counted by peak analysis and the planner, in this order:
# frees before copies, a copy's start before recomputation (peak.py states the ledger's
# rules for changes at one instant).
EVENT_ORDER = (EventKind.RELEASE, EventKind.SWAP_OUT, EventKind.SWAP_IN, EventKind.RECOMPUTE)
EVENT_RANK = {kind: rank for rank, kind in enumerate(EVENT_ORDER)}


def event_order(e: Event) -> tuple:
    """Sort key of an event: (trigger, delay), then ``EVENT_ORDER``, tensor, served op."""
    return (e.trigger, e.delay, EVENT_RANK[e.kind], e.tensor, e.before, e.via)


@dataclass(frozen=True)
class Plan:
    job: str
    events: tuple[Event, ...]         # sorted by (trigger, delay)
    peak_bytes: int                   # predicted peak with this plan
    vanilla_peak_bytes: int           # predicted peak with release-after-last-use only
    extra_time: float = 0.0           # predicted added seconds per iteration
    policy: str = "tensile"
    # Initial tensors that start every iteration on the host (cross-iteration swapping:
    # their updated versions are swapped out in the optimizer phase and not brought
    # back). Each has a SWAP_IN before its first use and no SWAP_OUT before that.
    host_at_start: frozenset[int] = frozenset()

    def count(self, kind: EventKind) -> int:
        return sum(1 for e in self.events if e.kind is kind)
