"""A job for the re-execution test, importable by path (``reconstructable`` needs that).

Settings from the environment: ``ECHOMQ_REEXEC_URL``, ``ECHOMQ_REEXEC_PREFIX`` and
``ECHOMQ_REEXEC_MARKER`` (child 1 of the flow dies while no file is there)."""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
import os
from typing import Any

from dagster import (
    AssetExecutionContext,
    Definitions,
    JobDefinition,
    MaterializeResult,
    asset,
    define_asset_job,
    in_process_executor,
)
from dagster_echomq import EchoMQIOManager, EchoMQResource

from echomq_core import Child, FlowRef

PARENT, CHILD = "rx-parent", "rx-child"


@asset(io_manager_key="echomq_io")
def flaky_fan(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
    marker = os.environ["ECHOMQ_REEXEC_MARKER"]
    children = [
        Child({"n": i, "fail_unless": marker if i == 1 else ""}, queue=CHILD) for i in range(4)
    ]
    return echomq.add_flow(PARENT, children, parent_id=echomq.run_scoped_id(context))


@asset
def flaky_sum(flaky_fan: dict[str, Any]) -> MaterializeResult:
    return MaterializeResult(metadata={"sum": sum(v["value"] for v in flaky_fan.values())})


def make_job() -> JobDefinition:
    echomq = EchoMQResource(
        url=os.environ["ECHOMQ_REEXEC_URL"], prefix=os.environ["ECHOMQ_REEXEC_PREFIX"]
    )
    defs = Definitions(
        assets=[flaky_fan, flaky_sum],
        jobs=[define_asset_job("flaky_job", executor_def=in_process_executor)],
        resources={
            "echomq": echomq,
            "echomq_io": EchoMQIOManager.from_resource(echomq, poll_interval=0.05),
        },
    )
    return defs.resolve_job_def("flaky_job")
