"""What a downstream load costs when there is nothing to pump: a flow found settled by the
first read, and a flow whose children are in the parent's own queue, are read without
starting a Pump (a Pump's start and stop are what the step would pay for nothing).

Real Dagster, a real server (standalone and Cluster), real worker processes (no Pump of
their own). The IO manager here records each Pump it is asked to make.
"""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from dagster import AssetExecutionContext, AssetSpec, DagsterInstance, asset, materialize
from dagster_echomq import EchoMQIOManager, EchoMQResource, flow_metadata
from dagster_support import client_url

from echomq_core import Child, EchoMQ, FlowRef, Pump
from tests.waiting import eventually

PARENT, CHILD = "st-parent", "st-child"


class CountingIOManager(EchoMQIOManager):
    """The IO manager, noting the queues of every Pump it makes."""

    made: ClassVar[list[list[str] | None]] = []

    def make_pump(self, queues: Sequence[str] | None) -> tuple[EchoMQ, Pump]:
        CountingIOManager.made.append(None if queues is None else list(queues))
        return super().make_pump(queues)


def io_manager(url: str, prefix: str) -> CountingIOManager:
    CountingIOManager.made = []
    return CountingIOManager(url=url, prefix=prefix, poll_interval=0.05)


def test_a_flow_found_released_is_read_without_a_pump(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    url = client_url(backend)
    workers(url, prefix, CHILD)
    with EchoMQ(url, prefix=prefix) as mq:
        ref = mq.add_flow(
            PARENT,
            [Child({"n": i}, queue=CHILD) for i in range(6)],
            parent_id="JOB-af/st_dag/fan/3f2a",  # an Airflow-derived id, '/' and all
            barrier=True,
        )
        pump = Pump(mq, [CHILD]).start()  # the deployment's Pump: it releases the flow
        try:
            eventually(lambda: mq.snapshot(PARENT, ref.parent_id).released, 30, "the release")
        finally:
            pump.stop()

        spec = AssetSpec("st_scores", metadata=flow_metadata(PARENT, ref.parent_id))

        @asset
        def st_report(st_scores: dict[str, Any]) -> int:
            return sum(v["value"] for v in st_scores.values())

        result = materialize(
            [spec.with_io_manager_key("echomq_io"), st_report],
            resources={"echomq_io": io_manager(url, prefix)},
            instance=instance,
        )
        assert result.success
        assert result.output_for_node("st_report") == sum(i * i for i in range(6))
        assert CountingIOManager.made == []  # a child queue, yet no Pump: nothing to deliver
        assert mq.snapshot(PARENT, ref.parent_id).parent_state == "closed"  # read, then closed


def test_children_in_the_parent_queue_are_waited_for_without_a_pump(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    url = client_url(backend)
    workers(url, prefix, PARENT)
    echomq = EchoMQResource(url=url, prefix=prefix)

    @asset(io_manager_key="echomq_io")
    def st_fan(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
        children = [Child({"n": i}, queue=PARENT) for i in range(8)]
        return echomq.add_flow(PARENT, children, parent_id=echomq.run_scoped_id(context))

    @asset
    def st_sum(st_fan: dict[str, Any]) -> int:
        return sum(v["value"] for v in st_fan.values())

    result = materialize(
        [st_fan, st_sum],
        resources={"echomq": echomq, "echomq_io": io_manager(url, prefix)},
        instance=instance,
    )
    assert result.success
    assert result.output_for_node("st_sum") == sum(i * i for i in range(8))
    assert CountingIOManager.made == []
