"""Hyperparameter tuning (``num_trials``): which options each trial trains with.

An option given as ``HPARAM_RANGE(min, max)`` or ``HPARAM_CANDIDATES([...])`` is searched;
without any, the model type's default search space is (as BigQuery ML tunes ``l1_reg`` and
``l2_reg`` of a linear model by default). ``HPARAM_TUNING_ALGORITHM`` (``ALGORITHMS``) picks how
the trials' points are chosen (``trial_points``): ``RANDOM_SEARCH`` draws every trial from a
generator seeded by the trial's number, a range log-uniformly when it spans more than a decade
from a positive lower end, else uniformly; ``GRID_SEARCH`` walks the grid of a discrete space
(candidates, integer ranges) in order, the first ``num_trials`` points; ``VIZIER_DEFAULT``
(BigQuery's default, Vizier's Bayesian optimisation) starts from the defaults, trial 1 taking each
searched option's default or the middle of its range, and then lets a Bayesian sampler choose
each next trial from the figures of those before (Optuna's TPE, seeded: ``Search``; Vizier's own
Gaussian-process bandit is Google's service). RANDOM_SEARCH and GRID_SEARCH know every point
before the first trial trains; VIZIER_DEFAULT knows trial 1's, and its later points lie in the
same checked space (``Search.checked``: each option at both ends of its range and at every
candidate). The trials, and the optimal one, are the same every time: the sampler is seeded
and training is deterministic.

The optimal trial is the one with the best ``HPARAM_TUNING_OBJECTIVES`` figure on its evaluation
rows (``OBJECTIVES``), or without one the best validation metric (accuracy or R^2, what ``train``
reports); ties: the earliest. ML.PREDICT and ML.EVALUATE use it.

Why not ``dbml.tuning.tune`` (main's tune(), made for this too): BigQuery ML serves every
trial (``ML.PREDICT(..., STRUCT(3 AS trial_id))``, ``ML.TRIAL_INFO``), and tune() stores only
the best trial's model. Until it can keep every trial's, CREATE MODEL trains one version
per trial here, one after another.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from sqlglot import exp

from ..errors import InvalidArgument
from ..search.studies import best_trial


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    integer: bool = False

    def draw(self, rng: np.random.Generator):
        if self.low > 0 and self.high / self.low > 10:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return int(round(value)) if self.integer else value

    def first(self):
        middle = math.sqrt(self.low * self.high) if self.low > 0 else (self.low + self.high) / 2
        return int(round(middle)) if self.integer else middle


@dataclass(frozen=True)
class Candidates:
    values: tuple

    def draw(self, rng: np.random.Generator):
        return self.values[int(rng.integers(len(self.values)))]

    def first(self):
        return self.values[0]


# model arch -> option -> its search space when num_trials is given without HPARAM_* options
DEFAULT_SPACES = {
    "linear": {"l1_reg": Range(1e-5, 10.0), "l2_reg": Range(1e-5, 10.0)},
    "dnn": {"learn_rate": Range(1e-4, 0.1), "dropout": Range(0.0, 0.5), "l2_reg": Range(1e-5, 1.0)},
    "wide_deep": {"learn_rate": Range(1e-4, 0.1), "dropout": Range(0.0, 0.5), "l2_reg": Range(1e-5, 1.0)},
    "boosted_tree": {"learn_rate": Range(0.01, 1.0), "max_tree_depth": Candidates((4, 6, 8, 10)),
                     "l2_reg": Range(1e-5, 10.0), "subsample": Range(0.5, 1.0)},
    "random_forest": {"max_tree_depth": Candidates((8, 12, 15, 20)), "subsample": Range(0.5, 0.9),
                      "colsample_bynode": Range(0.5, 1.0)},
}
# the value a default space's trial 1 takes (the option's own default)
FIRST = {"l1_reg": 0.0, "l2_reg": 0.0, "dropout": 0.0}
INTEGER_OPTIONS = ("max_tree_depth", "batch_size", "num_parallel_tree", "max_iterations", "num_clusters")


def space(option: str, node: exp.Expression, model: str):
    """``HPARAM_RANGE(a, b)`` / ``HPARAM_CANDIDATES([...])`` as a search space, or None for any
    other value."""
    from .parse import constant
    if not (isinstance(node, exp.Anonymous) and str(node.this).upper() in ("HPARAM_RANGE", "HPARAM_CANDIDATES")):
        return None
    fn = str(node.this).upper()
    args = [constant(a, f"option {option}: {fn}") for a in node.expressions]
    if fn == "HPARAM_RANGE":
        if len(args) != 2 or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args) \
                or not args[0] < args[1]:
            raise InvalidArgument(f"BigQuery ML: CREATE MODEL {model}: option {option} = HPARAM_RANGE(min, max) "
                                  f"takes two numbers, min < max; got {node.sql('bigquery')[:60]}")
        return Range(float(args[0]), float(args[1]), integer=option in INTEGER_OPTIONS)
    if len(args) != 1 or not isinstance(args[0], list) or not args[0]:
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {model}: option {option} = HPARAM_CANDIDATES([...]) takes "
                              f"one non-empty array; got {node.sql('bigquery')[:60]}")
    return Candidates(tuple(args[0]))


def given_spaces(options: dict) -> dict:
    """option -> space of the options given as HPARAM_RANGE or HPARAM_CANDIDATES."""
    return {k: v for k, v in options.items() if isinstance(v, (Range, Candidates))}


# HPARAM_TUNING_ALGORITHM's values (BigQuery ML's), VIZIER_DEFAULT the default
ALGORITHMS = ("VIZIER_DEFAULT", "RANDOM_SEARCH", "GRID_SEARCH")
MAX_GRID = 100_000   # GRID_SEARCH: the points enumerated (num_trials takes the first ones)


def algorithm(options: dict, spaces: dict, model: str) -> str:
    """``HPARAM_TUNING_ALGORITHM`` checked: one of ``ALGORITHMS``, with num_trials; GRID_SEARCH
    only over a discrete space (every searched option a HPARAM_CANDIDATES or an integer range)."""
    given = options.get("hparam_tuning_algorithm")
    if given is None:
        return "VIZIER_DEFAULT"
    name = str(given).upper()
    if name not in ALGORITHMS:
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {model}: hparam_tuning_algorithm {given!r} is not "
                              f"BigQuery's; use one of {', '.join(repr(a) for a in ALGORITHMS)}")
    if options.get("num_trials") is None:
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {model}: hparam_tuning_algorithm chooses the trials of "
                              f"num_trials = <number of trials>; pass num_trials too")
    continuous = [o for o, sp in sorted(spaces.items()) if isinstance(sp, Range) and not sp.integer]
    if name == "GRID_SEARCH" and continuous:
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {model}: GRID_SEARCH searches a discrete space, and "
                              f"{', '.join(continuous)} {'is' if len(continuous) == 1 else 'are'} a continuous "
                              f"range; give {continuous[0]} = HPARAM_CANDIDATES([...]), or use RANDOM_SEARCH")
    size = math.prod(len(values) for _, values in _axes(spaces)) if name == "GRID_SEARCH" else 0
    if size > MAX_GRID:
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {model}: GRID_SEARCH's grid has {size} points, more than "
                              f"{MAX_GRID}; give fewer HPARAM_CANDIDATES, or use RANDOM_SEARCH")
    return name


def _axes(spaces: dict) -> list[tuple[str, tuple | range]]:
    """(option, its values) of a discrete space, the options sorted (a continuous range: none)."""
    return [(o, sp.values if isinstance(sp, Candidates) else
             range(int(math.ceil(sp.low)), int(math.floor(sp.high)) + 1) if sp.integer else ())
            for o, sp in sorted(spaces.items())]


def _grid(spaces: dict) -> list[dict]:
    """The points of a discrete space, in order (the last option varying fastest)."""
    axes = _axes(spaces)
    return [dict(zip([o for o, _ in axes], point)) for point in itertools.product(*(v for _, v in axes))]


class Search:
    """The trials' points, asked one at a time (``ask``), each trial's figure told back
    (``tell``): RANDOM_SEARCH's and GRID_SEARCH's from ``trial_points``, VIZIER_DEFAULT's
    trial 1 at the defaults and the rest from a seeded TPE sampler that has seen the figures
    of the trials before. ``planned``: the points known before training (all of them, or
    VIZIER_DEFAULT's first); ``checked``: those points, and for VIZIER_DEFAULT every option
    at each end of its range and at each candidate, the others at trial 1's values (what
    CREATE MODEL checks before anything trains)."""

    def __init__(self, spaces: dict, trials: int, algorithm: str, defaults: bool, maximize: bool = True):
        self.spaces, self.trials, self.algorithm = spaces, trials, algorithm
        bayesian = algorithm == "VIZIER_DEFAULT" and trials > 1 and bool(spaces)
        self.planned = trial_points(spaces, 1 if bayesian else trials, algorithm, defaults)
        self._asked: list[dict] = []
        self._study = self._trial = None
        if bayesian:
            import optuna
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            # half the trials (up to Optuna's default of 10) drawn at random before the
            # sampler models the figures: too few and it models noise
            sampler = optuna.samplers.TPESampler(seed=0, n_startup_trials=max(1, min(10, trials // 2)))
            self._study = optuna.create_study(direction="maximize" if maximize else "minimize", sampler=sampler)
            self._dists = {o: _distribution(sp) for o, sp in sorted(spaces.items())}

    @property
    def checked(self) -> list[dict]:
        if self._study is None:
            return self.planned
        first = self.planned[0]
        ends = [{**first, o: v} for o, sp in sorted(self.spaces.items())
                for v in (sp.values if isinstance(sp, Candidates) else _ends(sp))]
        return [first] + [p for p in ends if p != first]

    def ask(self) -> dict | None:
        """The next trial's point; None when the search has no more (num_trials, or a grid's end)."""
        n = len(self._asked)
        if n >= (self.trials if self._study is not None else len(self.planned)):
            return None
        if self._study is None or n == 0:
            point = self.planned[n]
        else:
            self._trial = self._study.ask(self._dists)
            point = {o: _value(self.spaces[o], v) for o, v in self._trial.params.items()}
        self._asked.append(point)
        return point

    def tell(self, figure: float | None) -> None:
        """The last asked trial's figure (None or NaN: it has none, and teaches nothing)."""
        if self._study is None:
            return
        import optuna
        failed = figure is None or math.isnan(figure)
        if self._trial is None:   # trial 1, at the defaults: told as the space's nearest point
            if not failed:
                params = {o: _nearest(self.spaces[o], v) for o, v in self._asked[0].items()}
                self._study.add_trial(optuna.trial.create_trial(params=params, distributions=self._dists,
                                                                value=figure))
            return
        if failed:
            self._study.tell(self._trial, state=optuna.trial.TrialState.FAIL)
        else:
            self._study.tell(self._trial, figure)
        self._trial = None


