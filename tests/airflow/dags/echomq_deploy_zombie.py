"""Test DAG for the deployment test: a waiting task the scheduler fails for its lost heartbeat.

``fan_out`` (``@task.echo_flow``, waiting in its worker slot) adds a flow whose one child
is in a queue no worker serves. The test stops the task's supervisor (SIGSTOP): no more
heartbeats, so past ``[scheduler] task_instance_heartbeat_timeout`` the scheduler fails the
task instance itself and asks the dag processor to run its failure callback - the one the
provider adds - which cancels the flow. No code of the task runs meanwhile.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import dag, task


@dag(dag_id="echomq_deploy_zombie", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_deploy_zombie() -> None:
    @task.echo_flow(  # type: ignore[attr-defined]  # registered by the provider at run time
        parent_queue="example.reports", wait_for_completion=True
    )
    def fan_out() -> list[dict[str, Any]]:
        return [{"payload": {"n": 3}, "queue": "example.nowhere"}]

    fan_out()


echomq_deploy_zombie()
