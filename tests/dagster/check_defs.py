"""Definitions for the ``dagster dev`` test of test_dagster_dev_checks.py (``dagster dev -f
tests/dagster/check_defs.py``): a fan-out asset of four children, one of whose failure is
ignored, its ``echomq_flow_check`` (WARN above 0, ERROR above a half), and a reader.

Settings from the environment, read when a run starts: ``ECHOMQ_CK_URL``, ``ECHOMQ_CK_PREFIX``.
"""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
from typing import Any

from dagster import AssetExecutionContext, Definitions, EnvVar, asset, define_asset_job
from dagster_echomq import EchoMQIOManager, EchoMQResource, echomq_flow_check

from echomq_core import Child, FlowRef

PARENT, CHILD = "ckd-parent", "ckd-child"


@asset(io_manager_key="echomq_io")
def ckd_fan(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
    children = [
        Child({"n": i, "fail": i == 3}, queue=CHILD, ignore_dependency_on_failure=i == 3)
        for i in range(4)
    ]
    return echomq.add_flow(PARENT, children, parent_id=echomq.run_scoped_id(context))


@asset
def ckd_read(ckd_fan: dict[str, Any]) -> int:
    return len(ckd_fan)


ckd_children = echomq_flow_check(ckd_fan, warn_above=0.0, fail_above=0.5, poll_interval=0.1)

echomq = EchoMQResource(url=EnvVar("ECHOMQ_CK_URL"), prefix=EnvVar("ECHOMQ_CK_PREFIX"))
defs = Definitions(
    assets=[ckd_fan, ckd_read],
    asset_checks=[ckd_children],
    jobs=[define_asset_job("ckd_job", selection=[ckd_fan, ckd_read])],
    resources={
        "echomq": echomq,
        "echomq_io": EchoMQIOManager.from_resource(echomq, poll_interval=0.1),
    },
)
