"""Test DAG for the deployment test: event-driven scheduling on released flows.

The asset ``outside-released`` is watched by ``EchoFlowReleasedTrigger`` on the queue
``example.outside``, where the test adds barrier flows itself (a service outside Airflow
would). ``echomq_on_release`` is scheduled on the asset: each run returns the flows of the
events that triggered it (Airflow may put several events in one run) with the sum of their
values, read from the server.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import Asset, AssetWatcher, dag, task
from echomq_provider.results import flow_results
from echomq_provider.triggers.released import EchoFlowReleasedTrigger

OUTSIDE = Asset(
    "outside-released",
    watchers=[
        AssetWatcher(
            name="outside-released",
            trigger=EchoFlowReleasedTrigger(queue="example.outside", watcher="outside-to-dwh"),
        )
    ],
)


@dag(dag_id="echomq_on_release", schedule=[OUTSIDE], start_date=datetime(2026, 1, 1))
def echomq_on_release() -> None:
    @task(multiple_outputs=False)  # one XCom: the flows' ids are not XCom keys
    def read(triggering_asset_events: Any = None) -> dict[str, int]:
        return {
            event.extra["payload"]["parent_id"]: sum(
                value["value"] for _index, value in flow_results(event.extra["payload"])
            )
            for events in (triggering_asset_events or {}).values()
            for event in events
        }

    read()


echomq_on_release()
