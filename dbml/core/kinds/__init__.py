"""Model kinds beyond the zoo's gradient-trained networks, each a catalog model like any other.

* ``dnn`` (``dnn.py``): an MLP with a choice of activation (BigQuery ML's DNN models); trained
  as every zoo model is, under the memory scheduler.
* ``boosted_tree``, ``random_forest`` (``trees.py``): gradient-boosted trees and random
  forests by LightGBM (the ``trees`` extra); fitted, not stepped.
* ``kmeans`` (``kmeans.py``): k-means clustering in torch (k-means++ and Lloyd's iterations);
  fitted, not stepped.

Each is registered in the zoo when ``dbml`` is imported (``register()``), so ``train(...,
arch := 'boosted_tree')`` validates it, the catalog stores its config and weights (a tree
model's weights are LightGBM's text model as a uint8 tensor) and ``catalog.load`` rebuilds
it; ``predict``, ``predictions`` and ``evaluate`` call its ``forward`` as for any model. A
fitted kind trains through :data:`FITTERS`, which ``training`` consults before it builds a
step runner: ``fit(cur, table, prep, spec, n_train, n_val, progress)`` reads the job's
scratch table (``x``, ``y``, ``is_val``) and returns what ``training._fit_model`` returns.
"""

from __future__ import annotations

from typing import Callable

from ...zoo import register_model
from . import dnn, kmeans, trees

# arch -> fit(cur, table, prep, spec, n_train, n_val, progress) -> {"config", "module", "metrics", "memory"}
FITTERS: dict[str, Callable] = {"boosted_tree": trees.fit, "random_forest": trees.fit, "kmeans": kmeans.fit}
ARCHS = {"dnn": dnn.ENTRY, "boosted_tree": trees.BOOSTED, "random_forest": trees.FOREST, "kmeans": kmeans.ENTRY}


def register() -> None:
    """Register every kind's arch in the zoo (idempotent: re-registering replaces)."""
    for name, (factory, options, doc) in ARCHS.items():
        register_model(name, factory, kinds=("tabular",), options=options, doc=doc)


register()