def _distribution(sp):
    """A space as Optuna's distribution: a range log-uniform as ``Range.draw`` draws it, a
    candidate by its index (Optuna's categories are scalars; BigQuery's may be arrays)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    if isinstance(sp, Candidates):
        return CategoricalDistribution(list(range(len(sp.values))))
    log = sp.low > 0 and sp.high / sp.low > 10
    if sp.integer:
        return IntDistribution(int(math.ceil(sp.low)), int(math.floor(sp.high)), log=log)
    return FloatDistribution(sp.low, sp.high, log=log)


def _ends(sp: Range) -> tuple:
    return (int(math.ceil(sp.low)), int(math.floor(sp.high))) if sp.integer else (sp.low, sp.high)


def _value(sp, v):
    return sp.values[v] if isinstance(sp, Candidates) else v


def _nearest(sp, v):
    """Optuna's form of a trial's value: a candidate's index, a number clamped into its range
    (trial 1's default, e.g. l2_reg 0, may lie below a range's lower end)."""
    if isinstance(sp, Candidates):
        return sp.values.index(v) if v in sp.values else 0
    low, high = _ends(sp)
    return min(max(v, low), high)


def trial_points(spaces: dict, trials: int, algorithm: str, defaults: bool) -> list[dict]:
    """The searched hyperparameters of each trial (``algorithm``, see the module's docstring);
    ``defaults``: VIZIER_DEFAULT's trial 1 takes the options' defaults (a default space's), else
    each space's first value. GRID_SEARCH: at most the grid's points, however many ``trials``."""
    if algorithm == "GRID_SEARCH":
        return _grid(spaces)[:trials]
    points = []
    for trial in range(1, trials + 1):
        rng = np.random.default_rng(trial)
        if trial == 1 and algorithm == "VIZIER_DEFAULT":
            points.append({o: FIRST.get(o, sp.first()) if defaults else sp.first() for o, sp in sorted(spaces.items())})
        else:
            points.append({o: sp.draw(rng) for o, sp in sorted(spaces.items())})
    return points


# HPARAM_TUNING_OBJECTIVES: task -> objective -> whether larger is better (ML.EVALUATE's figure of
# the same name, lower-cased, measured on each trial's evaluation rows)
OBJECTIVES = {
    "classification": {"PRECISION": True, "RECALL": True, "ACCURACY": True, "F1_SCORE": True, "LOG_LOSS": False,
                       "ROC_AUC": True},
    "regression": {"MEAN_ABSOLUTE_ERROR": False, "MEAN_SQUARED_ERROR": False, "MEAN_SQUARED_LOG_ERROR": False,
                   "MEDIAN_ABSOLUTE_ERROR": False, "R2_SCORE": True, "EXPLAINED_VARIANCE": True},
}


def objective(options: dict, task: str, model: str) -> str | None:
    """``HPARAM_TUNING_OBJECTIVES = ['ROC_AUC']`` as ``'ROC_AUC'`` (checked against the task's), or
    None: the trials are then ranked by ``train``'s validation metric (accuracy or R^2)."""
    given = options.get("hparam_tuning_objectives")
    if given is None:
        return None
    allowed = OBJECTIVES[task]
    names = [given] if isinstance(given, str) else given
    if not isinstance(names, list) or len(names) != 1 or str(names[0]).upper() not in allowed:
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {model}: hparam_tuning_objectives takes one objective "
                              f"of a {task} model, e.g. hparam_tuning_objectives = ['{next(iter(allowed))}']; one of "
                              f"{', '.join(allowed)}; got {given!r}")
    if options.get("num_trials") is None:
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {model}: hparam_tuning_objectives ranks the trials of "
                              f"num_trials = <number of trials>; pass num_trials too")
    return str(names[0]).upper()


def optimal(results: list[tuple[int, float | None]], maximize: bool = True) -> int:
    """The trial id with the best metric, the highest (``maximize``) or lowest (``studies.best_trial``:
    ties, the earliest); where no trial has one, the earliest."""
    best = best_trial(results, "maximize" if maximize else "minimize")
    return best if best is not None else min(trial for trial, _ in results)
