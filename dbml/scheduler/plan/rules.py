"""How the memory ledger counts: the one statement of peak.py's rules as data.

The planner's peak analysis (``peak.py``), the executor's interpreter (``Program.add_bytes``,
``Replay``) and the fast path's replayed ledger (``codegen.static_ledger``) all count a
job's device bytes. They used to write the rules out each on their own, and two past
faults were disagreements between the copies (issue 22: "one ledger"). Each rule is now a
function here; the three read it, and only the tests' replay checker (``tests/sequences.py``)
writes the rules out again, independently, as the oracle they are checked against.

* ``op_changes``: rule 2, an op's start: + each output; an updated tensor written in place
  (``Liveness.in_place``) takes its old tensor's storage: - the old one.
* ``start_bytes``: rule 1, the iteration's start: the workspace and every initial tensor on
  the device.
* ``recompute_ops`` / ``recompute_outputs``: rule 3, a RECOMPUTE stall: it re-runs the
  generating op of each tensor of its chain (``Event.via``), then the tensor's, and adds
  every output of every one of them at its start; at its end it keeps only the tensor.

One planning rule lives here too, beside the ledger's, because it is stated in the
ledger's terms (an op's latency, a tensor's bytes, the tier's bandwidth):

* ``recompute_wins``: freeing a tensor by regenerating it beats copying it to the slow
  tier when regeneration costs fewer FLOPs per byte than the device's achieved FLOP rate
  over the tier's bandwidth (the planner's ``PlanSettings.recompute_ratio``).

>>> from dbml.scheduler.graph.sequence import AccessSequence, TensorInfo, TensorKind, Op, Phase
>>> t = (TensorInfo(0, "x", 4, TensorKind.BATCH), TensorInfo(1, "y", 8, TensorKind.ACTIVATION))
>>> seq = AccessSequence("j", t, (Op(0, "relu", (0,), (1,), 0.0, 1.0, Phase.FORWARD),), frozenset({0}))
>>> op_changes(seq), op_added_bytes(seq), start_bytes(seq, frozenset())
([((1, 8),)], [8], 4)
"""

from __future__ import annotations

from .liveness import analyse_liveness
from ..graph.sequence import AccessSequence, Event

__all__ = ["op_changes", "op_added_bytes", "start_bytes", "recompute_ops", "recompute_outputs", "stall_latency",
           "recompute_wins"]


def op_changes(seq: AccessSequence) -> list[tuple[tuple[int, int], ...]]:
    """Per op, the (tensor, bytes) changes at its start: + each output, and for an output
    written in place over an updated tensor, - that old tensor (their storage is one)."""
    live = analyse_liveness(seq)
    out = []
    for op in seq.ops:
        changes = []
        for t in op.outputs:
            changes.append((t, seq.tensors[t].nbytes))
            if t in live.in_place:
                old = live.in_place[t]
                changes.append((old, -seq.tensors[old].nbytes))
        out.append(tuple(changes))
    return out


def op_added_bytes(seq: AccessSequence) -> list[int]:
    """Per op, the bytes its start adds (``op_changes`` summed)."""
    return [sum(d for _, d in changes) for changes in op_changes(seq)]


def start_bytes(seq: AccessSequence, on_host: frozenset[int]) -> int:
    """What the ledger holds when an iteration starts: the workspace and the initial
    tensors not on the host (``on_host``: the plan's ``host_at_start``)."""
    return seq.workspace + sum(seq.tensors[t].nbytes for t in seq.initial if t not in on_host)


def recompute_ops(seq: AccessSequence, e: Event) -> list[int]:
    """The ops a RECOMPUTE re-runs, in order: the generating op of each tensor of its
    chain (``via``), then the tensor's; each once."""
    live = analyse_liveness(seq)
    return list(dict.fromkeys(live.gen[t] for t in (*e.via, e.tensor)))


def recompute_outputs(seq: AccessSequence, e: Event) -> list[int]:
    """The tensors a RECOMPUTE's stall allocates at its start: every output of its ops.
    At its end all but ``e.tensor`` are freed again."""
    return [o for g in recompute_ops(seq, e) for o in seq.ops[g].outputs]


def stall_latency(seq: AccessSequence, e: Event) -> float:
    """The seconds a RECOMPUTE stalls the compute channel: its ops' latencies."""
    return sum(seq.ops[g].latency for g in recompute_ops(seq, e))


def recompute_wins(regen_seconds: float, nbytes: int, bandwidth: float, ratio: float = 1.0) -> bool:
    """Regenerating ``nbytes`` in ``regen_seconds`` beats copying them at ``bandwidth``.

    Why: once the copy channel is full, every byte copied pushes other copies later, so
    an unhidden copy costs its whole channel time, while a recompute costs only its
    stall. The issue's form is FLOPs per byte against the device's achieved FLOP rate
    over the tier's bandwidth (about 1,000 FLOP/byte for a GPU over PCIe; on the CPU
    with disk as the slow tier, tens of GFLOP/s over 450 MB/s, about 50-100); the
    planner sees latencies, which are FLOPs over the achieved rate (or bytes over the
    memory bandwidth, for the memory-bound ops that are the cheapest to recompute), so

        FLOPs / nbytes < rate / bandwidth  <=>  regen_seconds < nbytes / bandwidth

    Norms, activations, element-wise ops and concatenations pass (a pass over memory
    against a copy over PCIe or disk); large convolutions and matmuls do not. ``ratio``
    scales the copy side (``PlanSettings.recompute_ratio``; 0 turns the rule off).

    >>> recompute_wins(0.002, 8 << 20, 450e6), recompute_wins(0.002, 8 << 20, 25e9)
    (True, False)
    """
    return ratio > 0 and regen_seconds * bandwidth < ratio * nbytes
