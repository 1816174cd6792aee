"""A fan-out over an empty plan (``EchoMQResource.fan_out`` in an asset declared
``output_required=False``): no flow is added, the asset is not materialized, and the asset
reading it is skipped; the run succeeds. A plan with items fans out as ``add_flow`` does.

Real Dagster, a real server (standalone and Cluster), real worker processes. The same under a
real ``dagster dev`` with the multiprocess executor: test_dagster_dev_runs.py.
"""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dagster import (
    AssetExecutionContext,
    DagsterEventType,
    DagsterInstance,
    Output,
    asset,
    materialize,
)
from dagster_echomq import EchoMQIOManager, EchoMQResource
from dagster_echomq.reading import read_handle
from dagster_support import client_url

from echomq_core import Child, EchoMQ, FlowRef, InvalidQueueName

PARENT, CHILD = "ep-parent", "ep-child"


def planned_assets(size: int, queue: str = PARENT) -> list[Any]:
    @asset(io_manager_key="echomq_io", output_required=False)
    def ep_fan(context: AssetExecutionContext, echomq: EchoMQResource) -> Iterator[Output[FlowRef]]:
        children = [Child({"n": i}, queue=CHILD) for i in range(size)]
        yield from echomq.fan_out(queue, children, parent_id=echomq.run_scoped_id(context))

    @asset
    def ep_sum(ep_fan: dict[str, Any]) -> int:
        return sum(v["value"] for v in ep_fan.values())

    return [ep_fan, ep_sum]


def resources(url: str, prefix: str) -> dict[str, Any]:
    echomq = EchoMQResource(url=url, prefix=prefix)
    return {
        "echomq": echomq,
        "echomq_io": EchoMQIOManager.from_resource(echomq, poll_interval=0.05),
    }


def test_an_empty_plan_adds_no_flow_and_skips_the_reader(
    backend: Any, prefix: str, instance: DagsterInstance
) -> None:
    url = client_url(backend)
    result = materialize(planned_assets(0), resources=resources(url, prefix), instance=instance)
    assert result.success
    assert result.asset_materializations_for_node("ep_fan") == []
    skipped = [
        e.step_key for e in result.all_events if e.event_type == DagsterEventType.STEP_SKIPPED
    ]
    assert skipped == ["ep_sum"]
    logged = [r.user_message for r in instance.all_logs(result.run_id)]
    assert f"EchoMQ: empty plan for {PARENT!r}: no flow added, readers skipped" in logged
    with EchoMQ(url, prefix=prefix) as mq:
        assert mq.list_flows(PARENT) == []
        assert read_handle(mq, ["ep_fan"]) is None


def test_a_plan_with_items_fans_out_and_is_read(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    url = client_url(backend)
    workers(url, prefix, CHILD)
    result = materialize(planned_assets(5), resources=resources(url, prefix), instance=instance)
    assert result.success
    assert result.output_for_node("ep_sum") == sum(i * i for i in range(5))
    (materialized,) = result.asset_materializations_for_node("ep_fan")
    assert materialized.metadata["N"].value == 5


@pytest.mark.onlystandalone
def test_an_empty_plan_with_a_bad_queue_is_refused_naming_it(
    backend: Any, prefix: str, instance: DagsterInstance
) -> None:
    url = client_url(backend)
    result = materialize(
        planned_assets(0, queue="bad queue"),
        resources=resources(url, prefix),
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    error = failure.step_failure_data.error.cause  # Dagster wraps what the step raised
    assert error.cls_name == InvalidQueueName.__name__
    assert "bad queue" in error.message
