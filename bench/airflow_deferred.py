"""The Airflow provider in a real deployment: XCom per run, and 100 deferred flows.

::

    .venv/bin/python -m bench.airflow_deferred            # both parts (~6 min on 2 cores)
    .venv/bin/python -m bench.airflow_deferred --json
    .venv/bin/python -m bench.airflow_deferred --deferred-only --flows 10
    .venv/bin/python -m bench.airflow_deferred --triggers      # 100 triggers, one event loop

Runs ``examples/airflow/deployment.py``'s :class:`Deployment` (Airflow's api-server,
scheduler, dag-processor and triggerer as processes, LocalExecutor, SQLite; an EchoMQ server,
worker and Pump) and measures:

1. **XCom bytes per run** in the default mode (the sensor returns the flow's reference and
   counts) at 200 and 200,000 children: the bytes the run's tasks wrote to the metadata
   database's XCom table, per task (the plan task's own list of inputs is reported apart: it
   is the DAG's input, whatever the provider does).
2. **100 flows deferred at once in one triggerer's event loop** (``--triggers``): 100
   :class:`EchoFlowTrigger` s run as tasks of one asyncio loop, as the triggerer runs them,
   against an embedded server; this process's CPU (user + system) is read over a window while
   they wait, then their flows are released one every 0.3 s and each trigger's
   release-to-event latency is taken. (100 concurrent DAG runs in the SQLite deployment do not
   get that far on 2 cores: SQLite serialises every writer, and the scheduler dies of
   ``database is locked``; a production Airflow runs on PostgreSQL.)
3. **Release-to-task-success in the deployment** (``--flows N``, default 10 runs deferred at
   once): each run's flow has one child in a queue no worker serves, so the sensors defer;
   the triggerer's CPU (its process group: the triggerer and its trigger runner, from
   ``/proc``) is read while they wait; then the children are completed one every 0.3 s by
   this script, and each run's latency is the sensor's ``end_date`` (REST API) minus the
   moment its child completed (the same clock).

Figures only: nothing here asserts a time (tests never do).
"""

from __future__ import annotations

import json
import os
import signal
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
from datetime import datetime, timedelta
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
     max_active_runs=200, max_active_tasks=200,
     default_args={"retries": 2, "retry_delay": timedelta(seconds=2)})  # SQLite under load
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


def part_triggers(flows: int = 100, window: float = 30.0) -> dict[str, Any]:
    import asyncio

    from echomq_provider.triggers.echo_flow import EchoFlowTrigger

    from echomq_core import Child
    from echomq_core.server import EmbeddedServer

    server = EmbeddedServer().start()
    home = Path(tempfile.mkdtemp())
    os.environ.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW_CONN_ECHOMQ_DEFAULT=f"echomq://{server.host}:{server.port}/0?prefix=benchtrig",
    )
    try:
        with EchoMQ(server.url, prefix="benchtrig") as mq:
            refs = [
                mq.add_flow("trig", [Child(i)], barrier=True, parent_id=f"JOB-trig-{i}")
                for i in range(flows)
            ]

            async def scenario() -> dict[str, Any]:
                fired: dict[str, float] = {}

                async def one(ref: Any) -> None:
                    trigger = EchoFlowTrigger(
                        queue=ref.queue, parent_id=ref.parent_id, poll_interval=1.0
                    )
                    await anext(trigger.run())
                    fired[ref.parent_id] = time.time()

                tasks = [asyncio.create_task(one(ref)) for ref in refs]
                await asyncio.sleep(5)  # every trigger connected and polling
                cpu = time.process_time()
                await asyncio.sleep(window)
                waiting = (time.process_time() - cpu) / window
                queue = mq.queue("trig")
                jobs = {job.id: job for job in await asyncio.to_thread(queue.claim, flows)}
                released = {}
                for ref in refs:
                    await asyncio.to_thread(queue.complete, jobs[ref.parent_id + ".0"], 1)
                    released[ref.parent_id] = time.time()
                    await asyncio.sleep(0.3)
                await asyncio.gather(*tasks)
                latencies = sorted(fired[p] - released[p] for p in released)
                return {
                    "flows": flows,
                    "cpu_pct_while_waiting": round(100 * waiting, 1),
                    "release_to_event_median_s": round(statistics.median(latencies), 3),
                    "release_to_event_max_s": round(latencies[-1], 3),
                }

            return asyncio.run(scenario())
    finally:
        server.stop()


def part_deferred(deployment: Deployment, flows: int = 10, window: float = 30.0) -> dict[str, Any]:
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
        "triggerer_cpu_deferred_pct": round(100 * waiting, 1),
        "latency_median_s": round(statistics.median(latencies), 2),
        "latency_p90_s": round(latencies[int(0.9 * len(latencies)) - 1], 2),
        "latency_min_s": round(latencies[0], 2),
        "latency_max_s": round(latencies[-1], 2),
    }


def main() -> None:
    # SIGTERM unwinds like Ctrl-C, so the deployment stops every process it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    dags = Path(tempfile.mkdtemp()) / "bench_airflow_dags.py"
    dags.write_text(DAGS)
    deployment = Deployment(
        [dags],
        worker_app="bench.airflow_deferred:HANDLERS",
        worker_queues=["bench.work"],
        pythonpath=[ROOT, ROOT / "examples" / "airflow"],
        prefix="bench",
        env={
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "200",
            # a loaded machine parses slowly: never drop the DAGs as stale mid-run
            "AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD": "600",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
        },
    )
    results: dict[str, Any] = {}
    if "--triggers" in sys.argv:
        results["triggers"] = part_triggers()
        print(json.dumps(results, indent=2))
        return
    flows = int(sys.argv[sys.argv.index("--flows") + 1]) if "--flows" in sys.argv else 10
    with deployment:
        if "--deferred-only" not in sys.argv:
            results["xcom"] = part_xcom(deployment)
        results["deferred"] = part_deferred(deployment, flows)
    deployment.cleanup()
    print(json.dumps(results, indent=2) if "--json" in sys.argv else results)


if __name__ == "__main__":
    main()
