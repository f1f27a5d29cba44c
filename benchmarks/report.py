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

MIB = 2 ** 20
# dbml's ledger and the shared tracker are two accounts of one peak: beyond this
# relative gap one of them is wrong, and the row says so.
LEDGER_TOLERANCE = 0.02
SECTION_ORDER = ("single", "coldstart", "concurrent", "mixed", "batch", "planning")

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


# ---- cell formatting ----------------------------------------------------------------------

def _number(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "**no**"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.{digits}f}" if abs(x) < 100 else f"{x:,.1f}"


def _mib(nbytes) -> str:
    return "—" if nbytes is None else f"{nbytes / MIB:.1f}"


def _seconds(s) -> str:
    if s is None:
        return "—"
    return f"{s:.3f}" if s < 10 else f"{s:.1f}"


def _budget(row) -> str:
    budget, vanilla = row.get("budget_bytes"), row.get("vanilla_peak_bytes")
    if budget is None:
        return "—"
    if not vanilla:
        return _mib(budget)
    return f"{_mib(budget)} ({100 * budget / vanilla:.0f} %)"


def _bit_identical(row) -> str:
    value = row.get("bit_identical")
    return "—" if value is None else ("yes" if value else "**NO**")


def _extra(key: str, value) -> str:
    """An extra key's value, formatted by what its name says it holds."""
    if key.endswith("_bytes"):
        return _mib(value)
    if key.endswith("_seconds"):
        return _seconds(value)
    if isinstance(value, (int, float)) or value is None:
        return _number(value)
    return str(value)


def _extra_header(key: str) -> str:
    for suffix, unit in (("_bytes", " MiB"), ("_seconds", " s")):
        if key.endswith(suffix):
            return key[: -len(suffix)].replace("_", " ") + unit
    return key.replace("_", " ")


def _cell(text) -> str:
    """Text made safe inside one GitHub table cell."""
    return str(text).replace("\n", " ").replace("|", "\\|")


def ledger_mismatch(row) -> bool:
    """dbml's own ledger peak and the tracker's peak differ by more than LEDGER_TOLERANCE."""
    ledger, peak = row.get("ledger_peak_bytes"), row.get("peak_bytes")
    if ledger is None or not peak:
        return False
    return abs(ledger - peak) / peak > LEDGER_TOLERANCE


def _note(row) -> str:
    """The row's own note, with the flags a reader must not miss put in front."""
    flags = []
    if ledger_mismatch(row):
        flags.append(f"⚠ ledger {_mib(row['ledger_peak_bytes'])} MiB")
    if row.get("within_budget") is False:
        flags.append("⚠ over budget")
    if row.get("bit_identical") is False:
        flags.append("⚠ results differ from eager")
    if row.get("note"):
        flags.append(str(row["note"]))
    return "; ".join(flags)


# ---- tables ------------------------------------------------------------------------------

# A column: (header, cell of a row, whether it is a measured figure an error row blanks).
_COL = {
    "workload": ("workload", lambda r: r.get("workload", ""), False),
    "method": ("method", lambda r: r.get("method", ""), False),
    "batch": ("batch", lambda r: _number(r.get("batch")), False),
    "jobs": ("jobs", lambda r: _number(r.get("jobs")), False),
    "threads": ("threads", lambda r: _number(r.get("threads")), False),
    "budget": ("budget MiB (% of vanilla)", _budget, False),
    "vanilla_peak": ("vanilla peak MiB", lambda r: _mib(r.get("vanilla_peak_bytes")), True),
    "peak": ("peak MiB", lambda r: _mib(r.get("peak_bytes")), True),
    "host_peak": ("host peak MiB", lambda r: _mib(r.get("host_peak_bytes")), True),
    "msr": ("MSR", lambda r: _number(r.get("msr")), True),
    "vanilla_seconds": ("vanilla s", lambda r: _seconds(r.get("vanilla_seconds")), True),
    "seconds": ("time s", lambda r: _seconds(r.get("seconds")), True),
    "eor": ("EOR", lambda r: _number(r.get("eor")), True),
    "first_eor": ("first-iteration EOR", lambda r: _number(r.get("first_iteration_eor")), True),
    "cbr": ("CBR", lambda r: _number(r.get("cbr")), True),
    "swaps": ("swaps", lambda r: _number(r.get("swaps")), True),
    "recomputes": ("recomp", lambda r: _number(r.get("recomputes")), True),
    "bit": ("bit-identical", _bit_identical, True),
    "note": ("note", _note, False),
}
_COMMON = ["workload", "method"]
_FIGURES = ["msr", "seconds", "eor", "cbr", "swaps", "recomputes", "bit"]
SECTION_COLUMNS = {
    "single": _COMMON + ["budget", "peak"] + _FIGURES,
    "coldstart": _COMMON + ["budget", "peak", "msr", "first_eor", "eor", "cbr", "bit"],
    "concurrent": _COMMON + ["jobs", "budget", "vanilla_peak", "peak", "msr", "vanilla_seconds",
                             "seconds", "eor", "cbr", "bit"],
    "batch": _COMMON + ["batch", "budget", "vanilla_peak", "peak", "msr", "vanilla_seconds",
                        "seconds", "eor", "cbr", "bit"],
    "planning": _COMMON,
}
SECTION_COLUMNS["mixed"] = SECTION_COLUMNS["concurrent"]
_DEFAULT_COLUMNS = _COMMON + ["budget", "peak"] + _FIGURES


