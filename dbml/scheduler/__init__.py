"""dbml.scheduler — TENSILE memory scheduling for PyTorch training steps.

A library for any PyTorch training step: it never imports the dbml runtime. Its
subpackages follow the paper's order, which is also a reading order:

* ``graph/``    capture a training step (forward, backward, optimizer) and build its
                tensor access sequence (``graph/sequence.py`` is the data contract);
* ``plan/``     single-job planning: liveness, peak analysis (Algorithm 1), swap and
                recompute passes (Algorithm 2, MSPS), the complete loop (Algorithm 3);
* ``multijob/`` one device, many jobs: joint planning, admission, plan hand-over;
* ``execute/``  performing plans: the executor, the step runner and its policies;
* ``latency/``  op latencies: roofline, the MLP predictor and its calibration.

``errors.py`` holds the exception tree and ``config.py`` the environment switches.
"""

from .config import ENVIRONMENT
from .errors import (CaptureError, ExecutionError, InfeasibleBudget, NotAdmitted, PlanningError,
                     SchedulerError, SequenceError)
from .graph.access import build_sequence
from .graph.capture import CapturedStep, capture
from .graph.graphs import GraphCache
from .graph.optim import OPTIMIZERS, OptimizerSpec, make_optimizer
from .plan.liveness import analyse_liveness, release_events
from .plan.peak import Peak, analyse_peak
from .plan.planner import PlanSettings, plan, plan_jobs, tensor_granularity_floor
from .multijob.registry import device_ledger, shared_scheduler
from .multijob.scheduler import JobPlanner, JobPlans, MemoryScheduler, graph_key
from .execute.devices import CpuDevice, CudaDevice, make_device
from .execute.executor import ExecState, Executor, Program, check_event_log
from .execute.measure import PeakMeter, live_tensors, measure_peak
from .execute.planners import ExternalPlanner, LocalPlanner
from .execute.runner import RUNNER_POLICIES, RunnerStats, ScheduledStep
from .execute.step import EagerStep, StepRunner
from .execute.updating import LatencyTracker, UpdateSettings, retime
from .latency.estimate import LatencyModel, Machine, RooflineModel, measure_machine
# calibrate() stays in .latency.calibrate: a package attribute of that name would shadow
# the module.
from .latency.calibrate import load_or_calibrate
from .latency.predictor import OpReport, Predictor, PredictorReport, load_predictor
from .latency.utilisation import device_utilisation

__all__ = [
    "ENVIRONMENT",
    "SchedulerError", "CaptureError", "SequenceError", "InfeasibleBudget", "PlanningError",
    "NotAdmitted", "ExecutionError",
    "capture", "CapturedStep", "GraphCache", "build_sequence", "OPTIMIZERS", "OptimizerSpec",
    "make_optimizer",
    "analyse_liveness", "release_events", "Peak", "analyse_peak", "PlanSettings", "plan",
    "plan_jobs", "tensor_granularity_floor",
    "MemoryScheduler", "JobPlanner", "JobPlans", "graph_key", "shared_scheduler", "device_ledger",
    "CpuDevice", "CudaDevice", "make_device", "Executor", "ExecState", "Program", "check_event_log",
    "PeakMeter", "live_tensors", "measure_peak", "ExternalPlanner", "LocalPlanner",
    "ScheduledStep", "RunnerStats", "RUNNER_POLICIES", "StepRunner", "EagerStep",
    "LatencyTracker", "UpdateSettings", "retime",
    "LatencyModel", "Machine", "RooflineModel", "measure_machine", "load_or_calibrate",
    "Predictor", "PredictorReport", "OpReport", "load_predictor", "device_utilisation",
]
