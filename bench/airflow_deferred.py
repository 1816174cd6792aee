"""The Airflow provider in a real deployment: XCom per run, and 100 deferred flows.

::

    .venv/bin/python -m bench.airflow_deferred            # both parts (~6 min on 2 cores)
    .venv/bin/python -m bench.airflow_deferred --json
    .venv/bin/python -m bench.airflow_deferred --deferred-only

Runs ``examples/airflow/deployment.py``'s :class:`Deployment` (Airflow's api-server,
scheduler, dag-processor and triggerer as processes, LocalExecutor, SQLite; an EchoMQ server,
worker and Pump) and measures:

1. **XCom bytes per run** in the default mode (the sensor returns the flow's reference and
   counts) at 200 and 200,000 children: the bytes the run's tasks wrote to the metadata
   database's XCom table, per task (the plan task's own list of inputs is reported apart: it
   is the DAG's input, whatever the provider does).
2. **100 flows deferred at once** in one triggerer: each run's flow has one child in a queue
   no worker serves, so all 100 sensors defer and wait. The triggerer's CPU (its process group:
   the triggerer and its trigger runner, user + system, from ``/proc``) is read over a window
   while they wait, and over the same window with nothing deferred. Then the children are
   completed one every 0.3 s by this script, and each run's release-to-success latency is the
   sensor's ``end_date`` (REST API) minus the moment its child completed (the same clock).

Figures only: nothing here asserts a time (tests never do).
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "airflow"))

from deployment import Deployment  # noqa: E402
from echomq_provider.flow_specs import parent_id_for  # noqa: E402

from echomq_core import EchoMQ, Job  # noqa: E402

DAGS = """
from datetime import datetime
from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.sensors.echo_flow import EchoFlowSensor


@dag(dag_id="bench_xcom", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
     params={"n": 200}, max_active_runs=1)
def bench_xcom():
    @task
    def plan(params=None):
        return list(range(params["n"]))

    fan_out = EchoFlowOperator(task_id="fan_out", parent_queue="bench.reports",
                               children=plan(), child_queue="bench.work")
    EchoFlowSensor(task_id="wait", flow=fan_out.output, deferrable=True, timeout=900)


@dag(dag_id="bench_deferred", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
     max_active_runs=200, max_active_tasks=200)
def bench_deferred():
    fan_out = EchoFlowOperator(task_id="fan_out", parent_queue="bench.gate",
                               children=[{"payload": 0}])   # same queue: no Pump involved
    EchoFlowSensor(task_id="wait", flow=fan_out.output, deferrable=True, timeout=3600)


bench_xcom()
bench_deferred()
"""


def work(job: Job) -> dict[str, int]:
    return {"n": int(job.payload), "square": int(job.payload) ** 2}


HANDLERS = {"bench.work": work}


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system) used so far by every process of a process group."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state ppid pgrp ...
            total += int(fields[11]) + int(fields[12])  # utime stime
    return total / ticks


def xcom_bytes(deployment: Deployment, dag_id: str, run_id: str) -> dict[str, int]:
    with sqlite3.connect(deployment.home / "airflow.db") as db:
        rows = db.execute(
            "SELECT task_id, SUM(LENGTH(value)) FROM xcom WHERE dag_id = ? AND run_id = ? "
            "GROUP BY task_id",
            (dag_id, run_id),
        ).fetchall()
    return {task_id: int(size) for task_id, size in rows}


def part_xcom(deployment: Deployment) -> dict[str, Any]:
    out = {}
    for n in (200, 200_000):
        started = time.monotonic()
        run_id = deployment.trigger("bench_xcom", {"n": n})
        state = deployment.wait_run("bench_xcom", run_id, timeout=900)
        sizes = xcom_bytes(deployment, "bench_xcom", run_id)
        out[str(n)] = {
            "state": state,
            "seconds": round(time.monotonic() - started, 1),
            "xcom_bytes_fan_out_and_wait": sizes.get("fan_out", 0) + sizes.get("wait", 0),
            "xcom_bytes_by_task": sizes,
        }
        print(f"xcom n={n}: {out[str(n)]}", flush=True)
    return out


def part_deferred(deployment: Deployment, flows: int = 100, window: float = 30.0) -> dict[str, Any]:
    pgid = deployment.procs["triggerer"].pid
    before = group_cpu(pgid)
    time.sleep(window)
    idle = (group_cpu(pgid) - before) / window
    runs = []
    for _ in range(flows):  # paced: SQLite takes one writer at a time
        runs.append(deployment.trigger("bench_deferred"))
        time.sleep(0.5)

    def all_deferred() -> bool:
        with sqlite3.connect(deployment.home / "airflow.db") as db:
            (count,) = db.execute(
                "SELECT COUNT(*) FROM task_instance WHERE dag_id = 'bench_deferred' "
                "AND task_id = 'wait' AND state = 'deferred'"
            ).fetchone()
        return bool(count == flows)

    deployment.wait_for(all_deferred, 900, f"{flows} sensors deferred", every=2)
    time.sleep(5)  # every trigger picked up and polling
    before = group_cpu(pgid)
    time.sleep(window)
    waiting = (group_cpu(pgid) - before) / window
    released: dict[str, float] = {}
    with EchoMQ(deployment.echomq_url, prefix=deployment.prefix) as mq:
        gate = mq.queue("bench.gate")
        jobs = {}
        while len(jobs) < flows:
            for job in gate.claim(100, lease=3600):
                jobs[job.id] = job
        for run_id in runs:
            job = jobs[parent_id_for("bench_deferred", run_id, "fan_out") + ".0"]
            gate.complete(job, {"ok": True})
            released[run_id] = time.time()
            time.sleep(0.3)

    def all_done() -> bool:
        return all(deployment.run_state("bench_deferred", r) == "success" for r in runs)

    deployment.wait_for(all_done, 900, "every deferred run succeeded", every=2)
    latencies = []
    for run_id in runs:
        ti = deployment.api(
            "GET", f"/api/v2/dags/bench_deferred/dagRuns/{run_id}/taskInstances/wait"
        )
        end = datetime.fromisoformat(ti["end_date"].replace("Z", "+00:00")).timestamp()
        latencies.append(end - released[run_id])
    latencies.sort()
    return {
        "flows": flows,
        "triggerer_cpu_idle_pct": round(100 * idle, 1),
        "triggerer_cpu_100_deferred_pct": round(100 * waiting, 1),
        "latency_median_s": round(statistics.median(latencies), 2),
        "latency_p90_s": round(latencies[int(0.9 * len(latencies)) - 1], 2),
        "latency_min_s": round(latencies[0], 2),
        "latency_max_s": round(latencies[-1], 2),
    }


def main() -> None:
    dags = Path(tempfile.mkdtemp()) / "bench_airflow_dags.py"
    dags.write_text(DAGS)
    deployment = Deployment(
        [dags],
        worker_app="bench.airflow_deferred:HANDLERS",
        worker_queues=["bench.work"],
        pythonpath=[ROOT, ROOT / "examples" / "airflow"],
        prefix="bench",
        env={"AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "200"},
    )
    results: dict[str, Any] = {}
    with deployment:
        if "--deferred-only" not in sys.argv:
            results["xcom"] = part_xcom(deployment)
        results["deferred"] = part_deferred(deployment)
    deployment.cleanup()
    print(json.dumps(results, indent=2) if "--json" in sys.argv else results)


if __name__ == "__main__":
    main()
