"""Graph capture: one whole training iteration as a static aten graph (TENSILE's G(V, E)).

:func:`capture` traces forward, backward and the optimizer update of a model once,
with ``make_fx`` over a functionalized step on fake tensors: no real compute, no device
memory. The traced function is ``torch.func.grad_and_value`` over ``functional_call``
followed by torch's own single-tensor optimizer update (``foreach=False``, the code
path :func:`~.optim.make_optimizer` uses in eager), so executing the graph op by op on
CPU reproduces eager ``loss.backward(); optimizer.step()`` bit for bit.

Graph inputs (placeholders, in this order): parameters, buffers, optimizer state, then
the batch ``x``, ``y`` (:func:`graph_state` builds the inputs before the batch). With
``OptimizerSpec.update_chunk_bytes`` set, a trainable parameter above that size is
several inputs, its pieces, each with its own optimizer state, and the update runs piece
by piece (:mod:`.chunks`: results unchanged, bit for bit). A tied tensor (an embedding that is also the LM head's weight, a
module registered twice) is one input under its first name, as ``named_parameters()``
deduplicates: its gradient is the sum of its uses (:func:`tensor_slots`).
Functionalization turns every in-place update of an input into a trailing
``copy_(input, new)``; capture removes those and returns the new values as graph
outputs instead, each mapped to the input it replaces (``CapturedStep.updates``).
The graph returns ``(loss, *updated values)``.

The optimizer's step-dependent scalars (Adam's bias corrections) stay symbolic:
``step.item()`` becomes ``_local_scalar_dense`` and Python float arithmetic nodes, which
compute in double precision at run time exactly as eager does.

Analyses written into ``node.meta`` (see :func:`annotate`):

``dbml_storage``  int storage id of a tensor-valued node (views share their base's id),
                  a tuple of ids for a multi-output node, ``None`` for non-tensors
``dbml_owner``    for a storage, the name of the node that created it
``dbml_nbytes``   bytes this node newly allocates (0 for views and non-tensors)
``dbml_phase``    :class:`~.sequence.Phase` of the node
``dbml_random``   whether the op draws random numbers (``nondeterministic_seeded`` tag)
``dbml_mutates``  whether the op writes into an input (BatchNorm's running statistics)
``dbml_kind``     for placeholders, the :class:`~.sequence.TensorKind`
``dbml_key``      for placeholders, what it holds: ``("param", name)``,
                  ``("buffer", name)``, ``("state", param name, state key)``, ``("batch", "x")``;
                  a parameter's piece adds its span: ``("param", name, (start, stop))``,
                  ``("state", param name, state key, (start, stop))``

Random numbers: the graph keeps eager's random ops (dropout's ``bernoulli`` on CPU) in
eager's order, and tracing on fake tensors draws nothing, so running the graph consumes
the global generator exactly as eager does and reproduces its masks bit for bit (tested
on CPU; on CUDA eager's fused ``native_dropout`` is traced the same way, untested here).
Capture, latency estimates and the executor never draw from the generator themselves.
Random ops are never recomputed (``dbml_random``), nor are ops that write into an
input (``dbml_mutates``: BatchNorm's running statistics).

A new batch shape (e.g. the last, smaller batch) needs its own graph;
:class:`GraphCache` keeps one per batch signature.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef

from . import collective as coll
from . import stacked
from .chunks import split, unit_layout, unit_tensors
from .optim import OptimizerSpec, add_l1, make_optimizer
from .sequence import Phase, TensorKind
from ..errors import CaptureError

__all__ = ["CapturedStep", "CaptureError", "capture", "annotate", "state_keys", "graph_state_without_optimizer",
           "init_state", "initial_states", "resumed_states", "graph_state", "trainable", "batch_signature", "tensor_slots"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class CapturedStep:
    """One traced training iteration and how its inputs and outputs map to state."""

    gm: fx.GraphModule
    spec: OptimizerSpec
    input_keys: list[tuple]             # per placeholder, its dbml_key
    updates: dict[int, int]             # output position -> placeholder position it replaces
    signature: tuple                    # batch_signature() of the example batch
    job: str = "job"
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def graph(self) -> fx.Graph:
        return self.gm.graph

    def placeholders(self) -> list[fx.Node]:
        return [n for n in self.gm.graph.nodes if n.op == "placeholder"]

    def output_node(self) -> fx.Node:
        return next(n for n in reversed(self.gm.graph.nodes) if n.op == "output")


def batch_signature(x: torch.Tensor, y: torch.Tensor) -> tuple:
    return (tuple(x.shape), x.dtype, x.device.type, tuple(y.shape), y.dtype, y.device.type)


# -- optimizer state ----------------------------------------------------------------

def state_keys(spec: OptimizerSpec) -> tuple[str, ...]:
    """The per-parameter optimizer state, in the order the graph takes it."""
    if spec.kind == "sgd":
        return ("momentum_buffer",) if spec.momentum != 0 else ()
    if spec.kind == "adagrad":
        return ("sum", "step")
    return ("exp_avg", "exp_avg_sq", "step")


def init_state(spec: OptimizerSpec, param: torch.Tensor) -> dict[str, torch.Tensor]:
    """Fresh state for ``param``, as torch.optim creates it lazily on its first step.

    SGD's momentum buffer starts at zero here, where torch clones the first gradient:
    ``0 * momentum + g`` equals ``g`` exactly (up to the sign of a zero), so one graph
    serves every iteration.
    """
    state = {}
    for key in state_keys(spec):
        if key == "step":
            # capturable=False: torch keeps Adam's step on the CPU
            state[key] = torch.zeros((), dtype=_scalar_dtype(), device="cpu")
        else:
            state[key] = torch.zeros_like(param, memory_format=torch.preserve_format)
    return state


def _scalar_dtype() -> torch.dtype:
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _optimizer_update(spec: OptimizerSpec, group: dict, params, grads, states) -> None:
    """torch's single-tensor update, in place, with the hyper-parameters eager uses."""
    if spec.kind == "sgd":
        from torch.optim.sgd import _single_tensor_sgd
        bufs = [s["momentum_buffer"] for s in states] if group["momentum"] != 0 else [None] * len(params)
        _single_tensor_sgd(params, grads, bufs, None, None, weight_decay=group["weight_decay"],
                           momentum=group["momentum"], lr=group["lr"], dampening=group["dampening"],
                           nesterov=group["nesterov"], maximize=group["maximize"], has_sparse_grad=False)
        return
    if spec.kind == "adagrad":
        from torch.optim.adagrad import _single_tensor_adagrad
        _single_tensor_adagrad(params, grads, [s["sum"] for s in states], [s["step"] for s in states], None, None,
                               lr=group["lr"], weight_decay=group["weight_decay"], lr_decay=group["lr_decay"],
                               eps=group["eps"], has_sparse_grad=False, maximize=group["maximize"],
                               differentiable=False, has_complex=False)
        return
    from torch.optim.adam import _single_tensor_adam
    _single_tensor_adam(params, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                        [], [s["step"] for s in states], None, None, amsgrad=group["amsgrad"],
                        has_complex=False, beta1=group["betas"][0], beta2=group["betas"][1],
                        lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                        maximize=group["maximize"], capturable=False, differentiable=False,
                        decoupled_weight_decay=group.get("decoupled_weight_decay", spec.kind == "adamw"))


