"""Test DAG for the first deferral of a fresh triggerer (``test_first_deferral.py``).

One child that waits (``wait_for``) until the test says go, and a deferrable sensor: the test
lets the child settle once the trigger runs, and reads how long after the release the
trigger's event fired.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.sensors.echo_flow import EchoFlowSensor


@dag(
    dag_id="echomq_first_deferral",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
)
def echomq_first_deferral() -> None:
    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="example.reports",
        children=[
            {
                "payload": {"n": 3, "wait_for": "{{ run_id | replace(':', '_') }}.go"},
                "queue": "example.square",
            }
        ],
    )
    EchoFlowSensor(
        task_id="wait", flow=fan_out.output, deferrable=True, poke_interval=1, timeout=300
    )


echomq_first_deferral()
