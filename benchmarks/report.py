"""The output side of ``python -m dbml bench``: a results dict as JSON, markdown and PNG plots.

Owns the presentation only; the harness measures and hands over ``results`` (see the
issue-12 layout: ``date``, ``machine``, ``command``, ``load_average``, ``threads``,
``emulate``, ``latency_model``, ``rows``, ``timelines``, ``notes``). Nothing here imports
torch or dbml, so a saved JSON can be re-rendered anywhere:

    markdown(results) -> str                      one table per section and mode, then the frontier
    plots(results, out_dir, prefix="") -> [png]   memory over one iteration; MSR vs EOR per workload
    write(results, out_dir) -> {"json", "markdown", "plots"}

Metrics as in the TENSILE paper: MSR = (vanilla peak - peak) / vanilla peak, EOR = time /
vanilla time, CBR = MSR / EOR. "Ahead" on the frontier means: among dbml rows whose
measured peak is at most a peer's peak, the best EOR is lower than the peer's.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from .goals import markdown as goals_markdown

MIB = 2 ** 20
# dbml's ledger and the shared tracker are two accounts of one peak: beyond this
# relative gap one of them is wrong, and the row says so.
LEDGER_TOLERANCE = 0.02
SECTION_ORDER = ("single", "coldstart", "concurrent", "mixed", "batch", "planning", "latency", "fastpath", "inference",
                 "realmem")
PLOTS_HINT = "no plots: matplotlib is not installed (pip install -e '.[bench]')"   # when plots() gives []

# The TENSILE journal paper (Zhang et al., "TENSILE: A Tensor granularity dynamic GPU memory
# scheduling method toward multiple dynamic workloads system"), Table III "Single task
# performance": batch 16 on one RTX A6000, (MSR, EOR) per method. The paper's "DenseNet"
# does not name its depth; it is set beside the zoo's densenet121.
PAPER_TABLE_III = {
    "vgg16": {"vDNN": (0.1109, 1.7835), "Capuchin": (0.2558, 1.8304), "TENSILE": (0.2670, 1.6287)},
    "inception_v3": {"vDNN": (0.1633, 2.5184), "Capuchin": (0.4331, 2.7745), "TENSILE": (0.4361, 1.6468)},
    "inception_v4": {"vDNN": (0.1903, 2.5028), "Capuchin": (0.5129, 3.2362), "TENSILE": (0.5154, 1.4281)},
    "resnet50": {"vDNN": (0.1733, 2.2981), "Capuchin": (0.3859, 2.2320), "TENSILE": (0.4258, 1.5540)},
    "densenet121": {"vDNN": (0.1381, 2.6148), "Capuchin": (0.4860, 3.4400), "TENSILE": (0.5135, 1.1678)},
}

# Keys every row has; any other key a section carries becomes an extra column of its table.
ROW_KEYS = frozenset((
    "section", "workload", "method", "family", "mode", "batch", "jobs", "threads", "budget_bytes",
    "vanilla_peak_bytes", "peak_bytes", "host_peak_bytes", "ledger_peak_bytes", "vanilla_seconds",
    "seconds", "msr", "eor", "cbr", "first_iteration_eor", "swaps", "recomputes", "bit_identical",
    "within_budget", "error", "note"))


# ---- cells and columns --------------------------------------------------------------------

def _number(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.{digits}f}" if abs(x) < 100 else f"{x:,.1f}"


def _mib(nbytes) -> str:
    return "—" if nbytes is None else f"{nbytes / MIB:.1f}"


def _seconds(s) -> str:
    return "—" if s is None else f"{s:.3f}" if s < 10 else f"{s:.1f}"


def _value(v) -> str:
    return _number(v) if v is None or isinstance(v, (int, float)) else str(v)


def _cell(text) -> str:
    """Text made safe inside one GitHub table cell."""
    return str(text).replace("\n", " ").replace("|", "\\|")


def ledger_mismatch(row) -> bool:
    """dbml's own ledger peak and the tracker's peak differ by more than LEDGER_TOLERANCE."""
    ledger, peak = row.get("ledger_peak_bytes"), row.get("peak_bytes")
    return ledger is not None and bool(peak) and abs(ledger - peak) / peak > LEDGER_TOLERANCE


def _note(row) -> str:
    """The row's own note, after the flags a reader must not miss."""
    flags = [f"⚠ ledger {_mib(row['ledger_peak_bytes'])} MiB" if ledger_mismatch(row) else "",
             "⚠ over budget" if row.get("within_budget") is False else "",
             "⚠ results differ from eager" if row.get("bit_identical") is False else "",
             str(row.get("note") or "")]
    return "; ".join(f for f in flags if f)


