"""Test DAG: one soft_fail sensor alone on a flow nobody works on: its timeout becomes a skip,
which cancels the flow."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.sensors.echo_flow import EchoFlowSensor


@dag(dag_id="echomq_timeouts_soft", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_timeouts_soft() -> None:
    """One soft_fail sensor alone on its flow: the skip it ends with cancels the flow."""
    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="test.idle-reports",
        children=[{"payload": {"n": 1}, "queue": "test.idle"}],
    )
    EchoFlowSensor(
        task_id="wait_soft", flow=fan_out.output, poke_interval=0.5, timeout=1.5,
        soft_fail=True, deferrable=True,
    )  # fmt: skip


echomq_timeouts_soft()
