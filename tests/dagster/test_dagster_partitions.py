"""Partitioned assets: one flow per partition, for a step over one partition and over a range
(single-run backfill policy), and the sensor that watches them - with real Dagster, a real
server and real worker processes (which run no Pump)."""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
from collections.abc import Callable
from typing import Any

import pytest
from dagster import (
    AssetExecutionContext,
    AssetKey,
    BackfillPolicy,
    DagsterEventType,
    DagsterInstance,
    DailyPartitionsDefinition,
    Definitions,
    EnvVar,
    asset,
    materialize,
)
from dagster_echomq import EchoMQIOManager, EchoMQResource, FlowFollow, echomq_flow_sensor
from dagster_echomq.handles import read_handle
from dagster_support import client_url, evaluate_sensor

from echomq_core import Child, EchoMQ, FlowRef

PARENT, CHILD = "pt-parent", "pt-child"
DAYS = ["2026-11-01", "2026-11-02"]
RANGE = {
    "dagster/asset_partition_range_start": DAYS[0],
    "dagster/asset_partition_range_end": DAYS[1],
}
daily = DailyPartitionsDefinition(start_date="2026-11-01")


def numbers(day: str) -> list[int]:
    return [int(day[-2:]) * 100 + i for i in range(3)]


def day_assets(seen: list[tuple[list[str], Any]], *, per_partition: bool = True) -> list[Any]:
    @asset(
        io_manager_key="echomq_io",
        partitions_def=daily,
        backfill_policy=BackfillPolicy.single_run(),
    )
    def day_fan(context: AssetExecutionContext, echomq: EchoMQResource) -> dict[str, FlowRef]:
        flows = {}
        for day in context.partition_keys:
            children = [Child({"n": n}, queue=CHILD) for n in numbers(day)]
            key = day if per_partition else None
            parent_id = echomq.run_scoped_id(context, partition_key=key)
            flows[day] = echomq.add_flow(PARENT, children, parent_id=parent_id)
        return flows

    @asset(partitions_def=daily, backfill_policy=BackfillPolicy.single_run())
    def day_collect(context: AssetExecutionContext, day_fan: dict[str, Any]) -> None:
        seen.append((list(context.partition_keys), day_fan))

    return [day_fan, day_collect]


def resources(url: str, prefix: str) -> dict[str, Any]:
    echomq = EchoMQResource(url=url, prefix=prefix)
    return {
        "echomq": echomq,
        "echomq_io": EchoMQIOManager.from_resource(echomq, poll_interval=0.05),
    }


def squares(day: str) -> list[int]:
    return sorted(n * n for n in numbers(day))


