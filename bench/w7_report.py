"""W7's tables: per (system, way, N) medians, the overheads over both baselines, and the
per-step timelines (:mod:`bench.orchestrators` records the runs).

Each EchoMQ way has a **plain twin** (way ``plain_<way>``): the same DAG or job shape without
EchoMQ, every step run, the item work done in process. Its wall at the same N is the first
baseline ("over plain" = the EchoMQ way's wall minus the twin's median); the same DAG or job
with 0 items is the second ("over 0"). Both are shown: the plain twin prices what EchoMQ adds
over doing the work without it, the 0-item run what the fan-out adds over its own DAG.

A run's ``timeline`` is a list of ``{"step": name, "marks": {label: seconds}}``, offsets from
the run's start (Airflow: the DAG run's ``start_date``; Dagster: ``RUN_START``); a negative
offset is before it (the REST trigger, the CLI's start). The table per (system, way, N) takes
each mark's median over the successful runs, so one slow run does not draw the picture.

Every run records its **setup** (the server: standalone or a Cluster and its masters; the
child queue's shards; the ``echomq worker`` processes; the Pump): rows are per (setup, system,
way, N) and a way is compared with baselines of its own setup only, so a 3-shard Cluster run
is never priced against a standalone twin. Runs recorded before setups were (no ``setup``)
ran on standalone with one worker process.
"""

from __future__ import annotations

import statistics
from typing import Any

#: The column order of the timelines: Airflow task instances, Dagster steps, EchoMQ rows.
MARKS = {
    "airflow": ("scheduled", "queued", "start", "parsed", "executing", "returned", "end"),
    "dagster": (
        "launched",
        "resources",
        "resources ready",
        "start",
        "inputs loaded",
        "output handled",
        "end",
    ),
}
ORDER = {"baseline": 0, "native": 1}


def twin(way: str) -> str:
    return f"plain_{way}"


def is_echomq(way: str) -> bool:
    return way.startswith("echomq")


