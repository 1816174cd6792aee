"""W7's tables (bench/w7_report.py): each EchoMQ way measured against its plain twin at the
same N and against itself at 0 items, and the per-step timelines as medians over runs.

The runs here are what ``bench.orchestrators`` records (the orchestrators themselves are too
slow for the suite: ``python -m bench.orchestrators --n 100 --runs 1`` runs them)."""

from __future__ import annotations

from typing import Any

from bench.w7_report import markdown, table


def run(way: str, n: int, wall: float, **extra: Any) -> dict[str, Any]:
    start = {"start": 1.0, "end": 1.0 + wall / 2}
    return {
        "system": "airflow",
        "way": way,
        "n": n,
        "state": extra.pop("state", "success"),
        "wall_s": wall,
        "end_to_end_s": wall + 1,
        "timeline": [{"step": "fan_out", "marks": {"queued": 0.5, **start}}],
        **extra,
    }


def test_each_echomq_way_is_measured_over_its_plain_twin_and_over_zero_items() -> None:
    runs = [
        run("baseline", 0, 2.0),
        run("echomq_task", 0, 2.2),
        run("echomq_task", 0, 2.4),
        run("plain_echomq_task", 100, 2.5),
        run("plain_echomq_task", 100, 2.7),
        run("echomq_task", 100, 3.0, busy_s=0.1),
        run("echomq_task", 100, 3.4, busy_s=0.1),
        run("plain_echomq_wait", 100, 9.0),  # another way's twin: not this way's baseline
        run("echomq_task", 100, 99.0, state="failed"),
    ]
    row = next(r for r in table(runs) if (r["way"], r["n"]) == ("echomq_task", 100))
    assert row["wall"]["median"] == 3.2 and row["attempted"] == 3
    assert row["plain_wall"]["median"] == 2.6
    assert row["over_plain"] == {"runs": 2, "median": 0.6, "min": 0.4, "max": 0.8}
    assert row["zero_wall"]["median"] == 2.3 and row["over_zero"]["median"] == 0.9
    assert "zero_is" not in row
    assert row["timeline"] == [
        {"step": "fan_out", "marks": {"queued": 0.5, "start": 1.0, "end": 2.6}, "duration": 1.6}
    ]
    twin = next(r for r in table(runs) if r["way"] == "plain_echomq_task")
    assert "over_plain" not in twin  # only EchoMQ ways get overheads
    md = markdown({"started": "now", "machine": "2 cores", "runs": runs, "notes": [],
                   "table": table(runs)})  # fmt: skip
    assert "| airflow | echomq_task | 100 | 3.20 (3.00 to 3.40, 2 runs) |" in md
    assert "**airflow `echomq_task`, N = 100 (2 runs)**" in md
    assert "| fan_out | - | 0.50 | 1.00 | - | - | - | 2.60 | 1.60 |" in md


def test_an_empty_plan_that_fails_falls_back_to_the_plain_job_at_zero() -> None:
    runs = [
        {**run("baseline", 0, 4.0), "system": "dagster"},
        {**run("echomq", 0, 0.0, state="failed"), "system": "dagster", "wall_s": None},
        {**run("echomq", 100, 5.0), "system": "dagster"},
    ]
    row = next(r for r in table(runs) if (r["way"], r["n"]) == ("echomq", 100))
    assert row["zero_is"] == "baseline" and row["over_zero"]["median"] == 1.0
    assert "plain_wall" not in row  # no twin run: no overhead over it, not a made-up one