def _eager_group(spec: OptimizerSpec) -> dict:
    """The param-group settings eager's optimizer uses for ``spec`` (one source of truth;
    a stacked spec's lr, weight_decay and momentum are its members', read from buffers)."""
    probe = torch.nn.Parameter(torch.empty(0))
    group = dict(make_optimizer(dataclasses.replace(spec, stacked=False), [probe]).param_groups[0])
    if group.get("amsgrad"):
        raise CaptureError("amsgrad is not supported by the captured optimizer")
    return group


# -- tracing ------------------------------------------------------------------------

def _phase_marker(marks: list[int]) -> Callable[[], None]:
    def mark() -> None:
        mode = get_proxy_mode()
        marks.append(len(mode.tracer.graph.nodes) if mode is not None else -1)
    return mark


def trainable(model: torch.nn.Module) -> list[bool]:
    """Per parameter, whether the optimizer updates it (eager skips a parameter whose
    ``requires_grad`` is off: it never gets a gradient)."""
    return [p.requires_grad for p in model.parameters()]


def initial_states(spec: OptimizerSpec, model: torch.nn.Module, params=None) -> list[torch.Tensor]:
    """Fresh optimizer state of every trained unit (a trainable parameter, or a piece of
    one: :mod:`.chunks`), flat, in graph input order (``params``: the tensors to shape it
    after, by default the model's own)."""
    params = list(model.parameters()) if params is None else list(params)
    layout = unit_layout(model, spec.update_chunk_bytes)
    units = unit_tensors(layout, params, copy=False)
    return [t for u in layout.trained for t in init_state(spec, units[u]).values()]


