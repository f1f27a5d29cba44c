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
from ..graph.sequence import Event, EventKind
from ..plan.rules import recompute_outputs
from .devices import as_view, storage_bytes
from .iteration import IterationLedger, IterationState
from .program import MULTI, Program
from .transfers import Room

__all__ = ["Replay"]


class Replay:
    """Re-runs generating ops on the iteration's values."""

    def __init__(self, prog: Program, it: IterationState, ledger: IterationLedger):
        self.prog, self.it, self.ledger = prog, it, ledger

    def recompute(self, sid: int, before: int, fetch: Callable[[int, int], None], room: Room,
                  passive: bool = False, via: tuple[int, ...] = ()) -> None:
        """Make ``sid`` resident before op ``before``: ``fetch`` brings the generating
        op's inputs, ``room`` makes room for its outputs (passive mode). ``via``: a chain
        (``Event.via``): those tensors are remade first, in order, and dropped after; the
        ledger adds every output of every op re-run at the start and removes all but
        ``sid``'s at the end, as ``peak.py`` counts a chain's stall."""
        prog, it = self.prog, self.it
        if it.res[sid]:
            return
        chain = (*via, sid)
        for u in chain:
            self._check_replayable(u, before)
        made = set(via)
        for g in {prog.gen[u] for u in chain}:
            for s in prog.inputs[g]:
                if s not in made and not it.res[s]:
                    fetch(s, before)
        outs = recompute_outputs(prog.seq, Event(before - 1, 0.0, EventKind.RECOMPUTE, sid, before, tuple(via)))
        need = sum(prog.nbytes[s] for s in outs)   # rule 3, owned by plan/rules.py
        room(need, before, prog.inputs[prog.gen[sid]])
        self.ledger.alloc(need)
        with torch.no_grad():
            for u in via:
                _place(it, u, storage_bytes(self._run(u)), before)
            value = self._run(sid)
        for u in via:
            it.drop(u)
        it.rebuild(sid, storage_bytes(value), before)
        self.ledger.free(sum(prog.nbytes[s] for s in outs if s != sid))
        it.counts["passive_recomputes" if passive else "recomputes"] += 1

    def _run(self, sid: int):
        """The value of ``sid``'s generating op, run on the iteration's values."""
        prog = self.prog
        g = prog.gen[sid]
        value = prog.replay_calls[g](self.it.env)
        if prog.kind[g] == MULTI:
            sids = prog.op_nodes[g].meta["dbml_storage"]
            value = value[sids.index(sid)]
        return value

    def _check_replayable(self, sid: int, before: int) -> None:
        prog = self.prog
        g = prog.gen[sid]
        if g < 0 or not replayable(prog.op_nodes[g]):
            node = prog.op_nodes[g].format_node() if g >= 0 else prog.seq.tensors[sid].name
            n_ops = len(prog.op_nodes)
            raise ExecutionError(f"job {prog.job!r}: op {before} ({prog.op_nodes[min(before, n_ops - 1)].name}) "
                                 f"needs tensor {sid}, which is gone and cannot be recomputed: {node}")


def _place(it: IterationState, sid: int, flat: torch.Tensor, k: int) -> None:
    """A chain's tensor, for the ops of the chain that read it: the values of every node
    that views ``sid`` and ran before op ``k`` (read later or not)."""
    for p, dtype, size, stride, offset, ran in it.prog.alias[sid]:
        if ran < k:
            it.env[p] = as_view(flat, dtype, size, stride, offset)
    it.res[sid] = True
