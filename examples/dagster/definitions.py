"""EchoMQ in Dagster: assets fan work out across two queues, downstream assets fan it in.

* ``measurements`` adds a flow whose parent waits in ``example-reports`` and whose children go
  to ``example-squares`` and ``example-cubes`` (one child per number in each); ``summary``
  declares an ordinary input and receives ``{child id: result}`` through
  ``EchoMQIOManager``, which waits (running a Pump for the children's queues) until the parent
  is released, records the final counts, and closes the flow.
* ``day_numbers`` / ``day_summary``: the same per day (daily partitions, one flow per
  partition). Both take ``BackfillPolicy.single_run()``: a backfill of a range runs once,
  ``day_numbers`` adds one flow per day, ``day_summary`` gets ``{day: {child id: result}}``.
* ``reports_released`` (a sensor on the ``measurements`` flows) launches ``summary_job`` for a
  flow that nobody read; ``imports_released`` launches ``import_job`` once for every flow
  that something outside Dagster adds to ``example-imports`` (``imported`` reads it: an
  ``AssetSpec`` naming only the queue).
* ``echomq_cancel_failed`` / ``echomq_cancel_terminated``: a run that fails or is terminated
  cancels the flows it stored and nobody read.

Try it (any Redis-protocol server; ``echomq server`` starts one)::

    export ECHOMQ_URL=redis://127.0.0.1:6379/0
    python examples/dagster/workers.py &          # the workers of both child queues
    echomq pump &                                  # for what no worker serves (retention)
    dagster dev -f examples/dagster/definitions.py

Settings come from the environment: ``ECHOMQ_URL`` (read by Dagster as an ``EnvVar`` when a
run or sensor starts, never stored in run config), ``ECHOMQ_PREFIX`` (default ``emq``),
``ECHOMQ_EXAMPLE_N`` (numbers per queue, default 20), ``ECHOMQ_SENSOR_INTERVAL`` (seconds
between sensor evaluations, default 30).
"""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations
# (context and resource types) at definition time and needs them as objects.
import os
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetSpec,
    BackfillPolicy,
    DailyPartitionsDefinition,
    Definitions,
    EnvVar,
    MaterializeResult,
    asset,
    define_asset_job,
)
from dagster_echomq import (
    EchoMQIOManager,
    EchoMQResource,
    echomq_cancel_sensors,
    echomq_flow_sensor,
    flow_metadata,
)

from echomq_core import Child, FlowRef

REPORTS = "example-reports"
SQUARES = "example-squares"  # must match workers.py
CUBES = "example-cubes"
IMPORTS = "example-imports"  # flows added outside Dagster (see the module docstring)
INTERVAL = int(os.environ.get("ECHOMQ_SENSOR_INTERVAL", "30"))

echomq = EchoMQResource(url=EnvVar("ECHOMQ_URL"), prefix=os.environ.get("ECHOMQ_PREFIX", "emq"))
daily = DailyPartitionsDefinition(start_date="2026-11-01", end_offset=1)


def numbers() -> int:
    return int(os.environ.get("ECHOMQ_EXAMPLE_N", "20"))


def totals(values: dict[str, Any]) -> dict[str, Any]:
    per_queue: dict[str, list[int]] = {}
    for result in values.values():
        per_queue.setdefault(result["queue"], []).append(result["value"])
    return {
        "children": len(values),
        "totals": {queue: sum(v) for queue, v in sorted(per_queue.items())},
        "counts": {queue: len(v) for queue, v in sorted(per_queue.items())},
    }


@asset(io_manager_key="echomq_io")
def measurements(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
    """Fan out: one child per number in each of two queues; returns the flow's handle."""
    n = numbers()
    children = [Child({"n": i}, queue=queue) for queue in (SQUARES, CUBES) for i in range(n)]
    flow = echomq.add_flow(
        REPORTS, children, payload={"n": n}, parent_id=echomq.run_scoped_id(context)
    )
    context.log.info(f"added flow {flow.parent_id} with {len(children)} children")
    return flow


@asset
def summary(measurements: dict[str, Any]) -> MaterializeResult:
    """Fan in: every child's result, as a plain dict, summed per queue."""
    result = totals(measurements)
    return MaterializeResult(metadata=result, value=result)


@asset(
    io_manager_key="echomq_io",
    partitions_def=daily,
    backfill_policy=BackfillPolicy.single_run(),
)
def day_numbers(context: AssetExecutionContext, echomq: EchoMQResource) -> dict[str, FlowRef]:
    """Fan out per day: one flow per partition this run covers (one, or a backfilled range)."""
    flows = {}
    for day in context.partition_keys:
        offset = int(day[-2:])  # the day of the month: each day's numbers differ
        children = [
            Child({"n": offset + i}, queue=queue)
            for queue in (SQUARES, CUBES)
            for i in range(numbers())
        ]
        parent_id = echomq.run_scoped_id(context, partition_key=day)
        flows[day] = echomq.add_flow(REPORTS, children, parent_id=parent_id)
    return flows


@asset(partitions_def=daily, backfill_policy=BackfillPolicy.single_run())
def day_summary(context: AssetExecutionContext, day_numbers: dict[str, Any]) -> MaterializeResult:
    """Fan in per day: a run over one day gets that day's results; over several, a dict of
    them by day."""
    by_day = (
        day_numbers if len(context.partition_keys) > 1 else {context.partition_key: day_numbers}
    )
    per_day = {day: totals(values) for day, values in sorted(by_day.items())}
    context.log.info(f"day totals: {per_day}")
    return MaterializeResult(metadata={"days": len(per_day), "per_day": per_day})


imports = AssetSpec("imports", metadata=flow_metadata(IMPORTS)).with_io_manager_key("echomq_io")


@asset
def imported(imports: dict[str, Any]) -> MaterializeResult:
    """Reads the flow the ``imports_released`` sensor launched this run for."""
    return MaterializeResult(metadata=totals(imports))


summary_job = define_asset_job("summary_job", selection=[summary])
import_job = define_asset_job("import_job", selection=[imported])

defs = Definitions(
    assets=[measurements, summary, day_numbers, day_summary, imports, imported],
    jobs=[summary_job, import_job],
    sensors=[
        echomq_flow_sensor(
            name="reports_released",
            target=summary_job,
            assets=["measurements"],
            minimum_interval_seconds=INTERVAL,
        ),
        echomq_flow_sensor(
            name="imports_released",
            target=import_job,
            queues=[IMPORTS],
            minimum_interval_seconds=INTERVAL,
        ),
        *echomq_cancel_sensors(),
    ],
    resources={"echomq": echomq, "echomq_io": EchoMQIOManager.from_resource(echomq)},
)
