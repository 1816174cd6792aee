"""Test DAG: a deferrable sensor on a flow released soon after its first read.

Two children that take ``then_sleep`` seconds once the test's gate opens (when the sensor
runs): the sensor's first read finds them outstanding, and the flow is released well within
:data:`~echomq_provider.waiting.IN_TASK_WAIT`, so the sensor reads it in its own process and
never defers.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.sensors.echo_flow import EchoFlowSensor


@dag(dag_id="echomq_in_task", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_in_task() -> None:
    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="example.reports",
        children=[{"payload": {"n": n, "then_sleep": 0.5}} for n in (1, 2)],
        child_queue="example.square",
    )
    EchoFlowSensor(task_id="wait", flow=fan_out.output, deferrable=True, timeout=300)


echomq_in_task()
