"""W7's tables (bench/w7_report.py): each EchoMQ way measured against its plain twin at the
same N and against itself at 0 items, and the per-step timelines as medians over runs.

The tables are checked on runs as ``bench.orchestrators`` records them; the ``--cluster
--shards 3`` mode runs for real at a tiny N (a 3-master Cluster, the Airflow deployment or the
Dagster CLI, an ``echomq worker``): the children must land on every shard, each on its own
master, and the last step must sum the right total."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.w7_report import markdown, own_time, table

ROOT = Path(__file__).resolve().parent.parent


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


def test_runs_of_each_setup_are_compared_within_it_and_the_report_names_the_setup() -> None:
    cluster = {
        "server": "cluster (3 masters)",
        "shards": 3,
        "shard_names": ["w7.work", "w7.work+s1.7", "w7.work+s2.9"],
        "shard_masters": ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"],
        "worker_processes": 2,
        "worker_concurrency": 4,
        "pump": "one echomq pump",
    }
    spread = {"completed_by_shard": {"w7.work": 30, "w7.work+s1.7": 40, "w7.work+s2.9": 30}}
    cpu = {"server_cpu_s": {"127.0.0.1:7001": 1.0, "127.0.0.1:7002": 3.0}}
    runs = [
        run("plain_echomq_task", 100, 2.0),  # standalone (recorded without a setup)
        run("echomq_task", 100, 2.5),
        run("plain_echomq_task", 100, 4.0, setup=cluster),
        run("echomq_task", 100, 5.0, setup=cluster, sum_ok=True, **spread, **cpu),
        run("echomq_task", 100, 7.0, setup=cluster, sum_ok=False, **spread, **cpu),
    ]
    rows = {(r["setup"], r["way"]): r for r in table(runs)}
    label = "cluster (3 masters), 3 shards, 2 workers"
    assert set(rows) == {
        ("standalone, 1 shard, 1 worker", "plain_echomq_task"),
        ("standalone, 1 shard, 1 worker", "echomq_task"),
        (label, "plain_echomq_task"),
        (label, "echomq_task"),
    }
    sharded = rows[(label, "echomq_task")]
    assert sharded["plain_wall"]["median"] == 4.0  # its own setup's twin, not standalone's
    assert sharded["over_plain"]["median"] == 2.0 and sharded["sums_wrong"] == 1
    assert rows[("standalone, 1 shard, 1 worker", "echomq_task")]["over_plain"]["median"] == 0.5
    md = markdown({"started": "now", "machine": "2 cores", "runs": runs, "notes": [],
                   "table": table(runs)})  # fmt: skip
    assert f"| success (2 attempted, 1 wrong sum(s)) | {label} |" in md
    assert (
        f"* airflow, {label}: child queue `w7.work` on 127.0.0.1:7001, "
        "`w7.work+s1.7` on 127.0.0.1:7002, `w7.work+s2.9` on 127.0.0.1:7003; "
        "2 `echomq worker` process(es) at concurrency 4; "
        "Pump: one echomq pump"
    ) in md
    assert (
        "children completed per shard: `w7.work` 30, `w7.work+s1.7` 40, `w7.work+s2.9` 30; "
        "server CPU per master: 127.0.0.1:7001 1.00 s (25%), 127.0.0.1:7002 3.00 s (75%)"
    ) in md


def test_runs_in_another_interpreter_are_a_setup_of_their_own() -> None:
    """--dagster-python: a Dagster-only venv's runs are compared with their own plain twin,
    and the Setups list names the interpreter and what it lacks."""
    own = {
        "server": "standalone",
        "shards": 1,
        "shard_names": ["w7.work"],
        "shard_masters": ["127.0.0.1:7001"],
        "worker_processes": 1,
        "worker_concurrency": 4,
        "pump": "none",
        "python": "/v/bin/python (no Airflow, no OpenTelemetry SDK)",
    }
    runs = [
        run("plain_echomq", 100, 4.0, system="dagster"),
        run("echomq", 100, 4.6, system="dagster"),
        run("plain_echomq", 100, 3.0, system="dagster", setup=own),
        run("echomq", 100, 3.2, system="dagster", setup=own),
    ]
    rows = {(r["setup"], r["way"]): r for r in table(runs)}
    label = "standalone, 1 shard, 1 worker, own venv"
    assert rows[(label, "echomq")]["over_plain"]["median"] == 0.2
    assert rows[("standalone, 1 shard, 1 worker", "echomq")]["over_plain"]["median"] == 0.6
    md = markdown({"started": "now", "machine": "2 cores", "runs": runs, "notes": [],
                   "table": table(runs)})  # fmt: skip
    assert "Dagster's interpreter: /v/bin/python (no Airflow, no OpenTelemetry SDK)" in md


def test_dagster_steps_own_time_leaves_out_the_launch_of_their_processes() -> None:
    """Resource set-up plus STEP_START..STEP_SUCCESS, summed over the steps, against the
    plain twin's at the same N; the launch (STEP_WORKER_STARTING..) is left out."""

    def steps(way: str, launch: float, setup_s: float, step_s: float) -> dict[str, Any]:
        marks = {"launched": 0.0, "resources": launch, "resources ready": launch + setup_s,
                 "start": launch + setup_s + 0.01, "end": launch + setup_s + 0.01 + step_s}
        r = run(way, 100, 4.0, system="dagster")  # fmt: skip
        r["timeline"] = [{"step": "run", "marks": {"start": 0.0, "end": 4.0}},
                         {"step": "a", "marks": marks}, {"step": "b", "marks": marks}]  # fmt: skip
        return r

    runs = [
        steps("plain_echomq", 1.9, 0.01, 0.05),
        steps("echomq", 1.1, 0.08, 0.06),  # launched faster: not counted
        steps("echomq", 2.5, 0.09, 0.07),
    ]
    assert own_time(runs[0]) == 0.12 and own_time(runs[1]) == 0.28
    md = markdown({"started": "now", "machine": "2 cores", "runs": runs, "notes": [],
                   "table": table(runs)})  # fmt: skip
    assert "## Dagster: the steps' own time" in md
    assert (
        "| echomq | 100 | 0.30 (0.28 to 0.32, 2 runs) | 0.12 (1 run) | "
        "0.18 (0.16 to 0.20, 2 runs) | standalone, 1 shard, 1 worker |"
    ) in md


