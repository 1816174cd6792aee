"""Test DAGs: a released flow announced as an Airflow asset event, and a DAG scheduled on it.

* ``echomq_assets``: ``fan_out`` adds three squares; the deferrable sensor ``wait`` names the
  asset ``echomq-squares`` in its outlets, so its success records an event carrying the flow's
  reference and counts; ``@task.echo_flow`` ``inline`` (one task: plan, fan-out, wait) names
  ``echomq-inline``.
* ``echomq_on_squares``: ``schedule=[squares]``: runs on each such event and returns what the
  event carried, as a downstream DAG of a fan-out would read it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import Asset, dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.sensors.echo_flow import EchoFlowSensor

SQUARES = Asset("echomq-squares")
INLINE = Asset("echomq-inline")


@dag(dag_id="echomq_assets", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_assets() -> None:
    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="example.reports",
        child_queue="example.square",
        children=[{"payload": {"n": n}} for n in (1, 2, 3)],
    )
    EchoFlowSensor(task_id="wait", flow=fan_out.output, deferrable=True, outlets=[SQUARES])

    @task.echo_flow(
        parent_queue="example.reports",
        child_queue="example.square",
        wait_for_completion=True,
        outlets=[INLINE],
    )
    def inline() -> list[dict[str, Any]]:
        return [{"payload": {"n": n}} for n in (4, 5)]

    inline()


@dag(dag_id="echomq_on_squares", schedule=[SQUARES], start_date=datetime(2026, 1, 1))
def echomq_on_squares() -> None:
    @task
    def read(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        return [
            event.extra["echomq_flow"]
            for events in (triggering_asset_events or {}).values()
            for event in events
        ]

    read()


echomq_assets()
echomq_on_squares()
