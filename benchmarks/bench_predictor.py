"""The latency predictor against a least-squares FLOPs/bytes baseline, on held-out shapes.

    python benchmarks/bench_predictor.py               # full calibration (<= 3 min)
    python benchmarks/bench_predictor.py --quick       # quick calibration (<= 30 s)
    python benchmarks/bench_predictor.py --threads 2   # time with 2 intra-op threads

One run calibrates (the same ``calibrate`` that ``python -m dbml install`` runs), which
splits the measured op shapes into training shapes and held-out shapes (every load level
of a held-out shape is held out). Both models are fitted on the training rows only:

* MLP       the predictor (one MLP over all op kinds, on the residual of the baseline);
* baseline  per op kind, least squares ``log t ~ a + b log FLOPs + c log bytes + d util``.

Per op kind, on the held-out rows: R^2 of log-latency, median relative error
|pred - t| / t; for the two convolution kinds also on the held-out shapes from captured
training steps alone (calibration adds conv layers probed on their own, which share the
split). Then the same per load level, and the goals: R^2 >= 0.95 for mm, addmm,
bmm, convolution and convolution_backward; median relative error <= 20% over all held-out
rows; the MLP's R^2 above the baseline's on every compute-heavy kind (those with FLOPs);
model <= 5 MB. Results also go to benchmarks/out/predictor.json.

Threads: by default timings use 1 intra-op thread. On a CPU shared with other processes,
kernels split across 2 OpenMP threads stall whenever one of them is descheduled, and
the same op's time varies by 7x between runs (measured here: std of log-ratio 2.0 with
2 threads against 0.24 with 1). The predictor's fingerprint records the thread count, so
a predictor is only used with the thread count it was calibrated for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from dbml.scheduler.latency.calibrate import calibrate
from dbml.scheduler.latency.opfeatures import LOG_FLOPS
from dbml.scheduler.latency.predictor import median_relative_error, predictions, r2_score, split_heldout

GOAL_R2_KINDS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.convolution.default",
                 "aten.convolution_backward.default")
GOAL_R2, GOAL_MEDIAN_REL, GOAL_BYTES = 0.95, 0.20, 5e6


def _metrics(log_t, pred, base) -> dict:
    return {"n": len(log_t), "r2": r2_score(log_t, pred), "base_r2": r2_score(log_t, base),
            "med_rel": median_relative_error(log_t.exp(), pred.exp()),
            "base_med_rel": median_relative_error(log_t.exp(), base.exp())}


def _select(values, kinds, want) -> torch.Tensor:
    return values[torch.tensor([i for i, k in enumerate(kinds) if want(i, k)], dtype=torch.long)]


def evaluate(predictor) -> dict:
    s = predictor.samples
    train, test = split_heldout(s)
    kinds, log_t, pred, base = predictions(predictor, s, test)
    test_rows = [i for i in test if s.kinds[i] in predictor.vocab]   # the rows predictions() kept
    compute_heavy = {s.kinds[i] for i in range(len(s)) if s.features[i][LOG_FLOPS] > 0}
    per_kind = {}
    for kind in sorted(set(kinds)):
        pick = lambda i, k: k == kind  # noqa: E731
        per_kind[kind] = _metrics(*(_select(v, kinds, pick) for v in (log_t, pred, base)))
        per_kind[kind].update(samples=s.kinds.count(kind), compute_heavy=kind in compute_heavy)
    # Convolutions are also probed on their own (calibrate.ConvProbes); the same figures
    # on the held-out shapes that came from captured training steps only:
    for kind in ("aten.convolution.default", "aten.convolution_backward.default"):
        if kind in per_kind:
            pick = lambda i, k: k == kind and not s.probe[test_rows[i]]  # noqa: E731
            per_kind[kind]["captured"] = _metrics(*(_select(v, kinds, pick) for v in (log_t, pred, base)))
    levels = [s.level[i] for i in test if s.kinds[i] in predictor.vocab]
    per_level = {}
    for level in sorted(set(levels)):
        pick = lambda i, k: levels[i] == level  # noqa: E731
        per_level[level] = _metrics(*(_select(v, kinds, pick) for v in (log_t, pred, base)))
        per_level[level]["util"] = statistics.mean(s.util[i] for i in test if s.level[i] == level)
    return {"per_kind": per_kind, "per_level": per_level, "overall": _metrics(log_t, pred, base),
            "train_rows": len(train), "heldout_rows": len(test),
            "heldout_shapes": len({s.shape_key(i) for i in test}),
            "disjoint": not ({s.shape_key(i) for i in train} & {s.shape_key(i) for i in test})}


def goals(result: dict, model_bytes: int) -> dict[str, bool]:
    kinds = result["per_kind"]
    return {
        f"R2 >= {GOAL_R2} on mm/addmm/bmm/convolution(_backward)":
            all(kinds[k]["r2"] >= GOAL_R2 for k in GOAL_R2_KINDS if k in kinds),
        f"median relative error <= {GOAL_MEDIAN_REL:.0%} over all held-out rows":
            result["overall"]["med_rel"] <= GOAL_MEDIAN_REL,
        "MLP R2 > baseline R2 on every compute-heavy kind":
            all(m["r2"] > m["base_r2"] for m in kinds.values() if m["compute_heavy"]),
        f"model <= {GOAL_BYTES / 1e6:.0f} MB": model_bytes <= GOAL_BYTES,
    }


def print_table(result: dict, predictor) -> None:
    print(f"\n{'op kind':42} {'rows':>5} {'held':>5} {'R2':>7} {'baseR2':>7} {'medrel':>7} {'baseMR':>7}")
    for kind, m in result["per_kind"].items():
        star = "*" if m["compute_heavy"] else " "
        print(f"{kind[5:]:41}{star} {m['samples']:5d} {m['n']:5d} {m['r2']:7.3f} {m['base_r2']:7.3f} "
              f"{m['med_rel']:7.1%} {m['base_med_rel']:7.1%}")
    print("(* compute-heavy: has FLOPs.  R2 of log-latency on held-out shapes.)")
    for kind, m in result["per_kind"].items():
        if "captured" in m:
            c = m["captured"]
            print(f"{kind[5:] + ', captured steps only':41}  {'':5} {c['n']:5d} {c['r2']:7.3f} {c['base_r2']:7.3f} "
                  f"{c['med_rel']:7.1%} {c['base_med_rel']:7.1%}")
    print(f"\n{'load level':>10} {'util':>6} {'held':>6} {'R2':>7} {'baseR2':>7} {'medrel':>7} {'baseMR':>7}")
    for level, m in result["per_level"].items():
        print(f"{level:10.2f} {m['util']:6.2f} {m['n']:6d} {m['r2']:7.3f} {m['base_r2']:7.3f} "
              f"{m['med_rel']:7.1%} {m['base_med_rel']:7.1%}")
    o = result["overall"]
    print(f"{'all':>10} {'':6} {o['n']:6d} {o['r2']:7.3f} {o['base_r2']:7.3f} {o['med_rel']:7.1%} "
          f"{o['base_med_rel']:7.1%}")
    meta = predictor.meta
    print(f"\nsamples {meta['samples']} from {meta['models']} models and {meta['probe_samples']} from conv probes; "
          f"train rows {result['train_rows']}, "
          f"held-out rows {result['heldout_rows']} ({result['heldout_shapes']} shapes, disjoint: "
          f"{result['disjoint']}); calibration {meta['calibration_seconds']:.1f} s; "
          f"model {predictor.model_bytes / 1e3:.0f} kB")
    cb = predictor.copy_bandwidth
    print(f"copy bandwidth h2d {cb['h2d'] / 1e9:.2f} GB/s, d2h {cb['d2h'] / 1e9:.2f} GB/s; "
          f"fingerprint {meta['fingerprint']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the quick calibration (<= 30 s)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads while timing (default 1)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--save", action="store_true", help="also save the predictor to the cache dir")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    last = [0.0]

    def progress(done, total, stage):
        if time.perf_counter() - last[0] > 5 or done == total:
            last[0] = time.perf_counter()
            print(f"  {time.perf_counter() - t0:6.1f} s  {done:3d}/{total}  {stage}", flush=True)

    predictor = calibrate(args.device, quick=args.quick, progress=progress, save=args.save)
    result = evaluate(predictor)
    print_table(result, predictor)
    met = goals(result, predictor.model_bytes)
    print("\ngoals:")
    for goal, ok in met.items():
        print(f"  [{'x' if ok else ' '}] {goal}")
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "predictor.json").write_text(json.dumps(
        {"quick": args.quick, "threads": args.threads, "goals": met, "model_bytes": predictor.model_bytes,
         "meta": {k: v for k, v in predictor.meta.items() if k in ("fingerprint", "calibration_seconds", "samples",
                                                                     "models", "probe_samples", "copy_bandwidth")},
         **{k: v for k, v in result.items() if k != "per_level"},
         "per_level": {str(k): v for k, v in result["per_level"].items()}}, indent=1))


if __name__ == "__main__":
    main()