@pytest.mark.onlystandalone
def test_one_flow_per_partition_for_a_partition_and_a_range(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    url = client_url(backend)
    workers(url, prefix, CHILD)
    seen: list[tuple[list[str], Any]] = []
    assets = day_assets(seen)

    one = materialize(
        assets, partition_key="2026-11-03", resources=resources(url, prefix), instance=instance
    )
    assert one.success
    (keys, values) = seen.pop()
    assert keys == ["2026-11-03"]  # one partition: the flow's values themselves
    assert sorted(v["value"] for v in values.values()) == squares("2026-11-03")

    ranged = materialize(assets, tags=RANGE, resources=resources(url, prefix), instance=instance)
    assert ranged.success
    (keys, by_day) = seen.pop()
    assert keys == DAYS
    assert sorted(by_day) == DAYS  # several partitions: {partition: that flow's values}
    for day in DAYS:
        assert sorted(v["value"] for v in by_day[day].values()) == squares(day)
    flows: dict[str, FlowRef] = ranged.output_for_node("day_fan")
    with EchoMQ(url, prefix=prefix) as mq:
        for day in DAYS:
            assert flows[day].parent_id.endswith(f".day_fan.{day}")
            assert read_handle(mq, ["day_fan", day]) == FlowRef(PARENT, flows[day].parent_id)
            assert mq.snapshot(PARENT, flows[day].parent_id).parent_state == "closed"
    # One materialization and one observation (the final counts) per partition.
    materialized = ranged.asset_materializations_for_node("day_fan")
    assert sorted(m.partition for m in materialized) == DAYS
    # (a step over several partitions writes them itself, as events of its run)
    observed = instance.fetch_observations(AssetKey("day_fan"), limit=50).records
    got = {r.partition_key: r.asset_observation for r in observed if r.run_id == ranged.run_id}
    assert sorted(k for k in got if k is not None) == DAYS
    assert all(got[d] is not None and got[d].metadata["processed"].value == 3 for d in DAYS)


@pytest.mark.onlystandalone
def test_a_range_step_without_one_id_per_partition_is_refused_before_adding(
    backend: Any, prefix: str, instance: DagsterInstance
) -> None:
    url = client_url(backend)
    result = materialize(
        day_assets([], per_partition=False),
        tags=RANGE,
        resources=resources(url, prefix),
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    error = failure.step_failure_data.error
    assert error.cause.cls_name == "InvalidInput"
    assert "covers 2 partitions" in error.cause.message
    with EchoMQ(url, prefix=prefix) as mq:
        assert mq.list_flows(PARENT) == []  # nothing was fanned out


@pytest.mark.onlystandalone
def test_sensor_requests_one_run_per_partition_flow_with_its_partition_key(
    backend: Any,
    prefix: str,
    workers: Callable[..., Any],
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The upstream alone adds the flows (no step waits, so no run Pump): the sensor's own
    Pump pass releases them, with the resource's URL an EnvVar resolved at evaluation."""
    url = client_url(backend)
    monkeypatch.setenv("ECHOMQ_TEST_SENSOR_URL", url)
    echomq = EchoMQResource(url=EnvVar("ECHOMQ_TEST_SENSOR_URL"), prefix=prefix)
    io = EchoMQIOManager.from_resource(echomq, poll_interval=0.05)
    seen: list[tuple[list[str], Any]] = []
    fan, collect = day_assets(seen)
    workers(url, prefix, CHILD)
    up = materialize(
        [fan, collect],
        selection=[fan],
        tags=RANGE,
        resources={"echomq": echomq, "echomq_io": io},
        instance=instance,
    )
    flows: dict[str, FlowRef] = up.output_for_node("day_fan")
    sensor = echomq_flow_sensor(name="days_released", target=collect, assets=["day_fan"])
    defs = Definitions(
        assets=[fan, collect], sensors=[sensor], resources={"echomq": echomq, "echomq_io": io}
    )

    def run_until_requests(cursor: str | None) -> tuple[list[Any], str | None]:
        for _ in range(200):  # bounded: each evaluation pumps up to 5 s
            tick = evaluate_sensor(sensor, instance, cursor, {"echomq": echomq}, defs)
            cursor = tick.cursor
            if tick.run_requests:
                return list(tick.run_requests), cursor
        raise AssertionError("no run requested")

    requests, cursor = run_until_requests(None)
    while len(requests) < 2:
        more, cursor = run_until_requests(cursor)
        requests += more
    assert sorted((r.partition_key, r.run_key) for r in requests) == [
        (day, flows[day].parent_id) for day in DAYS
    ]
    assert all(r.tags["echomq/parent_id"] == r.run_key for r in requests)
    again = evaluate_sensor(sensor, instance, cursor, {"echomq": echomq}, defs)
    assert not again.run_requests

    # The first day's flow is read; a sensor turned on now (no cursor) requests only the
    # other one: a flow read once never triggers again.
    read = materialize(
        [fan, collect],
        selection=[collect],
        partition_key=DAYS[0],
        resources={"echomq": echomq, "echomq_io": io},
        instance=instance,
    )
    assert read.success
    fresh, _ = run_until_requests(None)
    assert [(r.partition_key, r.run_key) for r in fresh] == [(DAYS[1], flows[DAYS[1]].parent_id)]


@pytest.mark.onlystandalone
def test_a_range_step_follows_one_flow_per_partition(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    """An input annotated ``dict[str, FlowFollow]`` over a range: one follower per partition's
    flow, each read to its release (and its barrier closed)."""
    url = client_url(backend)
    workers(url, prefix, CHILD)
    seen: list[dict[str, Any]] = []

    @asset(io_manager_key="echomq_io", partitions_def=daily,
           backfill_policy=BackfillPolicy.single_run())  # fmt: skip
    def day_stream(context: AssetExecutionContext, echomq: EchoMQResource) -> dict[str, FlowRef]:
        flows = {}
        for day in context.partition_keys:
            children = [Child({"n": n}, queue=CHILD) for n in numbers(day)]
            parent_id = echomq.run_scoped_id(context, partition_key=day)
            flows[day] = echomq.add_flow(PARENT, children, parent_id=parent_id, stream=True)
        return flows

    @asset(partitions_def=daily, backfill_policy=BackfillPolicy.single_run())
    def day_follow(day_stream: dict[str, FlowFollow]) -> None:
        seen.append({
            day: (type(f).__name__, f.total, sorted(v["value"] for _, v in f))
            for day, f in day_stream.items()
        })  # fmt: skip

    ranged = materialize([day_stream, day_follow], tags=RANGE, resources=resources(url, prefix),
                         instance=instance)  # fmt: skip
    assert ranged.success
    (got,) = seen
    assert got == {day: ("FlowFollow", 3, squares(day)) for day in DAYS}
    flows: dict[str, FlowRef] = ranged.output_for_node("day_stream")
    with EchoMQ(url, prefix=prefix) as mq:
        for day in DAYS:
            assert mq.snapshot(PARENT, flows[day].parent_id).parent_state == "closed"
