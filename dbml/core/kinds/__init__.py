"""Model kinds beyond the zoo's gradient-trained networks, each a catalog model like any other.

* ``dnn`` (``dnn.py``): an MLP with a choice of activation (BigQuery ML's DNN models), and
  ``wide_deep``, a linear layer plus such an MLP (its wide-and-deep models); trained as every
  zoo model is, under the memory scheduler.
* ``boosted_tree``, ``random_forest`` (``trees.py``): gradient-boosted trees and random
  forests by LightGBM (the ``trees`` extra); fitted, not stepped.
* ``kmeans`` (``kmeans.py``): k-means clustering in torch (k-means++ and Lloyd's iterations);
  fitted, not stepped.

Each is registered in the zoo, which lists this package's ``ARCHS`` by entry and reads it on
its first use (``dbml.zoo.registry.KINDS_ENTRY``; importing this package registers nothing),
so ``train(..., arch := 'boosted_tree')`` validates it, the catalog stores its config and
weights (a tree model's weights are LightGBM's text model as a uint8 tensor) and
``catalog.load`` rebuilds it; ``predict``, ``predictions`` and ``evaluate`` call its
``forward`` as for any model. A fitted kind's arch carries its ``fit`` (``dbml.zoo.fitter``),
which ``training`` consults before it builds a step runner: ``fit(cur, table, prep, spec,
n_train, n_val, progress)`` reads the job's scratch table (``x``, ``y``, ``is_val``) and
returns what ``training._fit_model`` returns.
"""

from __future__ import annotations

from . import dnn, kmeans, trees

# arch -> (factory, options, doc, fit); fit: None for a kind stepped as every zoo model is, else
# fit(cur, table, prep, spec, n_train, n_val, progress) -> {"config", "module", "metrics", "memory"}
ARCHS = {"dnn": (*dnn.ENTRY, None), "wide_deep": (*dnn.WIDE_DEEP, None), "boosted_tree": (*trees.BOOSTED, trees.fit),
         "random_forest": (*trees.FOREST, trees.fit), "kmeans": (*kmeans.ENTRY, kmeans.fit)}
