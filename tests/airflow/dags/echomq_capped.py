"""Test DAG: ``max_running`` passed on by ``@task.echo_flow`` and by ``EchoFlowOperator``.

* ``capped``: ``@task.echo_flow(max_running=2)`` planning six squares, waiting for them;
* ``classic``: ``EchoFlowOperator(max_running=3)``, four squares, waiting for them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator

SQUARES = {"parent_queue": "example.reports", "child_queue": "example.square"}


@dag(dag_id="echomq_capped", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_capped() -> None:
    @task.echo_flow(**SQUARES, max_running=2, wait_for_completion=True, poll_interval=0.1)
    def capped() -> list[dict[str, Any]]:
        return [{"payload": {"n": i}} for i in range(1, 7)]

    capped()

    EchoFlowOperator(
        task_id="classic",
        children=[{"payload": {"n": i}} for i in range(1, 5)],
        max_running=3,
        wait_for_completion=True,
        poll_interval=0.1,
        **SQUARES,
    )


echomq_capped()
