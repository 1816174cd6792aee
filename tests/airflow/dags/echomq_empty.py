"""Test DAG: an empty plan fanned out with EchoMQ (``native_empty.py``: the same with
``.expand()``): both skip the fan-out and what waits on it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.results import flow_results
from echomq_provider.sensors.echo_flow import EchoFlowSensor


@task
def plan() -> list[dict[str, Any]]:
    return []


@task
def collect(flow: dict[str, Any]) -> int:
    return sum(value["value"] for _, value in flow_results(flow))


@dag(dag_id="echomq_empty", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_empty() -> None:
    fan_out = EchoFlowOperator(
        task_id="fan_out", parent_queue="example.reports", children=plan(),
        child_queue="example.square",
    )  # fmt: skip
    wait = EchoFlowSensor(task_id="wait", flow=fan_out.output, poke_interval=0.2, timeout=60)
    collect(wait.output)  # type: ignore[arg-type]


echomq_empty()
