"""Which latency model a training job plans with: the installed predictor, or the roofline;
and the zoo networks calibration times besides its synthetic models.

``python -m dbml install`` (or ``SELECT calibrate()``) calibrates this machine and saves
a predictor (``dbml.scheduler.latency.predictor``). A job that finds none runs the quick
calibration once per process and says so in its summary (``latency_model``).

Calibration (``dbml.scheduler.latency.calibrate``) draws small synthetic models; the
scheduler package never imports the runtime, so the zoo's networks are built here and
passed in (:func:`zoo_workloads`): the model zoo's own architectures at small input
sizes, batches and widths, so that the op kinds and shapes of real networks (attention,
GELU, LayerNorm, embeddings, concatenations, 1x7 convolutions...) are in the training
set, and their whole steps teach the iteration scale (``scheduler/latency/iteration.py``).
"""

from __future__ import annotations

import threading

import torch

from ..errors import InvalidArgument
from ..scheduler.execute.rng import JobRandom, using
from .threads import use as use_threads
from ..zoo import Inputs, build

LATENCY_MODELS = ("predictor", "roofline")
_LOCK = threading.Lock()
_PREDICTOR_CACHE: dict[tuple[str, int], object] = {}   # (device, threads) -> Predictor: a cache of the file


# -- the zoo's networks for calibration ---------------------------------------------------------

# Architecture families: a held-out evaluation leaves one out (benchmarks/latency_eval.py).
ZOO_FAMILIES = {"vgg": ("vgg16",), "resnet": ("resnet50",), "densenet": ("densenet121",),
                "inception": ("inception_v3", "inception_v4"), "transformer": ("transformer",), "mlp": ("mlp",)}
_CLASSES = 10
_TOKENS = dict(vocab=1000)
# (arch, inputs, options, batch) per plan. Small: a zoo network's capture costs 1-30 s
# (DenseNet-121's 10k nodes the most) whatever the size, and each of its ops is timed at
# every load level in every pass. The quick plan (first use, the test suite) takes the
# three cheapest to capture; the full plan every architecture, two sizes where capture allows.
ZOO_CONFIGS = {
    "quick": (("mlp", Inputs("tabular", features=96), {"hidden": (384, 384)}, 8),
              ("transformer", Inputs("tokens", max_len=32, **_TOKENS),
               {"width": 64, "depth": 1, "heads": 4, "ff": 256, "dropout": 0.0}, 4),
              ("vgg16", Inputs("image", shape=(3, 32, 32)), {"width": 0.5, "dropout": 0.0}, 2)),
    "full": (("mlp", Inputs("tabular", features=96), {"hidden": (384, 384)}, 8),
             ("mlp", Inputs("tabular", features=784), {"hidden": (1024, 1024)}, 2),
             ("transformer", Inputs("tokens", max_len=32, **_TOKENS),
              {"width": 64, "depth": 1, "heads": 4, "ff": 256, "dropout": 0.0}, 4),
             ("transformer", Inputs("tokens", max_len=64, **_TOKENS),
              {"width": 128, "depth": 1, "heads": 8, "ff": 512, "dropout": 0.0}, 2),
             ("vgg16", Inputs("image", shape=(3, 32, 32)), {"width": 0.5, "dropout": 0.0}, 2),
             ("vgg16", Inputs("image", shape=(3, 64, 64)), {"dropout": 0.0}, 1),
             ("resnet50", Inputs("image", shape=(3, 32, 32)), {"width": 0.5}, 2),
             ("densenet121", Inputs("image", shape=(3, 32, 32)), {"width": 0.5}, 1),
             ("inception_v3", Inputs("image", shape=(3, 96, 96)), {"width": 0.5, "dropout": 0.0}, 1),
             ("inception_v4", Inputs("image", shape=(3, 96, 96)), {"width": 0.5, "dropout": 0.0}, 1)),
}


def family_of(arch: str) -> str:
    return next(f for f, archs in ZOO_FAMILIES.items() if arch in archs)