def resumed_states(spec: OptimizerSpec, model: torch.nn.Module, given: list[dict]) -> list[torch.Tensor]:
    """``given`` optimizer state (per trainable parameter, as torch.optim holds it and
    ``ScheduledStep.optimizer_state`` returns it) as the graph takes it: per trained unit,
    flat, in graph input order; copies, a piece's cut from its parameter's (``step`` whole)."""
    layout = unit_layout(model, spec.update_chunk_bytes)
    trained = [j for j, p in enumerate(model.parameters()) if p.requires_grad]
    if len(given) != len(trained):
        raise CaptureError(f"resuming optimizer state for {len(trained)} trainable parameters, got {len(given)}")
    of = {p: i for i, p in enumerate(trained)}
    out = []
    for u in layout.trained:
        p_index, span = layout.units[u]
        for key in state_keys(spec):
            value = given[of[p_index]][key].detach()
            out.append(value.clone() if span is None or key == "step" else split(value, [span])[0])
    return out


def graph_state(model: torch.nn.Module, spec: OptimizerSpec, optimizer_state: list[dict] | None = None
                ) -> list[torch.Tensor]:
    """The graph's inputs before the batch, as an executor holds them: the parameters'
    units (a whole parameter is the model's own tensor, detached; a piece a copy),
    the buffers, the optimizer state (fresh, or ``optimizer_state`` resumed:
    :func:`resumed_states`)."""
    states = initial_states(spec, model) if optimizer_state is None else resumed_states(spec, model, optimizer_state)
    return graph_state_without_optimizer(model, spec) + states


def graph_state_without_optimizer(model: torch.nn.Module, spec: OptimizerSpec) -> list[torch.Tensor]:
    """:func:`graph_state`'s parameters' units and buffers (the optimizer state follows them)."""
    units = unit_tensors(unit_layout(model, spec.update_chunk_bytes), list(model.parameters()))
    return units + [b.detach() for b in model.buffers()]


def tensor_slots(model: torch.nn.Module) -> dict[str, str]:
    """Per place a parameter or buffer sits in ``model`` (a module instance's attribute,
    named by its first path), the deduplicated name of the tensor there.

    Why: ``functional_call``'s ``tie_weights=True`` swaps in a value under every name of a
    tied tensor, and a module instance registered twice (a shared embedding: ``self.tok =
    self.embed``, BART's ``encoder.embed_tokens``) has two names for one attribute. Swapped
    twice, the second swap records the first's value as the original and the restore
    leaves that traced, storage-less tensor in the caller's model. One name per place,
    with ``tie_weights=False``, swaps each once and still binds every use of a tied
    tensor to its one graph input (so its gradient is the sum of the uses)."""
    canonical = {id(t): n for n, t in model.named_buffers()}
    canonical.update({id(t): n for n, t in model.named_parameters()})
    slots = {}
    for prefix, module in model.named_modules():   # each module instance once
        for attr, t in [*module._parameters.items(), *module._buffers.items()]:
            if t is not None:
                slots[f"{prefix}.{attr}" if prefix else attr] = canonical[id(t)]
    return slots


