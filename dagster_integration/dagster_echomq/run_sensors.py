"""``echomq_cancel_sensors``: a failed or terminated run cancels the flows it left unread.

Using::

    defs = Definitions(..., sensors=[*echomq_cancel_sensors()], resources={"echomq": echomq})

Two run status sensors (a run failure sensor, and one for CANCELED runs) that, for every run
of the code location that fails or is terminated, read the flows its materializations stored
(the ``echomq/...`` metadata the IO manager records) and the barrier flows its steps added
(``EchoMQResource.add_flow`` logs each one), and cancel each one that has not been read
(closed) or settled otherwise, with the reason ``dagster run <id> failed`` (or
``... was terminated``). Nothing of those flows that has not started then starts, for a run
that will not read it. Re-executing the run from failure repairs a cancelled flow (the IO
manager's ``repair_on_reexecution``), so cancelling loses nothing.

Why a sensor as well as the IO manager's own cancel: the IO manager cancels what it waits
for when the wait times out or the step is terminated; a flow whose run failed in another
step (the downstream never started) has nobody waiting for it. Why they are opt-in (leave
them out of the Definitions): a flow read by a sensor-launched run rather than by the run that
added it must outlive the failure of an unrelated step of that run.

A flow added by a step that failed before its output was stored is found through the line
``EchoMQResource.add_flow`` logged for it (``EchoMQ flow added: {...}``, INFO), so it is
cancelled too. Not found: a flow added with the client itself (``echomq.client.add_flow``) or
outside a run, and one whose line was not stored (a run whose log level is above INFO); those
expire with their queue's ``unclosed`` retention.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunFailureSensorContext,
    RunStatusSensorContext,
    SensorDefinition,
    run_failure_sensor,
    run_status_sensor,
)

from echomq_core import EchoMQ, FlowRef

from .reading import (
    ADDED_LOG_PREFIX,
    FLOW_PARENT_ID,
    FLOW_PARTITIONS,
    FLOW_QUEUE,
    decode_partitions,
)
from .resource import EchoMQResource


def echomq_cancel_sensors(
    *,
    name: str = "echomq_cancel",
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    minimum_interval_seconds: int | None = None,
) -> list[SensorDefinition]:
    """The two sensors (``<name>_failed``, ``<name>_terminated``) that cancel the unread flows
    of failed and terminated runs, using the ``echomq`` resource of the Definitions."""

    @run_failure_sensor(
        name=f"{name}_failed",
        default_status=default_status,
        minimum_interval_seconds=minimum_interval_seconds,
        description="Cancels the EchoMQ flows a failed run stored but did not read.",
    )
    def _failed(context: RunFailureSensorContext, echomq: EchoMQResource) -> None:
        cancel_run_flows(context, echomq, "failed")

    @run_status_sensor(
        run_status=DagsterRunStatus.CANCELED,
        name=f"{name}_terminated",
        default_status=default_status,
        minimum_interval_seconds=minimum_interval_seconds,
        description="Cancels the EchoMQ flows a terminated run stored but did not read.",
    )
    def _terminated(context: RunStatusSensorContext, echomq: EchoMQResource) -> None:
        cancel_run_flows(context, echomq, "was terminated")

    return [_failed, _terminated]


def cancel_run_flows(context: RunStatusSensorContext, echomq: EchoMQResource, why: str) -> int:
    """Cancel the unread flows the run's materializations stored; how many were cancelled."""
    run_id = context.dagster_run.run_id
    flows: dict[tuple[str, str], FlowRef] = {}
    # one read of the run's event log: its materializations and the resource's "added" lines
    for entry in context.instance.all_logs(run_id):
        event = entry.asset_materialization
        if event is not None:
            found = _flows_of(event.metadata)
        elif entry.dagster_event is None and entry.user_message.startswith(ADDED_LOG_PREFIX):
            found = _flow_added(entry.user_message)
        else:
            continue
        for flow in found:
            flows[(flow.queue, flow.parent_id)] = flow
    cancelled = 0
    with echomq.open_client() as client:
        for flow in flows.values():
            cancelled += _cancel_unread(context, client, flow, f"dagster run {run_id} {why}")
    return cancelled


def _cancel_unread(
    context: RunStatusSensorContext, client: EchoMQ, flow: FlowRef, reason: str
) -> int:
    snap = client.snapshot(flow.queue, flow.parent_id)
    if snap.outcome in ("missing", "failed", "cancelled") or snap.parent_state in (
        "closed",
        "completed",
    ):
        return 0  # read, settled otherwise, or gone: nothing to stop
    state = client.cancel_flow(flow.queue, flow.parent_id, reason=reason).state
    context.log.info(f"EchoMQ flow {flow.parent_id} in {flow.queue!r}: {state} ({reason})")
    return 1


def _flow_added(message: str) -> list[FlowRef]:
    try:
        added = json.loads(message[len(ADDED_LOG_PREFIX) :])
        return [FlowRef(str(added["queue"]), str(added["parent_id"]))]
    except (ValueError, TypeError, KeyError):
        return []  # a line that only looks like ours


def _flows_of(metadata: Mapping[str, Any]) -> list[FlowRef]:
    if FLOW_PARTITIONS in metadata:
        return list(decode_partitions(metadata[FLOW_PARTITIONS]).values())
    if FLOW_QUEUE in metadata and FLOW_PARENT_ID in metadata:
        queue, parent = (
            getattr(metadata[k], "value", metadata[k]) for k in (FLOW_QUEUE, FLOW_PARENT_ID)
        )
        return [FlowRef(str(queue), str(parent))]
    return []
