"""EchoMQ in Dagster: one asset fans work out across two queues, a downstream asset sums up.

``measurements`` adds a flow whose parent waits in ``example-reports`` and whose children go
to ``example-squares`` and ``example-cubes`` (one child per number in each); it returns the
flow's handle. EchoMQ workers (``workers.py``) compute the children. ``summary`` declares an
ordinary input and receives ``{child id: result}`` through ``EchoMQIOManager``, which waits
until the parent is released; the resource's Pump carries the children's results across
queues meanwhile. ``summary_job`` + ``reports_released`` show the other way to wait: a sensor
that launches the summary once the flow is released.

Try it (any Redis-protocol server; ``echomq server`` starts one)::

    export ECHOMQ_URL=redis://127.0.0.1:6379/0
    python examples/dagster/workers.py &
    dagster asset materialize -f examples/dagster/definitions.py --select '*'
    dagster definitions validate -f examples/dagster/definitions.py

Settings come from the environment: ``ECHOMQ_URL``, ``ECHOMQ_PREFIX`` (default ``emq``),
``ECHOMQ_EXAMPLE_N`` (numbers per queue, default 20).
"""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations
# (context and resource types) at definition time and needs them as objects.
import os
from typing import Any

from dagster import (
    AssetExecutionContext,
    Definitions,
    MaterializeResult,
    asset,
    define_asset_job,
)
from dagster_echomq import EchoMQIOManager, EchoMQResource, echomq_flow_sensor

from echomq_core import Child, FlowRef

REPORTS = "example-reports"
SQUARES = "example-squares"  # must match workers.py
CUBES = "example-cubes"

echomq = EchoMQResource(
    url=os.environ.get("ECHOMQ_URL", "redis://127.0.0.1:6379/0"),
    prefix=os.environ.get("ECHOMQ_PREFIX", "emq"),
)


@asset(io_manager_key="echomq_io")
def measurements(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
    """Fan out: one child per number in each of two queues; returns the flow's handle."""
    n = int(os.environ.get("ECHOMQ_EXAMPLE_N", "20"))
    children = [Child({"n": i}, queue=queue) for queue in (SQUARES, CUBES) for i in range(n)]
    flow = echomq.add_flow(
        REPORTS, children, payload={"n": n}, parent_id=echomq.run_scoped_id(context)
    )
    context.log.info(f"added flow {flow.parent_id} with {len(children)} children")
    return flow


@asset
def summary(measurements: dict[str, Any]) -> MaterializeResult:
    """Fan in: every child's result, as a plain dict, summed per queue."""
    per_queue: dict[str, list[int]] = {}
    for result in measurements.values():
        per_queue.setdefault(result["queue"], []).append(result["value"])
    totals = {queue: sum(values) for queue, values in sorted(per_queue.items())}
    counts = {queue: len(values) for queue, values in sorted(per_queue.items())}
    return MaterializeResult(
        metadata={"children": len(measurements), "totals": totals, "counts": counts},
        value={"children": len(measurements), "totals": totals, "counts": counts},
    )


summary_job = define_asset_job("summary_job", selection=[summary])

defs = Definitions(
    assets=[measurements, summary],
    jobs=[summary_job],
    sensors=[
        echomq_flow_sensor(
            name="reports_released", echomq=echomq, target=summary_job, assets=["measurements"]
        ),
    ],
    resources={"echomq": echomq, "echomq_io": EchoMQIOManager(echomq=echomq)},
)
