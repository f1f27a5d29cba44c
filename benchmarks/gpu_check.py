"""What ``benchmarks/gpu_check.sh`` measures on a real GPU, and the profile it writes.

``python -m dbml.bench.gpu_check --out DIR [--workloads mlp,transformer,resnet50] [--dry-run]``

* host<->device copy bandwidth from pinned memory: host to device alone, device to host
  alone, and both at once on two streams (each direction's rate while the other runs);
* the achieved FP32 matmul rate (a large square GEMM, TF32 off: what ``Profile.flops``
  means) and the device memory's bandwidth (a large on-device copy);
* three workloads of the benchmark on the card: eager PyTorch and dbml at half of eager's
  allocator peak, each step's time and ``torch.cuda.max_memory_allocated`` /
  ``max_memory_reserved``, and whether dbml's weights equal eager's bit for bit;
* ``DIR/profile.json``: an emulation profile (``emulate.profile_json``) from those figures,
  which ``python -m dbml bench --emulate DIR/profile.json`` loads, and ``DIR/gpu_check.json``
  with every figure.

``--dry-run`` runs every step on the CPU at toy sizes (no workload is trained, no GPU is
needed): it checks the code path and the profile's format, and its figures mean nothing.
Nothing here reaches the network.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path

import torch

from . import emulate

__all__ = ["copy_bandwidths", "memory_bandwidth", "matmul_flops", "workload_rows", "measured_profile", "main"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(fn, device: torch.device, repeats: int) -> float:
    fn()
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def copy_bandwidths(device: torch.device, nbytes: int = 256 << 20, repeats: int = 5) -> dict[str, float]:
    """Bytes/s: ``h2d`` and ``d2h`` alone, and ``duplex_h2d`` / ``duplex_d2h``, each
    direction while the other runs (two streams, both copies of ``nbytes``)."""
    cuda = device.type == "cuda"
    host_a = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    host_b = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dev_a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev_b = torch.empty(nbytes, dtype=torch.uint8, device=device)
    h2d = nbytes / _best(lambda: dev_a.copy_(host_a, non_blocking=cuda), device, repeats)
    d2h = nbytes / _best(lambda: host_b.copy_(dev_b, non_blocking=cuda), device, repeats)
    if cuda:
        up, down = torch.cuda.Stream(device), torch.cuda.Stream(device)
        ends = {}

        def both():
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            for name, stream, fn in (("h2d", up, lambda: dev_a.copy_(host_a, non_blocking=True)),
                                     ("d2h", down, lambda: host_b.copy_(dev_b, non_blocking=True))):
                stream.wait_event(start)
                with torch.cuda.stream(stream):
                    fn()
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()
                ends[name] = (start, end)
        times = {"h2d": float("inf"), "d2h": float("inf")}
        for _ in range(repeats + 1):
            both()
            torch.cuda.synchronize(device)
            for name, (start, end) in ends.items():
                times[name] = min(times[name], start.elapsed_time(end) / 1e3)
        duplex = {f"duplex_{k}": nbytes / v for k, v in times.items()}
    else:   # the dry run: one thread per direction, timed together
        import threading
        t = threading.Thread(target=lambda: host_b.copy_(dev_b))
        t0 = time.perf_counter()
        t.start()
        dev_a.copy_(host_a)
        t.join()
        both = time.perf_counter() - t0
        duplex = {"duplex_h2d": nbytes / both, "duplex_d2h": nbytes / both}
    return {"h2d": h2d, "d2h": d2h, **duplex, "bytes": nbytes}


def memory_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes/s of a large on-device copy, read plus write (``Profile.memory``)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / _best(lambda: dst.copy_(src), device, repeats)


def matmul_flops(device: torch.device, n: int = 8192, repeats: int = 5) -> float:
    """FLOP/s of an ``n`` x ``n`` float32 matmul, TF32 off (the FP32 rate)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.full((n, n), 0.5, device=device)
        b = torch.full((n, n), 0.25, device=device)
        return 2 * n ** 3 / _best(lambda: torch.mm(a, b), device, repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def workload_rows(names: list[str], device: torch.device, steps: int = 3, fraction: float = 0.5) -> list[dict]:
    """Per workload: eager and dbml at ``fraction`` of eager's allocator peak, on the card."""
    from dbml.scheduler.errors import InfeasibleBudget
    from dbml.scheduler.execute.runner import ScheduledStep
    from dbml.scheduler.execute.step import EagerStep

    from .methods import SPEC, loss_fn
    from .workloads import workload
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    rows = []
    for name in names:
        w = workload(name)
        model = w.model()   # on the CPU: each runner gets its own copy on the card
        x, y = (t.to(device) for t in w.batch_tensors())
        eager = copy.deepcopy(model).to(device)
        step = EagerStep(eager, loss_fn, SPEC)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        seconds = _steps(lambda: step.step(x, y), device, steps, warmups=3)
        vanilla = torch.cuda.max_memory_allocated(device)
        row = {"workload": name, "describe": w.describe(), "eager_seconds": seconds, "eager_peak_bytes": vanilla,
               "eager_reserved_bytes": torch.cuda.max_memory_reserved(device), "budget_bytes": int(fraction * vanilla)}
        want = [q.detach().cpu() for q in eager.parameters()]
        del step, eager   # off the card before dbml's peak is measured
        scheduled = copy.deepcopy(model).to(device)
        try:
            run = ScheduledStep(scheduled, loss_fn, SPEC, device=str(device), budget_bytes=row["budget_bytes"])
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            first = {}

            def warmed():   # the first iterations measure what the allocator holds beside the plan
                first["peak"] = torch.cuda.max_memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            row["dbml_seconds"] = _steps(lambda: run.step(x, y), device, steps, warmed, warmups=3)
            run.finish()
            stats = run.stats()
            row.update(dbml_first_peak_bytes=first["peak"], dbml_device_reserve_bytes=run.device_reserve,
                       dbml_peak_bytes=torch.cuda.max_memory_allocated(device),
                       dbml_reserved_bytes=torch.cuda.max_memory_reserved(device),
                       dbml_stats={k: v for k, v in stats.items() if isinstance(v, (int, float, str, bool))},
                       identical=all(torch.equal(a.cpu(), b) for a, b in zip(scheduled.parameters(), want)))
        except InfeasibleBudget as err:
            row["infeasible"] = str(err)
        rows.append(row)
        del scheduled
        torch.cuda.empty_cache()
    return rows


def _steps(fn, device: torch.device, steps: int, warmed=None, warmups: int = 1) -> float:
    """Median seconds of ``steps`` steps after ``warmups`` warm-up steps (each step runs on
    the same batch: the weights after all steps are compared, eager against dbml);
    ``warmed`` is called after the warm-up."""
    for _ in range(warmups):
        fn()
    if warmed is not None:
        _sync(device)
        warmed()
    times = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def measured_profile(name: str, copies: dict, flops: float, memory: float | None = None) -> emulate.Profile:
    """The emulation profile of a measured card: ``pcie`` the slower direction alone,
    ``duplex`` the slower direction while both run; the kernel efficiencies stay the
    calibrated defaults (``emulate.Profile``)."""
    pcie = min(copies["h2d"], copies["d2h"])
    duplex = min(copies["duplex_h2d"], copies["duplex_d2h"])
    source = (f"{name}: measured by benchmarks/gpu_check.sh: {flops / 1e12:.1f} TFLOPS FP32 matmul; copies "
              f"{copies['h2d'] / 1e9:.1f} GB/s h2d, {copies['d2h'] / 1e9:.1f} GB/s d2h alone, "
              f"{copies['duplex_h2d'] / 1e9:.1f}/{copies['duplex_d2h'] / 1e9:.1f} GB/s both at once")
    extra = {"memory": memory} if memory else {}
    return emulate.Profile(name, flops, pcie, source, duplex=duplex, **extra)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for profile.json and gpu_check.json")
    ap.add_argument("--workloads", default="mlp,transformer,resnet50")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dry-run", action="store_true", help="the CPU at toy sizes: checks the code path only")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        device, nbytes, n = torch.device("cpu"), 1 << 20, 128
        name = "dry-run-cpu"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_check: no CUDA device; use --dry-run to check the code path on a CPU")
        device, nbytes, n = torch.device("cuda"), 256 << 20, 8192
        name = torch.cuda.get_device_name(device)
    copies = copy_bandwidths(device, nbytes)
    print(f"copies: {json.dumps({k: round(v / 1e9, 2) if k != 'bytes' else v for k, v in copies.items()})} GB/s",
          flush=True)
    flops = matmul_flops(device, n)
    print(f"fp32 matmul {n}x{n}: {flops / 1e12:.2f} TFLOPS", flush=True)
    memory = memory_bandwidth(device, nbytes * 4)
    print(f"device memory: {memory / 1e9:.0f} GB/s", flush=True)
    # the profile first: if the workloads run out of time, it is there
    p = measured_profile(name.lower().replace(" ", "-"), copies, flops, memory)
    (out / "profile.json").write_text(json.dumps(emulate.profile_json(p), indent=1) + "\n")
    report = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "dry_run": args.dry_run,
              "load_average": list(os.getloadavg()), "copies": copies, "matmul_flops": flops, "matmul_n": n,
              "memory_bandwidth": memory, "workloads": [], "profile": emulate.profile_json(p)}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    for w in ([] if args.dry_run else args.workloads.split(",")):   # the report rewritten after each
        try:
            report["workloads"] += workload_rows([w], device, args.steps)
        except Exception as err:   # noqa: BLE001 - recorded; the other workloads still run
            report["workloads"].append({"workload": w, "error": f"{type(err).__name__}: {err}"})
        print(json.dumps(report["workloads"][-1]), flush=True)
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out / 'profile.json'} and {out / 'gpu_check.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
