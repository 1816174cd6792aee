"""``echomq_flow_sensor``: request a run when a watched flow's parent is released.

Using::

    flows_sensor = echomq_flow_sensor(
        name="reports_released",
        target=summary_job,
        assets=["measurements"],        # the flows materializations of this asset stored
        queues=["nightly"],             # and/or every released flow of these queues
        flows=[FlowRef("reports", "JOB-nightly")],      # and/or fixed flows, or a callable
    )
    defs = Definitions(..., sensors=[flows_sensor], resources={"echomq": EchoMQResource(...)})

The sensor takes the ``echomq`` resource of the Definitions as a typed parameter, so Dagster
hands it the configured resource with ``EnvVar`` values resolved (in the daemon as in tests).

**What it watches.** ``assets``: each new materialization of those assets (read from
Dagster's event log after the cursor's storage id) names its flow - each partition's
materialization its own (``echomq/queue``, ``echomq/parent_id``; earlier releases wrote one
``echomq/flows`` map, still read) - and the flow is watched until it settles. ``queues``:
every flow of those queues that is released and not yet closed (``list_flows``; the first 100
per queue and tick). ``flows``: fixed ``FlowRef``s or a callable
``(context, client) -> iterable of FlowRef``.

**What it requests.** One ``RunRequest`` per released flow, with ``run_key`` = the parent id
(Dagster never launches two runs with one key from one sensor), the partition key of the
materialization that stored it, and the tags ``echomq/queue`` and ``echomq/parent_id``
(:func:`flow_from_tags`; the IO manager reads them for an ``AssetSpec`` that names only a
queue).

**Read once, never again.** A flow that has been read is closed (the IO manager closes what it
reads), and a closed flow never requests a run - also on a sensor's first evaluation, which
reads the whole history of the watched assets: flows read long ago are closed (or expired)
and are dropped. A flow whose materializing run is still going is left alone until that run
ends, since the run may read it itself (the downstream in the same run). Failed and
cancelled flows request nothing and are logged once; so is a flow added without
``barrier=True`` (its released parent is a worker's job, which ends it; no Dagster run could
close it - see :class:`~dagster_echomq.NotABarrierFlow`).

**Cursor.** JSON: per asset, the last materialization storage id read; the flows still
waiting (queue, parent id, partition, run id); and the settled flows of ``flows``, kept only
while they stay on that list. It stays as small as the number of flows in flight.

**A sensor that never stalls.** A cross-queue flow is released only when a Pump delivers its
children's signals. Unless ``pump`` is off, each evaluation first runs a bounded Pump pass
(at most ``pump_seconds``) over the queues of the children of the flows it waits for (or the
resource's ``pump_queues``), so a flow released while no run is active is released even with
no Pump deployed; a long-lived ``echomq pump`` beside the deployment makes it prompt.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from echomq_core import EchoMQ, FlowRef, FlowSnapshot, InvalidInput, Pump

from .failures import NotABarrierFlow
from .metadata import FLOW_PARENT_ID, FLOW_PARTITIONS, FLOW_QUEUE, decode_partitions
from .resource import EchoMQResource

FlowSource = Sequence[FlowRef] | Callable[[SensorEvaluationContext, EchoMQ], Iterable[FlowRef]]
#: Materializations read per asset and evaluation (the next evaluation reads on).
EVENTS_PER_TICK = 500


def flow_from_tags(tags: Mapping[str, str]) -> FlowRef:
    """The flow a sensor-launched run was requested for (from ``context.run.tags``)."""
    return FlowRef(tags[FLOW_QUEUE], tags[FLOW_PARENT_ID])


def parse_cursor(cursor: str | None) -> dict[str, Any]:
    """The sensor's cursor as ``{"assets": {key: storage id}, "waiting": [[queue, parent id,
    partition, run id], ...], "settled": [[queue, parent id], ...]}``."""
    state: dict[str, Any] = {"assets": {}, "waiting": [], "settled": []}
    if cursor:
        try:
            data = json.loads(cursor)
        except ValueError:
            raise InvalidInput(f"not an echomq_flow_sensor cursor: {cursor[:80]!r}") from None
        if isinstance(data, list):  # the cursor of releases before 0.1: settled pairs
            data = {"settled": data}
        if not isinstance(data, dict):
            raise InvalidInput(f"not an echomq_flow_sensor cursor: {cursor[:80]!r}")
        state.update(data)
    return state


def echomq_flow_sensor(
    *,
    name: str,
    target: Any,
    flows: FlowSource = (),
    assets: Sequence[str | Sequence[str] | AssetKey] = (),
    queues: Sequence[str] = (),
    pump: bool = True,
    pump_seconds: float = 5.0,
    minimum_interval_seconds: int = 30,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
    description: str | None = None,
) -> SensorDefinition:
    """A sensor that requests a run of ``target`` (a job or an asset selection) once per
    released flow, using the ``echomq`` resource of the Definitions."""
    asset_keys = [AssetKey.from_coercible(a) for a in assets]
    if isinstance(queues, str):
        raise InvalidInput(f"queues must be a list of queue names, not a string {queues!r}")
    watched_queues = list(queues)

    @sensor(
        name=name,
        target=target,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=description or "Requests a run when a watched EchoMQ flow is released.",
    )
    def _evaluate(context: SensorEvaluationContext, echomq: EchoMQResource) -> SensorResult:
        state = parse_cursor(context.cursor)
        requests: list[RunRequest] = []
        with echomq.open_client() as client:
            waiting = _new_materializations(context, asset_keys, state)
            fixed = list(flows(context, client) if callable(flows) else flows)
            if pump:
                _pump(context, echomq, client, waiting, fixed, watched_queues, pump_seconds)
            still: list[list[Any]] = []
            for entry, verdict, _ in verdicts(context, client, waiting):
                if verdict == "waiting":
                    still.append(entry)
                # "missing": it expired long ago (a first evaluation reading old history)
                elif verdict == "request":
                    requests.append(_request(FlowRef(entry[0], entry[1]), entry[2]))
            state["waiting"] = still
            state["settled"] = _check_fixed(context, client, fixed, state, requests)
            for queue in watched_queues:
                for summary in client.list_flows(queue, "released"):
                    requests.append(_request(FlowRef(queue, summary.parent_id), None))
        cursor = json.dumps(state, sort_keys=True)
        if requests:
            return SensorResult(run_requests=requests, cursor=cursor)
        return SensorResult(
            skip_reason=f"no newly released flow ({len(state['waiting'])} waiting)",
            cursor=cursor,
        )

    return _evaluate


def _request(flow: FlowRef, partition: str | None) -> RunRequest:
    return RunRequest(
        run_key=flow.parent_id,
        partition_key=partition,
        tags={FLOW_QUEUE: flow.queue, FLOW_PARENT_ID: flow.parent_id},
    )


def _new_materializations(
    context: SensorEvaluationContext, asset_keys: Sequence[AssetKey], state: dict[str, Any]
) -> list[list[Any]]:
    """The flows waiting from earlier evaluations plus those of materializations stored since
    (one page of the event log per asset)."""
    waiting: list[list[Any]] = list(state["waiting"])
    seen = {(w[0], w[1]) for w in waiting}
    marks: dict[str, int] = state["assets"]
    for key in asset_keys:
        name = key.to_user_string()
        after = marks.get(name)
        result = context.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, after_storage_id=after),
            limit=EVENTS_PER_TICK,
            ascending=True,
        )
        for record in result.records:
            marks[name] = record.storage_id
            event = record.asset_materialization
            if event is None:
                continue
            for partition, flow in _flows_of(event.metadata, event.partition).items():
                if (flow.queue, flow.parent_id) not in seen:
                    seen.add((flow.queue, flow.parent_id))
                    waiting.append([flow.queue, flow.parent_id, partition, record.run_id])
    return waiting


def _flows_of(metadata: Mapping[str, Any], partition: str | None) -> dict[str | None, FlowRef]:
    """The flow a materialization stored (of its partition, if it has one)."""
    if FLOW_PARTITIONS in metadata and partition is not None:
        flows = decode_partitions(metadata[FLOW_PARTITIONS])
        return {partition: flows[partition]} if partition in flows else {}
    if FLOW_QUEUE in metadata and FLOW_PARENT_ID in metadata:
        queue = str(getattr(metadata[FLOW_QUEUE], "value", metadata[FLOW_QUEUE]))
        parent = str(getattr(metadata[FLOW_PARENT_ID], "value", metadata[FLOW_PARENT_ID]))
        return {partition: FlowRef(queue, parent)}
    return {}  # not stored by EchoMQIOManager


def verdicts(
    context: SensorEvaluationContext, client: EchoMQ, waiting: Sequence[list[Any]]
) -> list[tuple[list[Any], str, FlowSnapshot]]:
    """Each watched flow (``[queue, parent id, partition, run id]``) with its verdict and the
    snapshot it was made from: every snapshot in one round trip per node, whatever the number
    of flows waiting."""
    snaps = client.snapshots(FlowRef(entry[0], entry[1]) for entry in waiting)
    return [
        (entry, _verdict(context, FlowRef(entry[0], entry[1]), snap, entry[3]), snap)
        for entry, snap in zip(waiting, snaps, strict=True)
    ]


def _verdict(
    context: SensorEvaluationContext, flow: FlowRef, snap: FlowSnapshot, run_id: str | None
) -> str:
    """'request', 'waiting', 'missing' or 'drop' for one watched flow."""
    if snap.outcome in ("waiting", "missing"):
        return snap.outcome
    if snap.outcome in ("failed", "cancelled"):
        context.log.warning(
            f"EchoMQ flow {flow.parent_id} in {flow.queue!r} {snap.outcome} "
            f"({snap.failed} failed children); no run requested"
        )
        return "drop"
    if snap.parent_state == "closed":
        return "drop"  # read already: never requested again
    if snap.parent_state != "released":  # pending, running or run: a worker's, not Dagster's
        refused = NotABarrierFlow(flow.queue, flow.parent_id, "the sensor requests no run for it")
        context.log.warning(str(refused))
        return "drop"
    if run_id is not None:
        run = context.instance.get_run_by_id(run_id)
        if run is not None and not run.is_finished:
            return "waiting"  # the run that stored it may read it itself
    return "request"


def _check_fixed(
    context: SensorEvaluationContext,
    client: EchoMQ,
    fixed: Sequence[FlowRef],
    state: dict[str, Any],
    requests: list[RunRequest],
) -> list[list[str]]:
    """Request runs for released fixed flows; the settled ones still on the list."""
    listed = {(f.queue, f.parent_id) for f in fixed}
    settled = {(str(q), str(p)) for q, p in state["settled"]} & listed
    unsettled = [[q, p, None, None] for q, p in sorted(listed - settled)]
    for (queue, parent_id, _, _), verdict, _ in verdicts(context, client, unsettled):
        key = (queue, parent_id)
        if verdict not in ("waiting", "missing"):  # a missing one may be added later
            settled.add(key)
        if verdict == "request":
            requests.append(_request(FlowRef(*key), None))
    return [list(k) for k in sorted(settled)]


def _pump(
    context: SensorEvaluationContext,
    echomq: EchoMQResource,
    client: EchoMQ,
    waiting: Sequence[Sequence[Any]],
    fixed: Sequence[FlowRef],
    watched_queues: Sequence[str],
    budget: float,
) -> None:
    """One bounded Pump pass over the children's queues of every flow this sensor waits for:
    ticks until a tick finds nothing to do or ``budget`` seconds passed."""
    if echomq.pump_queues is not None:
        queues = set(echomq.pump_queues)
    else:
        parents = {(w[0], w[1]) for w in waiting} | {(f.queue, f.parent_id) for f in fixed}
        for queue in watched_queues:
            parents |= {(queue, s.parent_id) for s in client.list_flows(queue, "held")}
        queues = set()
        for queue, parent_id in parents:
            queues.update(client.child_queues(queue, parent_id))
    if not queues:
        return
    runner = Pump(
        client,
        sorted(queues),
        options=echomq.pump_options(),
        pump_id="dagster-sensor-pump-" + uuid.uuid4().hex[:12],
    )
    deadline = time.monotonic() + budget
    try:
        while time.monotonic() < deadline and runner.tick().busy:
            pass
    finally:
        runner.stop()  # gives up its outbox leases, so another Pump takes over at once
    if runner.totals.delivered:
        context.log.info(f"delivered {runner.totals.delivered} EchoMQ signal(s) for waiting flows")