def _budget(row) -> str:
    budget, vanilla = row.get("budget_bytes"), row.get("vanilla_peak_bytes")
    if budget is None or not vanilla:
        return _mib(budget)
    return f"{_mib(budget)} ({100 * budget / vanilla:.0f} %)"


# Row keys shown on an error row too (what was asked for); every other column is a figure.
SETTINGS = frozenset(("workload", "method", "batch", "jobs", "threads", "budget_bytes", "note"))
HEADERS = {"budget_bytes": "budget MiB (% of vanilla)", "seconds": "time s", "msr": "MSR", "eor": "EOR",
           "cbr": "CBR", "first_iteration_eor": "first-iteration EOR", "recomputes": "recomp",
           "bit_identical": "bit-identical"}
SHOW = {"budget_bytes": _budget, "note": _note,
        "bit_identical": lambda r: {None: "—", True: "yes", False: "**NO**"}[r.get("bit_identical")]}
_FIGURES = ["msr", "seconds", "eor", "cbr", "swaps", "recomputes", "bit_identical"]
_TOTALS = ["vanilla_peak_bytes", "peak_bytes", "msr", "vanilla_seconds", "seconds", "eor", "cbr",
           "bit_identical"]
SECTION_COLUMNS = {   # row keys, in table order; a section not named here gets "single"'s
    "single": ["workload", "method", "budget_bytes", "peak_bytes", *_FIGURES],
    "coldstart": ["workload", "method", "budget_bytes", "peak_bytes", "msr", "first_iteration_eor", "eor",
                  "cbr", "bit_identical"],
    "concurrent": ["workload", "method", "jobs", "budget_bytes", *_TOTALS],
    "mixed": ["workload", "method", "jobs", "budget_bytes", *_TOTALS],
    "batch": ["workload", "method", "batch", "budget_bytes", *_TOTALS],
    "planning": ["workload", "method"], "latency": ["workload", "method"], "fastpath": ["workload", "method"],
    "realmem": ["workload", "method", "batch", "added_bytes", "ratio", "kept_bytes", "seconds"],
}


def _column(key: str) -> tuple:
    """(header, cell of a row, is a figure) for a row key; units follow the key's suffix."""
    name, show = key, (lambda r: _value(r.get(key)))
    for suffix, unit, fmt in (("_bytes", " MiB", _mib), ("_seconds", " s", _seconds)):
        if key.endswith(suffix):
            name, show = key[: -len(suffix)] + unit, (lambda r, fmt=fmt: fmt(r.get(key)))
    return HEADERS.get(key, name.replace("_", " ")), SHOW.get(key, show), key not in SETTINGS


def _columns(section: str, rows: list[dict]) -> list[tuple]:
    """The section's columns, plus batch/jobs/threads where they vary, plus its extra keys."""
    keys = list(SECTION_COLUMNS.get(section, SECTION_COLUMNS["single"]))
    for setting in ("batch", "jobs", "threads"):
        if setting not in keys and len({r.get(setting) for r in rows}) > 1:
            keys.insert(2, setting)
    if "peak_bytes" in keys and any(r.get("host_peak_bytes") for r in rows):
        keys.insert(keys.index("peak_bytes") + 1, "host_peak_bytes")
    keys += [k for k in dict.fromkeys(k for r in rows for k in r) if k not in ROW_KEYS and k not in keys]
    return [_column(k) for k in keys + ["note"]]


def _caption(rows: list[dict]) -> str:
    """Settings every row of a table shares, said once above it."""
    said = []
    for key in ("batch", "jobs", "threads"):
        values = {r.get(key) for r in rows}
        if len(values) == 1 and None not in values:
            said.append(f"{key} {values.pop()}")
    return ", ".join(said)


def table(section: str, rows: list[dict]) -> str:
    """One GitHub table; a row with ``error`` shows it in place of its first figure."""
    columns = _columns(section, rows)
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells, error, shown = [], row.get("error"), False
        for _, cell, figure in columns:
            if error and figure:
                cells.append("" if shown else f"✗ {error}")
                shown = True
            else:
                cells.append(cell(row))
        if error and not shown:   # a table with no figure columns: the note carries it
            cells[-1] = "; ".join(filter(None, [f"✗ {error}", cells[-1]]))
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def _ordered(keys, first):
    """``keys`` with those in ``first`` leading in that order, the rest sorted after."""
    keys = set(keys)
    return [k for k in first if k in keys] + sorted(keys - set(first), key=str)


