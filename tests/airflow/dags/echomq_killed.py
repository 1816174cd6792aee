"""Test DAG: a poke-mode sensor killed by its ``execution_timeout`` (``on_kill``) cancels its
flow; one with ``cancel_on_failure=False`` leaves its own flow alone.

The children go to a queue no worker serves, so neither flow settles; the sensors' own
timeouts (60 s) are far off: ``execution_timeout`` (1.5 s) is what stops them.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import dag
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.sensors.echo_flow import EchoFlowSensor


@dag(dag_id="echomq_killed", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_killed() -> None:
    for name, cancel in (("cancelled", True), ("kept", False)):
        fan_out = EchoFlowOperator(
            task_id=f"fan_out_{name}",
            parent_queue="test.idle-reports",
            children=[{"payload": {"n": 1}, "queue": "test.idle"}],
        )
        EchoFlowSensor(
            task_id=f"wait_{name}",
            flow=fan_out.output,
            mode="poke",
            poke_interval=0.2,
            timeout=60,
            execution_timeout=timedelta(seconds=1.5),
            cancel_on_failure=cancel,
        )


echomq_killed()
