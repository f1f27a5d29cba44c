"""Synthetic training-shaped access sequences, shared by the planner's tests and benchmarks.

:func:`training_sequence` mimics a captured training step: a forward pass of
conv/bn/relu blocks (with residual adds), the loss, a backward pass that reads the saved
activations and parameters in reverse, and an Adam update per parameter (new parameter,
exp_avg, exp_avg_sq, all updated in place). Sizes and latencies are drawn from a seeded
RNG, so a (job, n_ops, seed, ...) call always builds the same sequence.

>>> seq = training_sequence("j", 60, seed=1)
>>> len(seq.ops), len(seq.updates)
(57, 18)
"""

from __future__ import annotations

import random

from .graph.sequence import AccessSequence, Op, Phase, TensorInfo, TensorKind


class _Builder:
    def __init__(self, job: str, rng: random.Random):
        self.job, self.rng = job, rng
        self.tensors: list[TensorInfo] = []
        self.ops: list[tuple] = []
        self.initial: set[int] = set()

    def tensor(self, name, nbytes, kind, initial=False, random_=False) -> int:
        t = len(self.tensors)
        self.tensors.append(TensorInfo(t, name, int(nbytes), kind, random_))
        if initial:
            self.initial.add(t)
        return t

    def op(self, name, inputs, outputs, latency, phase, random_=False) -> None:
        self.ops.append((name, tuple(dict.fromkeys(inputs)), tuple(outputs), latency, phase, random_))

    def build(self, updates, outputs, bandwidth) -> AccessSequence:
        ops, t = [], 0.0
        for i, (name, ins, outs, lat, phase, rnd) in enumerate(self.ops):
            ops.append(Op(i, name, ins, outs, t, t + lat, phase, rnd))
            t += lat
        return AccessSequence(self.job, tuple(self.tensors), tuple(ops), frozenset(self.initial),
                              updates, workspace=64 << 20, copy_bandwidth=bandwidth,
                              outputs=frozenset(outputs))


def training_sequence(job: str, n_ops: int, seed: int = 0, bandwidth: float = 12e9,
                      act_mb: float = 24.0, dropout_every: int = 0) -> AccessSequence:
    """About ``n_ops`` ops: forward blocks, loss, backward, Adam (three updates per param)."""
    rng = random.Random(seed)
    b = _Builder(job, rng)
    x = b.tensor("x", act_mb * 2**20 / 2, TensorKind.BATCH, initial=True)
    y = b.tensor("y", 4096, TensorKind.BATCH, initial=True)
    layers = max(2, round((n_ops - 3) / 9.33))   # 3.33 fwd + 4 bwd + 2 Adam ops per layer
    params, saved, cur = [], [], x
    for i in range(layers):
        scale = rng.uniform(0.3, 1.5)
        w = b.tensor(f"w{i}", rng.uniform(0.05, 4) * 2**20, TensorKind.PARAM, initial=True)
        params.append(w)
        a = b.tensor(f"conv{i}", act_mb * scale * 2**20, TensorKind.ACTIVATION)
        b.op(f"conv{i}", [cur, w], [a], rng.uniform(2e-4, 3e-3), Phase.FORWARD)
        n = b.tensor(f"bn{i}", act_mb * scale * 2**20, TensorKind.ACTIVATION)
        stats = b.tensor(f"bn{i}_stats", 8192, TensorKind.ACTIVATION)
        b.op(f"bn{i}", [a], [n, stats], rng.uniform(1e-4, 1e-3), Phase.FORWARD)
        r = b.tensor(f"relu{i}", act_mb * scale * 2**20, TensorKind.ACTIVATION,
                     random_=bool(dropout_every and i % dropout_every == 0))
        b.op(f"relu{i}", [n], [r], rng.uniform(5e-5, 5e-4), Phase.FORWARD,
             random_=bool(dropout_every and i % dropout_every == 0))
        if i >= 2 and i % 3 == 0:            # residual add
            s = b.tensor(f"add{i}", act_mb * scale * 2**20, TensorKind.ACTIVATION)
            b.op(f"add{i}", [r, saved[-2][3]], [s], rng.uniform(5e-5, 3e-4), Phase.FORWARD)
            r = s
        saved.append((cur, a, stats, r, w))
        cur = r
    loss = b.tensor("loss", 4, TensorKind.ACTIVATION)
    b.op("loss", [cur, y], [loss], 1e-4, Phase.FORWARD)
    g = b.tensor("grad_out", b.tensors[cur].nbytes, TensorKind.ACTIVATION)
    b.op("loss_bwd", [cur, y], [g], 1e-4, Phase.BACKWARD)
    grads = {}
    for i in reversed(range(layers)):
        inp, a, stats, r, w = saved[i]
        gr = b.tensor(f"grelu{i}", b.tensors[a].nbytes, TensorKind.ACTIVATION)
        b.op(f"relu_bwd{i}", [g, r], [gr], rng.uniform(5e-5, 5e-4), Phase.BACKWARD)
        gb = b.tensor(f"gbn{i}", b.tensors[a].nbytes, TensorKind.ACTIVATION)
        b.op(f"bn_bwd{i}", [gr, a, stats], [gb], rng.uniform(1e-4, 1e-3), Phase.BACKWARD)
        gw = b.tensor(f"gw{i}", b.tensors[w].nbytes, TensorKind.ACTIVATION)
        b.op(f"conv_bwd_w{i}", [gb, inp], [gw], rng.uniform(2e-4, 3e-3), Phase.BACKWARD)
        gx = b.tensor(f"gx{i}", b.tensors[inp].nbytes, TensorKind.ACTIVATION)
        b.op(f"conv_bwd_x{i}", [gb, w], [gx], rng.uniform(2e-4, 3e-3), Phase.BACKWARD)
        grads[w], g = gw, gx
    updates = {}
    for w in params:
        m = b.tensor(f"{b.tensors[w].name}_m", b.tensors[w].nbytes, TensorKind.OPT_STATE, initial=True)
        v = b.tensor(f"{b.tensors[w].name}_v", b.tensors[w].nbytes, TensorKind.OPT_STATE, initial=True)
        m2 = b.tensor(f"{b.tensors[w].name}_m_new", b.tensors[w].nbytes, TensorKind.OPT_STATE)
        v2 = b.tensor(f"{b.tensors[w].name}_v_new", b.tensors[w].nbytes, TensorKind.OPT_STATE)
        w2 = b.tensor(f"{b.tensors[w].name}_new", b.tensors[w].nbytes, TensorKind.PARAM)
        b.op(f"adam_mv_{w}", [grads[w], m, v], [m2, v2], 5e-5, Phase.OPTIMIZER)
        b.op(f"adam_w_{w}", [w, m2, v2], [w2], 5e-5, Phase.OPTIMIZER)
        updates.update({w2: w, m2: m, v2: v})
    return b.build(updates, {loss}, bandwidth)