def _group(rows, key):
    """Rows by ``key`` (a key name or a function of the row), in order of first appearance."""
    of = key if callable(key) else (lambda r: r.get(key))
    groups: dict = {}
    for row in rows:
        groups.setdefault(of(row), []).append(row)
    return groups


def _mode_label(mode: str) -> str:
    return f"{mode} (emulated figures: not measured on that GPU)" if mode.startswith("emulated") else mode


# ---- the frontier: dbml against each peer ------------------------------------------------

def _measured(row) -> bool:
    """A row whose figures can stand on a frontier: it ran, and (dbml) matched eager."""
    return (not row.get("error") and row.get("peak_bytes") is not None
            and row.get("eor") is not None and row.get("bit_identical") is not False)


def frontier(rows: list[dict]) -> list[dict]:
    """Per (mode, workload) of the "single" section and per peer: dbml's best EOR at ≤ its peak.

    Each entry: mode, workload, peer, peer_peak_bytes, peer_eor, peer_error, dbml_method,
    dbml_eor, dbml_peak_bytes (None where no dbml row is that small), verdict ("ahead",
    "behind", or "peer failed").
    """
    entries = []
    single = [r for r in rows if r.get("section") == "single"]
    single.sort(key=lambda r: r.get("mode") != "cpu")   # stable: cpu first, else row order
    for (mode, workload), group in _group(single, lambda r: (r.get("mode"), r.get("workload"))).items():
        dbml = [r for r in group if r.get("family") == "dbml" and _measured(r)]
        for peer in (r for r in group if r.get("family") == "peer"):
            fits = [r for r in dbml if _measured(peer) and r["peak_bytes"] <= peer["peak_bytes"]]
            best = min(fits, key=lambda r: r["eor"], default={})
            verdict = ("peer failed" if not _measured(peer) else
                       "ahead" if best and best["eor"] < peer["eor"] else "behind")
            entries.append({"mode": mode, "workload": workload, "peer": peer.get("method"),
                            "peer_peak_bytes": peer.get("peak_bytes"), "peer_eor": peer.get("eor"),
                            "peer_error": peer.get("error"), "dbml_method": best.get("method"),
                            "dbml_eor": best.get("eor"), "dbml_peak_bytes": best.get("peak_bytes"),
                            "verdict": verdict})
    return entries


def _frontier_row(e: dict) -> str:
    if e["verdict"] == "peer failed":
        cells = [e["workload"], e["peer"], "—", "—", "—", f"peer failed: {e['peer_error'] or 'no figures'}"]
    else:
        dbml = ("no dbml row at this peak" if e["dbml_method"] is None else
                f"{_number(e['dbml_eor'])} ({e['dbml_method']}, {_mib(e['dbml_peak_bytes'])} MiB)")
        cells = [e["workload"], e["peer"], _mib(e["peer_peak_bytes"]), _number(e["peer_eor"]), dbml,
                 f"dbml {e['verdict']}"]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _frontier_summary(workload: str, entries: list[dict]) -> str:
    """One plain sentence per workload: ahead of which peers, behind which."""
    ran = [e for e in entries if e["verdict"] != "peer failed"]
    behind = [e["peer"] for e in ran if e["verdict"] == "behind"]
    ahead = [e["peer"] for e in ran if e["verdict"] == "ahead"]
    failed = [e["peer"] for e in entries if e["verdict"] == "peer failed"]
    if not ran:
        text = "no peer ran"
    elif not behind:
        text = f"dbml ahead of every peer that ran ({', '.join(ahead)})"
    else:
        text = f"dbml behind {', '.join(behind)}" + (f"; ahead of {', '.join(ahead)}" if ahead else "")
    if failed:
        text += f"; did not run: {', '.join(failed)}"
    return f"- **{workload}**: {text}."


def frontier_markdown(rows: list[dict]) -> str:
    entries = frontier(rows)
    if not entries:
        return ""
    out = ["## Frontier", "",
           "For each peer: the lowest EOR among dbml rows whose measured peak is at most the "
           "peer's peak; dbml is ahead where that EOR is lower than the peer's.", ""]
    for mode, by_mode in _group(entries, "mode").items():
        out += [f"### {_mode_label(mode)}", "",
                "| workload | peer | peer peak MiB | peer EOR | dbml best EOR at ≤ that peak | verdict |",
                "|---|---|---|---|---|---|"]
        out += [_frontier_row(e) for e in by_mode]
        out.append("")
        out += [_frontier_summary(w, es) for w, es in _group(by_mode, "workload").items()]
        out.append("")
    return "\n".join(out)


# ---- the whole report --------------------------------------------------------------------

