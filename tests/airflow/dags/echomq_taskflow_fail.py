"""Test DAG: a waiting ``@task.echo_flow`` gives up on its flow, which it cancels.

* ``fail_fast``: a fail-parent child dies (after 1 s) while the task waits: the task fails at
  once naming it, and the child no worker serves is cancelled before it starts.
* ``too_slow``: nothing serves its queue; ``wait_timeout=1``: the task fails saying so and the
  flow is cancelled.
* ``too_slow_kept``: the same with ``cancel_on_failure=False``: the flow is left held.
* ``killed``: nothing serves its queue; its ``execution_timeout`` (1.5 s) kills it while it
  waits (``on_kill``): the flow is cancelled.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import dag, task

REPORTS = "example.reports"


@dag(dag_id="echomq_taskflow_fail", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_taskflow_fail() -> None:
    @task.echo_flow(parent_queue=REPORTS, wait_for_completion=True, poll_interval=0.1)
    def fail_fast() -> list[dict[str, Any]]:
        return [
            {"payload": {"n": 1}, "queue": "example.square"},
            {"payload": {"n": 2, "sleep": 1, "fail": "corrupt input"}, "queue": "example.cube"},
            {"payload": {"n": 3}, "queue": "example.later"},
        ]

    fail_fast()

    @task.echo_flow(
        parent_queue=REPORTS, child_queue="test.idle", wait_for_completion=True, wait_timeout=1
    )
    def too_slow() -> list[int]:
        return [1, 2]

    too_slow()

    @task.echo_flow(
        parent_queue=REPORTS,
        child_queue="test.idle",
        wait_for_completion=True,
        wait_timeout=1,
        cancel_on_failure=False,
    )
    def too_slow_kept() -> list[int]:
        return [1]

    too_slow_kept()

    @task.echo_flow(
        parent_queue=REPORTS,
        child_queue="test.idle",
        wait_for_completion=True,
        execution_timeout=timedelta(seconds=1.5),
    )
    def killed() -> list[int]:
        return [1]

    killed()


echomq_taskflow_fail()