def _make_step_fn(model, loss_fn, spec, names, buffer_names, marks, collective=None):
    group = _eager_group(spec)
    slots = tensor_slots(model)
    keys = state_keys(spec)
    mark = _phase_marker(marks)
    layout = unit_layout(model, spec.update_chunk_bytes)
    train = layout.trained

    def step(units, buffers, flat_states, x, y):
        def loss_of(trained, all_units, bs):
            us = list(all_units)
            for i, u in zip(train, trained):
                us[i] = u
            tensors = dict(zip(names, layout.assemble(us)))
            tensors.update(zip(buffer_names, bs))  # an argument: BatchNorm updates it in place
            bound = {slot: tensors[name] for slot, name in slots.items()}
            if collective is not None:   # this worker's share, weighted (collective.py)
                out = coll.weighted_loss(lambda xs: torch.func.functional_call(model, bound, (xs,), tie_weights=False),
                                         loss_fn, x, y, collective)
                mark()  # forward ends here
                return out
            loss = loss_fn(torch.func.functional_call(model, bound, (x,), tie_weights=False), y)
            mark()  # forward ends here
            return loss

        trained = [units[i] for i in train]   # a piece's gradient: a slice of its parameter's
        if collective is None:
            grads, loss = torch.func.grad_and_value(loss_of, argnums=0)(trained, list(units), list(buffers))
        else:
            grads, (_, loss) = torch.func.grad_and_value(loss_of, argnums=0, has_aux=True)(
                trained, list(units), list(buffers))
            grads = coll.all_reduce_gradients(list(grads), collective)
        mark()  # backward ends here
        states = [dict(zip(keys, flat_states[j * len(keys):(j + 1) * len(keys)]))
                  for j in range(len(train))]
        with torch.no_grad():
            grads = add_l1(spec, trained, grads)
            if spec.stacked:   # members with their own hyper-parameters, read from the model's buffers
                hyper = stacked.hyper_parameters(dict(zip(buffer_names, buffers)))
                stacked.stacked_update(spec, group, trained, grads, states, hyper)
            else:
                _optimizer_update(spec, group, trained, grads, states)
        return loss

    return step


def shape_env() -> ShapeEnv:
    """A ``ShapeEnv`` for a step's symbolic scalars (Adam's bias correction, ``.item()`` of its
    step count) whose symbols carry no source location. torch finds one for every symbol by
    walking the stack past its own files, and listing those files imports torch.export,
    torch._inductor and networkx once per process: 0.25 s of a fresh process's first
    ``train()``. The location only ever appears in guard and symbol logs; a step is traced
    with static shapes and no guards (torch's own method where this torch has none to replace)."""
    env = ShapeEnv()
    try:
        from torch._guards import SLoc
    except ImportError:
        return env
    if callable(getattr(env, "_get_stack_summary", None)):
        env._get_stack_summary = lambda is_debug=False, framework_loc=None: (
            SLoc(framework_loc or "a step traced by dbml", None), "")
    if callable(getattr(env, "_log_create_unbacked_symbol", None)):
        # its structured trace walks the stack past the same files (torch always has a handler there)
        env._log_create_unbacked_symbol = lambda *args, **kwargs: None
    return env


def _fake_inputs(model, spec, x, y):
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=shape_env(), static_shapes=True)
    params = [fake_mode.from_tensor(p.detach()) for p in model.parameters()]
    buffers = [fake_mode.from_tensor(b) for b in model.buffers()]
    with fake_mode:
        units = unit_tensors(unit_layout(model, spec.update_chunk_bytes), params)
        states = initial_states(spec, model, params)
    return fake_mode, units, buffers, states, fake_mode.from_tensor(x), fake_mode.from_tensor(y)


def _input_keys(model, spec) -> list[tuple]:
    """Per graph input, its dbml_key; a parameter's piece (:mod:`.chunks`) and its state
    carry the piece's span last: ``("param", name, span)``, ``("state", name, key, span)``."""
    names = [n for n, _ in model.named_parameters()]
    layout = unit_layout(model, spec.update_chunk_bytes)
    piece = [() if span is None else (span,) for _, span in layout.units]
    keys = [("param", names[p], *piece[u]) for u, (p, _) in enumerate(layout.units)]
    keys += [("buffer", n) for n, _ in model.named_buffers()]
    keys += [("state", names[layout.units[u][0]], k, *piece[u]) for u in layout.trained for k in state_keys(spec)]
    return keys + [("batch", "x"), ("batch", "y")]