def summarise(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"runs": 0}
    return {
        "runs": len(values),
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def setup_label(run: dict[str, Any]) -> str:
    """A run's setup in a few words: ``cluster (3 masters), 3 shards, 1 worker``."""
    setup = run.get("setup") or {}
    if not setup:
        return "standalone, 1 shard, 1 worker"
    k, w = setup.get("shards", 1), setup.get("worker_processes", 1)
    label = f"{setup['server']}, {k} shard{'s' * (k != 1)}, {w} worker{'s' * (w != 1)}"
    return label + (", own venv" if setup.get("python") else "")


def walls(
    runs: list[dict[str, Any]], system: str, way: str, n: int | None, setup: str
) -> list[float]:
    return [
        r["wall_s"]
        for r in runs
        if (r["system"], r["way"], r["state"]) == (system, way, "success")
        and (n is None or r["n"] == n)
        and r.get("wall_s") is not None
        and setup_label(r) == setup
    ]


def medians_of(runs: list[dict[str, Any]], field: str) -> dict[str, float]:
    """Per key of the runs' ``field`` mapping (a shard, a master), the median over runs."""
    values: dict[str, list[float]] = {}
    for run in runs:
        for key, value in (run.get(field) or {}).items():
            values.setdefault(key, []).append(value)
    return {key: statistics.median(v) for key, v in values.items()}


def table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (setup, system, way, n): medians and ranges of the successful runs; for an EchoMQ
    way at N > 0, what it adds over its plain twin at N, over itself at 0 (Dagster: over the
    plain job at 0 while an empty plan fails) and over the 2-step baseline, of its setup."""
    rows: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    for run in runs:
        rows.setdefault((setup_label(run), run["system"], run["way"], run["n"]), []).append(run)
    out = []
    for (setup, system, way, n), group in rows.items():
        ok = [r for r in group if r["state"] == "success" and r.get("wall_s") is not None]
        row: dict[str, Any] = {
            "setup": setup,
            "system": system,
            "way": way,
            "n": n,
            "attempted": len(group),
            "states": sorted({r["state"] for r in group}),
            "wall": summarise([r["wall_s"] for r in ok]),
            "end_to_end": summarise([r["end_to_end_s"] for r in ok if r.get("end_to_end_s")]),
            "timeline": timeline(ok),
        }
        busy = [r for r in ok if r.get("busy_s") is not None]
        if any("sum_ok" in r for r in ok):
            row["sums_wrong"] = sum(1 for r in ok if r.get("sum_ok") is False)
        if is_echomq(way) and n > 0 and ok:
            row["busy"] = summarise([r["busy_s"] for r in busy])
            row["completed_by_shard"] = medians_of(ok, "completed_by_shard")
            row["server_cpu_s"] = medians_of(ok, "server_cpu_s")
            for key, base in (
                ("plain", walls(runs, system, twin(way), n, setup)),
                ("zero", walls(runs, system, way, 0, setup)),
                ("baseline", walls(runs, system, "baseline", None, setup)),
            ):
                if key == "zero" and not base:  # an empty plan that fails: the plain job at 0
                    base = walls(runs, system, "baseline", None, setup)
                    row["zero_is"] = "baseline"
                if base:
                    b = statistics.median(base)
                    row[f"{key}_wall"] = summarise(base)
                    row[f"over_{key}"] = summarise([r["wall_s"] - b for r in ok])
        out.append(row)
    out.sort(key=lambda r: (r["setup"], r["system"], r["n"], ORDER.get(r["way"], 2), r["way"]))
    return out


def timeline(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The median of each step's marks over ``runs``, steps in the order they start."""
    marks: dict[str, dict[str, list[float]]] = {}
    durations: dict[str, list[float]] = {}
    for run in runs:
        for entry in run.get("timeline") or []:
            step = marks.setdefault(entry["step"], {})
            for label, value in entry["marks"].items():
                if value is not None:
                    step.setdefault(label, []).append(value)
            m = entry["marks"]
            if m.get("start") is not None and m.get("end") is not None:
                durations.setdefault(entry["step"], []).append(m["end"] - m["start"])
    rows = [
        {
            "step": step,
            "marks": {label: round(statistics.median(v), 2) for label, v in values.items()},
            "duration": round(statistics.median(durations[step]), 2) if step in durations else None,
        }
        for step, values in marks.items()
    ]
    rows.sort(key=lambda r: min(r["marks"].values(), default=0.0))
    return rows


def fmt(s: dict[str, Any]) -> str:
    if not s or not s.get("runs"):
        return "-"
    if s["runs"] == 1:
        return f"{num(s['median'])} (1 run)"
    return f"{num(s['median'])} ({num(s['min'])} to {num(s['max'])}, {s['runs']} runs)"


def num(v: float) -> str:
    return f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"


HEADER = (
    "Seconds: median (min to max, runs). `wall`: Airflow DAG run end_date - start_date; "
    "Dagster run start-to-end from the event log. `end-to-end`: Airflow REST trigger to run "
    "end; Dagster CLI start to exit. `busy`: the EchoMQ workers' first to last child "
    "completion (server). `plain at N`: the wall of the EchoMQ way's plain twin at the same N "
    "(the same DAG/job shape without EchoMQ, every task run, the doubling done in process: "
    "Airflow `plain_echomq` plan -> work -> wait (pass-through) -> collect, "
    "`plain_echomq_wait` plan -> work -> collect, `plain_echomq_task` plan+work -> collect; "
    "Dagster `plain_echomq` an asset returning the N results -> an asset summing them); "
    "`over plain` = wall - that median. `0 items`: the same DAG/job with 0 items (Airflow: "
    "the EchoMQ task skips; Dagster, marked *, the plain job at 0 while an empty plan fails "
    "in the EchoMQ job); `over 0` = wall - that median. `baseline`: `plan -> collect` "
    "(Airflow) / the plain job (Dagster) at 0 items. Ways (Airflow): `echomq` plan -> "
    "EchoFlowOperator -> EchoFlowSensor (deferrable) -> collect; `echomq_wait` plan -> "
    "EchoFlowOperator(wait_for_completion=True) -> collect; `echomq_task` "
    "`@task.echo_flow(wait_for_completion=True)` (plans, adds and waits) -> collect. "
    "`outcome`: the runs' states, and how many summed a wrong total (the last step's output "
    "against the N doubled items). `setup`: the server, the child queue's shards and the "
    "`echomq worker` processes (see Setups); each way is compared with its own setup's runs."
)


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# W7: fan-out/fan-in inside the orchestrators ({report['started']}, {report['machine']})",
        "",
        HEADER,
        "",
        "| system | way | N | wall | end-to-end | busy | plain at N | over plain | 0 items "
        "| over 0 | outcome | setup |",
        "|---|---|---:|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["table"]:
        star = "*" if row.get("zero_is") == "baseline" else ""
        wrong = f", {row['sums_wrong']} wrong sum(s)" if row.get("sums_wrong") else ""
        lines.append(
            f"| {row['system']} | {row['way']} | {row['n']:,} | {fmt(row['wall'])} | "
            f"{fmt(row['end_to_end'])} | {fmt(row.get('busy', {}))} | "
            f"{fmt(row.get('plain_wall', {}))} | {fmt(row.get('over_plain', {}))} | "
            f"{fmt(row.get('zero_wall', {}))}{star} | {fmt(row.get('over_zero', {}))} | "
            f"{', '.join(row['states'])} ({row['attempted']} attempted{wrong}) | "
            f"{row.get('setup', '-')} |"
        )
    lines += setups(report["runs"])
    lines += steps_own_time(report["runs"])
    lines += ["", "## Timelines", "", TIMELINE_HEADER]
    for row in report["table"]:
        lines += timeline_table(row)
    if report["notes"]:
        lines += ["", "Notes:", ""] + [f"* {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


def own_time(run: dict[str, Any]) -> float | None:
    """A Dagster run's time in its steps' own hands: for each step, its resources' set-up
    (RESOURCE_INIT_STARTED to SUCCESS, in the step's process) plus STEP_START to
    STEP_SUCCESS, summed over the steps; None for a run without those marks."""
    total, found = 0.0, False
    for row in run.get("timeline") or []:
        marks = row["marks"]
        if not {"resources", "resources ready", "start", "end"} <= set(marks):
            continue
        total += (marks["resources ready"] - marks["resources"]) + (marks["end"] - marks["start"])
        found = True
    return round(total, 3) if found else None


def steps_own_time(runs: list[dict[str, Any]]) -> list[str]:
    """Dagster: each way's steps' own time (:func:`own_time`) against its plain twin's at the
    same N - what EchoMQ adds inside the steps, without the launch of the step processes
    (1-2 s each, and the widest spread between runs of the same job)."""
    own: dict[tuple[str, str, int], list[float]] = {}
    for run in runs:
        value = own_time(run) if run.get("state") == "success" else None
        if run.get("system") == "dagster" and value is not None:
            own.setdefault((setup_label(run), run["way"], run["n"]), []).append(value)
    rows = []
    for (setup, way, n), values in sorted(own.items()):
        if not is_echomq(way):
            continue
        plain = own.get((setup, twin(way), n))
        added = fmt(summarise([v - statistics.median(plain) for v in values])) if plain else "-"
        twin_own = fmt(summarise(plain)) if plain else "-"
        rows.append(
            f"| {way} | {n:,} | {fmt(summarise(values))} | {twin_own} | {added} | {setup} |"
        )
    if not rows:
        return []
    return [
        "",
        "## Dagster: the steps' own time",
        "",
        "Per run, summed over its steps: the step's resources' set-up in its own process "
        "(RESOURCE_INIT_STARTED to RESOURCE_INIT_SUCCESS: EchoMQ's client imports redis-py "
        "there) plus STEP_START to STEP_SUCCESS. It leaves out the launch of each step's "
        "process (1-2 s, and most of the spread of the walls). `added` = the run's own time "
        "less its plain twin's median at the same N. Seconds, median (min to max, runs).",
        "",
        "| way | N | own time | twin's own time | added | setup |",
        "|---|---:|---|---|---|---|",
        *rows,
    ]


def setups(runs: list[dict[str, Any]]) -> list[str]:
    """One line per system and setup of the runs (each system has a server of its own): the
    masters each shard lives on, the workers and the Pump."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        seen.setdefault((run["system"], setup_label(run)), run.get("setup") or {})
    lines = ["", "## Setups", ""]
    for (system, label), setup in sorted(seen.items()):
        if not setup:
            lines.append(f"* {system}, {label}: recorded before setups were (one embedded server)")
            continue
        homes = ", ".join(
            f"`{name}` on {home}"
            for name, home in zip(setup["shard_names"], setup["shard_masters"], strict=True)
        )
        lines.append(
            f"* {system}, {label}: child queue {homes}; {setup['worker_processes']} "
            f"`echomq worker` process(es) at concurrency {setup['worker_concurrency']}; "
            f"Pump: {setup['pump']}"
            + (f"; Dagster's interpreter: {setup['python']}" if setup.get("python") else "")
        )
    return lines


TIMELINE_HEADER = (
    "Per (system, way, N): each step's marks, seconds from the run's start (Airflow: the DAG "
    "run's start_date; Dagster: RUN_START), medians over the successful runs; `duration` = "
    "end - start. Airflow: a task instance's scheduled / queued / start / end (a mapped task: "
    "the first of each and the last end over its instances), and from the task's own log: "
    "`parsed` the DAG file parsed in its process, `executing` its execute begins, `returned` "
    "it returned (the XCom push and the state report follow). Dagster: `launched` the step's "
    "first event (STEP_WORKER_STARTING: its process is being started), `resources` / "
    "`resources ready` the step's RESOURCE_INIT_STARTED / RESOURCE_INIT_SUCCESS (in its own "
    "process: EchoMQResource and EchoMQIOManager open their client there, which imports "
    "redis-py), `start` STEP_START, "
    "`inputs loaded` the last LOADED_INPUT (EchoMQIOManager: the wait and the read), `output "
    "handled` the last HANDLED_OUTPUT, `end` STEP_SUCCESS. EchoMQ rows, from the server: the "
    "flow's parent row (`created` by the add, `released` when its last child settled, "
    "`closed` by the reader) and the children's first and last completion. Under an EchoMQ "
    "way's table: the children each shard completed and each master's CPU seconds in the run "
    "(`INFO cpu`, user + sys), medians over its runs."
)


def timeline_table(row: dict[str, Any]) -> list[str]:
    steps = row.get("timeline") or []
    if not steps:
        return []
    columns = MARKS[row["system"]]
    runs = row["wall"].get("runs", 0)
    plural = "" if runs == 1 else "s"
    head = f"{row['system']} `{row['way']}`, N = {row['n']:,} ({runs} run{plural})"
    lines = [
        "",
        f"**{head}**, {row.get('setup', '-')}",
        "",
        "| step | " + " | ".join(columns) + " | duration |",
        "|---|" + "---:|" * (len(columns) + 1),
    ]
    for step in steps:
        cells = [step["marks"].get(c) for c in columns]
        shown = ["-" if v is None else f"{v:.2f}" for v in cells]
        duration = "-" if step["duration"] is None else f"{step['duration']:.2f}"
        lines.append(f"| {step['step']} | " + " | ".join(shown) + f" | {duration} |")
    spread = spread_line(row)
    return [*lines, "", spread] if spread else lines


def spread_line(row: dict[str, Any]) -> str:
    """Where the row's children ran: per shard completed, per master CPU seconds (and share)."""
    parts = []
    if row.get("completed_by_shard"):
        parts.append(
            "children completed per shard: "
            + ", ".join(f"`{k}` {v:,.0f}" for k, v in row["completed_by_shard"].items())
        )
    cpu = row.get("server_cpu_s") or {}
    total = sum(cpu.values())
    if total > 0:
        parts.append(
            "server CPU per master: "
            + ", ".join(f"{k} {v:.2f} s ({v / total:.0%})" for k, v in cpu.items())
        )
    return "; ".join(parts)
