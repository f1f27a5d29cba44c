"""Fusion (issue 23 part 3): tune() trials that differ only in lr, weight_decay or momentum
trained as one stacked model, one job, each member bit-identical to its trial trained alone.

What is checked: every fused member's weights equal train()'s alone with the same
arguments (classification and a one-output regression; Adam, SGD with momentum, weight
decay and an L1 penalty, AdamW; adagrad, whose update is not stacked, is never fused), and
the members share one job; a member that diverges, or whose early stopping runs out of
patience, leaves at the epoch boundary, and the others, stacked anew, still equal their
trials alone (each stops at the epoch, with the best epoch's weights, its trial alone
does); the stacked Linear equals the single model's on the shapes where the batched
products do not (short batches, one output, a member's slice off the allocator's alignment).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import dbml
from dbml.core import catalog
from dbml.search import engine as search, stacking
from helpers import linear, load, moons

CLASSIFY = dict(label="label", features=["x1", "x2"], arch="mlp", epochs=2, policy="tensile")
REGRESS = dict(label="y", arch="mlp", epochs=2, policy="tensile")


@pytest.fixture
def db(con):
    load(con, "moons", moons(300))
    load(con, "lin", linear(300))
    return con


@pytest.fixture
def kept(monkeypatch) -> dict[int, tuple[int, dict]]:
    """Every finished trial's job id and weights (the search keeps only the best's)."""
    out: dict[int, tuple[int, dict]] = {}
    keep = search.Search._keep_if_best

    def keeping(self, trial):
        if trial.trained is not None:
            out[trial.number] = (trial.job.id, {k: v.clone() for k, v in trial.trained.module.state_dict().items()})
        return keep(self, trial)
    monkeypatch.setattr(search.Search, "_keep_if_best", keeping)
    return out


def assert_each_equals_its_trial_alone(db, rows, kept, source, fixed):
    for r in rows:
        if r["status"] != "finished":
            continue
        name = f"alone_{r['trial']}"
        summary = dbml.train(db, name, source, **{**fixed, **json.loads(r["params"])})
        assert summary["epochs"] == r["epochs"], f"trial {r['trial']} trained {r['epochs']} epochs, alone {summary}"
        alone = catalog.load(db, name, 1).module.state_dict()
        fused = kept[r["trial"]][1]
        assert all(torch.equal(fused[k], alone[k]) for k in alone), f"trial {r['trial']} {r['params']}"


@pytest.mark.parametrize("source, fixed, space", [
    ("moons", {**CLASSIFY, "hidden": [16, 8], "batch_size": 32}, {"lr": {"choice": [0.003, 0.01, 0.1]}}),
    ("moons", {**CLASSIFY, "optimizer": "sgd", "batch_size": 64, "l1_reg": 0.001},
     {"lr": {"choice": [0.01, 0.1]}, "momentum": {"choice": [0.5, 0.9]}, "weight_decay": {"choice": [0.001, 0.01]}}),
    ("lin", {**REGRESS, "optimizer": "adamw", "hidden": [32], "batch_size": 32},
     {"lr": {"choice": [0.003, 0.03]}, "weight_decay": {"choice": [0.01, 0.1]}}),
], ids=["adam-classification", "sgd-momentum-weight-decay", "adamw-regression-one-output"])
@pytest.mark.slow   # ~12.2 s: out of the -m 'not slow' inner loop (under a minute)
def test_each_fused_member_equals_its_trial_trained_alone(db, kept, source, fixed, space):
    rows = dbml.tune(db, "m", source, space=space, sampler="grid", pruner="none", **fixed)
    assert all(r["status"] == "finished" for r in rows)
    jobs = [kept[r["trial"]][0] for r in rows]
    assert len(set(jobs[1:])) == 1 and len(rows) > 2, f"the trials after the probe were not fused: jobs {jobs}"
    assert_each_equals_its_trial_alone(db, rows, kept, source, fixed)


@pytest.mark.slow   # ~1.5 s: out of the -m 'not slow' inner loop (under a minute)
def test_trials_of_an_optimizer_without_a_stacked_update_are_not_fused(db, kept):
    rows = dbml.tune(db, "m", "moons", space={"lr": {"choice": [0.01, 0.05, 0.1]}}, sampler="grid", pruner="none",
                     optimizer="adagrad", **CLASSIFY)
    assert [r["status"] for r in rows] == ["finished"] * 3 and len({r["job_id"] for r in rows}) == 3


@pytest.mark.slow   # ~2.2 s: out of the -m 'not slow' inner loop (under a minute)
def test_a_diverging_member_leaves_and_the_others_still_equal_their_trials_alone(db, kept):
    fixed = {**CLASSIFY, "optimizer": "sgd", "momentum": 0.9, "batch_size": 32, "epochs": 3}
    rows = dbml.tune(db, "m", "moons", space={"lr": {"choice": [0.01, 0.05, 1e5, 0.1]}}, sampler="grid",
                     pruner="none", objective="loss", **fixed)
    status = {json.loads(r["params"])["lr"]: r for r in rows}
    assert status[1e5]["status"] == "failed" and "lr := (now 100000.0)" in status[1e5]["error"] and status[1e5]["epochs"] < 3
    assert [r["status"] for r in rows].count("finished") == 3
    fused = [r for r in rows if r["status"] == "finished" and r["job_id"] == status[1e5]["job_id"]]
    assert len(fused) >= 2   # went on, in a fusion of the ones left
    assert_each_equals_its_trial_alone(db, rows, kept, "moons", fixed)


@pytest.mark.slow   # ~4.0 s: out of the -m 'not slow' inner loop (under a minute)
def test_each_member_stops_early_at_its_own_epoch_with_its_best_weights_as_alone(db, kept):
    """Early stopping per member: lr 1 and 3 overshoot after an epoch or two and stop (patience
    1) while lr 0.01 and 0.1 go on longer; each ends where, and with the weights, its trial alone
    does."""
    fixed = {**CLASSIFY, "optimizer": "sgd", "hidden": [16, 8], "batch_size": 32, "epochs": 6, "patience": 1}
    rows = dbml.tune(db, "m", "moons", space={"lr": {"choice": [0.01, 0.1, 1.0, 3.0]}}, sampler="grid",
                     pruner="none", **fixed)
    epochs = {json.loads(r["params"])["lr"]: r["epochs"] for r in rows}
    assert all(r["status"] == "finished" for r in rows)
    # the small rates go on longer than the overshooting ones (which rate stops exactly when
    # follows the validation rows: issue 31's exact hold-out moved 0.1's stop to epoch 5)
    assert epochs[0.01] == 6 and epochs[1.0] < 6 and epochs[3.0] < 6, epochs
    assert epochs[0.1] > max(epochs[1.0], epochs[3.0]), epochs
    assert len({kept[r["trial"]][0] for r in rows if json.loads(r["params"])["lr"] != 0.01}) == 1   # one fused job
    assert_each_equals_its_trial_alone(db, rows, kept, "moons", fixed)


@pytest.mark.parametrize("rows, inputs, outputs", [
    (32, 16, 8), (7, 16, 32), (11, 64, 32), (32, 32, 1), (32, 1, 32), (1, 32, 16), (7, 17, 3), (64, 17, 128)])
def test_the_stacked_linear_equals_the_single_models_on_every_shape(rows, inputs, outputs):
    """Where the batched products differ (batches of 5-7 or 9-11 rows, one output or one
    input, a member's slice off a 64-byte boundary: MKL's kernels), the probe runs that
    shape one member at a time."""
    members = 3
    stacking.probe_linears(torch.nn.Linear(inputs, outputs), members, [rows], "cpu")
    torch.manual_seed(rows + inputs + outputs)
    x = torch.randn(members, rows, inputs, requires_grad=True)
    weight = torch.randn(members, outputs, inputs, requires_grad=True)
    bias = torch.randn(members, outputs, requires_grad=True)
    grad = torch.randn(members, rows, outputs)
    out = stacking.batched_linear(x, weight, bias)
    stacked = torch.autograd.grad(out, [weight, bias, x], grad)
    for k in range(members):
        own = [t[k].detach().clone().requires_grad_() for t in (weight, bias, x)]
        single = F.linear(own[2], own[0], own[1])
        assert torch.equal(single, out[k])
        assert all(torch.equal(a, b[k]) for a, b in zip(torch.autograd.grad(single, own, grad[k]), stacked))


def test_the_probe_finds_shapes_the_batched_products_round_differently():
    """Without the probe the batched products would serve every shape: on MKL, a batch of
    seven rows is one they round otherwise (if no shape differed here, the probe would be
    dead code: this says which)."""
    shapes = [(7, 16, 32), (32, 32, 1)]
    for rows, inputs, outputs in shapes:
        stacking.probe_linears(torch.nn.Linear(inputs, outputs), 3, [rows], "cpu")
    stacking.probe_linears(torch.nn.Linear(16, 32), 3, [32], "cpu")
    assert stacking._BMM_PROBE_CACHE[("cpu", 3, 32, 16, 32, True)], "a batch of 32 rows runs batched"
    assert not all(stacking._BMM_PROBE_CACHE[("cpu", 3, r, i, o, True)] for r, i, o in shapes)


def test_trials_on_a_ray_cluster_are_never_fused():
    """A fused job's stacked step runs in this process: on a Ray cluster each trial is a job of
    its own, placed on the cluster's workers (tests/test_cluster_nodes.py sees a search's
    trials on all three nodes)."""
    import dataclasses
    from dbml.core.spec import TrainSpec
    from dbml.search import fusion
    specs = [TrainSpec(model="m", source="t", label="y", arch="mlp", policy="tensile", lr=lr) for lr in (0.01, 0.02, 0.03)]
    assert fusion.group(specs) == [[0, 1, 2]]   # here: one fused job
    there = [dataclasses.replace(s, settings=dataclasses.replace(s.settings, cluster="ray")) for s in specs]
    assert fusion.group(there) == [[0], [1], [2]]
