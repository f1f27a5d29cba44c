"""dbml.scheduler — TENSILE memory scheduling for PyTorch training steps.

A library for any PyTorch training step: it never imports the dbml runtime.
"""

from .errors import (CaptureError, ExecutionError, InfeasibleBudget, NotAdmitted, SchedulerError,
                     SequenceError)
from .graph.access import build_sequence
from .graph.capture import CaptureError, CapturedStep, GraphCache, capture
from .execute.devices import CpuDevice, CudaDevice, make_device
from .latency.estimate import LatencyModel, Machine, RooflineModel, measure_machine
from .execute.executor import ExecState, ExecutionError, Executor, Program, check_event_log
from .execute.measure import PeakMeter, live_tensors, measure_peak
from .plan.liveness import analyse_liveness, release_events
from .graph.optim import OPTIMIZERS, OptimizerSpec, make_optimizer
from .plan.peak import Peak, analyse_peak
from .plan.planner import InfeasibleBudget, PlanSettings, plan, plan_jobs, tensor_granularity_floor
from .execute.runner import ScheduledStep

__all__ = ["SchedulerError", "SequenceError", "OPTIMIZERS", "OptimizerSpec", "make_optimizer", "PeakMeter", "live_tensors", "measure_peak",
           "analyse_liveness", "release_events", "Peak", "analyse_peak",
           "InfeasibleBudget", "PlanSettings", "plan", "plan_jobs", "tensor_granularity_floor",
           "capture", "CapturedStep", "CaptureError", "GraphCache", "build_sequence",
           "LatencyModel", "Machine", "RooflineModel", "measure_machine",
           "Executor", "ExecState", "ExecutionError", "Program", "check_event_log",
           "CpuDevice", "CudaDevice", "make_device", "ScheduledStep"]

# latency predictor (TENSILE IV-A cold start); calibrate() stays in .calibrate: a package
# attribute of that name would shadow the module.
from .latency.calibrate import load_or_calibrate  # noqa: E402
from .latency.predictor import OpReport, Predictor, PredictorReport, load_predictor  # noqa: E402
from .latency.utilisation import device_utilisation  # noqa: E402

__all__ += ["load_or_calibrate", "Predictor", "PredictorReport", "OpReport", "load_predictor",
            "device_utilisation"]

# one joint planner and admission control for all jobs on a device (TENSILE III-D)
from .multijob.scheduler import JobPlanner, JobPlans, MemoryScheduler, NotAdmitted, graph_key, shared_scheduler  # noqa: E402

__all__ += ["MemoryScheduler", "JobPlanner", "JobPlans", "NotAdmitted", "graph_key", "shared_scheduler"]

# plan updating (TENSILE IV-E) and the passive-mode (Capuchin) peer: see .runner
from .execute.updating import LatencyTracker, UpdateSettings, retime  # noqa: E402

__all__ += ["LatencyTracker", "UpdateSettings", "retime"]
