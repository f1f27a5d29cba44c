"""Ray as the core's placement backend (``dbml.core.placement`` finds it by name): the
three functions the core calls, each importing what it needs when called."""

from __future__ import annotations

__all__ = ["check_job", "fit_model", "step"]


def check_job(spec) -> None:
    from .placement import check_job as check
    check(spec)


def fit_model(cur, table: str, prep, spec, n_train: int, n_val: int, progress, fit) -> dict:
    from .remote import fit_model as remote_fit
    return remote_fit(cur, table, prep, spec, n_train, n_val, progress, fit)


def step(model, loss_fn, optimizer, job):
    from .ddp import DDPStep
    return DDPStep(model, loss_fn, optimizer, job)
