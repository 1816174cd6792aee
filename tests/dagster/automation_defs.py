"""Definitions for the declarative-automation test under ``dagster dev``
(``test_dagster_dev_automation.py``): ``crawl`` adds a cross-queue flow; ``crawl_released`` is
its release marker, reported by ``crawl_release``; ``crawl_summary`` is automated on it with
``after_release`` and reads the flow through the IO manager as a polars frame; the daemon's
automation sensor evaluates it. Configured by the environment: ``ECHOMQ_AUTO_URL``,
``ECHOMQ_AUTO_PREFIX``, ``ECHOMQ_AUTO_GATE`` (a file each child waits for),
``ECHOMQ_SENSOR_INTERVAL``."""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
import os

import polars as pl
from dagster import (
    AssetExecutionContext,
    AssetSelection,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
    Definitions,
    EnvVar,
    MaterializeResult,
    asset,
    define_asset_job,
)
from dagster_echomq import (
    EchoMQIOManager,
    EchoMQResource,
    after_release,
    echomq_release_sensor,
    echomq_released,
)

from echomq_core import Child, FlowRef

PARENT, CHILD = "auto-parent", "auto-child"
N = 40
INTERVAL = int(os.environ.get("ECHOMQ_SENSOR_INTERVAL", "5"))


@asset(io_manager_key="echomq_io")
def crawl(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
    gate = os.environ.get("ECHOMQ_AUTO_GATE", "")
    children = [Child({"n": i, "wait_for": gate}, queue=CHILD) for i in range(N)]
    return echomq.add_flow(PARENT, children, parent_id=echomq.run_scoped_id(context))


crawl_released = echomq_released(crawl)


@asset(deps=[crawl_released], automation_condition=after_release(crawl_released))
def crawl_summary(crawl: pl.DataFrame) -> MaterializeResult:
    # the results as a polars frame (a row per child), built by the IO manager page by page
    return MaterializeResult(metadata={"children": crawl.height, "sum": int(crawl["value"].sum())})


echomq = EchoMQResource(url=EnvVar("ECHOMQ_AUTO_URL"), prefix=EnvVar("ECHOMQ_AUTO_PREFIX"))

defs = Definitions(
    assets=[crawl, crawl_released, crawl_summary],
    jobs=[define_asset_job("crawl_job", selection=[crawl])],
    sensors=[
        echomq_release_sensor(
            "crawl_release",
            [crawl_released],
            minimum_interval_seconds=INTERVAL,
            default_status=DefaultSensorStatus.RUNNING,
        ),
        AutomationConditionSensorDefinition(
            "echomq_automation",
            target=AssetSelection.all(),
            minimum_interval_seconds=INTERVAL,
            default_status=DefaultSensorStatus.RUNNING,
        ),
    ],
    resources={"echomq": echomq, "echomq_io": EchoMQIOManager.from_resource(echomq)},
)
