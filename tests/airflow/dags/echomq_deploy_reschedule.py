"""Test DAG for the deployment test: a reschedule-mode sensor marked failed between two pokes.

Children: a square, and a cube that waits (``wait_for``) until the test says go. The sensor
pokes every 10 s in reschedule mode: between two pokes nothing of it runs, so marking it failed
then runs none of its code - the DAG's failure callback, which the provider adds, settles the
flow. The test then says go and clears ``fan_out`` with its downstream tasks: the operator
repairs the cancelled flow and the next try of the sensor reads it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.results import flow_results
from echomq_provider.sensors.echo_flow import EchoFlowSensor


@dag(
    dag_id="echomq_deploy_reschedule",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
)
def echomq_deploy_reschedule() -> None:
    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="example.reports",
        children=[
            {"payload": {"n": 1}, "queue": "example.square"},
            {
                "payload": {"n": 2, "wait_for": "{{ run_id | replace(':', '_') }}.go"},
                "queue": "example.cube",
            },
        ],
    )
    # Airflow's supervisor can see a poke's end up to its 5 s heartbeat late, and a scheduler
    # that queues the next poke first fails the sensor ("finished with state success, but the
    # task instance's state attribute is queued", apache/airflow#71172): a poke interval well
    # above that, and a retry for when it happens anyway (a retry waits on the same flow)
    wait = EchoFlowSensor(
        task_id="wait",
        flow=fan_out.output,
        mode="reschedule",
        poke_interval=10,
        timeout=300,
        retries=1,
        retry_delay=timedelta(seconds=1),
    )

    @task
    def summarise(flow: dict[str, Any]) -> dict[str, int]:
        return {str(index): value["value"] for index, value in flow_results(flow)}

    summarise(wait.output)  # type: ignore[arg-type]


echomq_deploy_reschedule()
