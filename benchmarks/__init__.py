"""The benchmarks, as the package ``dbml.bench``: ``python -m dbml bench`` runs :mod:`.harness`.

The ``bench_*.py`` scripts beside it are older single-topic benchmarks, run as scripts."""
