"""A fan-out over an empty plan (``EchoMQResource.fan_out`` in an asset declared
``output_required=False``): no flow is added, the asset is not materialized, and the asset
reading it is skipped; the run succeeds. A plan with items fans out as ``add_flow`` does.
With ``on_empty="empty"`` the asset is materialized (N = 0) and its readers get the empty
result of a flow's read: ``{}``, or a ``FlowStream`` that yields nothing.

Real Dagster, a real server (standalone and Cluster), real worker processes. The same under a
real ``dagster dev`` with the multiprocess executor: test_dagster_dev_runs.py.
"""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
import gc
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
from dagster_echomq import (
    FLOW_QUEUE,
    EchoMQIOManager,
    EchoMQResource,
    EmptyFlow,
    FlowStream,
    echomq_flow_sensor,
)
from dagster_echomq.handles import read_handle
from dagster_echomq.metadata import EMPTY_PARENT_ID, EMPTY_PLAN
from dagster_support import client_url, evaluate_sensor

from echomq_core import Child, EchoMQ, FlowRef, InvalidArgument, InvalidJobId, InvalidQueueName
from echomq_core.wire.connection import Call

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


def test_a_generator_plan_is_built_with_the_collector_paused(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    """A plan given as a generator is built by fan_out / add_flow with the cyclic collector
    paused (each collection while a big plan builds walks the step's whole heap), and the
    collector is on again in the asset's own code after it."""
    seen: list[bool] = []
    after: list[bool] = []

    @asset(io_manager_key="echomq_io")
    def ep_gen(context: AssetExecutionContext, echomq: EchoMQResource) -> Iterator[Output[FlowRef]]:
        def plan() -> Iterator[Child]:
            for i in range(4):
                seen.append(gc.isenabled())
                yield Child({"n": i}, queue=CHILD)

        yield from echomq.fan_out(PARENT, plan(), parent_id=echomq.run_scoped_id(context))
        after.append(gc.isenabled())

    @asset
    def ep_gen_sum(ep_gen: dict[str, Any]) -> int:
        return sum(v["value"] for v in ep_gen.values())

    url = client_url(backend)
    workers(url, prefix, CHILD)
    assert gc.isenabled()
    result = materialize([ep_gen, ep_gen_sum], resources=resources(url, prefix), instance=instance)
    assert result.success
    assert result.output_for_node("ep_gen_sum") == sum(i * i for i in range(4))
    assert seen == [False] * 4 and after == [True] and gc.isenabled()


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


def empty_result_assets(size: int) -> list[Any]:
    """A fan-out whose empty plan hands its readers an empty result, read as a whole and as
    a stream."""

    @asset(io_manager_key="echomq_io")
    def er_fan(context: AssetExecutionContext, echomq: EchoMQResource) -> Iterator[Output[FlowRef]]:
        children = [Child({"n": i}, queue=CHILD) for i in range(size)]
        parent_id = echomq.run_scoped_id(context)
        yield from echomq.fan_out(PARENT, children, parent_id=parent_id, on_empty="empty")

    @asset
    def er_sum(er_fan: dict[str, Any]) -> dict[str, Any]:
        return {"type": type(er_fan).__name__, "sum": sum(v["value"] for v in er_fan.values())}

    @asset
    def er_stream(er_fan: FlowStream) -> dict[str, Any]:
        return {"type": type(er_fan).__name__, "total": er_fan.total, "pairs": list(er_fan)}

    return [er_fan, er_sum, er_stream]


def test_an_empty_plan_asked_for_gives_its_readers_an_empty_result(
    backend: Any, prefix: str, instance: DagsterInstance
) -> None:
    url = client_url(backend)
    result = materialize(
        empty_result_assets(0), resources=resources(url, prefix), instance=instance
    )
    assert result.success
    assert result.output_for_node("er_sum") == {"type": "dict", "sum": 0}
    assert result.output_for_node("er_stream") == {"type": "FlowStream", "total": 0, "pairs": []}
    (materialized,) = result.asset_materializations_for_node("er_fan")
    meta = {k: getattr(v, "value", v) for k, v in materialized.metadata.items()}
    parent_id = f"JOB-dagster.{result.run_id}.er_fan"
    assert meta == {EMPTY_PLAN: PARENT, EMPTY_PARENT_ID: parent_id, "N": 0}
    assert FLOW_QUEUE not in meta  # the sensor waits for no flow
    logged = [r.user_message for r in instance.all_logs(result.run_id)]
    assert f"EchoMQ: empty plan for {PARENT!r}: no flow added, readers get {{}}" in logged
    assert logged.count(f"EchoMQ: empty plan for {PARENT!r}: the input is empty") == 2
    with EchoMQ(url, prefix=prefix) as mq:
        assert mq.list_flows(PARENT) == []
        assert read_handle(mq, ["er_fan"]) == EmptyFlow(PARENT, parent_id)
        expiry = mq.connection.execute([Call.cmd("PTTL", mq.keys.ref("dagster:er_fan"))])[0]
        assert 0 < expiry <= mq.retention(PARENT)["unclosed_age"] * 1000  # type: ignore[operator]
        # the reader alone, later (a re-execution of it): the stored empty plan, again {}
        again = materialize(
            empty_result_assets(0),
            resources=resources(url, prefix),
            instance=instance,
            selection=["er_sum"],
        )
        assert again.output_for_node("er_sum") == {"type": "dict", "sum": 0}
    # a sensor watching the fan-out asset: nothing to release, so no run requested
    (_, reader, _) = empty_result_assets(0)
    sensor = echomq_flow_sensor(name="er_released", target=reader, assets=["er_fan"])
    resource = EchoMQResource(url=url, prefix=prefix)
    tick = evaluate_sensor(sensor, instance, None, {"echomq": resource})
    assert not tick.run_requests


def test_an_empty_plan_replaces_the_flow_an_earlier_run_stored_and_back(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    """The handle is the latest plan's: an empty plan after a flow reads as empty (not as
    the earlier flow's results), a flow after an empty plan reads as that flow."""
    url = client_url(backend)
    workers(url, prefix, CHILD)
    runs = [
        materialize(empty_result_assets(n), resources=resources(url, prefix), instance=instance)
        for n in (3, 0, 4)
    ]
    assert [r.output_for_node("er_sum")["sum"] for r in runs] == [5, 0, 14]
    assert [r.output_for_node("er_stream")["total"] for r in runs] == [3, 0, 4]
    with EchoMQ(url, prefix=prefix) as mq:
        assert len(mq.list_flows(PARENT, "closed")) == 2
        expiry = mq.connection.execute([Call.cmd("PTTL", mq.keys.ref("dagster:er_fan"))])[0]
        assert expiry == -1  # a flow's handle expires with its flow, not on a timer


@pytest.mark.onlystandalone
def test_fan_out_refuses_a_bad_choice_or_id_for_an_empty_plan(backend: Any, prefix: str) -> None:
    echomq = EchoMQResource(url=client_url(backend), prefix=prefix)
    try:
        with pytest.raises(InvalidArgument, match="on_empty must be one of 'skip', 'empty'"):
            list(echomq.fan_out(PARENT, [], on_empty="nothing"))  # type: ignore[arg-type]
        with pytest.raises(InvalidJobId, match="bad id"):
            list(echomq.fan_out(PARENT, [], parent_id="bad id", on_empty="empty"))
        (out,) = echomq.fan_out(PARENT, [], on_empty="empty")
        assert isinstance(out.value, EmptyFlow) and out.value.parent_id.startswith("JOB-")
    finally:
        echomq.close()