def _outputs_from_copies(gm: fx.GraphModule) -> dict[int, int]:
    """Replace trailing ``copy_(placeholder, new)`` nodes by graph outputs."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    position = {n: i for i, n in enumerate(placeholders)}
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    (loss,) = out.args[0] if isinstance(out.args[0], (list, tuple)) else (out.args[0],)
    new_values: list[fx.Node] = []
    updates: dict[int, int] = {}
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default \
                and node.args[0] in position:
            updates[1 + len(new_values)] = position[node.args[0]]
            new_values.append(node.args[1])
            graph.erase_node(node)
    out.args = (tuple([loss] + new_values),)
    graph.set_codegen(fx.graph.CodeGen())  # flat positional inputs, a flat output tuple
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return updates


# make_fx patches module-level state while it traces (its "patcher"), so two traces on
# two threads at once corrupt each other: concurrent jobs capture one at a time.
_TRACE_LOCK = threading.Lock()


class _QuietWhileTracing(logging.Filter):
    """torch logs a meta kernel that fails while tracing at ERROR, with its traceback; the
    failure reaches the job as a CaptureError that names it, so the log only repeats it (a
    job cancelled by the interpreter's exit mid-capture printed 28 such lines). Only
    torch's fake-tensor logger, only while dbml traces (one trace at a time)."""

    tracing = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not _QuietWhileTracing.tracing


logging.getLogger("torch._subclasses.fake_tensor").addFilter(_QuietWhileTracing())

def capture(model: torch.nn.Module, loss_fn: LossFn, optimizer_spec: OptimizerSpec,
            example_batch: tuple[torch.Tensor, torch.Tensor], *, job: str = "job",
            collective: coll.Collective | None = None) -> CapturedStep:
    """Trace one training iteration of ``model`` on fake tensors; annotate its nodes.
    ``collective``: one worker of a data-parallel job, whose step trains on its share of
    the (global) batch and all-reduces the gradients in the graph (:mod:`.collective`)."""
    x, y = example_batch
    model.train()
    names = [n for n, _ in model.named_parameters()]
    buffer_names = [n for n, _ in model.named_buffers()]
    marks: list[int] = []
    originals = _named_tensors(model)
    fake_mode, units, buffers, states, fx_, fy = _fake_inputs(model, optimizer_spec, x, y)
    step = _make_step_fn(model, loss_fn, optimizer_spec, names, buffer_names, marks, collective)
    try:
        with _TRACE_LOCK:
            _QuietWhileTracing.tracing = True
            try:
                gm = make_fx(torch.func.functionalize(step), tracing_mode="fake")(units, buffers, states, fx_, fy)
            finally:
                _QuietWhileTracing.tracing = False
    except Exception as e:  # noqa: BLE001 - re-raised with the job's context
        raise CaptureError(f"job {job!r}: could not capture the training step of "
                           f"{type(model).__name__}: {type(e).__name__}: {e}") from e
    _check_model_restored(model, originals, job)
    phase_of = _phases_by_position(gm, marks)
    updates = _outputs_from_copies(gm)
    captured = CapturedStep(gm=gm, spec=optimizer_spec, input_keys=_input_keys(model, optimizer_spec),
                            updates=updates, signature=batch_signature(x, y), job=job)
    annotate(captured, phase_of)
    return captured


def _named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict([*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)])


def _check_model_restored(model: torch.nn.Module, originals: dict[str, torch.Tensor], job: str) -> None:
    """Tracing swaps traced tensors into the caller's model and back; one left behind has
    no storage and fails much later (``finish``), so say where here."""
    left = [n for n, t in _named_tensors(model).items() if originals.get(n) is not t]
    if left:
        raise CaptureError(f"job {job!r}: capturing {type(model).__name__} left traced tensors in the "
                           f"model at {left}")


def _phases_by_position(gm: fx.GraphModule, marks: list[int]) -> dict[str, Phase]:
    """Phase per node name from the node counts recorded at the phase boundaries."""
    if len(marks) != 2 or min(marks) < 0:
        raise CaptureError(f"phase boundaries not recorded during tracing (marks={marks})")
    phases = {}
    for i, node in enumerate(gm.graph.nodes):
        phases[node.name] = (Phase.FORWARD if i < marks[0] else
                             Phase.BACKWARD if i < marks[1] else Phase.OPTIMIZER)
    return phases


