"""Test DAG: a flow nobody works on; sensors in every mode time out, or skip with soft_fail.

The children go to a queue no worker serves, so the flow never settles. Every sensor has a
1.5 s timeout: the ones without soft_fail must end failed, the ones with it skipped - the
same in poke, reschedule and deferrable mode.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.sensors.echo_flow import EchoFlowSensor

MODES = {
    "poke": {"mode": "poke", "deferrable": False},
    "reschedule": {"mode": "reschedule", "deferrable": False},
    "deferrable": {"deferrable": True},
}


@dag(dag_id="echomq_timeouts", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_timeouts() -> None:
    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="test.idle-reports",
        children=[{"payload": {"n": 1}, "queue": "test.idle"}],
    )
    for name, options in MODES.items():
        for soft_fail in (False, True):
            EchoFlowSensor(
                task_id=f"wait_{name}{'_soft' if soft_fail else ''}",
                flow=fan_out.output,
                poke_interval=0.5,
                timeout=1.5,
                soft_fail=soft_fail,
                **options,
            )


echomq_timeouts()
