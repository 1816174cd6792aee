"""Test DAG: one flow id across runs (``params.parent``), so a test can re-run the operator
as a clear would: with the same plan after a failure (repair), or another plan (replace).

``plan`` makes ``params.n`` squares; ``params.fail_once`` names a marker: the second child
then dies on its first run only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.results import flow_results
from echomq_provider.sensors.echo_flow import EchoFlowSensor


@dag(
    dag_id="echomq_replan",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={"n": 3, "parent": "JOB-replan", "fail_once": ""},
)
def echomq_replan() -> None:
    @task
    def plan(params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        assert params is not None
        items: list[dict[str, Any]] = [
            {"payload": {"n": n}, "queue": "example.square"} for n in range(1, params["n"] + 1)
        ]
        if params["fail_once"]:
            items[1]["payload"]["fail_once"] = params["fail_once"]
        return items

    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="example.reports",
        parent_id="{{ params.parent }}",
        children=plan(),
        on_conflict="replace",
    )
    wait = EchoFlowSensor(task_id="wait", flow=fan_out.output, poke_interval=0.2, timeout=60)

    @task
    def collect(flow: dict[str, Any]) -> dict[str, int]:
        return {str(index): value["value"] for index, value in flow_results(flow)}

    collect(wait.output)  # type: ignore[arg-type]


echomq_replan()
