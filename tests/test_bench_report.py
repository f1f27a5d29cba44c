"""benchmarks/report.py: the markdown, the ledger flag, the frontier verdicts and the plots of
``python -m dbml bench``, from a synthetic results dict (no measurement runs here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
from dbml.bench import report

MIB = 2 ** 20
VANILLA = 100 * MIB


def row(method, family, peak_mib, eor, section="single", workload="vgg16", mode="cpu", **extra):
    """A measured row: vanilla 100 MiB and 1 s, MSR and CBR derived as the harness does."""
    peak = None if peak_mib is None else int(peak_mib * MIB)
    msr = None if peak is None else (VANILLA - peak) / VANILLA
    base = dict(section=section, workload=workload, method=method, family=family, mode=mode, batch=16,
                jobs=1, threads=2, budget_bytes=None, vanilla_peak_bytes=VANILLA, peak_bytes=peak,
                host_peak_bytes=0, ledger_peak_bytes=peak if family == "dbml" else None,
                vanilla_seconds=1.0, seconds=eor, msr=msr, eor=eor,
                cbr=None if eor is None else msr / eor, first_iteration_eor=None, swaps=0,
                recomputes=0, bit_identical=True if family == "dbml" else None,
                within_budget=None, error=None, note="")
    base.update(extra)
    return base


def failed(method, error, **where):
    r = row(method, "peer", None, None, **where)
    r.update(error=error, vanilla_peak_bytes=None, vanilla_seconds=None)
    return r


def results() -> dict:
    rows = [
        row("eager", "eager", 100, 1.0),
        row("dbml-none", "dbml", 100, 1.02),
        # ledger 49.5 MiB against a tracked 48.0: 3.1 % apart -> flagged
        row("dbml-tensile@50%", "dbml", 48, 1.2, budget_bytes=50 * MIB, ledger_peak_bytes=int(49.5 * MIB),
            within_budget=True, swaps=12, recomputes=3),
        # ledger 74.7 MiB against 74.0: 0.95 % apart -> not flagged
        row("dbml-tensile@75%", "dbml", 74, 1.05, budget_bytes=75 * MIB, ledger_peak_bytes=int(74.7 * MIB),
            within_budget=True, swaps=4),
        row("checkpoint", "peer", 60, 1.3),             # dbml@50% reaches 48 MiB at 1.2: ahead
        row("offload", "peer", 49, 1.1, host_peak_bytes=30 * MIB),  # dbml's best there is 1.2: behind
        row("activation-cap", "peer", 30, 2.0),         # no dbml row that small: behind
        failed("compile", "torch.compile: no C++ compiler | gcc missing"),
        row("eager", "eager", 100, 1.0, workload="mlp"),
        row("dbml-tensile@min", "dbml", 20, 1.5, workload="mlp", budget_bytes=21 * MIB),
        row("checkpoint", "peer", 30, 1.6, workload="mlp"),   # ahead: dbml of every peer
        row("dbml-tensile@50%", "dbml", 49, 1.9, mode="emulated:a6000", budget_bytes=50 * MIB),
        row("checkpoint", "peer", 60, 1.4, mode="emulated:a6000"),   # behind in emulation
        row("dbml-tensile@50%", "dbml", 48, 1.3, section="coldstart", first_iteration_eor=1.41,
            capture_seconds=2.5),
        row("dbml-capuchin@50%", "dbml", 49, 1.6, section="coldstart", first_iteration_eor=6.2,
            capture_seconds=2.5),
        row("dbml-tensile@50%", "dbml", 150, 1.4, section="concurrent", jobs=2, eor_sequential=0.8),
        row("dbml-tensile@50%", "dbml", 280, 1.5, section="concurrent", jobs=4, eor_sequential=0.75),
        row("dbml-tensile@50%", "dbml", 20, 1.2, section="batch", batch=4),
        row("dbml-tensile@50%", "dbml", 180, 1.2, section="batch", batch=64),
        row("dbml-tensile@50%", "dbml", None, None, section="planning", plan_seconds=0.21),
    ]
    steps = [(0.0, 0.1), (0.2, 0.6), (0.5, 1.0), (0.9, 0.2), (1.0, 0.1)]
    timelines = {
        "vgg16/eager/cpu": [[t, int(f * VANILLA), 0] for t, f in steps],
        "vgg16/dbml-tensile@50%/cpu": [[t * 1.2, int(f * 48 * MIB), int(f * 20 * MIB)] for t, f in steps],
        "vgg16/offload/cpu": [[t * 1.1, int(f * 49 * MIB), int(f * 30 * MIB)] for t, f in steps],
    }
    return {"date": "2026-11-23", "command": "python -m dbml bench --emulate a6000",
            "machine": {"name": "testbox", "cpu": "Test CPU", "cores": 2, "memory_gib": 24,
                        "torch": "2.13.0", "duckdb": "1.4.0", "gpu": None},
            "load_average": {"before": [1.0, 0.9, 0.8], "after": [1.25, 1.0, 0.85]},
            "quick": False, "threads": 2, "emulate": ["a6000"], "latency_model": "roofline",
            "rows": rows, "timelines": timelines, "notes": ["rockmate: not installed here"]}


def line_of(md: str, *cells: str) -> str:
    """The one table line whose leading cells are ``cells``."""
    prefix = "| " + " | ".join(cells) + " |"
    found = [ln for ln in md.splitlines() if ln.startswith(prefix)]
    assert len(found) == 1, (prefix, found)
    return found[0]


def section(md: str, title: str) -> str:
    """The text under the heading that starts with ``title``, up to the next heading."""
    start = md.index(title)
    rest = md[start + len(title):]
    ends = [i for i in (rest.find("\n#"),) if i >= 0]
    return rest[: ends[0]] if ends else rest


def test_header_says_when_where_how_and_that_emulated_figures_are_emulated():
    md = report.markdown(results())
    head = md.split("\n## ")[0]
    assert "# dbml bench — 2026-11-23, testbox" in head
    assert "before 1.00 / 0.90 / 0.80, after 1.25 / 1.00 / 0.85" in head
    assert "`python -m dbml bench --emulate a6000`" in head
    assert "threads: 2; latency model: roofline" in head
    assert "Test CPU, 2 cores, 24 GiB; GPU: none; torch 2.13.0, duckdb 1.4.0" in head
    assert "are emulated" in head and "rockmate: not installed here" in head
    assert "### single — emulated:a6000 (emulated figures: not measured on that GPU)" in md


def test_single_table_cells():
    md = section(report.markdown(results()), "### single — cpu")
    assert md.startswith(" · batch 16, jobs 1, threads 2\n")    # shared settings said once
    assert ("| workload | method | budget MiB (% of vanilla) | peak MiB | host peak MiB | MSR | time s | EOR "
            "| CBR | swaps | recomp | bit-identical | note |") in md
    assert line_of(md, "vgg16", "dbml-tensile@50%") .startswith(
        "| vgg16 | dbml-tensile@50% | 50.0 (50 %) | 48.0 | 0.0 | 0.520 | 1.200 | 1.200 | 0.433 | 12 | 3 | yes |")
    assert line_of(md, "vgg16", "offload").startswith("| vgg16 | offload | — | 49.0 | 30.0 | 0.510 | 1.100 |")
    assert "| eager | — | 100.0 | 0.0 | 0.000 | 1.000 | 1.000 | 0.000 | 0 | 0 | — |" in md


def test_an_error_row_shows_its_error_instead_of_figures():
    md = report.markdown(results())
    line = line_of(section(md, "### single — cpu"), "vgg16", "compile")
    # the pipe in the message is escaped so the table keeps its columns
    assert line == ("| vgg16 | compile | — | ✗ torch.compile: no C++ compiler \\| gcc missing "
                    "|  |  |  |  |  |  |  |  |  |")
    planning = section(md, "### planning — cpu")
    assert "| workload | method | plan s | note |" in planning
    assert "| vgg16 | dbml-tensile@50% | 0.210 |  |" in planning


def test_ledger_flag_beyond_two_percent_only():
    md = section(report.markdown(results()), "### single — cpu")
    assert line_of(md, "vgg16", "dbml-tensile@50%").endswith("| ⚠ ledger 49.5 MiB |")
    assert "⚠" not in line_of(md, "vgg16", "dbml-tensile@75%")
    r = row("dbml-x", "dbml", 100, 1.0)
    for ledger_mib, flagged in ((102.0, False), (102.1, True), (97.9, True), (99.0, False)):
        r["ledger_peak_bytes"] = int(ledger_mib * MIB)
        assert report.ledger_mismatch(r) is flagged, ledger_mib


def test_broken_promises_are_flagged_in_the_note():
    r = row("dbml-x", "dbml", 60, 1.0, budget_bytes=50 * MIB, within_budget=False, bit_identical=False,
            note="replanned twice")
    line = line_of(report.table("single", [r]), "vgg16", "dbml-x")
    assert "| **NO** | ⚠ over budget; ⚠ results differ from eager; replanned twice |" in line


def test_frontier_verdicts():
    entries = {(e["mode"], e["workload"], e["peer"]): e for e in report.frontier(results()["rows"])}
    ahead = entries["cpu", "vgg16", "checkpoint"]
    assert (ahead["verdict"], ahead["dbml_method"], ahead["dbml_eor"]) == ("ahead", "dbml-tensile@50%", 1.2)
    assert entries["cpu", "vgg16", "offload"]["verdict"] == "behind"
    assert entries["cpu", "vgg16", "activation-cap"]["dbml_method"] is None
    assert entries["cpu", "vgg16", "activation-cap"]["verdict"] == "behind"
    assert entries["cpu", "vgg16", "compile"]["verdict"] == "peer failed"
    assert entries["emulated:a6000", "vgg16", "checkpoint"]["verdict"] == "behind"
    assert entries["cpu", "mlp", "checkpoint"]["verdict"] == "ahead"

    md = report.markdown(results())
    front = section(md[md.index("## Frontier"):], "### cpu")
    assert line_of(front, "vgg16", "checkpoint") == (
        "| vgg16 | checkpoint | 60.0 | 1.300 | 1.200 (dbml-tensile@50%, 48.0 MiB) | dbml ahead |")
    assert line_of(front, "vgg16", "offload").endswith("| 1.200 (dbml-tensile@50%, 48.0 MiB) | dbml behind |")
    assert line_of(front, "vgg16", "activation-cap").endswith("| no dbml row at this peak | dbml behind |")
    assert "- **vgg16**: dbml behind offload, activation-cap; ahead of checkpoint; did not run: compile." in front
    assert "- **mlp**: dbml ahead of every peer that ran (checkpoint)." in front


def test_a_dbml_row_that_differs_from_eager_does_not_count_on_the_frontier():
    rows = [row("dbml-fast", "dbml", 40, 1.0, bit_identical=False), row("checkpoint", "peer", 60, 1.3)]
    (entry,) = report.frontier(rows)
    assert entry["verdict"] == "behind" and entry["dbml_method"] is None


def test_other_sections_get_their_extra_keys_as_columns():
    md = report.markdown(results())
    cold = section(md, "### coldstart — cpu")
    assert "| first-iteration EOR | EOR | CBR | bit-identical | capture s | note |" in cold
    assert "| 1.410 | 1.300 |" in line_of(cold, "vgg16", "dbml-tensile@50%")
    concurrent = section(md, "### concurrent — cpu")
    assert "| eor sequential | note |" in concurrent and " · batch 16, threads 2" in concurrent
    assert line_of(concurrent, "vgg16", "dbml-tensile@50%", "4").endswith("| yes | 0.750 |  |")
    batch = section(md, "### batch — cpu")
    assert line_of(batch, "vgg16", "dbml-tensile@50%", "64")
    assert md.index("## single") < md.index("## coldstart") < md.index("## concurrent") < md.index("## batch")


def test_pareto_keeps_the_points_nothing_beats():
    points = [(0.5, 1.2), (0.3, 1.05), (0.4, 1.3), (0.0, 1.02), (0.5, 1.25)]
    assert report.pareto(points) == [(0.0, 1.02), (0.3, 1.05), (0.5, 1.2)]


@pytest.mark.slow   # matplotlib's import and three figures: 3-5 s here
def test_write_produces_json_markdown_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    data = results()
    paths = report.write(data, str(tmp_path))
    stem = "2026-11-23-testbox"
    assert paths["json"] == str(tmp_path / f"{stem}.json")
    assert json.loads(Path(paths["json"]).read_text()) == data
    assert Path(paths["markdown"]).read_text() == report.markdown(data)
    names = sorted(Path(p).name for p in paths["plots"])
    assert names == [f"{stem}-frontier-cpu.png", f"{stem}-frontier-emulated-a6000.png",
                     f"{stem}-memory-vgg16-cpu.png"]
    for p in paths["plots"]:
        assert Path(p).stat().st_size > 10_000
        with Image.open(p) as image:
            assert image.format == "PNG" and image.width > 500 and image.height > 300


def test_plots_without_matplotlib_return_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib now raises ImportError
    assert report.plots(results(), str(tmp_path)) == []
    assert list(tmp_path.iterdir()) == []