# -- analyses -----------------------------------------------------------------------

_KIND_OF = {"param": TensorKind.PARAM, "buffer": TensorKind.BUFFER,
            "state": TensorKind.OPT_STATE, "batch": TensorKind.BATCH}


def is_random(node: fx.Node) -> bool:
    """Whether running ``node`` draws from a random generator (dropout masks):
    such an op is never recomputed, since a rerun would draw a different mask."""
    target = node.target
    return node.op == "call_function" and isinstance(target, torch._ops.OpOverload) \
        and torch.Tag.nondeterministic_seeded in target.tags


# Ops that write into an input although their schema does not say so (BatchNorm's running
# statistics are updated inside the kernel). Functionalization cannot see this. By op
# name: the positions of the arguments written (running_mean, running_var); the
# executor reads them to know which host copies the op makes stale.
HIDDEN_MUTATIONS: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {"native_batch_norm": (3, 4), "cudnn_batch_norm": (3, 4), "miopen_batch_norm": (3, 4)})


def mutates_inputs(node: fx.Node) -> bool:
    """Whether ``node`` writes into one of its inputs: rerunning it would apply the write
    twice, so like a random op it is never recomputed."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if target.overloadpacket.__name__ in HIDDEN_MUTATIONS:
        return True
    return any(a.alias_info is not None and a.alias_info.is_write for a in target._schema.arguments)


def writes_statistics_only(node: fx.Node) -> bool:
    """Whether the only inputs ``node`` writes are statistics the kernel updates without
    saying so (``HIDDEN_MUTATIONS``: BatchNorm's running mean and variance), which its
    outputs do not depend on in training. Such an op can be re-run on copies of those
    inputs (``execute/program.py``'s ``OnCopies``): the outputs come back bit for bit and
    the statistics are updated once, by the op's own run."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    return target.overloadpacket.__name__ in HIDDEN_MUTATIONS and \
        not any(a.alias_info is not None and a.alias_info.is_write for a in target._schema.arguments)


def _vals(val: Any) -> list:
    return list(val) if isinstance(val, (list, tuple)) else [val]


def annotate(captured: CapturedStep, phase_of: dict[str, Phase]) -> None:
    """Write dbml_storage / dbml_owner / dbml_nbytes / dbml_phase / dbml_random /
    dbml_kind / dbml_key into each node's meta."""
    ids: dict[StorageWeakRef, int] = {}
    owners: list[str] = []
    keys = iter(captured.input_keys)
    for node in captured.graph.nodes:
        node.meta["dbml_phase"] = phase_of.get(node.name, Phase.OPTIMIZER)
        node.meta["dbml_random"] = is_random(node)
        node.meta["dbml_mutates"] = mutates_inputs(node)
        if node.op == "placeholder":
            key = next(keys)
            node.meta["dbml_key"] = key
            node.meta["dbml_kind"] = _KIND_OF[key[0]]
            node.meta["dbml_phase"] = Phase.FORWARD
        if node.op == "output":
            node.meta["dbml_storage"], node.meta["dbml_nbytes"] = None, 0
            continue
        if coll.is_wait(node):   # the collective's output itself, written until here
            sid = node.args[0].meta["dbml_storage"]
            ids[StorageWeakRef(node.meta["val"].untyped_storage())] = sid
            node.meta["dbml_storage"], node.meta["dbml_nbytes"] = sid, 0
            continue
        storages, nbytes = [], 0
        for v in _vals(node.meta.get("val")):
            if not isinstance(v, torch.Tensor):
                storages.append(None)
                continue
            ref = StorageWeakRef(v.untyped_storage())
            if ref not in ids:
                ids[ref] = len(owners)
                owners.append(node.name)
                nbytes += v.untyped_storage().nbytes()
            storages.append(ids[ref])
        multi = isinstance(node.meta.get("val"), (list, tuple))
        node.meta["dbml_storage"] = tuple(storages) if multi else storages[0]
        node.meta["dbml_nbytes"] = nbytes
    for node in captured.graph.nodes:
        sid = node.meta.get("dbml_storage")
        if isinstance(sid, int):
            node.meta["dbml_owner"] = owners[sid]
    captured.meta["storage_owners"] = owners
