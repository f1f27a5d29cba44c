"""PyTorch's own memory tools as peers of dbml's scheduler in the benchmark (issue 12).

Each method is a runner the harness drives iteration by iteration, interleaved with the
others, in one process: ``make_peer(name, model, spec, x, y)`` returns a :class:`PeerStep`
whose ``step(x, y)`` is one training iteration (zero_grad, forward, cross-entropy loss,
backward, optimizer step) and returns the loss. The optimizer is built exactly as
``EagerStep`` builds it, so a peer that recomputes or copies exactly equals eager.

- ``checkpoint``: ``torch.utils.checkpoint`` (non-reentrant) around each top-level block
  (:func:`top_level_blocks` says which); BatchNorm statistics are restored after the
  recomputation, so the model's buffers too stay equal to eager's.
- ``offload``: activations saved for backward go to a host copy through
  ``torch.autograd.graph.saved_tensors_hooks`` and come back in backward; with
  ``copy_seconds`` each copy lasts as long as the emulated GPU's would (emulable).
- ``compile``: ``torch.compile`` with ``activation_memory_budget = 0.5`` (the min-cut
  partitioner recomputes cheap activations). Backend ``aot_eager_decomp_partition``:
  its graphs run op by op, so a dispatch-mode memory tracker sees every allocation
  (inductor's generated code allocates outside the dispatcher).
- ``rockmate``: not available here; :data:`ROCKMATE_ERROR` records why.

``make_peer`` takes ownership of ``model``: checkpoint wraps its blocks in place.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch
import torch._functorch.config as functorch_config   # not imported by `import torch` alone
import torch.nn.functional as F
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.checkpoint import checkpoint

from dbml.scheduler.graph.optim import OptimizerSpec, make_optimizer

from .memtrack import mark_host

PEERS = ("checkpoint", "offload", "compile", "rockmate")

# Offload tools leave small tensors where they are: a copy of a few kilobytes costs a
# transfer's fixed latency and saves nothing (torchtune's OffloadActivations uses the
# same kind of cut-off). 1 MiB is one (16, 64, 16, 16) float map.
OFFLOAD_MIN_BYTES = 1 << 20

# aot_eager_decomp_partition: the min-cut partitioner (which honours the memory budget),
# graphs run op by op, so a dispatch-mode tracker sees every allocation; inductor compiles
# for minutes here (see CompileStep)
COMPILE_BACKEND = "aot_eager_decomp_partition"
COMPILE_MEMORY_BUDGET = 0.5

# Tried in a throwaway venv (torch==2.13.0 first, then `pip install rockmate`): the install
# succeeds, the import fails. Even importable, Rockmate 2.0.0 could not run here: its
# Rockmate.__init__ sets `self.device = torch.device("cuda")` whatever the model's device.
ROCKMATE_ERROR = ("2026-11-23, stage import: ModuleNotFoundError: No module named 'rkgb.core' "
                  "(pip install rockmate installs rockmate 2.0.0 and rkgb 2.0.0, whose distribution "
                  "holds only rkgb/__init__.py and rkgb/rkgb.py; rkgb/__init__.py imports rkgb.core)")


class PeerUnavailable(RuntimeError):
    """The method cannot run here; the message says why (it goes into the results)."""


CopySeconds = Callable[[int], float]


class PeerStep:
    """One training iteration under a peer method; subclasses set up the model."""

    name = "eager"
    emulable = False

    def __init__(self, model: nn.Module, spec: OptimizerSpec):
        self.model = model
        self.optimizer = make_optimizer(spec, model.parameters())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.forward(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def stats(self) -> dict:
        return {"recomputes": 0, "swaps": 0, "note": ""}

    def close(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)


# -- checkpoint -------------------------------------------------------------------------

def top_level_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks to checkpoint one by one: the children of the longest module list.

    A model that is one ``nn.Sequential`` (the Inceptions, cnn, mlp) is its own list; any
    other model's blocks are those of the longest ``nn.Sequential`` / ``nn.ModuleList``
    among its direct children (ResNet's ``stages``, VGG's ``features``, DenseNet's
    ``features``, the transformer's ``layers``). Direct children only: that is the level a
    user wraps by hand, and each block's input is then the only activation kept.
    """
    if isinstance(model, (nn.Sequential, nn.ModuleList)):
        return list(model)
    lists = [m for m in model.children() if isinstance(m, (nn.Sequential, nn.ModuleList))]
    if not lists:
        return []
    return list(max(lists, key=len))


