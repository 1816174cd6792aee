"""Measuring DAG: what the metadata DB keeps for each way of fanning out N children.

Two ways side by side, N from the run's conf (``{"n": 200}``):

* ``plan -> fan_out (EchoFlowOperator) -> wait (EchoFlowSensor, deferrable) -> collect_op``:
  the plan is ``plan``'s XCom, and ``fan_out``'s rendered ``children``;
* ``one_task (@task.echo_flow, wait_for_completion) -> collect_one``: the plan stays inside
  the task.

Used to measure the ``xcom`` and ``rendered_task_instance_fields`` rows per task (docs/airflow.md,
"Results that scale"); children go to ``example.square``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.results import flow_results
from echomq_provider.sensors.echo_flow import EchoFlowSensor

SQUARES = {"parent_queue": "example.reports", "child_queue": "example.square"}


@dag(
    dag_id="echomq_xcom_ways",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={"n": 200},
)
def echomq_xcom_ways() -> None:
    @task
    def plan(params: Any = None) -> list[dict[str, Any]]:
        return [{"payload": {"n": n}} for n in range(int(params["n"]))]

    fan_out = EchoFlowOperator(task_id="fan_out", children=plan(), **SQUARES)
    wait = EchoFlowSensor(task_id="wait", flow=fan_out.output, deferrable=True, poke_interval=1)

    @task.echo_flow(**SQUARES, wait_for_completion=True)
    def one_task(params: Any = None) -> list[dict[str, Any]]:
        return [{"payload": {"n": n}} for n in range(int(params["n"]))]

    @task
    def collect(flow: dict[str, Any]) -> int:
        return sum(value["value"] for _index, value in flow_results(flow))

    collect.override(task_id="collect_op")(wait.output)
    collect.override(task_id="collect_one")(one_task())


echomq_xcom_ways()
