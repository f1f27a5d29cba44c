"""plan/simulate.py, the timeline both PoocH and SwapAdvisor judge a classification by:
any choice of gaps to swap and recompute becomes events the replay checker accepts, with
the peak peak.py's ledger gives; compute waits for memory rather than the peak grow."""

from __future__ import annotations

import random

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbml.scheduler.graph.sequence import EventKind
from dbml.scheduler.plan.simulate import exposed, prepare, simulate, to_plan
from dbml.scheduler.synthetic import training_sequence
from sequences import chain, check_plan, make_seq, random_sequences


def _check(prep, out, policy="test"):
    plan = to_plan(prep, out, policy)
    check_plan(prep.seq, plan)
    return plan


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=random_sequences(), seed=st.integers(0, 1000), frac=st.floats(0.2, 1.0), repairs=st.sampled_from([0, 6]))
@pytest.mark.slow   # ~0.7 s: out of the -m 'not slow' inner loop (under a minute)
def test_any_choice_becomes_events_the_replay_accepts(seq, seed, frac, repairs):
    prep = prepare(seq)
    rng = random.Random(seed)
    n = len(prep.gaps.tensor)
    swap = frozenset(g for g in range(n) if rng.random() < 0.5)
    recompute = frozenset(g for g in range(n) if rng.random() < 0.4) - swap
    out = simulate(prep, swap, recompute, int(frac * prep.vanilla), repairs)
    plan = _check(prep, out)
    assert out.swap <= swap and out.recompute <= recompute
    assert plan.peak_bytes == out.peak
    assert out.time >= seq.duration


def test_nothing_chosen_is_the_release_only_plan():
    seq = training_sequence("j", 60, seed=1)
    prep = prepare(seq)
    out = simulate(prep, frozenset())
    assert out.peak == prep.vanilla and out.time == seq.duration and out.copied == 0
    assert {e.kind for e in out.events} == {EventKind.RELEASE}


def test_slow_copies_make_compute_wait_for_memory_instead_of_the_peak_growing():
    """chain(): t1 (100 bytes) is off the device from op 0 to op 7; at 10 B/s its copy
    takes 10 s, longer than the ops between. Without repairs the swap-out has not ended
    at the peak (ops 3-4); with them op 2 waits for it, the swap-in waits for the ops that
    hold 10-byte tensors, and the peak falls to 103 bytes."""
    seq = chain(bandwidth=10.0)
    prep = prepare(seq)
    gap = next(g for g in range(len(prep.gaps.tensor)) if prep.gaps.tensor[g] == 1)
    plain = simulate(prep, frozenset({gap}), budget=103)
    repaired = simulate(prep, frozenset({gap}), budget=103, repairs=10)
    assert plain.peak == 121 > repaired.peak == 103
    assert repaired.time > plain.time
    out = next(e for e in repaired.events if e.kind is EventKind.SWAP_OUT)
    assert out.before >= 0   # synchronous: an op waits for it
    _check(prep, plain), _check(prep, repaired)
    outs, ins = exposed(repaired)
    assert gap in outs or gap in ins


def test_a_recompute_whose_input_is_away_is_dropped():
    """t2 = op1(t1), both read again by op 5. Recomputing t2 before op 5 needs t1 there:
    with t1 swapped across op 5 the recompute cannot be performed and t2 stays."""
    seq = make_seq([1, 50, 50, 1, 1, 1, 1], [0],
                   [([0], [1], 1), ([1], [2], 1), ([0], [3], 1), ([3], [4], 1), ([4], [5], 1), ([1, 2, 5], [6], 1)],
                   outputs={6}, bandwidth=100.0)
    prep = prepare(seq)
    gap = {int(prep.gaps.tensor[g]): g for g in range(len(prep.gaps.tensor))}
    alone = simulate(prep, frozenset(), frozenset({gap[2]}))
    assert alone.recompute == {gap[2]} and alone.time == seq.duration + 1.0   # op 1 again: 1 s
    both = simulate(prep, frozenset({gap[1]}), frozenset({gap[2]}))
    assert both.recompute == set() and both.swap == {gap[1]}
    _check(prep, alone), _check(prep, both)