def _loads(values) -> str:
    return " / ".join(f"{v:.2f}" for v in values) if values else "—"


def header(results: dict) -> str:
    m = results.get("machine", {})
    load = results.get("load_average", {})
    emulate = results.get("emulate") or []
    lines = [
        f"# dbml bench — {results.get('date', '?')}, {m.get('name', '?')}", "",
        f"- machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('memory_gib', '?')} GiB; "
        f"GPU: {m.get('gpu') or 'none'}; torch {m.get('torch', '?')}, duckdb {m.get('duckdb', '?')}",
        f"- command: `{results.get('command', '?')}`",
        f"- threads: {results.get('threads', '?')}; latency model: {results.get('latency_model', '?')}"
        + ("; quick run (a subset)" if results.get("quick") else ""),
        f"- load average (1 / 5 / 15 min): before {_loads(load.get('before'))}, "
        f"after {_loads(load.get('after'))}",
    ]
    lines.append(f"- emulated profiles: {', '.join(emulate) or 'none'}. Figures whose mode is "
                 "`emulated:<profile>` are emulated (the CPU's copy channel throttled to that GPU's "
                 "copy-to-compute ratio), not measured on that GPU; mode `cpu` is measured on this CPU.")
    lines += [f"- {note}" for note in results.get("notes", [])]
    return "\n".join(lines)


def markdown(results: dict) -> str:
    """The report as GitHub markdown: header, one table per section and mode, the frontier."""
    rows = results.get("rows", [])
    parts = [header(results)]
    by_section = _group(rows, "section")
    for section in _ordered(by_section, SECTION_ORDER):
        parts.append(f"## {section}")
        by_mode = _group(by_section[section], "mode")
        for mode in _ordered(by_mode, ["cpu"]):
            caption = _caption(by_mode[mode])
            parts.append(f"### {section} — {_mode_label(mode)}" + (f" · {caption}" if caption else ""))
            parts.append(table(section, by_mode[mode]))
    parts += [text.rstrip() for text in (frontier_markdown(rows), goals_markdown(results)) if text]
    return "\n\n".join(parts) + "\n"


# ---- plots -------------------------------------------------------------------------------

