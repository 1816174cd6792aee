"""Test DAG for the production-stack test: both fan-out tasks wait in their Celery worker.

``op`` (``EchoFlowOperator``) and ``tf`` (``@task.echo_flow``) each add a flow of three
children that wait (``wait_for``) for the marker ``go-killed`` and wait for its release in the
task itself (``wait_for_completion=True``). The test kills (SIGKILL) the Celery worker running
each while it waits: the scheduler finds the task's heartbeat gone, the retry runs in a worker
that is alive and converges on the flow the first try added.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.results import flow_results

GATE = "go-killed"


@dag(
    dag_id="echomq_prod_killed",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
)
def echomq_prod_killed() -> None:
    op = EchoFlowOperator(
        task_id="op",
        parent_queue="example.reports",
        children=[
            {"payload": {"n": n, "wait_for": GATE}, "queue": "example.square"} for n in (1, 2, 3)
        ],
        wait_for_completion=True,
        wait_timeout=600,
        retries=3,
        retry_delay=timedelta(seconds=1),
    )

    @task.echo_flow(  # registered by the provider at run time
        parent_queue="example.reports",
        wait_for_completion=True,
        wait_timeout=600,
        retries=3,
        retry_delay=timedelta(seconds=1),
    )
    def tf() -> list[dict[str, Any]]:
        return [{"payload": {"n": n, "wait_for": GATE}, "queue": "example.cube"} for n in (1, 2, 3)]

    @task
    def summarise(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, int]]:
        return {
            name: {str(index): value["value"] for index, value in flow_results(flow)}
            for name, flow in (("op", a), ("tf", b))
        }

    summarise(op.output, tf())  # type: ignore[arg-type]


echomq_prod_killed()
