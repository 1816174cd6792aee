"""Definitions for test_dagster_runs.py (through ``execute_job``; importable by path, as
``reconstructable`` needs) and for the ``dagster dev`` test of test_dagster_deployment.py
(``dagster dev -f tests/dagster/run_jobs.py``): runs re-executed as Dagster re-executes, range
steps, a sensor on fixed flows, the cancel sensors.

Settings from the environment, read when a run or sensor starts: ``ECHOMQ_RUNS_URL``,
``ECHOMQ_RUNS_PREFIX``, ``ECHOMQ_RUNS_MARKER`` (``fan`` fails after adding its flow while no
file is there), ``ECHOMQ_RUNS_RECORD`` (the file the workers append each child run to),
``ECHOMQ_SENSOR_INTERVAL`` (seconds between sensor evaluations, default 30). A run tagged
``echomq-test/mode: wrong`` makes ``day_fan`` return its flows under the wrong partitions; a
``plan_job`` (``plan_empty_job``) run's ``echomq-test/plan`` tag is the number of children
``plan_fan`` (``plan_empty``) plans.
"""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
import os
import time
from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetSpec,
    BackfillPolicy,
    DailyPartitionsDefinition,
    Definitions,
    EnvVar,
    JobDefinition,
    MaterializeResult,
    Output,
    asset,
    define_asset_job,
    in_process_executor,
    multiprocess_executor,
)
from dagster_echomq import (
    EchoMQIOManager,
    EchoMQResource,
    echomq_cancel_sensors,
    echomq_flow_sensor,
    flow_metadata,
)

from echomq_core import Child, FlowRef

PARENT, DONE, LATER = "rj-parent", "rj-done", "rj-later"
DASHBOARD = "http://127.0.0.1:9/echomq"
DAYS = ["2026-11-01", "2026-11-02"]
MODE_TAG = "echomq-test/mode"
PLAN_TAG = "echomq-test/plan"
#: The flows the fixed-flow sensor watches (added by the test, outside Dagster).
EXTERNAL = [FlowRef(PARENT, "JOB-ext-barrier"), FlowRef(PARENT, "JOB-ext-worker-run")]
INTERVAL = int(os.environ.get("ECHOMQ_SENSOR_INTERVAL", "30"))
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
        # The served queue's children settle first (a gate, so that a repair has completed
        # children to keep), then the step fails.
        deadline = time.monotonic() + 60
        with echomq.pumping([DONE]):
            while echomq.snapshot(flow).processed < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
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
    if context.run.tags.get(MODE_TAG) == "wrong":  # each flow one partition too early
        return {"2026-10-31": flows[DAYS[0]], DAYS[0]: flows[DAYS[1]]}
    return flows


@asset(partitions_def=daily, backfill_policy=BackfillPolicy.single_run())
def day_collect(day_fan: dict[str, Any]) -> MaterializeResult:
    return MaterializeResult(metadata={"sizes": {d: len(v) for d, v in sorted(day_fan.items())}})


@asset(io_manager_key="echomq_io", output_required=False)
def plan_fan(context: AssetExecutionContext, echomq: EchoMQResource) -> Iterator[Output[FlowRef]]:
    """Fans out over as many children as the run's plan tag says: none, by default."""
    children = [Child({"n": i}, queue=DONE) for i in range(int(context.run.tags.get(PLAN_TAG, 0)))]
    yield from echomq.fan_out(PARENT, children, parent_id=echomq.run_scoped_id(context))


@asset
def plan_sum(plan_fan: dict[str, Any]) -> MaterializeResult:
    return MaterializeResult(metadata={"sum": sum(v["value"] for v in plan_fan.values())})


@asset(io_manager_key="echomq_io")
def plan_empty(
    context: AssetExecutionContext, echomq: EchoMQResource
) -> Iterator[Output[FlowRef]]:
    """As ``plan_fan``, but an empty plan gives its reader an empty result."""
    children = [Child({"n": i}, queue=DONE) for i in range(int(context.run.tags.get(PLAN_TAG, 0)))]
    parent_id = echomq.run_scoped_id(context)
    yield from echomq.fan_out(PARENT, children, parent_id=parent_id, on_empty="empty")


@asset
def plan_empty_sum(plan_empty: dict[str, Any]) -> MaterializeResult:
    return MaterializeResult(
        metadata={"sum": sum(v["value"] for v in plan_empty.values()), "read": len(plan_empty)}
    )


external = AssetSpec("external", metadata=flow_metadata(PARENT)).with_io_manager_key("echomq_io")


@asset
def external_read(external: dict[str, Any]) -> MaterializeResult:
    """Reads the flow the fixed-flow sensor launched this run for."""
    return MaterializeResult(metadata={"children": len(external)})


echomq = EchoMQResource(
    url=EnvVar("ECHOMQ_RUNS_URL"), prefix=EnvVar("ECHOMQ_RUNS_PREFIX"), dashboard_url=DASHBOARD
)
external_job = define_asset_job("external_job", selection=[external_read])
defs = Definitions(
    assets=[
        *(fan, fan_sum, day_fan, day_collect, plan_fan, plan_sum, plan_empty, plan_empty_sum),
        *(external, external_read),
    ],
    jobs=[
        define_asset_job("fan_job", selection=[fan, fan_sum], executor_def=in_process_executor),
        # over a range, in real step processes: what a step adds and what its output stores
        # are seen in the step's own process
        define_asset_job(
            "day_job", selection=[day_fan, day_collect], executor_def=multiprocess_executor
        ),
        # the empty plan in real step processes (the default executor)
        define_asset_job("plan_job", selection=[plan_fan, plan_sum]),
        define_asset_job("plan_empty_job", selection=[plan_empty, plan_empty_sum]),
        external_job,
    ],
    sensors=[
        echomq_flow_sensor(
            name="external_released",
            target=external_job,
            flows=EXTERNAL,
            minimum_interval_seconds=INTERVAL,
        ),
        *echomq_cancel_sensors(minimum_interval_seconds=INTERVAL),
    ],
    resources={
        "echomq": echomq,
        "echomq_io": EchoMQIOManager.from_resource(echomq, poll_interval=0.05),
    },
)


def fan_job() -> JobDefinition:
    return defs.resolve_job_def("fan_job")


def day_job() -> JobDefinition:
    return defs.resolve_job_def("day_job")
