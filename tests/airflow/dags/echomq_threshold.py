"""Test DAG: ``min_success`` passed on by ``@task.echo_flow`` and by ``EchoFlowOperator``.

* ``planned``: ``@task.echo_flow(min_success=0.75)`` planning eight squares (2 may fail);
* ``classic``: ``EchoFlowOperator(min_success=3)``, four squares (1 may fail).

Neither waits: the test reads the flows the run added.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator

SQUARES = {"parent_queue": "example.reports", "child_queue": "example.square"}


@dag(dag_id="echomq_threshold", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_threshold() -> None:
    @task.echo_flow(**SQUARES, min_success=0.75)
    def planned() -> list[dict[str, Any]]:
        return [{"payload": {"n": i}} for i in range(1, 9)]

    planned()

    EchoFlowOperator(
        task_id="classic",
        children=[{"payload": {"n": i}} for i in range(1, 5)],
        min_success=3,
        **SQUARES,
    )


echomq_threshold()
