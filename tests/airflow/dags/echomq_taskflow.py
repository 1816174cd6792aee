"""Test DAG: ``@task.echo_flow`` and ``EchoFlowOperator(wait_for_completion=True)`` - plan,
fan-out and wait as one task.

* ``squares``: ``@task.echo_flow`` planning five squares from its argument, waiting in its
  own process; ``total`` reads the values page by page from the summary it returns.
* ``values``: the same with ``return_values=True``; ``double.expand()`` maps over them.
* ``deferred``: children that wait for the marker ``deferred.go`` (made by the test once the
  task is deferred), ``deferrable=True``: the task defers to the trigger and resumes with the
  summary.
* ``classic``: the operator form, ``wait_for_completion=True``.
* ``empty``: the plan is empty: the task skips, and ``after_empty`` with it.
* ``shards``: ``.expand()`` over two shards: a flow per mapped instance.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.results import flow_results

SQUARES = {"parent_queue": "example.reports", "child_queue": "example.square"}


@dag(dag_id="echomq_taskflow", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_taskflow() -> None:
    @task.echo_flow(**SQUARES, wait_for_completion=True, poll_interval=0.1)
    def squares(n: int, params: Any = None) -> list[dict[str, Any]]:
        return [{"payload": {"n": i}} for i in range(1, n + 1)]

    @task
    def total(flow: dict[str, Any]) -> int:
        return sum(value["value"] for _index, value in flow_results(flow))

    total(squares(5))

    @task.echo_flow(**SQUARES, wait_for_completion=True, return_values=True)
    def values() -> list[dict[str, Any]]:
        return [{"payload": {"n": i}} for i in range(1, 4)]

    @task
    def double(value: dict[str, int]) -> int:
        return 2 * value["value"]

    double.expand(value=values())

    @task.echo_flow(**SQUARES, wait_for_completion=True, deferrable=True, poll_interval=0.2)
    def deferred() -> list[dict[str, Any]]:
        return [{"payload": {"n": i, "wait_for": "deferred.go"}} for i in range(1, 3)]

    deferred()

    EchoFlowOperator(
        task_id="classic",
        children=[{"payload": {"n": 7}}],
        wait_for_completion=True,
        **SQUARES,
    )

    @task.echo_flow(**SQUARES, wait_for_completion=True)
    def empty() -> list[dict[str, Any]]:
        return []

    @task
    def after_empty(flow: dict[str, Any]) -> str:
        return "ran"

    after_empty(empty())

    @task.echo_flow(**SQUARES, wait_for_completion=True)
    def shards(shard: int) -> list[dict[str, Any]]:
        return [{"payload": {"n": shard * 10 + i}} for i in range(shard)]

    @task
    def sizes(flows: list[dict[str, Any]]) -> list[int]:
        return [flow["processed"] for flow in flows]

    sizes(shards.expand(shard=[1, 2]))


echomq_taskflow()
