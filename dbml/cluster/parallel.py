"""Data-parallel training of one model: ``train(..., workers := N)`` on Ray Train's TorchTrainer.

Ray Train starts N workers (one GPU each where the cluster has GPUs, else one CPU slot),
sets up torch.distributed among them (gloo on CPU, NCCL on GPU) and restarts the group
after a worker dies, up to the ``max_retries`` setting (``FailureConfig``). Each worker
runs ``train_loop``: one worker's part of the job (``worker.run_task``: the rows streamed
into a DuckDB of its own, training's ``_fit_model`` from the last checkpoint) with
``collective=True``, so its step is ``ddp.DDPStep`` (``runners.make_runner`` picks it for
``workers > 1``). Rank 0 reports progress and checkpoints through the hub and hands the
trained model to it; the driver stores it once (``dbml.cluster.remote``).

An error of dbml's own (a diverging loss, a cancel) is the job's outcome, not a worker
failure: it goes to the hub and the worker returns, so Ray Train does not retry it. Any
other error (a peer that died mid-collective, a lost node) is raised for Ray Train to
restart the group, or to end the run when the restarts are spent.
"""

from __future__ import annotations

import shutil
import tempfile
import threading

from .placement import WorkerDied
from ..errors import DbmlError
from ..core.runtime import runtime
from .worker import RemoteProgress, Task, run_task, unpack_error

# Ray Train's controller looks at its workers this often (its default is 2 s: a finished
# or failed run was noticed up to 2 s late). Set for the controllers this process starts.
HEALTH_CHECK_S = "0.2"


class DataParallel:
    """A ``workers := N`` job's TorchTrainer, run on a thread of the driver (``fit`` blocks)."""

    def __init__(self, cluster, task: Task, progress):
        self.cluster, self.task, self.progress = cluster, task, progress
        self.error: BaseException | None = None
        self.storage: str | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
        spec = self.task.spec
        # Ray Train reads its health check's interval only from its environment
        runtime().environ_default("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", HEALTH_CHECK_S)
        gpu = self.cluster.gpus() and spec.settings.device != "cpu"
        self.cluster.check_room(spec.workers, gpu)   # before anything waits for slots that do not exist
        self.cluster.free_idle()   # idle device workers give their slots to this job's workers
        self.progress.place(None, None, f"{spec.workers} devices")
        self.storage = spec.settings.cluster_storage or tempfile.mkdtemp(prefix="dbml-ray-train-")
        trainer = TorchTrainer(
            train_loop, train_loop_config={"task": self.task},
            scaling_config=ScalingConfig(num_workers=spec.workers, use_gpu=gpu,
                                         resources_per_worker={"CPU": 1, **({"GPU": 1} if gpu else {})}),
            run_config=RunConfig(name=f"dbml-{self.task.key.replace(':', '-')}", storage_path=self.storage,
                                 failure_config=FailureConfig(max_failures=spec.settings.max_retries or 0)))
        self._thread = threading.Thread(target=self._fit, args=(trainer,), name=f"dbml-ddp-{self.task.job_id}",
                                        daemon=True)
        self._thread.start()

    def _fit(self, trainer) -> None:
        try:
            trainer.fit()
        except BaseException as e:   # outcome() reads it
            self.error = e

    def done(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def outcome(self) -> tuple:
        result = self.cluster.ray.get(self.cluster.hub.result.remote(self.task.key))
        if result is not None:
            return result
        detail = str(self.error).strip().splitlines() if self.error is not None else ["no result"]
        raise WorkerDied(f"{type(self.error).__name__}: {detail[-1] if detail else ''}")

    def kill(self) -> None:
        """Stop every worker of the job (Ray Train then ends the run, or restarts the group,
        whose workers find the job cancelled in the hub and stop at once)."""
        workers = self.cluster.ray.get(self.cluster.hub.workers.remote(self.task.key))
        for w in workers.values():
            if w.get("actor") is not None:
                try:
                    self.cluster.ray.kill(w["actor"])
                except Exception:   # already gone
                    pass

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.join(60.0)
        if self.storage is not None and not self.task.spec.settings.cluster_storage:
            shutil.rmtree(self.storage, ignore_errors=True)


def train_loop(config: dict) -> None:
    """One Ray Train worker of a data-parallel job (see the module docstring)."""
    import duckdb
    import ray
    import ray.train
    import torch
    task: Task = config["task"]
    rank = ray.train.get_context().get_world_rank()
    device = "cpu"
    if torch.cuda.is_available() and task.spec.settings.device != "cpu":
        import ray.train.torch
        torch.cuda.set_device(ray.train.torch.get_device())
        device = f"cuda:{ray.get_gpu_ids()[0]}" if ray.get_gpu_ids() else "cuda"
    progress = RemoteProgress(task, rank, ray.util.get_node_ip_address(), device, collective=True)
    progress.worker["actor"] = ray.get_runtime_context().current_actor
    db = duckdb.connect()   # in memory: this worker's copy of the job's rows
    try:
        kind, value = run_task(task, db.cursor(), progress)
    finally:
        db.close()
    if kind == "error" and not issubclass(value[0], DbmlError):
        raise unpack_error(value)   # Ray Train restarts the group (or ends the run)
    if rank == 0:
        ray.get(task.hub.finish.remote(task.key, (kind, value)))
