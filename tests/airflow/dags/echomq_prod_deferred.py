"""Test DAG for the production-stack test: a deferred sensor per run, released on a signal.

``fan_out`` adds two squares and a cube that waits (``wait_for``) for the marker ``go`` the
test makes once every run's sensor is deferred; ``wait`` defers at once (its flow cannot be
released within its in-task read) and its trigger runs in one of the triggerers; ``summarise``
reads the values.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.results import flow_results
from echomq_provider.sensors.echo_flow import EchoFlowSensor


@dag(
    dag_id="echomq_prod_deferred",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=200,  # 100 deferred sensors at once (ECHOMQ_PROD_SENSORS)
)
def echomq_prod_deferred() -> None:
    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="example.reports",
        children=[
            {"payload": {"n": 1}, "queue": "example.square"},
            {"payload": {"n": 2, "wait_for": "go"}, "queue": "example.cube"},
            {"payload": {"n": 3}, "queue": "example.square"},
        ],
    )
    wait = EchoFlowSensor(task_id="wait", flow=fan_out.output, deferrable=True, timeout=600)

    @task
    def summarise(flow: dict[str, Any]) -> dict[str, int]:
        return {str(index): value["value"] for index, value in flow_results(flow)}

    summarise(wait.output)  # type: ignore[arg-type]


echomq_prod_deferred()
