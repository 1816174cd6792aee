"""Jobs for test_dagster_runs.py, importable by path (``reconstructable`` needs that): run
through ``execute_job`` in real step processes, re-executed as Dagster re-executes.

Settings from the environment: ``ECHOMQ_RUNS_URL``, ``ECHOMQ_RUNS_PREFIX``,
``ECHOMQ_RUNS_MARKER`` (``fan`` fails after adding its flow while no file is there),
``ECHOMQ_RUNS_RECORD`` (the file the workers append each child run to) and
``ECHOMQ_RUNS_MODE`` (``wrong``: ``day_fan`` returns its flows under the wrong partitions).
"""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
import os
from typing import Any

from dagster import (
    AssetExecutionContext,
    BackfillPolicy,
    DailyPartitionsDefinition,
    Definitions,
    JobDefinition,
    MaterializeResult,
    asset,
    define_asset_job,
    in_process_executor,
    multiprocess_executor,
)
from dagster_echomq import EchoMQIOManager, EchoMQResource

from echomq_core import Child, FlowRef

PARENT, DONE, LATER = "rj-parent", "rj-done", "rj-later"
DASHBOARD = "http://127.0.0.1:9/echomq"
DAYS = ["2026-11-01", "2026-11-02"]
daily = DailyPartitionsDefinition(start_date="2026-11-01")


def children_of(day: str) -> int:
    """Each day's flow has its own size (2 on the 1st, 3 on the 2nd)."""
    return int(day[-2:]) + 1


@asset(io_manager_key="echomq_io")
def fan(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
    """Two children in a queue that a worker serves, two in one that none serves yet; then the
    step fails (while the marker is missing) before its output is stored."""
    record = os.environ["ECHOMQ_RUNS_RECORD"]
    children = [Child({"n": i, "record": record}, queue=DONE) for i in range(2)]
    children += [Child({"n": i, "record": record}, queue=LATER) for i in range(2, 4)]
    flow = echomq.add_flow(PARENT, children, parent_id=echomq.run_scoped_id(context))
    if not os.path.exists(os.environ["ECHOMQ_RUNS_MARKER"]):
        raise RuntimeError("the fan-out step fails after adding its flow")
    return flow


@asset
def fan_sum(fan: dict[str, Any]) -> MaterializeResult:
    return MaterializeResult(metadata={"sum": sum(v["value"] for v in fan.values())})


@asset(
    io_manager_key="echomq_io",
    partitions_def=daily,
    backfill_policy=BackfillPolicy.single_run(),
)
def day_fan(context: AssetExecutionContext, echomq: EchoMQResource) -> dict[str, FlowRef]:
    flows = {}
    for day in context.partition_keys:
        children = [Child({"n": i}, queue=DONE) for i in range(children_of(day))]
        parent_id = echomq.run_scoped_id(context, partition_key=day)
        flows[day] = echomq.add_flow(PARENT, children, parent_id=parent_id)
    if os.environ.get("ECHOMQ_RUNS_MODE") == "wrong":  # each flow one partition too early
        return {"2026-10-31": flows[DAYS[0]], DAYS[0]: flows[DAYS[1]]}
    return flows


@asset(partitions_def=daily, backfill_policy=BackfillPolicy.single_run())
def day_collect(day_fan: dict[str, Any]) -> MaterializeResult:
    return MaterializeResult(metadata={"sizes": {d: len(v) for d, v in sorted(day_fan.items())}})


def _defs(executor: Any) -> Definitions:
    echomq = EchoMQResource(
        url=os.environ["ECHOMQ_RUNS_URL"],
        prefix=os.environ["ECHOMQ_RUNS_PREFIX"],
        dashboard_url=DASHBOARD,
    )
    return Definitions(
        assets=[fan, fan_sum, day_fan, day_collect],
        jobs=[
            define_asset_job("fan_job", selection=[fan, fan_sum], executor_def=executor),
            define_asset_job("day_job", selection=[day_fan, day_collect], executor_def=executor),
        ],
        resources={
            "echomq": echomq,
            "echomq_io": EchoMQIOManager.from_resource(echomq, poll_interval=0.05),
        },
    )


def fan_job() -> JobDefinition:
    return _defs(in_process_executor).resolve_job_def("fan_job")


def day_job() -> JobDefinition:
    """Over a range, in real step processes (the multiprocess executor): what a step adds and
    what its output stores are seen in the step's own process."""
    return _defs(multiprocess_executor).resolve_job_def("day_job")
