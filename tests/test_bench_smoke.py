"""The benchmark harness (bench/) in smoke mode: tiny sizes, one run, real worker processes.

EchoMQ always runs every workload; the peers (BullMQ, Celery, RQ) run W1, W3 and W4 when they
are installed (``pip install -r bench/requirements.txt``), so the harness cannot rot while
the full runs stay out of CI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PEERS = [
    name
    for name, module in (("bullmq", "bullmq"), ("celery", "celery"), ("rq", "rq"))
    if importlib.util.find_spec(module) is not None
]
SMOKE_N = {"W1": 300, "W2": 200, "W3": 200, "W4": 1_000, "W5": 2_000}


def run_bench(out: Path, only: str, workloads: str) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    args = ["--smoke", "--only", only, "--workloads", workloads, "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.run", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the harness stops its workers and its server
        stdout, stderr = proc.communicate(timeout=30)
        pytest.fail(f"the smoke run took over 150 s:\n{stderr[-5000:]}")
    assert proc.returncode == 0, f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-5000:]}"
    assert "## W1 flat" in stdout  # the table is printed too
    return json.loads((out / "results.json").read_text())  # type: ignore[no-any-return]


def only_run(doc: dict[str, Any], workload: str, name: str) -> dict[str, Any]:
    rows = doc["workloads"][workload]["results"][name]
    assert "unsupported" not in rows, rows
    row = rows[str(min(r["n"] for r in rows.values()))]
    assert row["errors"] == [], row["errors"]
    assert len(row["runs"]) == 1
    return row["runs"][0]  # type: ignore[no-any-return]


def test_echomq_smoke_runs_every_workload(tmp_path: Path) -> None:
    doc = run_bench(tmp_path, "echomq", "W1,W2,W3,W4,W5")
    assert doc["meta"]["server"]["version"]
    assert doc["peers"]["echomq"]["status"] == "ok"
    for workload, n in SMOKE_N.items():
        run = only_run(doc, workload, "echomq")
        assert run["n"] == n
        assert run["rate"] > 0 and run["seconds"] > 0
        # deterministic, harness probes removed: every item cost at least one command - but a
        # Pump tick (W4) records a parent's signals in bulk, a few commands per page
        assert run["commands_per_item"] >= (0.001 if workload == "W4" else 1.0)
        assert run["commands"] == pytest.approx(run["commands_per_item"] * n, abs=n * 0.001)
        assert "evalsha" in run["top_commands"]
        assert "info" not in run["top_commands"] and "config|resetstat" not in run["top_commands"]
    # each workload finished everything it added (the peer checks it; here: the counts)
    w4 = only_run(doc, "W4", "echomq")
    assert w4["ticks"] >= 1
    reader = only_run(doc, "W5", "echomq")["reader"]
    assert reader["baseline_kib"] > 0
    assert reader["paged_all_kib"] >= reader["baseline_kib"]
    assert reader["one_page_kib"] >= reader["baseline_kib"]
    w5 = only_run(doc, "W5", "echomq")
    assert w5["add_seconds"] + w5["settle_seconds"] == pytest.approx(w5["seconds"], abs=0.05)
    names = [t["target"] for t in doc["targets"]]
    assert "W4 Pump signals/s" in names and "W1 commands per job" in names
    md = (tmp_path / "results.md").read_text()
    assert "EchoMQ against the targets" in md and "valkey" in md
    assert list((tmp_path / "raw").glob("results-*.json"))


@pytest.mark.skipif(not PEERS, reason="peers not installed: pip install -r bench/requirements.txt")
def test_peers_smoke_side_by_side(tmp_path: Path) -> None:
    doc = run_bench(tmp_path, ",".join(["echomq", *PEERS]), "W1,W3,W4")
    for name in PEERS:
        assert doc["peers"][name]["status"] == "ok", doc["peers"][name]
        for workload in ("W1", "W3"):
            run = only_run(doc, workload, name)
            assert run["rate"] > 0 and run["commands_per_item"] >= 1.0
            ratio = doc["ratios"][workload][name]
            assert ratio["speed"] > 0 and ratio["commands"] > 0
        assert doc["workloads"]["W4"]["results"][name]["unsupported"].startswith("n/a")


NODE = (ROOT / "bench" / "peers" / "node" / "node_modules" / "bullmq").is_dir()


def test_concurrency_levels_async_worker_and_io_bound_smoke(tmp_path: Path) -> None:
    """--concurrency runs every library at each level (keys name@cN), the asyncio worker is a
    peer of its own, W6 always runs at concurrency 200, and the targets compare like with
    like (issue 19)."""
    only = "echomq,echomq_async" + (",bullmq_node" if NODE else "")
    env = ["--concurrency", "1,4"]
    doc = run_bench_args(tmp_path, ["--only", only, "--workloads", "W1,W2,W6", *env])
    assert doc["meta"]["concurrency"] == [1, 4]
    for name in only.split(","):
        for key in (name, f"{name}@c4"):
            for workload in ("W1", "W2"):
                run = only_run(doc, workload, key)
                assert run["rate"] > 0 and run["concurrency"] == (4 if "@c4" in key else 1)
        run = only_run(doc, "W6", f"{name}@c200")
        assert run["concurrency"] == 200 and run["rate"] > 0
    names = [t["target"] for t in doc["targets"]]
    assert "W1 commands per job at concurrency 4" in names
    assert "W1 concurrency 4 vs 1" in names
    assert any(n.startswith("W6 EchoMQ c200 vs the ideal") for n in names)
    if NODE:
        assert doc["ratios"]["W1"]["bullmq_node@c4"]["speed"] > 0
        assert "W1 speed vs BullMQ (Node) at concurrency 1" in names


def run_bench_args(out: Path, args: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--out", str(out), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    return json.loads((out / "results.json").read_text())  # type: ignore[no-any-return]


def test_workers_started_before_and_after_the_add_side_by_side(tmp_path: Path) -> None:
    """--worker-start both: each library runs with its worker started before the window and
    with it started after the add (keys ``<name>+after@cN``, the worker's start-up inside the
    window, its CPU charged to the run), compared like with like; --n sets a workload's N for
    every library. A peer that cannot start late is reported as such."""
    only = "echomq,echomq_async" + (",bullmq_node" if NODE else "") + (
        ",bullmq" if "bullmq" in PEERS else ""
    )
    args = ["--only", only, "--workloads", "W1,W2", "--concurrency", "4"]
    doc = run_bench_args(tmp_path, [*args, "--worker-start", "both", "--n", "W1=400"])
    assert doc["meta"]["worker_start"] == ["before", "after"]
    assert doc["workloads"]["W1"]["n"] == 400
    for name in only.split(","):
        if name == "bullmq":
            rows = doc["workloads"]["W1"]["results"]["bullmq+after@c4"]
            assert "before the add only" in rows["unsupported"]
            continue
        for key in (f"{name}@c4", f"{name}+after@c4"):
            run = only_run(doc, "W1", key)
            assert run["n"] == 400 and run["rate"] > 0
            # measured, but at 400 items a worker's CPU can be under the clock tick that
            # process CPU times count in (10 ms): 0.0 is a reading, not a missing figure
            assert run["cpu_us_per_item"]["workers"] >= 0
            assert only_run(doc, "W2", key)["rate"] > 0
        if name.startswith("echomq"):  # the window opened at the add's start
            assert only_run(doc, "W1", f"{name}+after@c4")["splits"]["added"] > 0
    names = [t["target"] for t in doc["targets"]]
    if NODE:
        assert doc["ratios"]["W1"]["bullmq_node+after@c4"]["speed"] > 0
        assert "W1 speed vs BullMQ (Node) (worker started after the add) at concurrency 4" in names
    md = (tmp_path / "results.md").read_text()
    assert "EchoMQ (worker started after the add) c4" in md
