"""``echomq_flow_sensor``: request a run when a watched flow's parent is released.

Using::

    flows_sensor = echomq_flow_sensor(
        name="reports_released",
        echomq=echomq,                       # the same EchoMQResource the assets use
        target=summary_job,
        assets=["measurements"],             # watch the flow each materialization stored
        flows=[FlowRef("reports", "JOB-nightly")],      # and/or fixed flows, or a callable
    )

Each evaluation reads the snapshot of every watched flow not yet seen released and returns one
``RunRequest`` per newly released parent, with ``run_key`` = the parent id (Dagster never
launches two runs with one key from the same sensor) and the tags ``echomq/queue`` and
``echomq/parent_id`` (:func:`flow_from_tags` reads them back in the run).

The cursor is the list of watched flows already settled (released, or failed: a failed parent
requests no run and is logged once). It keeps only flows still on the watch list, so it stays
as small as the list; a flow that leaves the list and comes back is guarded by its run key.
A flow whose parent does not exist yet is simply watched again next time.

The sensor only reads: it opens a short-lived client per evaluation and runs no Pump (a Pump
belongs to whatever delivers the flow: workers' deployments or the runs using
:class:`EchoMQResource`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dagster import (
    AssetKey,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from echomq_core import EchoMQ, FlowRef

from .io_manager import FLOW_PARENT_ID, FLOW_QUEUE, read_handle
from .resource import EchoMQResource

FlowSource = Sequence[FlowRef] | Callable[[SensorEvaluationContext, EchoMQ], Iterable[FlowRef]]


def flow_from_tags(tags: Mapping[str, str]) -> FlowRef:
    """The flow a sensor-launched run was requested for (from ``context.run.tags``)."""
    return FlowRef(tags[FLOW_QUEUE], tags[FLOW_PARENT_ID])


def parse_cursor(cursor: str | None) -> set[tuple[str, str]]:
    """The (queue, parent id) pairs a cursor records as settled."""
    if not cursor:
        return set()
    return {(str(q), str(p)) for q, p in json.loads(cursor)}


def echomq_flow_sensor(
    *,
    name: str,
    echomq: EchoMQResource,
    target: Any,
    flows: FlowSource = (),
    assets: Sequence[str | Sequence[str] | AssetKey] = (),
    minimum_interval_seconds: int = 30,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
    description: str | None = None,
) -> SensorDefinition:
    """A sensor that requests a run of ``target`` (a job or an asset selection) once per
    released flow parent.

    ``flows``: fixed ``FlowRef``s, or a callable ``(context, client) -> iterable of FlowRef``
    read at every evaluation. ``assets``: asset keys whose latest flow handle (stored by
    :class:`~dagster_echomq.EchoMQIOManager`) is watched.
    """
    asset_keys = [AssetKey.from_coercible(a) for a in assets]

    @sensor(
        name=name,
        target=target,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=description or "Requests a run when a watched EchoMQ flow is released.",
    )
    def _evaluate(context: SensorEvaluationContext) -> SensorResult:
        settled = parse_cursor(context.cursor)
        requests: list[RunRequest] = []
        watched: set[tuple[str, str]] = set()
        with echomq.open_client() as client:
            for flow in _watched(context, client, flows, asset_keys):
                key = (flow.queue, flow.parent_id)
                if key in watched:
                    continue
                watched.add(key)
                if key in settled:
                    continue
                snap = client.snapshot(flow.queue, flow.parent_id)
                if snap.outcome == "released":
                    settled.add(key)
                    requests.append(
                        RunRequest(
                            run_key=flow.parent_id,
                            tags={FLOW_QUEUE: flow.queue, FLOW_PARENT_ID: flow.parent_id},
                        )
                    )
                elif snap.outcome in ("failed", "cancelled"):
                    settled.add(key)
                    context.log.warning(
                        f"EchoMQ flow {flow.parent_id} in {flow.queue!r} {snap.outcome} "
                        f"({snap.failed} failed children); no run requested"
                    )
        cursor = json.dumps(sorted(settled & watched))
        if requests:
            return SensorResult(run_requests=requests, cursor=cursor)
        pending = len(watched) - len(settled & watched)
        return SensorResult(
            skip_reason=f"no newly released flow ({pending} pending)", cursor=cursor
        )

    return _evaluate


def _watched(
    context: SensorEvaluationContext,
    client: EchoMQ,
    flows: FlowSource,
    asset_keys: Sequence[AssetKey],
) -> Iterable[FlowRef]:
    yield from (flows(context, client) if callable(flows) else flows)
    for key in asset_keys:
        flow = read_handle(client, key.path)
        if flow is not None:
            yield flow
