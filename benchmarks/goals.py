"""The scheduler's goals (issue 13), judged from one run's rows: met, missed or not measured.

Each goal reads the rows ``python -m dbml bench`` wrote and answers per workload with the
figure it was judged on, so a report says plainly which goals a run met and by how much.
A goal whose rows are not in the run (a section or workload left out) is "not measured",
never "met". Only rows that are bit-identical to eager and within their budget count for
dbml (a fast wrong answer is not a result).

>>> rows = [{"section": "single", "mode": "cpu", "workload": "w", "family": "dbml", "method": "dbml-tensile@50%",
...          "msr": 0.55, "eor": 1.1, "bit_identical": True, "within_budget": True, "error": None}]
>>> [(g.goal, g.met) for g in memory_at_overhead(rows, ("w",), 0.5, 1.15)]
[('MSR >= 0.5 at EOR <= 1.15', True)]
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Goal", "evaluate", "markdown", "PAPER_CBR", "CNNS"]

CNNS = ("vgg16", "resnet50", "densenet121", "inception_v3", "inception_v4", "transformer")
PEERS = ("checkpoint", "offload", "compile", "rockmate")
# TENSILE's Table III (A6000, batch 16): its CBR per workload
PAPER_CBR = {"vgg16": 0.16, "inception_v3": 0.26, "inception_v4": 0.36, "resnet50": 0.27, "densenet121": 0.44}


@dataclass(frozen=True)
class Goal:
    goal: str
    workload: str
    figure: str          # what it was judged on, in words and numbers
    met: bool | None     # None: not measured in this run


def _ok(row: dict) -> bool:
    """A dbml row that counts: measured, bit-identical to eager, within its budget."""
    return (row.get("error") is None and row.get("eor") is not None and row.get("msr") is not None
            and row.get("bit_identical") is not False and row.get("within_budget") is not False)


def _dbml(rows, workload: str, mode: str = "cpu", section: str = "single") -> list[dict]:
    return [r for r in rows if r.get("section") == section and r.get("mode") == mode
            and r.get("workload") == workload and r.get("family") == "dbml" and r.get("method") != "dbml-none"
            and _ok(r)]


def memory_at_overhead(rows, workloads, msr: float, eor: float) -> list[Goal]:
    """MSR >= msr at EOR <= eor on each workload (native CPU): the best MSR within the EOR."""
    out = []
    for w in workloads:
        ours = _dbml(rows, w)
        name = f"MSR >= {msr} at EOR <= {eor}"
        if not ours:
            out.append(Goal(name, w, "no dbml row", None))
            continue
        within = [r for r in ours if r["eor"] <= eor]
        best = max(within, key=lambda r: r["msr"], default=None)
        if best is None:
            least = min(ours, key=lambda r: r["eor"])
            out.append(Goal(name, w, f"no row at EOR <= {eor} (least {least['eor']:.3f}, {least['method']})", False))
        else:
            out.append(Goal(name, w, f"MSR {best['msr']:.3f} at EOR {best['eor']:.3f} ({best['method']})",
                            best["msr"] >= msr))
    return out


def frontier_dominates(rows, workloads) -> list[Goal]:
    """At each peer's measured peak, dbml's EOR is at most the peer's: some dbml row uses no
    more memory than the peer and takes no more time."""
    out = []
    for w in workloads:
        peers = [r for r in rows if r.get("section") == "single" and r.get("mode") == "cpu" and r.get("workload") == w
                 and r.get("method") in PEERS and r.get("error") is None and r.get("peak_bytes")]
        ours = _dbml(rows, w) + [r for r in rows if r.get("section") == "single" and r.get("mode") == "cpu"
                                 and r.get("workload") == w and r.get("method") == "dbml-none" and _ok(r)]
        for p in peers:
            fits = [r for r in ours if r.get("peak_bytes") and r["peak_bytes"] <= p["peak_bytes"]]
            best = min(fits, key=lambda r: r["eor"], default=None)
            name = f"frontier dominates {p['method']}"
            if best is None:
                out.append(Goal(name, w, f"no dbml row at <= {p['peak_bytes'] / 2**20:.0f} MiB", False))
            else:
                out.append(Goal(name, w, f"{p['method']} EOR {p['eor']:.3f} at {p['peak_bytes'] / 2**20:.0f} MiB; "
                                f"dbml EOR {best['eor']:.3f} at {best['peak_bytes'] / 2**20:.0f} MiB "
                                f"({best['method']})", best["eor"] <= p["eor"]))
    return out


def smallest_budget(rows, workloads, ratio: float = 1.15) -> list[Goal]:
    """Smallest feasible budget <= ratio x the tensor-granularity floor (the planning row's
    ``floor_bytes``); and a VGG-16 plan at 35 % of its peak."""
    floors = {r["workload"]: r.get("floor_bytes") for r in rows if r.get("section") == "planning"}
    out = []
    for w in workloads:
        for method in ("dbml-tensile@min", "dbml-stalls@min"):
            row = next((r for r in rows if r.get("section") == "single" and r.get("mode") == "cpu"
                        and r.get("workload") == w and r.get("method") == method), None)
            name, floor = f"smallest feasible <= {ratio} x floor", floors.get(w)
            if row is None or not floor or not row.get("smallest_feasible_bytes"):
                if method == "dbml-tensile@min":
                    out.append(Goal(name, w, "not measured", None))
                continue
            r = row["smallest_feasible_bytes"] / floor
            out.append(Goal(name, w, f"{method}: {row['smallest_feasible_bytes'] / 2**20:.1f} MiB = {r:.2f} x floor "
                            f"{floor / 2**20:.1f} MiB ({row.get('latency_model')})", r <= ratio))
    for vgg in (r for r in rows if r.get("section") == "single" and r.get("mode") == "cpu"
                and r.get("workload") == "vgg16" and r.get("method") in ("dbml-tensile@35%", "dbml-stalls@35%")):
        out.append(Goal("a plan at 35 % of the peak", "vgg16", f"{vgg['method']}: " +
                        ("planned and ran" if _ok(vgg) else f"failed: {vgg.get('error')}"), _ok(vgg)))
    return out


def latency_estimates(rows, within: float = 0.20, quick_within: float = 0.35) -> list[Goal]:
    """Whole-iteration estimate within +-20 % of measured on held-out architectures
    (quick calibration: +-35 %): the "latency" section's rows."""
    out = []
    for r in rows:
        if r.get("section") != "latency" or not r.get("held_out") or r.get("ratio") is None:
            continue
        bound = quick_within if r.get("calibration") == "quick" else within
        out.append(Goal(f"iteration estimate within +-{bound:.0%} ({r.get('latency_model')}, {r.get('calibration')})",
                        r["workload"], f"predicted / measured {r['ratio']:.2f}", abs(r["ratio"] - 1) <= bound))
    return out


