"""Turn a results JSON into the markdown table, the ratios, the targets and the PNG chart."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

LABELS = {
    "echomq": "EchoMQ",
    "echomq_async": "EchoMQ (asyncio worker)",
    "bullmq_node": "BullMQ (Node)",
    "bullmq": "BullMQ (Python)",
    "celery": "Celery",
    "rq": "RQ",
}
UNITS = {
    "W1": "jobs",
    "W2": "children",
    "W3": "children",
    "W4": "signals",
    "W5": "children",
    "W6": "jobs",
}
COLORS = {
    "echomq": "#d62728",
    "echomq_async": "#ff9896",
    "bullmq_node": "#17becf",
    "bullmq": "#1f77b4",
    "celery": "#2ca02c",
    "rq": "#9467bd",
}
#: The targets for EchoMQ, each checked in the same run (issue 19: vs BullMQ for Node and
#: for Python at matched concurrency; concurrency 50 at 0.9x concurrency 1 or better; W6 at
#: 90% of its ideal rate).
SPEED_TARGET, COMMANDS_TARGET, PUMP_TARGET, MEMORY_TARGET = 10.0, 4.0, 50_000.0, 0.5
NODE_TARGET, PYTHON_TARGET, SCALING_TARGET, IO_TARGET = 5.0, 15.0, 0.9, 0.9
#: W6's ideal rate: concurrency / handler wait.
IO_IDEAL = 200 / 0.05


#: The tag of a library's runs whose workers started after the add (``bench.run --worker-start``).
LATE = "+after"


def split_key(name: str) -> tuple[str, int]:
    """``"echomq@c50"`` -> ("echomq", 50); a name without a suffix ran at concurrency 1.
    A late-start run keeps its tag in the base: ``"echomq+after@c50"`` -> ("echomq+after", 50)."""
    base, _, level = name.partition("@c")
    return base, int(level) if level else 1


def library(name: str) -> str:
    """The library of a result key, without concurrency or late-start tag."""
    return split_key(name)[0].removesuffix(LATE)


def ours(name: str) -> str:
    """EchoMQ's result key at the concurrency (and worker start) of ``name``."""
    base, level = split_key(name)
    me = "echomq" + (LATE if base.endswith(LATE) else "")
    return me if level == 1 else f"{me}@c{level}"


#: W5 reads "flat" when reading every page peaks at most this much above reading one page.
FLAT_SLACK_KIB = 8 * 1024


def label(name: str) -> str:
    base, level = split_key(name)
    text = LABELS.get(library(name), base)
    if base.endswith(LATE):
        text += " (worker started after the add)"
    return text if "@c" not in name else f"{text} c{level}"


def main_row(entry: dict[str, Any], name: str) -> dict[str, Any] | None:
    """A library's row for a workload: at the standard N if it ran there, else its largest N
    (a peer that runs reduced sizes). None when it has no successful run."""
    rows = entry["results"].get(name)
    if not rows or "unsupported" in rows:
        return None
    done = [r for r in rows.values() if r.get("summary")]
    if not done:
        return None
    standard = [r for r in done if r["n"] == entry["n"]]
    return standard[0] if standard else max(done, key=lambda r: r["n"])


def ratios(doc: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per workload and peer: EchoMQ's speed multiple (its rate / the peer's), the peer's
    commands per item / EchoMQ's, and EchoMQ's retained memory per item / the peer's."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for workload, entry in doc["workloads"].items():
        for name in entry["results"]:
            mine = main_row(entry, ours(name))
            theirs = main_row(entry, name)
            if library(name) == "echomq" or theirs is None or mine is None:
                continue
            a, b = mine["summary"], theirs["summary"]
            out.setdefault(workload, {})[name] = {
                "speed": _div(a["rate"]["median"], b["rate"]["median"]),
                "commands": _div(
                    b["commands_per_item"]["median"], a["commands_per_item"]["median"]
                ),
                "memory": _div(a["memory_per_item"]["median"], b["memory_per_item"]["median"]),
                "n_echomq": mine["n"],
                "n_peer": theirs["n"],
            }
    return out


