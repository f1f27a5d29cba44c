"""The inference section of ``python -m dbml bench`` (issue 22 part 8): a forward pass
over many rows, eager PyTorch's ``torch.no_grad()`` on the whole batch against dbml's
``inference.forward`` under a budget of the weights and one row plus a quarter of what
eager's peak holds beyond them (the activations), which runs the rows in chunks the
budget holds (``dbml/forward_memory.py``). Peaks are the storage meter's
(``PeakMeter``: exact on CPU), times the median of ``iters`` runs; one row per method with
``section = 'inference'``, ``within_budget`` for dbml's."""

from __future__ import annotations

import statistics
import time

import torch

from dbml.core.forward_memory import forward_bytes, rows_within
from dbml.core.models import config
from dbml.scheduler.execute.measure import PeakMeter, live_tensors

ROWS = 256          # rows in the pass
BUDGET = 0.25       # dbml's budget: the weights and one row, and this share of eager's activations


def _run(fn, module, x, iters: int) -> tuple[int, float]:
    with PeakMeter(live_tensors(module, None, x)) as meter, torch.no_grad():
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        with torch.no_grad():
            fn()
        times.append(time.perf_counter() - t0)
    return meter.peak_bytes, statistics.median(times)


def rows_for(w, iters: int = 3) -> list[dict]:
    """Eager and dbml rows for workload ``w`` (a ``workloads.Workload``)."""
    cfg = config(w.arch, w.inputs, 10, dict(w.options))
    module = w.model().eval()
    x, _ = w.batch_tensors(ROWS)
    eager_peak, eager_s = _run(lambda: module(x), module, x, iters)
    held = x.numel() * x.element_size() + len(x) * cfg.outputs * 4   # the whole input, every output
    floor = forward_bytes(cfg, 1) + held
    budget = int(floor + BUDGET * max(0, eager_peak - floor))
    base = {"section": "inference", "workload": w.name, "mode": "cpu", "batch": ROWS, "jobs": 1,
            "vanilla_peak_bytes": eager_peak, "vanilla_seconds": eager_s}
    out = [{**base, "method": "eager", "family": "eager", "peak_bytes": eager_peak, "seconds": eager_s,
            "msr": 0.0, "eor": 1.0}]
    try:   # as dbml.core.inference.forward: the whole input and every row's output are held beside a chunk
        rows = rows_within(cfg, budget, held=held)
    except Exception as e:   # noqa: BLE001 - the budget too small for one row: the row says so
        return out + [{**base, "method": "dbml@25%act", "family": "dbml", "budget_bytes": budget, "error": str(e)}]

    def chunked():
        return torch.cat([module(x[i:i + rows]) for i in range(0, len(x), rows)])
    peak, seconds = _run(chunked, module, x, iters)
    out.append({**base, "method": "dbml@25%act", "family": "dbml", "budget_bytes": budget, "peak_bytes": peak,
                "seconds": seconds, "msr": (eager_peak - peak) / eager_peak, "eor": seconds / eager_s,
                "within_budget": peak <= budget, "note": f"{rows} rows per forward pass"})
    return out
