"""The fast path: one generated Python function for a plan that binds nothing.

A plan whose only events are releases at the end of an op (no swap, no recompute, no
delayed release, nothing on the host at the start) leaves the executor nothing to do
between ops but drop references. For it, :func:`fast_path_for` generates one function
for the whole iteration from the :class:`~.program.Program`: straight-line code over
locals, one statement per op (the same call the executor's closure makes: its ``out=``
variants for in-place updates and overwrites included), and ``del`` of the values
viewing a storage where the plan releases it. Per op there is only the aten call.

The books stay true without per-op work, because with no events the executor's ledger
is a fixed sequence of additions and releases: :func:`static_ledger` replays the
executor's rules once (an op's outputs added before it runs, an in-place update adding
new minus old, a release freeing a resident tensor) and the fast path reports that
iteration's peak, its releases and what it holds at the end, as the executor would
have measured them. The executor's reuse pool is used as the interpreter uses it (a
released buffer offered to it, a pointwise output written into a pooled buffer of its
size, buffers given back past the limit), with the ledger's totals as constants: it
keeps a large model's allocations from faulting in fresh pages every iteration.

The job's account in the device ledger hears of every change, as from the executor,
when other jobs are on the device (one generated variant calls it per op); a job alone
reports its iteration's peak at the start and, at the end, its largest ledger + pool and
what it holds: the same global and reserved peaks for no per-op cost.

Op latencies for plan updating are measured in some iterations only (a timed variant
of the function): the first :data:`MEASURE_FIRST` fast iterations, then one in
:data:`MEASURE_EVERY`; the runner folds in only those (:meth:`FastStep.measured`).

The executor runs a fast iteration when its ``fast`` attribute holds a
:class:`FastStep` that accepts the iteration (:meth:`FastStep.accepts`: made for the
plan in effect, the state all resident). The runner sets it when a plan is taken,
always at an iteration boundary; a plan with events gets None, and the executor's
interpreter runs again from the next iteration. ``DBML_NO_FASTPATH=1`` turns it off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from .. import config
from ..errors import ExecutionError
from ..graph.sequence import EventKind
from .iteration import COUNTS, ExecState, NullAccount
from .program import MULTI, SKIP, Program, call_source

__all__ = ["FastStep", "StaticLedger", "fast_path_for", "release_slots", "static_ledger", "generate",
           "MEASURE_FIRST", "MEASURE_EVERY"]

MEASURE_FIRST = 3    # the first fast iterations are timed (the tracker starts from them)
MEASURE_EVERY = 10   # then one iteration in this many is timed


@dataclass(frozen=True)
class StaticLedger:
    """The executor's ledger over one iteration of a plan with releases only."""

    start: int                 # held when the first op runs: state, batch, workspace
    peak: int                  # the iteration's peak (the executor's ``iteration_peak``)
    end: int                   # held after it: the resident state
    releases: int              # releases that freed a resident tensor (``counts["releases"]``)
    added: tuple[int, ...]     # per op, bytes added before it runs
    total: tuple[int, ...]     # per op, the ledger's total once they are added
    # per slot (0: the start, k + 1: after op k), the resident tensors it releases, each
    # with the total after its release
    freed: tuple[tuple[tuple[int, int], ...], ...]


def release_slots(after: list[tuple]) -> tuple[tuple[int, ...], ...] | None:
    """The tensors released in each slot of an event table (``Executor.after``), or None
    when the table has any other event, or a delayed release: the plan binds something."""
    slots = []
    for events in after:
        if any(kind is not EventKind.RELEASE or delay > 0 for kind, _, delay, _ in events):
            return None
        slots.append(tuple(sid for _, sid, _, _ in events))
    return tuple(slots)


def static_ledger(prog: Program, slots: tuple[tuple[int, ...], ...]) -> StaticLedger:
    """Replay the executor's ledger rules for a plan releasing ``slots`` (see the module
    docstring): the figures its interpreter would measure, exactly."""
    nbytes = prog.nbytes
    res = [False] * len(nbytes)
    for s in prog.ph_sid:
        res[s] = True
    total = sum(nbytes[s] for s in prog.ph_sid) + prog.seq.workspace
    start = peak = total
    n_ops = len(prog.op_nodes)
    added, totals, freed = [0] * n_ops, [0] * n_ops, []
    for slot, sids in enumerate(slots):
        if slot:
            k = slot - 1
            if prog.kind[k] != SKIP:
                added[k] = prog.add_bytes[k]
                total += added[k]
                peak = max(peak, total)
                for s in prog.outputs[k]:
                    res[s] = True
                if k in prog.in_place:
                    res[prog.in_place[k][1]] = False
            totals[k] = total
        here = []
        for sid in sids:
            if res[sid]:
                res[sid] = False
                total -= nbytes[sid]
                here.append((sid, total))
        freed.append(tuple(here))
    end = sum(nbytes[prog.nodes[p].meta["dbml_storage"]] for p in _state_sources(prog))
    return StaticLedger(start, peak, end, sum(map(len, freed)), tuple(added), tuple(totals), tuple(freed))


