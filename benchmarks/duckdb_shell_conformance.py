"""Run DuckDB's own shell tests against ``python -m dbml shell`` (issue 25's conformance run).

DuckDB's tests (``tools/shell/tests`` in the duckdb repository) are not part of this
project: point ``--tests`` at a copy of the duckdb repository's root (the tests read
``data/`` and ``test/`` files relative to it). The adapter is a two-line wrapper script
that starts ``python -m dbml shell`` with the arguments the tests pass to the CLI binary
(``--shell-binary``). With ``--reference`` (a released ``duckdb`` binary, e.g. from
``pip download duckdb-cli``) the same tests run against it too, and the count that matters
is printed: of the tests the released CLI passes, how many dbml's shell passes, per file.

    python benchmarks/duckdb_shell_conformance.py --tests /path/to/duckdb \\
        --reference /path/to/duckdb-cli/duckdb [--keep results/]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def wrapper(directory: Path) -> Path:
    """An executable that is ``python -m dbml shell`` for the tests."""
    path = directory / "dbml-shell"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m dbml shell "$@"\n')
    path.chmod(0o755)
    return path


def run_suite(tests: Path, binary: Path, xml: Path, extra: list[str]) -> dict[str, str]:
    """Each test's outcome (passed, failed, skipped) for one shell binary."""
    subprocess.run([sys.executable, "-m", "pytest", "tools/shell/tests", f"--shell-binary={binary}", "-q",
                    "-p", "no:cacheprovider", "-p", "no:randomly", "--rootdir", str(tests), "-o", "addopts=",
                    f"--junitxml={xml}", *extra], cwd=tests, stdout=subprocess.DEVNULL, env={**os.environ})
    outcomes = {}
    for case in ET.parse(xml).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[name] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    return outcomes


def per_file(ours: dict[str, str], reference: dict[str, str] | None) -> list[tuple[str, int, int, list[str]]]:
    """(file, tests the reference passes, of those ours passes, names we fail)."""
    counts: dict[str, list] = defaultdict(lambda: [0, 0, []])
    for name, outcome in ours.items():
        if reference is not None and reference.get(name) != "passed":
            continue
        if reference is None and outcome == "skipped":
            continue
        entry = counts[name.split("::")[0].rsplit(".", 1)[-1]]
        entry[0] += 1
        if outcome == "passed":
            entry[1] += 1
        else:
            entry[2].append(name.split("::", 1)[1])
    return sorted((f, *v) for f, v in counts.items())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tests", type=Path, required=True, help="a copy of the duckdb repository's root")
    p.add_argument("--reference", type=Path, help="a released duckdb CLI binary to compare with")
    p.add_argument("--keep", type=Path, help="write the junit XML files here")
    p.add_argument("pytest_args", nargs="*", help="more pytest arguments (e.g. -k pattern)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        ours = run_suite(args.tests, wrapper(Path(tmp)), out / "dbml.xml", args.pytest_args)
        reference = run_suite(args.tests, args.reference, out / "reference.xml", args.pytest_args) \
            if args.reference else None
    rows = per_file(ours, reference)
    total = sum(r[1] for r in rows)
    passed = sum(r[2] for r in rows)
    basis = "the released CLI passes" if reference else "not skipped"
    print(f"{'file':<40} {'tests ' + basis:>28} {'dbml passes':>12}")
    for name, count, ok, failed in rows:
        print(f"{name:<40} {count:>28} {ok:>12}")
    print(f"{'total':<40} {total:>28} {passed:>12}  ({100 * passed / max(total, 1):.1f} %)")
    for name, count, ok, failed in rows:
        for test in failed:
            print(f"  failed: {name}::{test}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
