"""``kmeans``: k-means clustering in torch (BigQuery ML's KMEANS).

k-means++ (or random) initial centroids from a seeded generator, then Lloyd's iterations on
the job's encoded features until the mean squared distance improves by less than
``min_rel_progress`` (relative) or ``max_iterations`` pass. BigQuery's ``standardize_features``
is the default; without it distances are taken in the numeric columns' own units (``scale``:
each encoded column's std, so ``scale * x`` is the raw value less its mean).

k-means has no label: it is trained as a regression on a constant column (``NO_LABEL``), which
the BigQuery translation adds, so the job's preprocessing and storage are every model's.
``forward`` returns each row's nearest centroid id (1-based, as a number: what ``predict``
returns); ``distances`` the distance to every centroid.
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import InvalidArgument
from ..data import shared_tensor
from ..models import ModelConfig, _frozen
from .scratch import Clock, read

NO_LABEL = "__dbml_no_label"
OPTIONS = {"num_clusters": 4, "max_iterations": 20, "min_rel_progress": 0.01, "early_stop": True,
           "kmeans_init_method": "kmeans++", "distance_type": "euclidean", "standardize_features": True}
ENTRY = None   # set below


class KMeans(nn.Module):
    def __init__(self, inputs, outputs: int, num_clusters: int = 4, distance_type: str = "euclidean", **_):
        super().__init__()
        self.distance_type = str(distance_type).lower()
        self.register_buffer("centroids", torch.zeros(int(num_clusters), inputs.features))
        self.register_buffer("scale", torch.ones(inputs.features))

    def distances(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float() * self.scale
        if self.distance_type == "cosine":
            return 1 - nn.functional.normalize(x, dim=1) @ nn.functional.normalize(self.centroids, dim=1).T
        return torch.cdist(x, self.centroids)

    def between_centroids(self) -> torch.Tensor:
        """The centroids' distances to each other, in the distance ``distances`` takes."""
        c = self.centroids
        if self.distance_type == "cosine":
            return 1 - nn.functional.normalize(c, dim=1) @ nn.functional.normalize(c, dim=1).T
        return torch.cdist(c, c)

    def forward(self, x):
        return (self.distances(x).argmin(1) + 1).float().unsqueeze(1)


def _factory(inputs, outputs: int, **options) -> nn.Module:
    return KMeans(inputs, outputs, **options)


ENTRY = (_factory, OPTIONS, "k-means clustering (k-means++, Lloyd's iterations); train with a constant label")


def _initial(x: torch.Tensor, k: int, method: str, gen: torch.Generator) -> torch.Tensor:
    if method == "random":
        return x[torch.randperm(len(x), generator=gen)[:k]].clone()
    if method != "kmeans++":
        raise InvalidArgument(f"train(): kmeans_init_method {method!r} is not supported; use 'kmeans++' or 'random'")
    centroids = [x[torch.randint(len(x), (1,), generator=gen)].squeeze(0)]
    for _ in range(1, k):
        d2 = torch.cdist(x, torch.stack(centroids)).min(1).values ** 2
        total = float(d2.sum())
        pick = torch.multinomial(d2 / total, 1, generator=gen) if total > 0 else torch.randint(len(x), (1,), generator=gen)
        centroids.append(x[pick].squeeze(0))
    return torch.stack(centroids).clone()


def fit(cur, table: str, prep, spec, n_train: int, n_val: int, progress) -> dict:
    from ...zoo import arch as zoo_arch, resolve_options
    options = resolve_options(zoo_arch(spec.arch), spec.options_dict(), prep.model_inputs())
    k = int(options["num_clusters"])
    x_np, _, _ = read(cur, table, prep.width)   # every row: k-means has no validation
    if not 2 <= k <= len(x_np):
        raise InvalidArgument(f"train(): num_clusters is {k}; it must be at least 2 and at most the number of "
                              f"rows ({len(x_np)})")
    module = KMeans(prep.model_inputs(), 1, **options)
    if not options["standardize_features"]:
        module.scale = torch.tensor([s for f in prep.features for s in (f.stds if f.kind == "array" else
                                     [f.std] if f.kind == "numeric" else [1.0] * f.width)], dtype=torch.float32)
    x = shared_tensor(x_np) * module.scale
    gen = torch.Generator().manual_seed(int(spec.seed))
    module.centroids = _initial(x, k, str(options["kmeans_init_method"]).lower(), gen)
    history, clock, before = [], Clock(), None
    progress.begin(int(options["max_iterations"]), 1)
    for it in range(int(options["max_iterations"])):
        d = module.distances(x / module.scale)
        nearest = d.argmin(1)
        loss = float((d.min(1).values ** 2).mean())
        for c in range(k):
            members = x[nearest == c]
            if len(members):
                module.centroids[c] = members.mean(0)
        progress.step(len(x))
        history.append(clock.record(it + 1, loss, learning_rate=None))
        progress.end_epoch(history[-1], {})
        if options["early_stop"] and before and (before - loss) / before < options["min_rel_progress"]:
            break
        before = loss
    module.eval()
    config = ModelConfig(spec.arch, prep.model_inputs(), 1, _frozen(options))
    stored = {"final_loss": history[-1]["loss"], "history": history, "fetch_wait_seconds": 0.0, "memory": {},
              "val_metric": None, "val_metric_name": "mean_squared_distance", "val_loss": None}
    return {"config": config, "module": module, "metrics": stored, "memory": {}}
