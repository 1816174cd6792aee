"""A released flow as an Airflow asset event: the waiting tasks' ``outlets``.

``dag.test()`` (tasks in process, triggers inline) records the events in the metadata DB as a
deployment does; the deployment test runs a DAG scheduled on one (``schedule=[asset]``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from echomq_provider.flow_specs import parent_id_for
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.sensors.echo_flow import EchoFlowSensor
from echomq_provider.waiting import ASSET_EXTRA_KEY

from echomq_core import InvalidInput

from .helpers import run_dag

pytestmark = pytest.mark.onlystandalone


def asset_events(name: str, run_id: str) -> list[dict[str, Any]]:
    """The ``extra`` of each event of asset ``name`` that run ``run_id`` recorded."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.name == name, AssetEvent.source_run_id == run_id)
        ).all()
        return [dict(row.extra or {}) for row in rows]


def test_a_released_flow_is_an_asset_event_with_its_reference_and_counts(
    airflow_db: Path, echomq_conn: str, start_worker: Callable[..., Any]
) -> None:
    start_worker()
    run = run_dag(airflow_db, "echomq_assets")
    assert run.state == "success", {k: str(t.state) for k, t in run.tasks.items()}
    for task_id, asset, total in (("wait", "echomq-squares", 3), ("inline", "echomq-inline", 2)):
        adder = "fan_out" if task_id == "wait" else "inline"
        assert asset_events(asset, run.run_id) == [
            {
                ASSET_EXTRA_KEY: {
                    "queue": "example.reports",
                    "parent_id": parent_id_for("echomq_assets", run.run_id, adder),
                    "state": "closed",
                    "total": total,
                    "processed": total,
                    "ignored": 0,
                    "failed": 0,
                }
            }
        ], task_id


def a_dag() -> Any:
    from airflow.sdk import DAG

    return DAG("echomq_bad_outlets", schedule=None, start_date=datetime(2026, 1, 1))


@pytest.mark.parametrize(
    "outlets, match",
    [
        (["s3://bucket/key"], "outlets must be Assets .* got str"),
        ([object()], "outlets must be Assets .* got object"),
    ],
)
def test_outlets_that_are_not_assets_are_refused_when_the_dag_is_parsed(
    outlets: list[Any], match: str
) -> None:
    with a_dag(), pytest.raises(InvalidInput, match=match):
        EchoFlowSensor(task_id="wait", parent_queue="q", parent_id="JOB-x", outlets=outlets)


def test_an_asset_alias_is_refused_naming_what_to_give() -> None:
    from airflow.sdk import AssetAlias

    with a_dag(), pytest.raises(InvalidInput, match="got AssetAlias"):
        EchoFlowSensor(
            task_id="wait", parent_queue="q", parent_id="JOB-x", outlets=[AssetAlias("a")]
        )


def test_outlets_on_an_operator_that_does_not_wait_are_refused() -> None:
    from airflow.sdk import Asset

    with a_dag(), pytest.raises(InvalidInput, match="wait_for_completion=True"):
        EchoFlowOperator(
            task_id="fan_out", parent_queue="q", children=[{"payload": {}}], outlets=[Asset("a")]
        )
    with a_dag():  # waiting, it is the release that is announced
        EchoFlowOperator(
            task_id="fan_out",
            parent_queue="q",
            children=[{"payload": {}}],
            wait_for_completion=True,
            outlets=[Asset("a")],
        )


def test_outlets_with_end_from_trigger_are_refused() -> None:
    from airflow.sdk import Asset

    with a_dag(), pytest.raises(InvalidInput, match="end_from_trigger"):
        EchoFlowSensor(
            task_id="wait",
            parent_queue="q",
            parent_id="JOB-x",
            deferrable=True,
            end_from_trigger=True,
            outlets=[Asset("a")],
        )
