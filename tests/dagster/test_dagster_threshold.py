"""``EchoMQResource.add_flow(min_success=)`` passes the threshold on (real Dagster, real
server): the flow tolerates that many deaths."""

# No ``from __future__ import annotations``: Dagster reads the asset's annotations.
from typing import Any

from dagster import AssetExecutionContext, asset, materialize
from dagster_echomq import EchoMQResource
from dagster_support import client_url

from echomq_core import Child, EchoMQ
from tests.flowkit import work_off


def test_the_resource_adds_a_flow_with_a_threshold(backend: Any, prefix: str) -> None:
    @asset
    def fan_out(context: AssetExecutionContext, echomq: EchoMQResource) -> str:
        children = [Child(i, queue="dgt-child", max_attempts=1) for i in range(5)]
        ref = echomq.add_flow(
            "dgt-parent", children, parent_id=echomq.run_scoped_id(context), min_success=0.6
        )
        return ref.parent_id

    result = materialize(
        [fan_out], resources={"echomq": EchoMQResource(url=client_url(backend), prefix=prefix)}
    )
    assert result.success
    parent = result.output_for_node("fan_out")
    mq: EchoMQ = backend.client(prefix)
    assert mq.snapshot("dgt-parent", parent).allowed == 2
    work_off(mq, ["dgt-parent", "dgt-child"], lambda j: j.payload, die=lambda j: j.payload < 2)
    snap = mq.snapshot("dgt-parent", parent)
    assert (snap.parent_state, snap.processed, snap.failed) == ("released", 3, 2)
    mq.close()
