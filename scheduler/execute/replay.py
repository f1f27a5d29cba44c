"""Recomputation performed: re-run a tensor's generating op before the op that needs it.

A RECOMPUTE event of the plan, or a *passive* recompute when an op needs a tensor that
is neither resident nor on the host. The ledger adds all the generating op's outputs,
then removes the others (``peak.py``'s rule). An op that draws random numbers or writes
into its input is never re-run (``replayable``): its tensor is gone for good, an error.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import ExecutionError
from ..graph.access import replayable
from .devices import storage_bytes
from .iteration import IterationLedger, IterationState
from .program import MULTI, Program
from .transfers import Room

__all__ = ["Replay"]


class Replay:
    """Re-runs generating ops on the iteration's values."""

    def __init__(self, prog: Program, it: IterationState, ledger: IterationLedger):
        self.prog, self.it, self.ledger = prog, it, ledger

    def recompute(self, sid: int, before: int, fetch: Callable[[int, int], None], room: Room,
                  passive: bool = False) -> None:
        """Make ``sid`` resident before op ``before``: ``fetch`` brings the generating
        op's inputs, ``room`` makes room for its outputs (passive mode)."""
        prog, it = self.prog, self.it
        g = prog.gen[sid]
        if it.res[sid]:
            return
        if g < 0 or not replayable(prog.op_nodes[g]):
            node = prog.op_nodes[g].format_node() if g >= 0 else prog.seq.tensors[sid].name
            n_ops = len(prog.op_nodes)
            raise ExecutionError(f"job {prog.job!r}: op {before} ({prog.op_nodes[min(before, n_ops - 1)].name}) "
                                 f"needs tensor {sid}, which is gone and cannot be recomputed: {node}")
        for s in prog.inputs[g]:
            if not it.res[s]:
                fetch(s, before)
        outs = prog.outputs[g]
        need = sum(prog.nbytes[s] for s in outs)
        room(need, before, prog.inputs[g])
        self.ledger.alloc(need)
        with torch.no_grad():
            value = prog.replay_calls[g](it.env)
        if prog.kind[g] == MULTI:
            sids = prog.op_nodes[g].meta["dbml_storage"]
            value = value[sids.index(sid)]
        it.rebuild(sid, storage_bytes(value), before)
        self.ledger.free(sum(prog.nbytes[s] for s in outs if s != sid))
        it.counts["passive_recomputes" if passive else "recomputes"] += 1
