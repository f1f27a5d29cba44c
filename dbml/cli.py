"""The command line: ``python -m dbml <command>``. Thin: each command calls one dbml function."""

from __future__ import annotations

import argparse
import sys

COMMANDS = {
    "shell": "an interactive SQL shell with dbml installed; reads statements from a pipe too",
    "demo": "build demo data, train several models from SQL, predict, evaluate, and print a report",
    "install": "calibrate this machine (op latencies under load, copy bandwidth) and train the latency "
               "predictor the memory scheduler plans with; --quick takes about 30 s",
    "bench": "benchmark dbml against eager PyTorch, the paper and PyTorch's own memory tools "
             "(python -m dbml bench --help); --quick takes a few minutes",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dbml", description="In-database machine learning for DuckDB.")
    sub = p.add_subparsers(dest="command", required=True)
    # its options are DuckDB CLI's (python -m dbml shell -help; dbml/shell/options.py): main() hands them over
    sub.add_parser("shell", help=COMMANDS["shell"], description=COMMANDS["shell"], add_help=False)
    demo = sub.add_parser("demo", help=COMMANDS["demo"], description=COMMANDS["demo"])
    demo.add_argument("database", nargs="?", default=":memory:", help="DuckDB database file (default: in memory)")
    install = sub.add_parser("install", help=COMMANDS["install"], description=COMMANDS["install"])
    install.add_argument("--quick", action="store_true", help="a quick calibration (about 30 s)")
    install.add_argument("--device", default="auto", help="device to calibrate: auto, cpu or cuda (default auto)")
    install.add_argument("--threads", type=int, default=1,
                         help="PyTorch threads, as training jobs use them (the torch_threads setting; default 1)")
    # its options are the harness's own (benchmarks/harness.py): main() hands them over unparsed
    sub.add_parser("bench", help=COMMANDS["bench"], description=COMMANDS["bench"], add_help=False)
    return p


def progress_bar(out=sys.stderr, width: int = 40):
    """A progress callback drawing ``[####....]  45%  stage`` on one line."""
    def draw(done: int, total: int, stage: str) -> None:
        filled = int(width * done / max(total, 1))
        out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {100 * done / max(total, 1):3.0f}%  {stage[:30]:30}")
        if done >= total:
            out.write("\n")
        out.flush()
    return draw


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from .bench import harness
        return harness.main(argv[1:])
    if argv[:1] == ["shell"]:
        from .shell import main as shell
        return shell(argv[1:])
    args = parser().parse_args(argv)
    if args.command == "install":
        from .core.latency import calibrate
        from .scheduler.latency.predictor import predictor_path
        from .core.settings import resolve_device
        device = resolve_device(args.device)
        predictor = calibrate(device, args.quick, args.threads, progress=progress_bar())
        print(predictor.report().format())
        if device.startswith("cpu"):   # the CPU's slow tier: disk, where DuckDB spills (its default '.tmp')
            from .scheduler.execute.spill import calibrate_tier
            tier = calibrate_tier(".tmp")
            print(f"spill tier (.tmp): write {tier.write / 1e6:.0f} MB/s, read {tier.read / 1e6:.0f} MB/s, "
                  f"{tier.latency * 1e6:.0f} us per copy")
        print(f"saved {predictor_path(device, args.threads)}")
        return 0
    if args.command == "demo":
        from . import demo
        return demo.main(args.database)
    return 2