def run_cluster_bench(out: Path, only: str, n: int, timeout: float) -> dict[str, Any]:
    """``python -m bench.orchestrators --cluster --shards 3`` at ``n`` items: the EchoMQ way
    and the plain twin once each, nothing else counted; its results.json."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    args = ["--cluster", "--shards", "3", "--only", only, "--n", str(n), "--runs", "1",
            "--zero-runs", "0", "--baseline-runs", "0", "--skip-native",
            "--ways", "echomq_task", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.orchestrators", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the bench stops what it started
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(f"the cluster bench took over {timeout} s:\n{stderr[-5000:]}")
    assert proc.returncode == 0, f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-5000:]}"
    return json.loads((out / "results.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize(("only", "way"), [("dagster", "echomq"), ("airflow", "echomq_task")])
def test_the_cluster_mode_spreads_the_children_over_three_shards_on_three_masters(
    tmp_path: Path, only: str, way: str
) -> None:
    n = 90
    doc = run_cluster_bench(tmp_path, only, n, timeout=420)
    got = next(r for r in doc["runs"] if (r["way"], r["n"]) == (way, n))
    assert got["state"] == "success", got.get("errors")
    setup = got["setup"]
    assert setup["server"] == "cluster (3 masters)" and setup["shards"] == 3
    assert setup["worker_processes"] == 1
    assert len(set(setup["shard_names"])) == 3 and len(set(setup["shard_masters"])) == 3
    by_shard = got["completed_by_shard"]
    assert set(by_shard) == set(setup["shard_names"])
    assert all(count > 0 for count in by_shard.values()), by_shard
    assert sum(by_shard.values()) == got["completed"] == n
    assert got["collected"] == n * (n - 1) and got["sum_ok"] is True  # what the last step summed
    assert len(got["server_cpu_s"]) == 3  # every master measured
    twin = next(r for r in doc["runs"] if r["way"] == f"plain_{way}")
    assert twin["state"] == "success" and twin["sum_ok"] is True
    md = (tmp_path / "results.md").read_text()
    assert "| cluster (3 masters), 3 shards, 1 worker |" in md
