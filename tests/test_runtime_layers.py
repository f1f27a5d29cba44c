"""The runtime's layering and its one exception table (REVIEW findings 7 and 8)."""

import subprocess
import sys
from types import SimpleNamespace

import pytest

import dbml.errors
import dbml.core.jobs
from dbml.errors import BudgetTooSmall, InvalidArgument, JobCancelled, scheduler_errors
from dbml.scheduler import CaptureError, ExecutionError, InfeasibleBudget, NotAdmitted, SequenceError


def loaded_after(module: str) -> set[str]:
    """The dbml modules a fresh interpreter holds after importing ``module``."""
    code = f"import {module}, sys; print(' '.join(m for m in sys.modules if m.startswith('dbml')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.slow
def test_the_predict_path_loads_neither_training_nor_the_scheduler():
    loaded = loaded_after("dbml.core.inference")
    assert "dbml.core.inference" in loaded and "dbml.core.metrics" in loaded
    assert "dbml.core.training" not in loaded and "dbml.scheduler" not in loaded


@pytest.mark.slow
def test_the_job_manager_does_not_import_training():
    loaded = loaded_after("dbml.core.jobs")
    assert "dbml.core.jobs" in loaded
    assert "dbml.core.training" not in loaded and "dbml.scheduler" not in loaded


def test_job_cancelled_is_one_class_in_the_one_tree():
    assert dbml.core.jobs.JobCancelled is dbml.errors.JobCancelled
    assert issubclass(JobCancelled, dbml.errors.DbmlError)


SPEC_OWN = SimpleNamespace(model="m", memory_budget=10_000)
SPEC_SHARED = SimpleNamespace(model="m", memory_budget=None)


def raised(spec, error: BaseException, device_budget=lambda: 2_000_000) -> BaseException:
    with pytest.raises(Exception) as info:
        with scheduler_errors(spec.model, job_id=7, memory_budget=spec.memory_budget, shared_budget=device_budget):
            raise error
    return info.value


def test_not_admitted_becomes_job_cancelled():
    e = raised(SPEC_OWN, NotAdmitted("timed out"))
    assert type(e) is JobCancelled
    assert str(e) == "job 7 ('m') was cancelled while it waited for memory; nothing was stored"


def test_infeasible_budget_names_the_argument_or_the_setting_to_raise():
    own = raised(SPEC_OWN, InfeasibleBudget("job_7", 10_000, 109_404))
    assert type(own) is BudgetTooSmall and isinstance(own, InvalidArgument) and own.min_budget == 109_404
    assert str(own) == ("train(): memory_budget 0.0 MB (10000 bytes) is below the smallest budget this model "
                        "and batch can be trained in, 0.1 MB (109404 bytes); pass memory_budget := '140KB' "
                        "or more, or a smaller batch_size")
    shared = raised(SPEC_SHARED, InfeasibleBudget("job_7", 2_000_000, 2_500_000))
    assert str(shared) == ("train(): memory_budget 2.0 MB (2000000 bytes) is below the smallest budget this "
                           "model and batch can be trained in, 2.5 MB (2500000 bytes); "
                           "SET VARIABLE dbml_memory_budget = '3MB' or more, or a smaller batch_size")


def test_the_device_budget_is_asked_for_only_when_the_message_names_it():
    def unasked():
        raise AssertionError("device_budget() called")
    assert type(raised(SPEC_OWN, InfeasibleBudget("j", 1, 2000), unasked)) is BudgetTooSmall
    assert type(raised(SPEC_OWN, NotAdmitted("x"), unasked)) is JobCancelled


@pytest.mark.parametrize("error", [CaptureError("job 'job_7': could not capture"), SequenceError("bad seq"),
                                   ExecutionError("no buffer")])
def test_other_scheduler_errors_reach_the_user_unchanged(error):
    assert raised(SPEC_OWN, error) is error   # their text, as the user saw it before the table


def test_other_errors_pass_through():
    with pytest.raises(KeyError):
        with scheduler_errors(SPEC_OWN.model, job_id=7, memory_budget=SPEC_OWN.memory_budget, shared_budget=lambda: 0):
            raise KeyError("x")


def test_a_job_is_what_training_reports_progress_to():
    from dbml.core.training import Progress
    assert isinstance(dbml.core.jobs.Job(id=1, model="m"), Progress)
    assert not isinstance(object(), Progress)
