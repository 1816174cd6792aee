"""``echomq_cancel_sensors(monitored_jobs=..., monitor_all_code_locations=...)``: the cancel
sensors watch what Dagster's ``run_failure_sensor`` would, evaluated tick by tick as the daemon
evaluates them, on runs of two real jobs; what they cannot take is refused when the
Definitions load. Real Dagster, real server."""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
from typing import Any

import pytest
from dagster import (
    AssetExecutionContext,
    DagsterInstance,
    Definitions,
    JobSelector,
    asset,
    build_sensor_context,
    define_asset_job,
)
from dagster_echomq import EchoMQIOManager, EchoMQResource, echomq_cancel_sensors
from dagster_support import client_url

from echomq_core import Child, EchoMQ, FlowRef, InvalidInput

PARENT, CHILD = "cs-parent", "cs-child"


def _definitions(url: str, prefix: str) -> Definitions:
    @asset(io_manager_key="echomq_io")
    def cs_fan(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
        children = [Child({"n": i}, queue=CHILD) for i in range(3)]
        return echomq.add_flow(PARENT, children, parent_id=echomq.run_scoped_id(context))

    @asset(deps=[cs_fan])
    def cs_boom() -> None:
        raise RuntimeError("a later step fails; nobody reads the flow")

    echomq = EchoMQResource(url=url, prefix=prefix)
    return Definitions(
        assets=[cs_fan, cs_boom],
        jobs=[
            define_asset_job("watched", selection=[cs_fan, cs_boom]),
            define_asset_job("unwatched", selection=[cs_fan, cs_boom]),
        ],
        resources={"echomq": echomq, "echomq_io": EchoMQIOManager.from_resource(echomq)},
    )


def _tick(sensor: Any, instance: DagsterInstance, cursor: str | None, url: str, prefix: str) -> Any:
    with build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={"echomq": EchoMQResource(url=url, prefix=prefix)},
    ) as context:
        return sensor.evaluate_tick(context)


@pytest.mark.onlystandalone
def test_monitored_jobs_limit_the_cancel_sensor_to_those_jobs_runs(
    backend: Any, prefix: str, instance: DagsterInstance
) -> None:
    url = client_url(backend)
    defs = _definitions(url, prefix)
    watched = defs.resolve_job_def("watched")
    failed_sensor, terminated_sensor = echomq_cancel_sensors(monitored_jobs=[watched])
    everything, _ = echomq_cancel_sensors(name="all", monitor_all_code_locations=True)
    # first ticks set the cursors (a run status sensor starts after the latest event)
    cursor = _tick(failed_sensor, instance, None, url, prefix).cursor
    all_cursor = _tick(everything, instance, None, url, prefix).cursor

    flows: dict[str, FlowRef] = {}
    for name in ("unwatched", "watched"):
        result = defs.resolve_job_def(name).execute_in_process(
            instance=instance, raise_on_error=False
        )
        assert not result.success
        flows[name] = result.output_for_node("cs_fan")
    _tick(failed_sensor, instance, cursor, url, prefix)
    with EchoMQ(url, prefix=prefix) as mq:
        state = {n: mq.snapshot(f.queue, f.parent_id).outcome for n, f in flows.items()}
        assert state == {"watched": "cancelled", "unwatched": "waiting"}
        _tick(everything, instance, all_cursor, url, prefix)  # every run: the other one too
        assert mq.snapshot(flows["unwatched"].queue, flows["unwatched"].parent_id).outcome == (
            "cancelled"
        )
    assert terminated_sensor.name == "echomq_cancel_terminated"


def test_what_the_cancel_sensors_cannot_watch_is_refused_at_definitions_load() -> None:
    job = define_asset_job("some_job", selection="*")
    selector = JobSelector(location_name="elsewhere", job_name="theirs")
    assert len(echomq_cancel_sensors(monitored_jobs=[job, selector])) == 2
    with pytest.raises(InvalidInput, match=r"monitored_jobs must be a list .* got str"):
        echomq_cancel_sensors(monitored_jobs="some_job")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match=r"monitored_jobs\[1\] is a str"):
        echomq_cancel_sensors(monitored_jobs=[job, "theirs"])  # type: ignore[list-item]
    with pytest.raises(InvalidInput, match="exclude each other"):
        echomq_cancel_sensors(monitored_jobs=[job], monitor_all_code_locations=True)
    with pytest.raises(InvalidInput, match="monitor_all_code_locations must be True or False"):
        echomq_cancel_sensors(monitor_all_code_locations="yes")  # type: ignore[arg-type]
