"""``EchoMQResource.add_flow(max_running=)`` passes the cap on (real Dagster, real server)."""

# No ``from __future__ import annotations``: Dagster reads the asset's annotations.
from typing import Any

from dagster import AssetExecutionContext, asset, materialize
from dagster_echomq import EchoMQResource
from dagster_support import client_url

from echomq_core import Child, EchoMQ


def test_the_resource_adds_a_capped_flow(backend: Any, prefix: str) -> None:
    @asset
    def fan_out(context: AssetExecutionContext, echomq: EchoMQResource) -> str:
        children = [Child(i, queue="dgc-child") for i in range(5)]
        ref = echomq.add_flow(
            "dgc-parent", children, parent_id=echomq.run_scoped_id(context), max_running=2
        )
        return ref.parent_id

    result = materialize(
        [fan_out], resources={"echomq": EchoMQResource(url=client_url(backend), prefix=prefix)}
    )
    assert result.success
    parent = result.output_for_node("fan_out")
    mq: EchoMQ = backend.client(prefix)
    cap = mq.flow_cap("dgc-parent", parent)
    assert cap is not None and (cap.cap, cap.admitted, cap.waiting) == (2, 2, 3)
    assert len(mq.queue("dgc-child").claim(10)) == 2
    mq.close()
