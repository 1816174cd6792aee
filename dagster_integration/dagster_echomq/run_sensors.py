"""``echomq_cancel_sensors``: a failed or terminated run cancels the flows it left unread.

Using::

    defs = Definitions(..., sensors=[*echomq_cancel_sensors()], resources={"echomq": echomq})

Two run status sensors (a run failure sensor, and one for CANCELED runs) that, for every run
of the code location that fails or is terminated (or of the ``monitored_jobs``, or of every
code location: the arguments of Dagster's ``run_failure_sensor``), read the flows its
materializations stored (the ``echomq/...`` metadata the IO manager records) and the barrier
flows its steps added (``EchoMQResource.add_flow`` logs each one), and cancel each one that
has not been read (closed) or settled otherwise, with the reason ``dagster run <id> failed``
(or ``... was terminated``). Nothing of those flows that has not started then starts, for a run
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
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    CodeLocationSelector,
    DagsterRunStatus,
    DefaultSensorStatus,
    GraphDefinition,
    JobDefinition,
    JobSelector,
    RepositorySelector,
    RunFailureSensorContext,
    RunStatusSensorContext,
    SensorDefinition,
    run_failure_sensor,
    run_status_sensor,
)
from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition,
)

from echomq_core import EchoMQ, FlowRef, InvalidInput

from .metadata import (
    ADDED_LOG_PREFIX,
    FLOW_PARENT_ID,
    FLOW_PARTITIONS,
    FLOW_QUEUE,
    decode_partitions,
)
from .resource import EchoMQResource

#: What ``monitored_jobs`` may hold: what Dagster's ``run_failure_sensor`` takes there.
MonitoredJob = (
    JobDefinition
    | GraphDefinition
    | UnresolvedAssetJobDefinition
    | RepositorySelector
    | JobSelector
    | CodeLocationSelector
)
_MONITORABLE = (
    JobDefinition,
    GraphDefinition,
    UnresolvedAssetJobDefinition,
    RepositorySelector,
    JobSelector,
    CodeLocationSelector,
)


def echomq_cancel_sensors(
    *,
    name: str = "echomq_cancel",
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    minimum_interval_seconds: int | None = None,
    monitored_jobs: Sequence[MonitoredJob] | None = None,
    monitor_all_code_locations: bool | None = None,
) -> list[SensorDefinition]:
    """The two sensors (``<name>_failed``, ``<name>_terminated``) that cancel the unread flows
    of failed and terminated runs, using the ``echomq`` resource of the Definitions.

    ``monitored_jobs`` / ``monitor_all_code_locations`` mean what they mean to Dagster's
    ``run_failure_sensor`` and are passed to both sensors: by default the runs of every job of
    this code location; with ``monitored_jobs``, only those jobs' runs (a ``JobSelector`` or
    ``CodeLocationSelector`` reaches another code location); with
    ``monitor_all_code_locations=True``, the runs of every code location of the instance. They
    are checked here, so a wrong value fails when the Definitions load (``InvalidInput``),
    not on the daemon's first tick."""
    jobs = _monitored(monitored_jobs, monitor_all_code_locations)
    both: dict[str, Any] = {  # the settings the two sensors share
        "default_status": default_status,
        "minimum_interval_seconds": minimum_interval_seconds,
        "monitored_jobs": jobs,
        "monitor_all_code_locations": monitor_all_code_locations,
    }

    @run_failure_sensor(
        name=f"{name}_failed",
        description="Cancels the EchoMQ flows a failed run stored but did not read.",
        **both,
    )
    def _failed(context: RunFailureSensorContext, echomq: EchoMQResource) -> None:
        cancel_run_flows(context, echomq, "failed")

    @run_status_sensor(
        run_status=DagsterRunStatus.CANCELED,
        name=f"{name}_terminated",
        description="Cancels the EchoMQ flows a terminated run stored but did not read.",
        **both,
    )
    def _terminated(context: RunStatusSensorContext, echomq: EchoMQResource) -> None:
        cancel_run_flows(context, echomq, "was terminated")

    return [_failed, _terminated]


def _monitored(
    jobs: Sequence[MonitoredJob] | None, all_locations: bool | None
) -> list[MonitoredJob] | None:
    """``monitored_jobs`` as a list, refused (naming what is wrong) unless it is a sequence
    of what Dagster monitors and is not combined with ``monitor_all_code_locations``."""
    if all_locations is not None and not isinstance(all_locations, bool):
        raise InvalidInput(
            f"monitor_all_code_locations must be True or False, got {all_locations!r}"
        )
    if jobs is None:
        return None
    if isinstance(jobs, (str, bytes)) or not isinstance(jobs, Sequence):
        raise InvalidInput(
            "monitored_jobs must be a list of jobs (JobDefinition, define_asset_job(...), "
            f"GraphDefinition) or selectors (JobSelector, CodeLocationSelector, "
            f"RepositorySelector), got {type(jobs).__name__} {jobs!r:.80}"
        )
    for i, job in enumerate(jobs):
        if not isinstance(job, _MONITORABLE):
            raise InvalidInput(
                f"monitored_jobs[{i}] is a {type(job).__name__} ({job!r:.80}): pass a job "
                "(JobDefinition, define_asset_job(...), GraphDefinition) or a selector "
                "(JobSelector, CodeLocationSelector, RepositorySelector)"
            )
    if all_locations and jobs:
        raise InvalidInput(
            "monitored_jobs and monitor_all_code_locations=True exclude each other: the "
            "first watches the runs of those jobs, the second the runs of every job"
        )
    return list(jobs)


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