def _state_sources(prog: Program) -> list[int]:
    """Per state value (placeholders but the batch), the node holding it at the end."""
    source = {ph: o for o, ph in prog.updates.items()}
    return [prog.out_pos[source[i]] if i in source else p for i, p in enumerate(prog.placeholders[:-2])]


class _Unbound(Exception):
    """The generated code would read a value the executor would not hold there."""


class _Writer:
    """Source lines of the generated function, the locals bound so far, and per line the op."""

    def __init__(self, prog: Program, ns: dict, timed: bool, accounted: bool):
        self.prog, self.ns, self.timed, self.accounted = prog, ns, timed, accounted
        self.pooled = bool(prog.reuse_demand)   # the executor's reuse pool is used as it would use it
        self.lines: list[str] = []
        self.line_op: list[int] = []   # per line (1-based minus one), the op it computes (-1: none)
        self.bound: set[int] = set()

    def emit(self, text: str, op: int = -1) -> None:
        self.lines.append("    " + text)
        self.line_op.append(op)

    def ref(self, p: int) -> str:
        if p not in self.bound:
            raise _Unbound(p)
        return f"v{p}"

    def unbind(self, positions) -> None:
        names = [f"v{p}" for p in positions if p in self.bound]
        self.bound.difference_update(positions)
        if names:
            self.emit(f"del {', '.join(names)}")


def generate(prog: Program, slots, ledger: StaticLedger, *, timed: bool, accounted: bool) -> tuple[str, dict, list]:
    """The source of ``step(S, x, y, L, A, P, Q, X, M)`` for a plan releasing ``slots``, its
    namespace and its line -> op map. ``S``: the state values (taken over, given back
    updated); ``L``: per-op latencies (written when ``timed``, with the clock ``P``);
    ``A``: the account's ``add`` (called per change when ``accounted``); ``Q``: the
    executor's reuse pool, ``X`` its take (counting the reuse), ``M`` its limit. Raises
    :class:`_Unbound` where the plan would read a released value."""
    ns: dict = {}
    w = _Writer(prog, ns, timed, accounted)
    n_state = len(prog.placeholders) - 2
    state = prog.placeholders[:n_state]
    if state:
        w.emit(f"{''.join(f'v{p}, ' for p in state)}= S")
        w.emit(f"S[:] = {(None,) * n_state!r}")   # the iteration holds them now, as the executor does
    w.emit(f"v{prog.placeholders[-2]}, v{prog.placeholders[-1]} = x, y")
    w.emit("F = Q.free")
    w.bound.update(prog.placeholders)
    _emit_releases(w, ledger.freed[0])
    for k in range(len(prog.op_nodes)):
        if prog.kind[k] != SKIP:
            _emit_op(w, k, ledger.added[k], ledger.total[k])
        _emit_releases(w, ledger.freed[k + 1])
    for i, p in enumerate(_state_sources(prog)):
        w.emit(f"S[{i}] = {w.ref(p)}")
    w.emit(f"return {w.ref(prog.out_pos[0])}")
    return "def step(S, x, y, L, A, P, Q, X, M):\n" + "\n".join(w.lines) + "\n", ns, [-1] + w.line_op