def unbound_overhead(rows, limit: float = 1.05) -> list[Goal]:
    """A job whose budget binds nothing runs at <= 1.05 x eager per step (dbml-none and
    the "fastpath" section's unbound tensile rows)."""
    out = []
    for r in rows:
        unbound = (r.get("section") == "single" and r.get("mode") == "cpu" and r.get("method") == "dbml-none") or \
                  (r.get("section") == "fastpath" and r.get("family") == "dbml" and "interpreted" not in r["method"])
        if unbound and r.get("eor") is not None:
            out.append(Goal(f"unbound job <= {limit} x eager", r["workload"],
                            f"{r['method']}: {r['eor']:.3f} x eager", r["eor"] <= limit))
    return out


def emulated(rows, profile: str = "a6000", first_limit: float = 1.2) -> list[Goal]:
    """On the emulated GPU: the best CBR above the paper's Table III, and the first
    iteration's EOR at 50 % (planned from the latency model) <= 1.2."""
    mode, out = f"emulated:{profile}", []
    if not any(r.get("mode") == mode for r in rows):
        return out
    for w, paper in PAPER_CBR.items():
        ours = [r for r in _dbml(rows, w, mode) if r.get("cbr") is not None]
        best = max(ours, key=lambda r: r["cbr"], default=None)
        name = f"CBR above the paper's ({profile})"
        out.append(Goal(name, w, "not measured", None) if best is None else
                   Goal(name, w, f"CBR {best['cbr']:.3f} ({best['method']}) vs paper {paper}", best["cbr"] > paper))
    for r in rows:
        if r.get("section") == "coldstart" and r.get("mode") == mode and r.get("method") == "dbml-tensile@50%":
            f = r.get("first_iteration_eor")
            out.append(Goal(f"first-iteration EOR <= {first_limit} at 50 % ({profile})", r["workload"],
                            "not measured" if f is None else f"{f:.3f}", None if f is None else f <= first_limit))
    return out


def mixed(rows, msr: float = 0.3, eor: float = 1.15) -> list[Goal]:
    """The mixed concurrent workload: MSR >= 0.3 at EOR <= 1.15 (paper: 0.157 at 1.159)."""
    ours = [r for r in rows if r.get("section") == "mixed" and r.get("family") == "dbml" and _ok(r)]
    best = max((r for r in ours if r["eor"] <= eor), key=lambda r: r["msr"], default=None)
    name = f"mixed: MSR >= {msr} at EOR <= {eor}"
    if not ours:
        return []
    if best is None:
        least = min(ours, key=lambda r: r["eor"])
        return [Goal(name, "mixed", f"no row at EOR <= {eor} (least {least['eor']:.3f})", False)]
    return [Goal(name, "mixed", f"MSR {best['msr']:.3f} at EOR {best['eor']:.3f} ({best['method']})",
                 best["msr"] >= msr)]


def evaluate(results: dict) -> list[Goal]:
    """Every goal of issue 13, for the workloads the run measured."""
    rows = results.get("rows", [])
    ran = [w for w in CNNS if any(r.get("workload") == w and r.get("section") == "single" for r in rows)]
    return (memory_at_overhead(rows, ran, 0.5, 1.15) + memory_at_overhead(rows, ran, 0.65, 1.3)
            + frontier_dominates(rows, ran) + smallest_budget(rows, ran) + latency_estimates(rows)
            + unbound_overhead(rows) + emulated(rows) + mixed(rows))


def markdown(results: dict) -> str:
    """The goals as a markdown section: a count, then one line per goal and workload."""
    goals = evaluate(results)
    if not goals:
        return ""
    met = sum(g.met is True for g in goals)
    missed = sum(g.met is False for g in goals)
    lines = ["## goals (issue 13)", "",
             f"{met} met, {missed} missed, {len(goals) - met - missed} not measured in this run.", "",
             "| goal | workload | figure | met |", "|---|---|---|---|"]
    mark = {True: "yes", False: "**NO**", None: "—"}
    lines += [f"| {g.goal} | {g.workload} | {g.figure} | {mark[g.met]} |" for g in goals]
    return "\n".join(lines) + "\n"
