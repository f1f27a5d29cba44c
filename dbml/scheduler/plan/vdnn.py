"""vDNN-conv as a fixed plan: the layer-granularity baseline TENSILE's experiments compare with.

vDNN (Rhu et al., MICRO 2016, "vDNN: Virtualized Deep Neural Networks") offloads feature
maps to host memory after their forward use and prefetches them back for backward. Its
"conv" mode, the one TENSILE's journal version takes as its baseline (vDNN's authors found
it much faster than offloading every layer's input), offloads only the *input feature maps
of convolution layers*; the prefetch for layer ``i``'s backward is issued when the backward
of the next convolution layer ``i + 1`` starts (one layer ahead), and compute waits for a
prefetch that is late. It plans no budget: its peak is whatever this plan gives.

:func:`vdnn_plan` is the release-only plan (activity analysis, ``liveness.py``) plus, for
every tensor :func:`offloaded` picks:

* a SWAP_OUT issued right after its last forward access (its last forward reader: a
  block's input may feed a residual add after its convolutions);
* a SWAP_IN issued before the backward op (``convolution_backward``) of the next
  convolution in forward order, for the first access after the swap-out; where there is
  no next convolution (the last one), or that op runs after the first access (branches:
  a downsampling convolution beside a block's own), before the first backward op or that
  access, whichever comes first.

Every event has delay 0: vDNN issues at layer boundaries and the copy channel queues.
The peak is peak.py's analysis of these events, as for every plan; ``Plan.extra_time`` is
the compute predicted to wait for late prefetches (:func:`prefetch_waits`).

>>> from dbml.scheduler.graph.sequence import AccessSequence, TensorInfo, TensorKind, Op, Phase as P
>>> t = [TensorInfo(0, "x", 8, TensorKind.ACTIVATION), TensorInfo(1, "w", 4, TensorKind.PARAM),
...      TensorInfo(2, "convolution", 8, TensorKind.ACTIVATION), TensorInfo(3, "relu", 8, TensorKind.ACTIVATION),
...      TensorInfo(4, "g", 4, TensorKind.ACTIVATION)]
>>> ops = (Op(0, "convolution", (0, 1), (2,), 0, 1, P.FORWARD), Op(1, "relu", (2,), (3,), 1, 2, P.FORWARD),
...        Op(2, "sum", (3,), (), 2, 3, P.BACKWARD), Op(3, "convolution_backward", (3, 0, 1), (4,), 3, 4, P.BACKWARD))
>>> p = vdnn_plan(AccessSequence("j", tuple(t), ops, frozenset({0, 1}), outputs=frozenset({4})))
>>> [(e.trigger, e.kind.value, e.tensor, e.before) for e in p.events if e.kind.value.startswith("swap")]
[(0, 'swap_out', 0, -1), (1, 'swap_in', 0, 3)]
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from .liveness import analyse_liveness, release_events
from .peak import analyse_peak, host_at_start
from .planner import PlanSettings
from ..graph.sequence import AccessSequence, Event, EventKind, Op, Phase, Plan, TensorKind, event_order

__all__ = ["vdnn_plan", "convolutions", "offloaded", "prefetch_waits", "Offload"]

# fx names a node after its aten op, numbering repeats: convolution, convolution_1, ...
_CONV = re.compile(r"convolution(_\d+)?")
_CONV_BACKWARD = re.compile(r"convolution_backward(_\d+)?")
# A convolution's feature map is an activation, or the batch for the first layer (vDNN
# offloads that too); weights and biases are parameters and stay (vDNN keeps them resident).
# Not the batch, which vDNN offloads too: the caller holds it through the step, so a
# host copy of it frees no device memory here (the benchmark's tracker showed it)
FEATURE_MAPS = (TensorKind.ACTIVATION,)


@dataclass(frozen=True)
class Offload:
    """One feature map vDNN offloads: swapped out after op ``out`` (its last forward
    access), swapped in after op ``prefetch`` for op ``first_use`` (its next access)."""

    tensor: int
    out: int
    prefetch: int
    first_use: int


def convolutions(seq: AccessSequence) -> list[tuple[Op, Op | None]]:
    """The forward convolutions in order, each with its backward op (None if none): the
    ``convolution_backward`` that reads the same weight and feature map."""
    backward = [op for op in seq.ops if op.phase is not Phase.FORWARD and _CONV_BACKWARD.fullmatch(op.name)]
    out = []
    for op in seq.ops:
        if op.phase is Phase.FORWARD and _CONV.fullmatch(op.name):
            reads = set(op.inputs[:2])   # (input, weight): argument order
            out.append((op, next((b for b in backward if reads <= set(b.inputs)), None)))
    return out


def offloaded(seq: AccessSequence) -> list[Offload]:
    """What vDNN-conv offloads: each convolution's feature-map inputs (``FEATURE_MAPS``)
    that are read again after their last forward access, at least two ops later (a
    copy out and straight back in saves nothing). A map several convolutions read (a
    residual block's input feeding its downsampling convolution too) is offloaded once,
    prefetched for the earliest of them."""
    live = analyse_liveness(seq)
    convs = convolutions(seq)
    backward_start = next((op.index for op in seq.ops if op.phase is not Phase.FORWARD), len(seq.ops))
    plans: dict[int, Offload] = {}
    for i, (conv, _) in enumerate(convs):
        # one layer ahead: the prefetch is issued as the next convolution's backward starts
        ahead = convs[i + 1][1].index if i + 1 < len(convs) and convs[i + 1][1] is not None else backward_start
        for t in conv.inputs:
            if seq.tensors[t].kind not in FEATURE_MAPS or seq.tensors[t].nbytes == 0:
                continue
            acc = live.accesses[t]
            out = max(a for a in acc if seq.ops[a].phase is Phase.FORWARD)
            later = bisect.bisect_right(acc, out)
            if later == len(acc) or acc[later] - out < 2:
                continue
            first_use = acc[later]
            issue = min(ahead, first_use)   # before that op starts
            if t in plans:                  # read by an earlier convolution too
                issue = min(issue, plans[t].prefetch + 1)
            plans[t] = Offload(t, out, max(issue - 1, out), first_use)
    return sorted(plans.values(), key=lambda o: (o.out, o.tensor))


def vdnn_plan(seq: AccessSequence, settings: PlanSettings | None = None) -> Plan:
    """The release-only plan plus vDNN-conv's offloads and prefetches (module docstring).
    ``settings`` is accepted for the planners' common signature; vDNN has no knobs."""
    del settings
    releases = release_events(seq)
    vanilla = analyse_peak(seq, releases).bytes
    swaps = [e for o in offloaded(seq) for e in (Event(o.out, 0.0, EventKind.SWAP_OUT, o.tensor),
                                                Event(o.prefetch, 0.0, EventKind.SWAP_IN, o.tensor, o.first_use))]
    events = tuple(sorted((*releases, *swaps), key=event_order))
    return Plan(seq.job, events, analyse_peak(seq, events).bytes, vanilla, prefetch_waits(seq, events), "vdnn",
                host_at_start(seq, events))


def prefetch_waits(seq: AccessSequence, events) -> float:
    """Seconds compute waits per iteration for prefetches that are late, by the sequence's
    latencies: copies run one at a time in issue order at ``seq.copy_bandwidth`` (vDNN's
    one copy stream), an op waits for the swap-ins it reads, and a wait delays what follows.
    (TENSILE's planner never places a late copy; vDNN's fixed schedule may.)"""
    issued: dict[int, list[Event]] = {}
    for e in sorted(events, key=event_order):
        if e.kind in (EventKind.SWAP_OUT, EventKind.SWAP_IN):
            issued.setdefault(e.trigger, []).append(e)
    shift, channel_free, ready = 0.0, 0.0, {}   # ready: (tensor, op it serves) -> copy's end
    for k in range(-1, len(seq.ops)):
        if k >= 0:
            start = seq.ops[k].start + shift
            late = max((ready.pop((t, k)) for t in seq.ops[k].inputs if (t, k) in ready), default=start)
            shift += max(late - start, 0.0)
        now = seq.ops[k].end + shift if k >= 0 else 0.0
        for e in issued.get(k, ()):
            channel_free = max(now, channel_free) + seq.copy_time(e.tensor)
            if e.kind is EventKind.SWAP_IN:
                ready[(e.tensor, e.before)] = channel_free
    return shift
