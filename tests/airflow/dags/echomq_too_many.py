"""Test DAG: ``return_values`` over ``max_values`` fails the reader, never the work.

* ``fan_out`` / ``wait_capped``: three children in a queue no worker serves, so the flow is
  still held when the sensor - asking for their values with ``max_values=2`` - fails at its
  first read with TooManyValues. The flow is left to run: not cancelled, by the sensor nor by
  the failure callbacks (the task's, the DAG's), though ``cancel_on_failure`` is on.
* ``planned``: ``@task.echo_flow(wait_for_completion=True, return_values=True,
  max_values=2)`` planning three children: refused before anything is added.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.sensors.echo_flow import EchoFlowSensor

CAPPED = "test.capped"  # parent and children: settled without a Pump once someone works it


@dag(dag_id="echomq_too_many", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_too_many() -> None:
    fan_out = EchoFlowOperator(
        task_id="fan_out", parent_queue=CAPPED, children=[{"payload": {"n": n}} for n in range(3)]
    )
    EchoFlowSensor(
        task_id="wait_capped",
        flow=fan_out.output,
        return_values=True,
        max_values=2,
        poke_interval=0.2,
        timeout=60,
    )

    @task.echo_flow(parent_queue=CAPPED, wait_for_completion=True, return_values=True, max_values=2)
    def planned() -> list[dict[str, Any]]:
        return [{"payload": {"n": n}} for n in range(3)]

    planned()


echomq_too_many()