def _emit_op(w: _Writer, k: int, added: int, total: int) -> None:
    """Op ``k`` as the executor runs it: its bytes added (the pool giving buffers back
    past the limit), its call (into a pooled buffer where one of its size is free)."""
    prog = w.prog
    target, out_pos, copy_into = prog.call_spec[k]
    call = call_source(prog.op_nodes[k], prog.pos, w.ref, w.ns, target, out_pos, copy_into)
    if w.accounted and added:
        w.emit(f"A({added})")
    if w.pooled and added:
        w.emit(f"if Q.bytes: Q.hold_within({total}, M)")
    if w.timed:
        w.emit("t0 = P()")
    r = prog.reuse[k]
    if prog.kind[k] == MULTI:
        w.emit(f"t = {call}", k)
        got = [p for _, p in prog.distribute[k]]
    elif r is not None:   # as the executor: into a pooled buffer of its size if there is one
        reuse = call_source(prog.op_nodes[k], prog.pos, w.ref, w.ns, r.target, out_arg=True)
        w.ns[f"R{k}"] = r
        w.emit(f"if F.get({r.nbytes}):")
        w.emit(f"    o = X(R{k})")
        w.emit(f"    v{prog.op_pos[k]} = {reuse}", k)
        w.emit("    del o")
        w.emit("else:")
        w.emit(f"    v{prog.op_pos[k]} = {call}", k)
        got = [prog.op_pos[k]]
    else:
        w.emit(f"v{prog.op_pos[k]} = {call}", k)
        got = [prog.op_pos[k]]
    if w.timed:
        w.emit(f"L[{k}] = P() - t0")
    if prog.kind[k] == MULTI:
        for idx, p in prog.distribute[k]:
            w.emit(f"v{p} = t[{idx}]")
        w.emit("del t")
    w.bound.update(got)
    if k in prog.in_place:   # the old value's storage is the new one's now
        w.unbind([a.pos for a in prog.alias[prog.in_place[k][1]] if a.pos not in got])


def _emit_releases(w: _Writer, freed) -> None:
    """Releases as the executor performs them: the values dropped, the bytes freed, the
    buffer offered to the reuse pool when it wants one of that size."""
    prog = w.prog
    for sid, total in freed:
        n = prog.nbytes[sid]
        bound = [a.pos for a in prog.alias[sid] if a.pos in w.bound]
        want = prog.reuse_demand.get(n, 0)
        if want and bound:
            w.emit(f"b = v{bound[0]} if len(F.get({n}, ())) < {want} else None")
        w.unbind(bound)
        if w.accounted:
            w.emit(f"A({-n})")
        if want and bound:
            w.emit(f"if b is not None: Q.recycle(b, {n}, {total}, M)")
            w.emit("del b")


