"""tune()'s search as Optuna sees it: the study made from stored trials, and the space's
dimensions as Optuna's distributions.

Optuna's categories are scalars, so a list choice (``hidden``'s ``[128, 64]``) is held as its
JSON text (``encode``) and read back (``decode``); ``dbml.trials`` keeps Optuna's form of each
trial (its params and distributions, ``search``) beside the decoded one, so a study made again
(``make_study``, ``frozen``) is the one that ran. A search resumed with another space (a
choice's values, a range, a distribution changed) learns from the stored trials its space
could have drawn, each seen under the new space's distributions (Optuna refuses a study whose
trials disagree on a parameter's distribution); the others stay stored and ranked. Optuna
is imported when a function runs.

``best_trial`` is the one rule of which trial is best, for tune()'s search and BigQuery ML's
trials alike; ``dbml.trials.ROWS_SQL`` states it in SQL for the stored ones.
"""

from __future__ import annotations

import json
import math
from typing import Iterable

from .tunespec import Dimension, TuneRequest

__all__ = ["make_study", "frozen", "distribution", "encode", "decode", "dists_json", "best_trial"]


def best_trial(results: Iterable[tuple[int, float | None]], direction: str) -> int | None:
    """The number of the best of ``results`` ((trial number, objective) pairs): the lowest
    objective, the highest where ``direction`` is 'maximize'; a tie goes to the lowest
    number. A trial without an objective (None) is never best, and NaN is worse than any
    number (as ``dbml.trials.ROWS_SQL`` orders them); None when no trial has an objective.

    >>> best_trial([(1, 0.5), (2, 0.7), (3, 0.7), (4, None)], "maximize")
    2
    >>> best_trial([(1, 0.5), (2, 0.7)], "minimize")
    1
    """
    sign = -1.0 if direction == "maximize" else 1.0
    scored = [(math.isnan(value), 0.0 if math.isnan(value) else sign * value, number)
              for number, value in results if value is not None]
    return min(scored)[2] if scored else None


def make_study(request: TuneRequest, stored: list[dict]):
    """An in-memory Optuna study holding those of ``stored`` (dbml.trials rows) that the request's
    space could have drawn (``frozen``), with the request's sampler (seeded by ``seed`` and the
    trials before, so a resumed search draws anew) and pruner."""
    import optuna

    seed = (request.base.seed + len(stored)) % 2**32
    sampler = (optuna.samplers.TPESampler(seed=seed, constant_liar=True) if request.sampler == "tpe" else
               optuna.samplers.RandomSampler(seed=seed))   # grid: every point enqueued (Search._plan)
    pruner = {"median": lambda: optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0),
              "successive_halving": lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=1),
              "none": optuna.pruners.NopPruner}[request.pruner]()
    study = optuna.create_study(direction=request.direction, sampler=sampler, pruner=pruner)
    space = {d.name: distribution(d) for d in request.space.dims}
    study.add_trials([t for t in (frozen(r, space) for r in stored) if t is not None])
    return study


def frozen(record: dict, space: dict | None = None):
    """A dbml.trials row as the finished Optuna trial it was; with ``space`` (parameter -> Optuna
    distribution, a search's), as that search sees it: only the space's parameters, each under
    the space's distribution, or None where the space cannot draw a value the trial took."""
    import optuna
    from optuna.distributions import json_to_distribution
    from optuna.trial import TrialState

    params = record["search"]["params"]
    dists = {k: json_to_distribution(v) for k, v in record["search"]["distributions"].items()}
    if space is not None:
        if not all(_draws(space[k], v) for k, v in params.items() if k in space):
            return None
        params = {k: v for k, v in params.items() if k in space}
        dists = {k: space[k] for k in params}
    state = {"finished": TrialState.COMPLETE, "pruned": TrialState.PRUNED}.get(record["status"], TrialState.FAIL)
    return optuna.trial.create_trial(
        state=state, value=record["objective"] if state == TrialState.COMPLETE else None,
        params=params, distributions=dists,
        intermediate_values={i + 1: v for i, v in enumerate(record["objectives"])})


def _draws(dist, value) -> bool:
    """Whether Optuna's ``dist`` can draw ``value`` (a value of another choice list, outside a
    range or of another type: no)."""
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False


def distribution(d: Dimension):
    """The Optuna distribution of one dimension (a list choice as its JSON text: Optuna's
    categories are scalars)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if d.kind == "choice":
        return CategoricalDistribution([_scalar(v) for v in d.choices])
    if d.kind in ("int", "log_int"):
        return IntDistribution(int(d.low), int(d.high), log=d.log)
    return FloatDistribution(d.low, d.high, log=d.log)


def _scalar(value):
    return json.dumps(value) if isinstance(value, (list, tuple)) else value


def encode(dims: tuple[Dimension, ...], values: dict) -> dict:
    """Drawn values as Optuna holds them (``distribution``)."""
    return {d.name: _scalar(values[d.name]) for d in dims if d.name in values}


def decode(dims: tuple[Dimension, ...], params: dict) -> dict:
    """Optuna's params as the train() arguments they stand for, in the space's order."""
    return {d.name: json.loads(params[d.name]) if d.sql_type == "INTEGER[]" else params[d.name]
            for d in dims if d.name in params}


def dists_json(distributions: dict) -> dict:
    from optuna.distributions import distribution_to_json
    return {k: distribution_to_json(v) for k, v in distributions.items()}
