"""Test DAG for the deployment test: a flow that fails, is cancelled, then repaired by a clear.

Children: two squares, a cube that dies on its first run only (``fail_once``, a marker file)
once the test says go (``wait_for``), and a child in ``example.later``, a queue no worker
serves until the test starts one. First run: the cube dies while the sensor is deferred; the
sensor fails naming it and cancels the flow (the later child, still pending, never runs).
Then the test starts a worker for ``example.later`` and clears ``fan_out`` with its
downstream tasks: the operator repairs the flow - the dead cube and the cancelled later child
run again, the squares that completed do not - and the sensor and ``summarise`` succeed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.results import flow_results
from echomq_provider.sensors.echo_flow import EchoFlowSensor


@dag(dag_id="echomq_deploy_repair", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_deploy_repair() -> None:
    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="example.reports",
        children=[
            {"payload": {"n": 1}, "queue": "example.square"},
            {
                "payload": {
                    "n": 2,
                    "fail_once": "{{ run_id | replace(':', '_') }}",
                    "wait_for": "{{ run_id | replace(':', '_') }}.go",
                },
                "queue": "example.cube",
            },
            {"payload": {"n": 3}, "queue": "example.square"},
            {"payload": {"n": 4}, "queue": "example.later"},
        ],
    )
    wait = EchoFlowSensor(
        task_id="wait", flow=fan_out.output, deferrable=True, poke_interval=1, timeout=300
    )

    @task
    def summarise(flow: dict[str, Any]) -> dict[str, int]:
        return {str(index): value["value"] for index, value in flow_results(flow)}

    summarise(wait.output)  # type: ignore[arg-type]


echomq_deploy_repair()