def zoo_workloads(plan: str = "full", exclude: tuple[str, ...] = ()) -> list:
    """Calibration workloads (``scheduler.latency.workloads.Workload``) of the zoo's
    networks in ``ZOO_CONFIGS[plan]``, leaving out the families in ``exclude``; Adam, as
    ``train()`` defaults to."""
    from ..scheduler.latency.workloads import Workload

    unknown = set(exclude) - set(ZOO_FAMILIES)
    if unknown:
        raise InvalidArgument(f"zoo_workloads(): unknown family {sorted(unknown)[0]!r} in exclude; "
                              f"families are {', '.join(ZOO_FAMILIES)}")
    out = []
    for arch, inputs, options, batch in ZOO_CONFIGS[plan]:
        if family_of(arch) in exclude:
            continue
        describe = (f"zoo {arch} b{batch} {inputs.kind} {inputs.shape or inputs.max_len or inputs.features} "
                    f"{options}")
        model, x = _zoo_model(arch, inputs, options), _zoo_x(inputs, batch)
        y = lambda batch=batch: torch.randint(0, _CLASSES, (batch,))   # noqa: E731
        out.append(Workload(f"zoo:{family_of(arch)}", model, x, y, "adam", describe,
                            iteration=_zoo_iteration(model, x, y, describe)))
    return out


def _zoo_iteration(model, x, y, describe: str):
    """A factory of ``run()``: one real training step of the network, as a job runs it
    (ScheduledStep, no budget), on the graph calibration captured (shared by name)."""
    def factory():
        from ..scheduler.execute.runner import ScheduledStep
        from ..scheduler.graph.optim import OptimizerSpec

        random = JobRandom(0)      # never the process's generator (scheduler/execute/rng.py)
        net, batch = random.call(lambda: (model(), (x(), y())))
        runner = ScheduledStep(net, torch.nn.functional.cross_entropy, OptimizerSpec("adam"), policy="none",
                               job=f"calibrate {describe}", share_graphs=("dbml-calibration", describe))

        def run() -> None:
            with using(random):
                runner.step(*batch)
        run.close, run.runner = runner.close, runner
        return run
    return factory


def _zoo_model(arch: str, inputs: Inputs, options: dict):
    return lambda: build(arch, inputs, _CLASSES, dict(options))


def _zoo_x(inputs: Inputs, batch: int):
    if inputs.kind == "tokens":
        return lambda: torch.randint(1, inputs.vocab, (batch, inputs.max_len))
    if inputs.kind == "image":
        return lambda: torch.randn(batch, *inputs.shape)
    return lambda: torch.randn(batch, inputs.features)


def calibration_work(device: str, quick: bool, exclude: tuple[str, ...] = (), seed: int = 0) -> list:
    """What a calibration times: the plan's synthetic models and probes with the zoo's
    networks spread among them (the plan's deadline then cuts both kinds alike)."""
    from ..scheduler.latency.calibrate import PLANS, workloads

    work = workloads(PLANS["quick" if quick else "full"], device, seed)
    zoo = zoo_workloads("quick" if quick else "full", exclude)
    for i, w in enumerate(zoo):
        work.insert(round(i * len(work) / (2 * len(zoo))) + i, w)   # in the first half: a deadline cuts the end
    return work


def calibrate(device: str, quick: bool, threads: int, progress=None):
    """Calibrate ``device`` with ``threads`` PyTorch threads (the count jobs train with:
    the predictor's fingerprint includes it) and save the predictor."""
    from ..scheduler.latency.calibrate import calibrate as run

    use_threads(threads)
    with _LOCK:
        predictor = run(device, quick=quick, progress=progress, work=calibration_work(device, quick))
        _PREDICTOR_CACHE[(device, threads)] = predictor
    return predictor


def latency_model(kind: str, device: str, threads: int) -> tuple[object | None, str]:
    """(model for ScheduledStep, how it was obtained). None means the runner's roofline default."""
    if kind not in LATENCY_MODELS:
        raise InvalidArgument(f"latency_model {kind!r} is unknown; SET VARIABLE dbml_latency_model = "
                              f"one of {', '.join(map(repr, LATENCY_MODELS))}")
    if kind == "roofline":
        return None, "roofline"
    from ..scheduler.latency.calibrate import calibrate as run
    from ..scheduler.latency.predictor import load_predictor

    key = (device, threads)
    with _LOCK:
        if key in _PREDICTOR_CACHE:
            return _PREDICTOR_CACHE[key], "predictor"
        predictor = load_predictor(device, threads=threads)
        how = "predictor"
        if predictor is None:
            use_threads(threads)
            predictor = run(device, quick=True, work=calibration_work(device, True))
            how = "predictor (none was installed: quick calibration ran now; run python -m dbml install)"
        _PREDICTOR_CACHE[key] = predictor
        return predictor, how


def loaded_predictor(device: str, threads: int):
    """The predictor jobs on ``device`` with ``threads`` threads plan with: the one this
    process loaded or calibrated, else the installed one; None if there is none."""
    from ..scheduler.latency.predictor import load_predictor

    return _PREDICTOR_CACHE.get((device, threads)) or load_predictor(device, threads=threads)
