"""Models with tied weights under the scheduler: an embedding shared with the LM head
(and registered twice, as seq2seq models share theirs), one layer used twice, a
parameter under two names, a buffer in two modules and a BatchNorm registered twice.

Each tied tensor is one graph input, its gradient the sum of its uses and its
optimizer state one; training is bit-identical to eager under every policy, and after
``finish`` the caller's model holds real tensors with the ties intact."""

from __future__ import annotations

import copy

import pytest
import torch

from dbml.scheduler.execute.runner import ScheduledStep
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.graph.capture import capture
from dbml.scheduler.graph.optim import OptimizerSpec
from helpers import assert_same, state_of, vanilla_peak

pytestmark = pytest.mark.usefixtures("one_thread")

loss_fn = torch.nn.functional.cross_entropy
VOCAB, WIDTH, BATCH, TOKENS = 48, 24, 32, 24
DEPTH = 6


class TiedLM(torch.nn.Module):
    """Tokens (B, T) -> logits over the vocabulary of the mean-pooled hidden state (the
    per-token activations are what the scheduler has to fit). The embedding is the
    output layer's weight and is also registered a second time as ``tok``."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.tok = self.embed                       # one module instance, two names
        self.mix = torch.nn.Linear(WIDTH, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight        # tied embedding / LM head

    def forward(self, tokens):
        h = self.tok(tokens)
        for _ in range(DEPTH):                       # one layer, applied DEPTH times
            h = torch.tanh(self.mix(h))
        return self.head(h.mean(dim=1))

    def ties_hold(self) -> bool:
        return self.head.weight is self.embed.weight and self.tok is self.embed


class SharedParts(torch.nn.Module):
    """Sharing other than an embedding: a layer used twice in forward, a parameter
    registered under a second name, a buffer in two modules, a BatchNorm registered
    twice and run twice (its running statistics written by both uses)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.layer = torch.nn.Linear(WIDTH, WIDTH)
        self.register_parameter("layer_bias", self.layer.bias)
        self.norm = torch.nn.BatchNorm1d(WIDTH)
        self.norm_again = self.norm
        self.a, self.b = torch.nn.Module(), torch.nn.Module()
        scale = torch.linspace(0.5, 1.5, WIDTH)
        self.a.register_buffer("scale", scale)
        self.b.register_buffer("scale", scale)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens).flatten(0, 1)     # per token: (B * T, WIDTH)
        h = torch.tanh(self.norm(self.layer(h)) * self.a.scale)
        h = torch.tanh(self.norm_again(self.layer(h)) + self.layer_bias * self.b.scale)
        return self.head(h.unflatten(0, tokens.shape).mean(dim=1))

    def ties_hold(self) -> bool:
        return (self.layer_bias is self.layer.bias and self.norm_again is self.norm
                and self.a.scale is self.b.scale)


MODELS = [TiedLM, SharedParts]


def token_batches(n: int = 3, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VOCAB, (BATCH, TOKENS), generator=g), torch.randint(0, VOCAB, (BATCH,), generator=g))
            for _ in range(n)]


def fresh(model_cls):
    torch.manual_seed(0)
    return model_cls()


def run(runner, data):
    torch.manual_seed(1)
    losses = [runner.step(x, y) for x, y in data]
    runner.finish()
    return losses


def assert_real_and_tied(model) -> None:
    """Every parameter and buffer is a real tensor (the bug left a storage-less traced
    one) and the model's sharing is as it was built."""
    assert model.ties_hold()
    for name, p in model.named_parameters(remove_duplicate=False):
        assert type(p) is torch.nn.Parameter, f"{name} is a {type(p).__name__}"
        assert p.untyped_storage().nbytes() == p.numel() * p.element_size()
    for _, b in model.named_buffers(remove_duplicate=False):
        b.data_ptr()   # raises on a tensor without storage


def test_capture_leaves_the_model_as_it_was():
    model = TiedLM()
    before = dict(model.named_parameters(remove_duplicate=False))
    captured = capture(model, loss_fn, OptimizerSpec("adam"), token_batches(1)[0])
    after = dict(model.named_parameters(remove_duplicate=False))
    assert before.keys() == after.keys() and all(after[n] is t for n, t in before.items())
    assert_real_and_tied(model)
    # the tied weight is one graph input with one optimizer state
    params = [k for k in captured.input_keys if k[0] == "param"]
    assert params == [("param", "embed.weight"), ("param", "mix.weight"), ("param", "mix.bias")]
    assert [k for k in captured.input_keys if k[0] == "state" and k[2] == "exp_avg"] == \
        [("state", n, "exp_avg") for _, n in params]


@pytest.mark.slow
@pytest.mark.parametrize("model_cls", MODELS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("policy", ["none", "tensile", "capuchin"])
def test_tied_model_trains_bit_identical_to_eager(model_cls, policy):
    spec = OptimizerSpec("adam", lr=0.01)
    data = token_batches()
    model = fresh(model_cls)
    eager, sched = copy.deepcopy(model), copy.deepcopy(model)
    budget = None if policy == "none" else vanilla_peak(model, spec, *data[0]) // 2
    eager_runner = EagerStep(eager, loss_fn, spec)
    want = run(eager_runner, data)
    runner = ScheduledStep(sched, loss_fn, spec, policy=policy, budget_bytes=budget)
    got = run(runner, data)

    assert_same(got, want)
    assert_same(state_of(sched), state_of(eager))
    assert_real_and_tied(sched)
    if budget is not None:
        stats = runner.stats()
        assert stats["measured_peak_bytes"] <= budget
        assert stats["swaps"] + stats["recomputes"] + stats["passive_swaps"] > 0   # it did schedule
    # one optimizer state per tied tensor, equal to eager's (built from the summed gradient)
    eager_states = [eager_runner.optimizer.state[p] for p in eager.parameters()]
    assert len(runner.optimizer_state()) == len(eager_states)
    for ours, theirs in zip(runner.optimizer_state(), eager_states):
        assert_same([ours["exp_avg"], ours["exp_avg_sq"]], [theirs["exp_avg"], theirs["exp_avg_sq"]])


def test_state_dict_round_trips(tmp_path):
    spec = OptimizerSpec("sgd", lr=0.1, momentum=0.9)
    data = token_batches()
    model = fresh(TiedLM)
    run(ScheduledStep(model, loss_fn, spec, policy="tensile", budget_bytes=vanilla_peak(model, spec, *data[0]) // 2),
        data)
    torch.save(model.state_dict(), tmp_path / "tied.pt")
    loaded = fresh(TiedLM)
    loaded.load_state_dict(torch.load(tmp_path / "tied.pt"))

    assert loaded.ties_hold()
    assert not torch.equal(loaded.embed.weight, fresh(TiedLM).embed.weight)   # trained values came through
    model.eval(), loaded.eval()
    x = token_batches(1, seed=9)[0][0]
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