def _slug(text: str) -> str:
    """A file-name-safe form: ``emulated:a6000`` -> ``emulated-a6000``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-")


def _colours(results: dict) -> dict:
    """One colour per method, the same in every plot of a run."""
    from matplotlib import colormaps
    methods = list(dict.fromkeys(r.get("method") for r in results.get("rows", [])))
    methods += [k.split("/")[1] for k in results.get("timelines", {}) if k.count("/") >= 2]
    methods = list(dict.fromkeys(methods))
    dark_then_light = colormaps["tab20"].colors[0::2] + colormaps["tab20"].colors[1::2]
    return {m: dark_then_light[i % 20] for i, m in enumerate(methods)}


def _timelines(results: dict) -> dict:
    """``{(workload, mode): {method: [[seconds, device_bytes, host_bytes], ...]}}``."""
    out: dict = {}
    for key, samples in results.get("timelines", {}).items():
        workload, rest = key.split("/", 1)
        method, mode = rest.rsplit("/", 1)
        out.setdefault((workload, mode), {})[method] = samples
    return out


def _memory_plot(results, workload, mode, by_method, colours, path) -> None:
    from matplotlib.figure import Figure
    has_host = any(s[2] for samples in by_method.values() for s in samples if len(s) > 2)
    fig = Figure(figsize=(10, 7 if has_host else 5), layout="constrained")
    axes = fig.subplots(2 if has_host else 1, 1, sharex=True, squeeze=False)[:, 0]
    for method, samples in by_method.items():
        t = [s[0] for s in samples]
        axes[0].plot(t, [s[1] / MIB for s in samples], drawstyle="steps-post", label=method,
                     color=colours.get(method), linewidth=1.2)
        if has_host:
            axes[1].plot(t, [(s[2] if len(s) > 2 else 0) / MIB for s in samples], drawstyle="steps-post",
                         color=colours.get(method), linewidth=1.2)
    budgets = [r for r in results.get("rows", []) if r.get("section") == "single" and r.get("budget_bytes")
               and r.get("workload") == workload and r.get("mode") == mode and r.get("method") in by_method]
    for row in budgets:   # the budget a dbml line must stay under, in that line's colour
        axes[0].axhline(row["budget_bytes"] / MIB, linestyle="--", linewidth=0.8,
                        color=colours.get(row["method"]), label=f"budget {row['method']}")
    axes[0].set_ylabel("device memory MiB")
    axes[0].set_title(f"{workload}: memory over one training iteration — {_mode_label(mode)}")
    axes[0].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    if has_host:
        axes[1].set_ylabel("host memory MiB (copies moved off the device)")
    axes[-1].set_xlabel("seconds into the iteration")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110)


def pareto(points: list[tuple]) -> list[tuple]:
    """The (msr, eor, ...) points no other point beats on both (more saved, less time), by MSR."""
    best = [p for p in points
            if not any(q[0] >= p[0] and q[1] <= p[1] and (q[0], q[1]) != (p[0], p[1]) for q in points)]
    return sorted(best)


def _frontier_axes(ax, workload, rows, colours) -> None:
    points = [r for r in rows if not r.get("error") and r.get("msr") is not None and r.get("eor") is not None]
    for r in points:
        marker = {"dbml": "o", "peer": "s"}.get(r.get("family"), "D")
        ax.scatter(r["msr"], r["eor"], color=colours.get(r["method"]), marker=marker, zorder=3)
        ax.annotate(r["method"], (r["msr"], r["eor"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    line = pareto([(r["msr"], r["eor"]) for r in points if r.get("family") == "dbml" and _measured(r)])
    if line:
        ax.plot(*zip(*line), color="black", linewidth=1, zorder=2, label="dbml frontier")
    for method, (msr, eor) in PAPER_TABLE_III.get(workload, {}).items():
        ax.scatter(msr, eor, facecolors="none", edgecolors="black", marker="^", zorder=3)
        ax.annotate(f"paper {method}", (msr, eor), fontsize=6, xytext=(3, -8), textcoords="offset points")
    ax.set_title(workload)
    ax.set_xlabel("MSR (memory saved ÷ vanilla peak)")
    ax.set_ylabel("EOR (time ÷ vanilla time)")
    ax.grid(alpha=0.3)


def _frontier_plot(mode, by_workload, colours, path) -> None:
    from matplotlib.figure import Figure
    n = len(by_workload)
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(5 * ncols, 4.2 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, (workload, rows) in zip(axes, by_workload.items()):
        _frontier_axes(ax, workload, rows, colours)
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(f"MSR vs EOR per workload — {_mode_label(mode)}\n"
                 "circles dbml (line: its frontier), squares PyTorch's tools, diamond eager; "
                 "hollow triangles: TENSILE journal paper, Table III (batch 16, RTX A6000)",
                 fontsize="medium")
    fig.savefig(path, dpi=110)


def plots(results: dict, out_dir: str, prefix: str = "") -> list[str]:
    """PNG plots into ``out_dir``; [] when matplotlib is not installed (the caller hints).

    ``{prefix}memory-<workload>-<mode>.png`` per timeline group and
    ``{prefix}frontier-<mode>.png`` per mode of the "single" section; ``<mode>`` has ':'
    turned into '-' (``emulated-a6000``).
    """
    try:
        import matplotlib  # noqa: F401  (only its Agg-backed Figure is used: no GUI, no pyplot state)
    except ImportError:
        return []
    os.makedirs(out_dir, exist_ok=True)
    colours, paths = _colours(results), []
    for (workload, mode), by_method in _timelines(results).items():
        path = os.path.join(out_dir, f"{prefix}memory-{_slug(workload)}-{_slug(mode)}.png")
        _memory_plot(results, workload, mode, by_method, colours, path)
        paths.append(path)
    single = [r for r in results.get("rows", []) if r.get("section") == "single"]
    for mode, rows in _group(single, "mode").items():
        path = os.path.join(out_dir, f"{prefix}frontier-{_slug(mode)}.png")
        _frontier_plot(mode, _group(rows, "workload"), colours, path)
        paths.append(path)
    return paths


def write(results: dict, out_dir: str) -> dict:
    """``<date>-<machine>.json``, ``.md`` and the PNGs (prefixed ``<date>-<machine>-``) in out_dir.

    Returns ``{"json": path, "markdown": path, "plots": [paths]}``; "plots" is [] when
    matplotlib is missing.
    """
    os.makedirs(out_dir, exist_ok=True)
    stem = f"{_slug(results.get('date', 'undated'))}-{_slug(results.get('machine', {}).get('name', 'machine'))}"
    json_path, md_path = (os.path.join(out_dir, f"{stem}.{ext}") for ext in ("json", "md"))
    Path(json_path).write_text(json.dumps(results, indent=1) + "\n")
    Path(md_path).write_text(markdown(results))
    return {"json": json_path, "markdown": md_path, "plots": plots(results, out_dir, prefix=f"{stem}-")}