def _columns(section: str, rows: list[dict]) -> list[tuple]:
    """The section's columns, plus batch/jobs/threads where they vary, plus its extra keys."""
    names = list(SECTION_COLUMNS.get(section, _DEFAULT_COLUMNS))
    for setting in ("batch", "jobs", "threads"):
        if setting not in names and len({r.get(setting) for r in rows}) > 1:
            names.insert(2, setting)
    if any(r.get("host_peak_bytes") for r in rows) and "peak" in names:
        names.insert(names.index("peak") + 1, "host_peak")
    columns = [_COL[n] for n in names]
    extras = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in ROW_KEYS]
    columns += [(_extra_header(k), (lambda r, k=k: _extra(k, r.get(k))), True) for k in extras]
    return columns + [_COL["note"]]


def _caption(rows: list[dict]) -> str:
    """Settings every row of a table shares, said once above it."""
    shared = []
    for key, word in (("batch", "batch"), ("jobs", "jobs"), ("threads", "threads")):
        values = {r.get(key) for r in rows}
        if len(values) == 1 and None not in values:
            shared.append(f"{word} {values.pop()}")
    return ", ".join(shared)


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
            entry = {"mode": mode, "workload": workload, "peer": peer.get("method"),
                     "peer_peak_bytes": peer.get("peak_bytes"), "peer_eor": peer.get("eor"),
                     "peer_error": peer.get("error"), "dbml_method": None, "dbml_eor": None,
                     "dbml_peak_bytes": None}
            if not _measured(peer):
                entry["verdict"] = "peer failed"
            else:
                fits = [r for r in dbml if r["peak_bytes"] <= peer["peak_bytes"]]
                best = min(fits, key=lambda r: r["eor"], default=None)
                if best is not None:
                    entry.update(dbml_method=best["method"], dbml_eor=best["eor"],
                                 dbml_peak_bytes=best["peak_bytes"])
                ahead = best is not None and best["eor"] < peer["eor"]
                entry["verdict"] = "ahead" if ahead else "behind"
            entries.append(entry)
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
        text += f" (did not run: {', '.join(failed)})"
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
    if emulate:
        lines.append(f"- emulated profiles: {', '.join(emulate)}. Figures whose mode is `emulated:<profile>` "
                     "are emulated: the CPU's copy channel is throttled to that GPU's copy-to-compute "
                     "ratio; they were not measured on that GPU.")
    else:
        lines.append("- no emulation: every figure was measured on this CPU (mode `cpu`); "
                     "emulated figures, where present, are labelled by their mode.")
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
    front = frontier_markdown(rows)
    if front:
        parts.append(front.rstrip())
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
    budgets = [r for r in results.get("rows", []) if r.get("section") == "single"
               and r.get("workload") == workload and r.get("mode") == mode
               and r.get("family") == "dbml" and r.get("budget_bytes")]
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
    json_path = os.path.join(out_dir, f"{stem}.json")
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    md_path = os.path.join(out_dir, f"{stem}.md")
    with open(md_path, "w") as f:
        f.write(markdown(results))
    return {"json": json_path, "markdown": md_path, "plots": plots(results, out_dir, prefix=f"{stem}-")}