@contextlib.contextmanager
def _batchnorm_frozen(block: nn.Module):
    """Undo what a recomputation does to BatchNorm's running statistics: a recomputed
    forward in training mode updates them a second time, which eager never does."""
    norms = [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [[b.clone() for b in m.buffers()] for m in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, buffers in zip(norms, saved):
                for b, old in zip(m.buffers(), buffers):
                    b.copy_(old)


def _checkpointed(block: nn.Module) -> Callable:
    """``block.forward`` run under a non-reentrant checkpoint (module names, hence
    ``state_dict`` keys, stay as they were)."""
    forward = block.forward

    def contexts():
        return contextlib.nullcontext(), _batchnorm_frozen(block)

    def run(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, context_fn=contexts, **kwargs)
    return run


class CheckpointStep(PeerStep):
    name = "checkpoint"

    def __init__(self, model: nn.Module, spec: OptimizerSpec):
        blocks = top_level_blocks(model)
        if not blocks:
            raise PeerUnavailable(f"checkpoint: {type(model).__name__} has no list of blocks to checkpoint")
        for block in blocks:
            block.forward = _checkpointed(block)
        self.blocks = blocks
        super().__init__(model, spec)

    def close(self) -> None:
        super().close()
        for block in self.blocks:
            vars(block).pop("forward", None)   # the class's forward again

    def stats(self) -> dict:
        return {"recomputes": len(self.blocks), "swaps": 0,
                "note": f"{len(self.blocks)} blocks checkpointed (non-reentrant)"}


# -- offload ----------------------------------------------------------------------------

class OffloadStep(PeerStep):
    """Saved activations of ``min_bytes`` or more are copied to the host in forward and back
    in backward. Parameters and the batch are left alone: something else holds them, so a
    copy would free nothing."""

    name = "offload"
    emulable = True

    def __init__(self, model: nn.Module, spec: OptimizerSpec, *, copy_seconds: CopySeconds | None = None,
                 min_bytes: int = OFFLOAD_MIN_BYTES):
        super().__init__(model, spec)
        self.copy_seconds, self.min_bytes = copy_seconds, min_bytes
        self.swaps = self.bytes_offloaded = 0
        self._held: set[int] = set()
        self._copies: dict[tuple, tuple[StorageWeakRef, torch.Tensor]] = {}

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.swaps = self.bytes_offloaded = 0
        self._held = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        self._held |= {x.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()}
        self._copies = {}
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                return super().step(x, y)
        finally:
            self._copies = {}   # the graph holds what it still needs

    def _copy(self, t: torch.Tensor, device: torch.device, to_host: bool) -> torch.Tensor:
        """A synchronous copy of ``t`` on ``device``, lasting at least ``copy_seconds``.

        The host copy is allocated outside any dispatch mode: a tracker must never count
        it as device memory, not even for an instant. No op inside a mode ever takes a
        host copy as an argument, so a tracker that discovers tensors by the ops it sees
        never meets one; a copy back to the device is allocated inside, where it is
        device memory. (A host copy is dense, being made by empty_like: its strides are
        valid for empty_strided.)"""
        start = time.perf_counter()
        if to_host:
            with _disable_current_modes():
                out = torch.empty_like(t, device=device)
        else:   # not empty_like(t): that op would show the host copy to the tracker
            out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
        with _disable_current_modes():
            out.copy_(t)
        if self.copy_seconds is not None:
            left = self.copy_seconds(t.untyped_storage().nbytes()) - (time.perf_counter() - start)
            if left > 0:
                time.sleep(left)
        return out

    def _pack(self, t: torch.Tensor):
        nbytes = t.numel() * t.element_size()
        if nbytes < self.min_bytes or t.untyped_storage().data_ptr() in self._held:
            return t
        # a tensor saved twice (a ReLU's output, saved by the ReLU and by the next
        # convolution) is copied once while it lives; the weak reference tells a live
        # tensor from a new one that reuses a freed address
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.size(), t.stride(), t.dtype)
        seen = self._copies.get(key)
        if seen is not None and not seen[0].expired():
            return (t.device, seen[1])
        host = self._copy(t, torch.device("cpu"), to_host=True)
        mark_host(host)
        self._copies[key] = (StorageWeakRef(t.untyped_storage()), host)
        self.swaps += 1
        self.bytes_offloaded += nbytes
        return (t.device, host)

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        return self._copy(host, device, to_host=False)

    def stats(self) -> dict:
        return {"recomputes": 0, "swaps": self.swaps,
                "note": f"{self.swaps} saved activations >= {self.min_bytes} B offloaded per iteration "
                        f"({self.bytes_offloaded / 2**20:.1f} MiB)"}


# -- compile ----------------------------------------------------------------------------

class CompileStep(PeerStep):
    """``torch.compile(model)``, the loss and optimizer eager.

    The memory budget is set around every call, not around ``torch.compile()``: compiling
    is lazy, at the first call (and again on any recompile), and the partitioner reads the
    setting then. (Checked: set only around ``torch.compile()``, resnet18 saved the same
    124 tensors, 7.5 MB, as with budget 1.0; set around the call, 85 tensors, 5.2 MB.)

    Backends, measured on resnet50, batch 16, 64x64, one thread, with benchmarks/memtrack
    (activation peak above parameters, gradients and Adam's state; eager 80.5 MiB):
    ``aot_eager_decomp_partition`` compiles in 30-40 s, 74.8 MiB at budget 1.0, 50.1 MiB
    at 0.5; ``inductor`` compiles in 300 s cold (15 s from its cache), 88.9 MiB at 1.0,
    51.5 MiB at 0.5 (its buffers are seen only with memtrack.see_inductor_buffers()).
    """

    name = "compile"

    def __init__(self, model: nn.Module, spec: OptimizerSpec, *, backend: str = COMPILE_BACKEND,
                 memory_budget: float = COMPILE_MEMORY_BUDGET):
        super().__init__(model, spec)
        self.backend, self.memory_budget = backend, memory_budget
        self.compiled = torch.compile(model, backend=backend)
        self.compile_seconds: float | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with functorch_config.patch(activation_memory_budget=self.memory_budget):
            return self.compiled(x)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.compile_seconds is not None:
            return super().step(x, y)
        start = time.perf_counter()
        loss = super().step(x, y)
        self.compile_seconds = time.perf_counter() - start    # the first iteration, compile included
        return loss

    def stats(self) -> dict:
        first = "" if self.compile_seconds is None else f"; first iteration (compile) {self.compile_seconds:.1f} s"
        return {"recomputes": 0, "swaps": 0,
                "note": f"backend {self.backend}, activation_memory_budget {self.memory_budget}{first}; "
                        "no copies: unaffected by GPU-ratio emulation"}

    def close(self) -> None:
        super().close()
        torch._dynamo.reset()


# -- rockmate ---------------------------------------------------------------------------

def _rockmate(model, spec, x, y, budget_bytes):
    """Rockmate (rematerialisation solved as an ILP) if it imports; it did not here, see
    :data:`ROCKMATE_ERROR`. Imported lazily so the other peers never depend on it."""
    try:
        import rockmate   # noqa: F401
    except Exception as err:   # a broken install fails with any error, not only ImportError
        first = (str(err).splitlines() or [""])[0]
        raise PeerUnavailable(f"rockmate: stage import: {type(err).__name__}: {first}. In a venv of its own, "
                              "pip install rockmate (2.0.0) installs but does not import (rkgb 2.0.0 ships "
                              "without rkgb.core), and its Rockmate class hard-codes CUDA") from None
    raise PeerUnavailable("rockmate: stage run: Rockmate 2.0.0 places the model on CUDA whatever its "
                          f"device (Rockmate.__init__); this harness runs on {x.device.type}")


def make_peer(name: str, model: nn.Module, spec: OptimizerSpec, x: torch.Tensor, y: torch.Tensor, *,
              copy_seconds: CopySeconds | None = None, budget_bytes: int | None = None,
              offload_min_bytes: int = OFFLOAD_MIN_BYTES, compile_backend: str = COMPILE_BACKEND) -> PeerStep:
    """The runner for peer ``name`` (one of :data:`PEERS`); PeerUnavailable when it cannot run.

    ``copy_seconds(nbytes)``: how long a copy lasts under GPU-ratio emulation (offload
    only; the others make no copies). ``budget_bytes``: Rockmate's memory budget."""
    if name == "checkpoint":
        return CheckpointStep(model, spec)
    if name == "offload":
        return OffloadStep(model, spec, copy_seconds=copy_seconds, min_bytes=offload_min_bytes)
    if name == "compile":
        return CompileStep(model, spec, backend=compile_backend)
    if name == "rockmate":
        return _rockmate(model, spec, x, y, budget_bytes)
    raise ValueError(f"make_peer(): unknown peer {name!r}; peers are {', '.join(PEERS)}")
