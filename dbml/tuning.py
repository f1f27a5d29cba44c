"""tune() from Python, for notebooks and for other layers (BigQuery ML's ``num_trials``).

    rows = dbml.tuning.tune(con, "churn", "customers", {"lr": {"log_uniform": [1e-4, 0.1]}},
                            trials=20, objective="val_loss", algorithm="tpe", label="churned")
    dbml.tuning.trials(con, "churn")        # every stored trial (the dbml_trials rows), in order
    dbml.tuning.best(con, "churn")          # the best trial's row, or None
    dbml.tuning.importances(con, "churn")   # parameter -> importance (Optuna)

``tune`` runs the SQL ``tune`` (``dbml.api.tune``), so settings, interrupts, progress and
errors are exactly those of SQL; it also takes BigQuery ML's names for the algorithm
(``hparam_tuning_algorithm``) and for some objectives (``hparam_tuning_objectives``). The
search itself is ``dbml.search.engine``; the trial records ``dbml.trials``.
"""

from __future__ import annotations

from .core import home
from .search import trials as store
from .errors import InvalidArgument
from .search.tunespec import OBJECTIVES, SAMPLERS

__all__ = ["tune", "trials", "best", "importances", "ALGORITHMS", "OBJECTIVE_NAMES"]

# BigQuery ML's hparam_tuning_algorithm -> tune()'s sampler (Vizier's default is Bayesian
# optimisation; TPE is Optuna's)
ALGORITHMS = {"vizier_default": "tpe", "random_search": "random", "grid_search": "grid"}
# BigQuery ML's hparam_tuning_objectives that tune() measures -> its objective. log_loss is
# the classification loss and mean_squared_error the regression one (on standardised
# targets: the same order of trials); accuracy and r2_score are the validation metric of
# the model's task (accuracy for a classifier, R^2 for a regression).
OBJECTIVE_NAMES = {"log_loss": "val_loss", "mean_squared_error": "val_loss", "accuracy": "val_metric",
                   "r2_score": "val_metric"}


def tune(con, model: str, source: str, space, *, trials: int | None = None, parallel: int | None = None,
         objective: str = "val_loss", algorithm: str = "tpe", pruner: str = "median", **train_args) -> list[dict]:
    """Search ``space`` (a dict or JSON text: ``dbml.search.tunespec``) for ``model`` on ``source``;
    one dict per trial run (the ``dbml_trials`` columns). ``train_args`` are train()'s
    arguments, fixed for every trial (``label='y'``, ``arch='mlp'``, ``epochs=10``...).
    The best trial is stored as the model's next version (``best(con, model)['version']``)."""
    from .api import tune as sql_tune
    return sql_tune(con, model, source, space=space, trials=trials, parallel=parallel,
                    objective=_objective(objective), sampler=_sampler(algorithm), pruner=pruner, **train_args)


def _sampler(algorithm: str) -> str:
    name = str(algorithm).lower()
    if name in SAMPLERS:
        return name
    if name in ALGORITHMS:
        return ALGORITHMS[name]
    raise InvalidArgument(f"dbml.tuning.tune(): unknown algorithm {algorithm!r}; pass one of "
                          f"{', '.join(map(repr, SAMPLERS + tuple(k.upper() for k in ALGORITHMS)))}")


def _objective(objective: str) -> str:
    name = str(objective).lower()
    if name in OBJECTIVES:
        return name
    if name in OBJECTIVE_NAMES:
        return OBJECTIVE_NAMES[name]
    raise InvalidArgument(f"dbml.tuning.tune(): objective {objective!r} is not measured by tune(); pass one of "
                          f"{', '.join(map(repr, [*OBJECTIVES, *(k.upper() for k in OBJECTIVE_NAMES)]))}")


def trials(con, model: str) -> list[dict]:
    """Every stored trial of ``model`` (the ``dbml_trials`` rows), in trial order."""
    cur = con.execute(home.sql(con, store.ALL_ROWS_OF), [model])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def best(con, model: str) -> dict | None:
    """``model``'s best trial (its row; ``version``: the model version it is stored as), or None."""
    return next((row for row in trials(con, model) if row["best"]), None)


def importances(con, model: str) -> dict[str, float]:
    """Each searched parameter's importance to the objective over ``model``'s finished
    trials (Optuna's default evaluator), largest first; empty before two have finished."""
    import optuna

    from .search.studies import frozen
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    finished = [r for r in store.load(con, model) if r["status"] == "finished"]
    if len(finished) < 2:
        return {}
    study = optuna.create_study(direction=finished[0]["direction"])
    study.add_trials([frozen(r) for r in finished])
    try:
        return dict(optuna.importance.get_param_importances(study))
    except (RuntimeError, ValueError, ImportError):   # same values in every trial; an evaluator's package missing
        return {}