def _div(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0 or a < 0:
        return None
    return round(a / b, 2)


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets for EchoMQ, each with the measured value and whether it is met."""
    rat = ratios(doc)
    out: list[dict[str, Any]] = []

    def add(target: str, value: Any, goal: str, met: bool | None) -> None:
        out.append({"target": target, "value": value, "goal": goal, "met": met})

    levels = doc["meta"].get("concurrency", [1])
    for w in ("W1", "W2", "W3"):
        if w not in doc["workloads"]:
            continue
        entry = doc["workloads"][w]
        for level in levels:
            suffix = "" if level == 1 else f"@c{level}"
            pairs = [("bullmq_node", NODE_TARGET), ("bullmq_node" + LATE, NODE_TARGET)]
            for peer, goal in [*pairs, ("bullmq", PYTHON_TARGET)]:
                vs = rat.get(w, {}).get(peer + suffix)
                if vs:
                    add(
                        f"{w} speed vs {label(peer)} at concurrency {level}",
                        f"{vs['speed']}x",
                        f">= {goal:g}x",
                        vs["speed"] is not None and vs["speed"] >= goal,
                    )
            row = main_row(entry, "echomq" + suffix)
            if row:
                cpi = row["summary"]["commands_per_item"]["median"]
                add(
                    f"{w} commands per {UNITS[w][:-1] if w == 'W1' else 'child'}"
                    + ("" if level == 1 else f" at concurrency {level}"),
                    cpi,
                    f"<= {COMMANDS_TARGET:g}",
                    cpi <= COMMANDS_TARGET,
                )
        one = main_row(entry, "echomq")
        for level in levels:
            many = main_row(entry, f"echomq@c{level}") if level != 1 else None
            if one and many:
                ratio = round(
                    many["summary"]["rate"]["median"] / one["summary"]["rate"]["median"], 2
                )
                add(
                    f"{w} concurrency {level} vs 1",
                    f"{ratio}x",
                    f">= {SCALING_TARGET:g}x",
                    ratio >= SCALING_TARGET,
                )
    if "W6" in doc["workloads"]:
        entry = doc["workloads"]["W6"]
        node = main_row(entry, "bullmq_node@c200")
        for name in ("echomq@c200", "echomq_async@c200"):
            row = main_row(entry, name)
            if not row:
                continue
            rate = row["summary"]["rate"]["median"]
            add(
                f"W6 {label(name)} vs the ideal {IO_IDEAL:,.0f} jobs/s",
                f"{rate / IO_IDEAL:.0%}",
                f">= {IO_TARGET:.0%}",
                rate >= IO_TARGET * IO_IDEAL,
            )
            if node:
                theirs = node["summary"]["rate"]["median"]
                add(
                    f"W6 {label(name)} vs BullMQ (Node) c200",
                    f"{rate / theirs:.2f}x",
                    ">= 1x",
                    rate >= theirs,
                )
    for w in ("W2", "W3"):
        vs = rat.get(w, {}).get("bullmq")
        if vs and vs["memory"] is not None:
            add(
                f"{w} retained memory per child vs BullMQ",
                f"{vs['memory']}x",
                f"<= {MEMORY_TARGET:g}x",
                vs["memory"] <= MEMORY_TARGET,
            )
    if "W4" in doc["workloads"]:
        row = main_row(doc["workloads"]["W4"], "echomq")
        if row:
            rate = row["summary"]["rate"]["median"]
            add("W4 Pump signals/s", rate, f">= {PUMP_TARGET:,.0f}", rate >= PUMP_TARGET)
    if "W5" in doc["workloads"]:
        row = main_row(doc["workloads"]["W5"], "echomq")
        reader = row["summary"].get("reader") if row else None
        if reader:
            grow = reader["paged_all_kib"] - reader["one_page_kib"]
            add(
                "W5 paged read memory is flat",
                f"all pages {reader['paged_all_delta_kib'] / 1024:.1f} MiB over baseline; "
                f"one page {(reader['one_page_kib'] - reader['baseline_kib']) / 1024:.1f} "
                f"MiB; whole read {reader['whole_delta_kib'] / 1024:.1f} MiB",
                f"all pages - one page <= {FLAT_SLACK_KIB // 1024} MiB",
                grow <= FLAT_SLACK_KIB,
            )
    return out


# -- markdown --------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _spread(s: dict[str, float], digits: int) -> str:
    if s["min"] == s["max"]:
        return _num(s["median"], digits)
    return f"{_num(s['median'], digits)} ({_num(s['min'], digits)}-{_num(s['max'], digits)})"


def _vs(r: dict[str, Any] | None) -> str:
    if not r:
        return ""
    parts = []
    if r["speed"] is not None:
        parts.append(f"{r['speed']}x faster")
    if r["commands"] is not None:
        parts.append(f"{r['commands']}x fewer cmds")
    if r["memory"] is not None:
        parts.append(f"{r['memory']}x memory")
    note = (
        ""
        if r["n_echomq"] == r["n_peer"]
        else f" (rates at N={r['n_peer']:,} vs {r['n_echomq']:,})"
    )
    return ", ".join(parts) + note


def markdown(doc: dict[str, Any]) -> str:
    meta, rat = doc["meta"], ratios(doc)
    m, srv, clients = meta["machine"], meta["server"], meta.get("clients", {})
    lines = [
        f"# EchoMQ side-by-side benchmark{' (smoke run)' if meta.get('smoke') else ''}",
        "",
        f"- **Date**: {meta['date']}; total {meta.get('duration_s', 0) / 60:.1f} min; "
        f"`{meta['command']}`",
        f"- **Machine**: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; {m['os']}; "
        f"Python {m['python']}",
        f"- **Server**: {srv['name']} {srv['version']} (embedded, one for the run, "
        f"FLUSHALL before every workload run; {srv['persistence']})",
        f"- **Load average** (1/5/15 min) before: "
        f"{'/'.join(f'{x:.1f}' for x in meta['load_before'])}, after: "
        f"{'/'.join(f'{x:.1f}' for x in meta.get('load_after', []))}",
        f"- **EchoMQ**: commit {meta['echomq']['commit']}"
        f"{' with uncommitted core changes' if meta['echomq']['core_modified'] else ''}; "
        f"every library in one venv, on redis-py {clients.get('redis')}"
        f"{' with hiredis ' + clients['hiredis'] if clients.get('hiredis') else ' (no hiredis)'}",
        "",
        "Figures: median of the runs, (min-max) where they differ. Rate = items / seconds "
        "from the start of the add to the end of the workload. Commands = `INFO "
        "commandstats` calls per item, including commands run inside scripts, harness "
        "probes removed. Memory = `used_memory` (script cache and client buffers excluded) "
        "after the workload minus before, per item, at each library's default retention.",
        "",
    ]
    for workload, entry in doc["workloads"].items():
        unit = UNITS[workload]
        one = "child" if unit == "children" else unit[:-1]
        lines += [
            f"## {workload} {entry['title']} ({entry['n']:,} {unit})",
            "",
            f"| Library | N | Runs | Seconds | {unit.capitalize()}/s | Cmds/{one} "
            f"| Memory B/{one} | EchoMQ vs this |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for name, rows in entry["results"].items():
            if "unsupported" in rows:
                lines.append(f"| {label(name)} | | | {rows['unsupported']} | | | | |")
                continue
            for row in sorted(rows.values(), key=lambda r: r["n"]):
                s = row.get("summary")
                if not s:
                    lines.append(
                        f"| {label(name)} | {row['n']:,} | 0 | failed: "
                        f"{'; '.join(row['errors'])[:200]} | | | | |"
                    )
                    continue
                is_main = main_row(entry, name) is row
                vs = _vs(rat.get(workload, {}).get(name)) if is_main else ""
                extra = ""
                if "add_seconds" in s and workload == "W5":
                    extra = (
                        f" (add {_num(s['add_seconds']['median'], 1)} + settle "
                        f"{_num(s['settle_seconds']['median'], 1)})"
                    )
                lines.append(
                    f"| {label(name)} | {row['n']:,} | {s['runs']} | "
                    f"{_spread(s['seconds'], 2)}{extra} | {_spread(s['rate'], 0)} | "
                    f"{_num(s['commands_per_item']['median'], 2)} | "
                    f"{_num(s['memory_per_item']['median'], 0)} | {vs} |"
                )
                if row["errors"]:
                    lines.append(
                        f"| | | | {len(row['errors'])} failed run(s): "
                        f"{row['errors'][0][:160]} | | | | |"
                    )
        lines.append("")
        if workload == "W5":
            lines += _reader_lines(entry)
    lines += matrix(doc)
    tgt = targets(doc)
    if tgt:
        lines += [
            "## EchoMQ against the targets",
            "",
            "| Target | Measured | Goal | Met |",
            "|---|---|---|---|",
        ]
        for t in tgt:
            met = "-" if t["met"] is None else ("yes" if t["met"] else "**no**")
            lines.append(f"| {t['target']} | {t['value']} | {t['goal']} | {met} |")
        lines.append("")
    lines += [
        "## Where the commands go (per item, median run, top 8)",
        "",
        "| Workload | Library | Commands per item |",
        "|---|---|---|",
    ]
    for workload, entry in doc["workloads"].items():
        for name in entry["results"]:
            row = main_row(entry, name)
            if row:
                top = ", ".join(f"{k} {v:g}" for k, v in row["summary"]["top_commands"].items())
                lines.append(f"| {workload} | {label(name)} | {top} |")
    lines += ["", "## Configurations", ""]
    for name, peer in doc["peers"].items():
        if peer["status"] != "ok":
            lines.append(f"- **{label(name)}**: {peer['status']}")
            continue
        lines.append(f"- **{label(name)} {peer['version']}**: {peer['config']}.")
        for workload, note in peer.get("notes", {}).items():
            lines.append(f"  - {workload}: {note}.")
    return "\n".join(lines) + "\n"


def matrix(doc: dict[str, Any]) -> list[str]:
    """With several concurrency levels: one table of rates (median, min-max) and commands per
    item, a row per library and workload, a column per level (what docs/benchmarks.md shows)."""
    levels = doc["meta"].get("concurrency", [1])
    if len(levels) < 2:
        return []
    head = " | ".join(f"c{c} items/s | c{c} cmds/item" for c in levels)
    lines = [
        "## Side by side at matched concurrency",
        "",
        f"| Workload | Library | {head} |",
        "|---|---|" + "---:|---:|" * len(levels),
    ]
    for workload in ("W1", "W2", "W3"):
        entry = doc["workloads"].get(workload)
        if not entry:
            continue
        names = list(dict.fromkeys(split_key(n)[0] for n in entry["results"]))
        for name in names:
            cells = []
            for level in levels:
                row = main_row(entry, name if level == 1 else f"{name}@c{level}")
                if row is None:
                    cells += ["-", "-"]
                    continue
                s = row["summary"]
                cells += [_spread(s["rate"], 0), _num(s["commands_per_item"]["median"], 2)]
            lines.append(f"| {workload} | {label(name)} | {' | '.join(cells)} |")
    return [*lines, ""]


def _reader_lines(entry: dict[str, Any]) -> list[str]:
    lines = []
    for name in entry["results"]:
        row = main_row(entry, name)
        reader = row["summary"].get("reader") if row else None
        if not reader:
            continue
        if reader.get("paged_all_kib") is not None:
            lines.append(
                f"- {label(name)} reader ({row['n']:,} results, pages of {reader['page']:,}; "
                f"{reader['method']}): baseline {reader['baseline_kib'] / 1024:.1f} MiB; one "
                f"page +{(reader['one_page_kib'] - reader['baseline_kib']) / 1024:.1f} MiB; "
                f"every page +{reader['paged_all_delta_kib'] / 1024:.1f} MiB "
                f"({reader['paged_seconds']:.2f} s); everything at once "
                f"+{reader['whole_delta_kib'] / 1024:.1f} MiB."
            )
        elif reader.get("whole_kib") is not None:
            base = reader.get("baseline_kib")
            delta = (
                f"+{(reader['whole_kib'] - base) / 1024:.1f} MiB over a "
                f"{base / 1024:.1f} MiB baseline"
                if base is not None
                else f"{reader['whole_kib'] / 1024:.1f} MiB peak"
            )
            lines.append(
                f"- {label(name)} reader ({row['n']:,} results): {reader['note']}; "
                f"reading them all: {delta}."
            )
        else:
            lines.append(f"- {label(name)}: {reader.get('note', '')}.")
    return [*lines, ""] if lines else []


# -- chart ------------------------------------------------------------------------------------


def chart(doc: dict[str, Any], path: Path) -> bool:
    """Throughput and commands per item, per workload and library. False (and no file) when
    matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    workloads = list(doc["workloads"])
    names = [n for n in doc["peers"] if doc["peers"][n]["status"] == "ok"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8.5))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs, rates, lo, hi, cmds = [], [], [], [], []
        for j, w in enumerate(workloads):
            row = main_row(doc["workloads"][w], name)
            if not row:
                continue
            s = row["summary"]
            xs.append(j + (i - (len(names) - 1) / 2) * width)
            rates.append(s["rate"]["median"])
            lo.append(s["rate"]["median"] - s["rate"]["min"])
            hi.append(s["rate"]["max"] - s["rate"]["median"])
            cmds.append(s["commands_per_item"]["median"])
            if row["n"] != doc["workloads"][w]["n"]:
                top.annotate(
                    f"N={row['n']:,}",
                    (xs[-1], rates[-1]),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    rotation=90,
                    xytext=(0, 3),
                    textcoords="offset points",
                )
        color = COLORS.get(name)
        top.bar(xs, rates, width, yerr=[lo, hi], label=label(name), color=color, capsize=2)
        bottom.bar(xs, cmds, width, label=label(name), color=color)
    if "W4" in workloads and len(names) > 1:
        top.annotate(
            "peers: n/a\n(no outbox)",
            (workloads.index("W4") + 0.25, 0.02),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            ha="center",
        )
        top.axhline(PUMP_TARGET, color="#d62728", ls=":", lw=0.8)
        top.annotate(
            "W4 target",
            (len(workloads) - 0.5, PUMP_TARGET),
            fontsize=7,
            ha="right",
            va="bottom",
            color="#d62728",
        )
    for ax in (top, bottom):
        ax.set_xticks(range(len(workloads)))
        if not any(b.get_height() > 0 for b in ax.patches):
            continue  # nothing ran: a log scale has nothing to scale
        ax.set_xticklabels([f"{w}\n{doc['workloads'][w]['title']}" for w in workloads], fontsize=8)
        ax.set_yscale("log")
        ax.grid(axis="y", which="both", alpha=0.3)
    top.set_ylabel("items per second (log; median, min-max)")
    bottom.set_ylabel("Redis commands per item (log)")
    bottom.axhline(COMMANDS_TARGET, color="#d62728", ls="--", lw=0.8)
    bottom.annotate(
        "target: 4",
        (len(workloads) - 0.5, COMMANDS_TARGET),
        fontsize=7,
        ha="right",
        va="bottom",
        color="#d62728",
    )
    top.legend(loc="upper right", fontsize=8)
    meta = doc["meta"]
    fig.suptitle(
        f"EchoMQ vs BullMQ / Celery / RQ - {meta['date']}, {meta['machine']['cores']}"
        f" cores, {meta['server']['name']} {meta['server']['version']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(doc: dict[str, Any], out: Path) -> list[Path]:
    """Write results.json (with ratios and targets), results.md and results.png to ``out``,
    and a dated copy of the JSON to ``out/raw/``."""
    out.mkdir(parents=True, exist_ok=True)
    doc["ratios"] = ratios(doc)
    doc["targets"] = targets(doc)
    paths = [out / "results.json", out / "results.md"]
    paths[0].write_text(json.dumps(doc, indent=1) + "\n")
    paths[1].write_text(markdown(doc))
    if chart(doc, out / "results.png"):
        paths.append(out / "results.png")
    raw = out / "raw"
    raw.mkdir(exist_ok=True)
    stamp = doc["meta"]["date"].replace(" ", "_").replace(":", "")
    shutil.copyfile(paths[0], raw / f"results-{stamp}.json")
    return paths