class FastStep:
    """The generated iteration of one program under plans releasing ``slots``. ``plan``:
    the plan it runs for now (the executor's plan must be it)."""

    def __init__(self, prog: Program, slots, ledger: StaticLedger, plan):
        self.prog, self.slots, self.ledger, self.plan = prog, slots, ledger, plan
        self.n_state = len(prog.placeholders) - 2
        self._variants: dict[tuple[bool, bool], tuple[Callable, list]] = {}
        self.runs = 0                  # fast iterations run
        self.unmeasured_iteration = 0  # the executor's iteration count after the last untimed run
        self.counts = dict.fromkeys(COUNTS, 0)
        self.counts["releases"] = ledger.releases
        # both variants a job alone runs, now (the runner builds this in prepare(), while the
        # data is read): a failure shows here, and the first iteration compiles nothing
        self.variant(timed=False, accounted=False)
        self.variant(timed=True, accounted=False)

    def variant(self, *, timed: bool, accounted: bool) -> tuple[Callable, list]:
        key = (timed, accounted)
        if key not in self._variants:
            src, ns, line_op = generate(self.prog, self.slots, self.ledger, timed=timed, accounted=accounted)
            code = compile(src, f"<dbml fast path {self.prog.job}>", "exec")
            exec(code, ns)  # noqa: S102 - generated from the captured graph
            self._variants[key] = (ns["step"], line_op)
        return self._variants[key]

    def accepts(self, executor, state: ExecState) -> bool:
        """This iteration can run here: the executor's plan is the one it was made for,
        the whole state is resident, and the limit (if any) is not below the peak."""
        return executor.plan is self.plan and not state.host and len(state.values) == self.n_state \
            and (executor.budget is None or executor.budget >= self.ledger.peak)

    def measured(self, executor) -> bool:
        """False when the executor's last iteration was a fast one whose op latencies
        were not measured (``op_latencies()`` still holds an earlier iteration's)."""
        return self.unmeasured_iteration != executor.totals["iterations"]

    def run(self, executor, state: ExecState, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One iteration in place of :meth:`~.executor.Executor.run`, with the same books."""
        self.runs += 1
        timed = self.runs <= MEASURE_FIRST or self.runs % MEASURE_EVERY == 0
        led, mem = self.ledger, executor.mem
        mem.hold(led.start)
        account = mem.account
        alone = _alone_begin(executor.pool, account, led.peak - led.start) \
            if not isinstance(account, NullAccount) and _alone(account) else None
        accounted = alone is None and not isinstance(account, NullAccount)
        fn, line_op = self.variant(timed=timed, accounted=accounted)
        executor.it.counts = counts = dict(self.counts)   # the pool's takes count their reuse here
        limit = executor.budget if executor.budget is not None else executor.plan.peak_bytes   # the pool's
        try:
            with torch.no_grad():
                loss = fn(state.values, x, y, executor.latency, account.add, time.perf_counter, executor.pool,
                          executor._from_pool, limit)
        except (ExecutionError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with the graph context, as the executor does
            raise _with_context(e, self.prog, line_op) from e
        finally:
            if alone is not None:
                executor.pool.account = account
        mem.peak = executor.iteration_peak = led.peak
        executor.peak_bytes = max(executor.peak_bytes, led.peak)
        totals = executor.totals
        totals["releases"] += led.releases
        totals["reused_buffers"] += counts["reused_buffers"]
        totals["iterations"] += 1
        totals["fast_iterations"] = totals.get("fast_iterations", 0) + 1   # not in COUNTS: the executor never counts it
        if not timed:
            self.unmeasured_iteration = totals["iterations"]
        if alone is not None:
            _alone_end(executor.pool, account, alone, mem, led)
        else:
            mem.hold(led.end)
        return loss


# The job's account in the device ledger. With other jobs on the device, the generated
# code reports every change (the accounted variant). Alone, it reports none: the account
# hears the iteration's peak at its start, and the largest ledger + pool (which the pool
# itself tracks: only allocations and recycled buffers raise it) at its end, which gives
# the device ledger the same peaks as every change reported, for no per-op cost.
_QUIET = NullAccount()


def _alone(account) -> bool:
    """No other account is open on the job's device ledger, nor holds memory."""
    ledger = getattr(account, "ledger", None)
    return ledger is not None and ledger.current_bytes == account.bytes and len(ledger.accounts()) == 1


def _alone_begin(pool, account, rise: int) -> int:
    """Report the iteration's peak now, the pool at the end; returns the pool's reserved peak so far."""
    account.add_pool(-pool.bytes)
    account.add(rise)
    pool.account, reserved_so_far, pool.reserved_peak = _QUIET, pool.reserved_peak, 0
    return reserved_so_far


def _alone_end(pool, account, alone: int, mem, led: StaticLedger) -> None:
    """``alone``: the pool's reserved peak before the iteration."""
    reserved = max(pool.reserved_peak, led.peak)   # this iteration's largest ledger + pool
    pool.reserved_peak = max(alone, pool.reserved_peak)
    account.add_pool(reserved - led.peak)          # the device ledger's reserved peak sees it
    mem.hold(led.end)
    account.add_pool(pool.bytes - (reserved - led.peak))   # what the pool holds now


def _with_context(e: Exception, prog: Program, line_op: list) -> ExecutionError:
    """The executor's error for a failed op, found from the generated code's line."""
    k = -1
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith("<dbml fast path"):
            k = line_op[tb.tb_lineno - 1] if tb.tb_lineno - 1 < len(line_op) else -1
        tb = tb.tb_next
    node = prog.op_nodes[k].format_node() if k >= 0 else "(iteration start)"
    return ExecutionError(f"job {prog.job!r}: op {k} failed: {node}: {type(e).__name__}: {e}")


def fast_path_for(executor, previous: FastStep | None = None) -> FastStep | None:
    """The fast path for the executor's plan in effect, or None where it needs the
    interpreter: a plan with events other than releases at op ends, the event log, passive
    mode, ``DBML_NO_FASTPATH``, or a value the plan would read after releasing it.
    ``previous``: the executor's last one, reused when it releases the same tensors."""
    if config.fast_path_disabled() or executor.log_enabled or executor.evictor is not None \
            or executor.plan.host_at_start:
        return None
    slots = release_slots(executor.after)
    if slots is None:
        return None
    if previous is not None and previous.prog is executor.prog and previous.slots == slots:
        fast = previous   # the same code; its sampling goes on (a drift replan need not time anew)
        fast.plan = executor.plan
    else:
        try:
            fast = FastStep(executor.prog, slots, static_ledger(executor.prog, slots), executor.plan)
        except _Unbound:
            return None
    if executor.budget is not None and executor.budget < fast.ledger.peak:
        return None
    executor.transfers.reset()   # no copies: no copy bandwidth measured from now on
    return fast
