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

# Each public name -> the submodule that defines it, imported at the first use of the name
# (PEP 562): importing one part (dbml.core.spec reads graph.optim's OPTIMIZERS) runs no other,
# and torch.fx comes only with the parts that capture a graph. calibrate() stays in
# .latency.calibrate: a package attribute of that name would shadow the module.
_EXPORTS = {
    **dict.fromkeys(('ENVIRONMENT',), '.config'),
    **dict.fromkeys(('CaptureError', 'ExecutionError', 'InfeasibleBudget', 'NotAdmitted', 'PlanningError', 'SchedulerError', 'SequenceError'), '.errors'),
    **dict.fromkeys(('build_sequence',), '.graph.access'),
    **dict.fromkeys(('CapturedStep', 'capture'), '.graph.capture'),
    **dict.fromkeys(('GraphCache',), '.graph.graphs'),
    **dict.fromkeys(('OPTIMIZERS', 'OptimizerSpec', 'make_optimizer'), '.graph.optim'),
    **dict.fromkeys(('analyse_liveness', 'release_events'), '.plan.liveness'),
    **dict.fromkeys(('Peak', 'analyse_peak'), '.plan.peak'),
    **dict.fromkeys(('PlanSettings', 'plan', 'plan_jobs', 'tensor_granularity_floor'), '.plan.planner'),
    **dict.fromkeys(('device_ledger', 'shared_scheduler'), '.multijob.registry'),
    **dict.fromkeys(('JobPlanner', 'JobPlans', 'MemoryScheduler', 'graph_key'), '.multijob.scheduler'),
    **dict.fromkeys(('CpuDevice', 'CudaDevice', 'make_device'), '.execute.devices'),
    **dict.fromkeys(('ExecState', 'Executor', 'Program', 'check_event_log'), '.execute.executor'),
    **dict.fromkeys(('PeakMeter', 'live_tensors', 'measure_peak'), '.execute.measure'),
    **dict.fromkeys(('ExternalPlanner', 'LocalPlanner'), '.execute.planners'),
    **dict.fromkeys(('RUNNER_POLICIES', 'RunnerStats', 'ScheduledStep'), '.execute.runner'),
    **dict.fromkeys(('EagerStep', 'StepRunner'), '.execute.step'),
    **dict.fromkeys(('LatencyTracker', 'UpdateSettings', 'retime'), '.execute.updating'),
    **dict.fromkeys(('LatencyModel', 'Machine', 'RooflineModel', 'measure_machine'), '.latency.estimate'),
    **dict.fromkeys(('load_or_calibrate',), '.latency.calibrate'),
    **dict.fromkeys(('OpReport', 'Predictor', 'PredictorReport', 'load_predictor'), '.latency.predictor'),
    **dict.fromkeys(('device_utilisation',), '.latency.utilisation'),
}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


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
