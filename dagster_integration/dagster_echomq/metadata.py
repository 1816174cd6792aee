"""What a flow leaves in Dagster's metadata and run tags: the keys that name a flow, and the
metadata of a flow added, of an empty plan, and of a settled flow. Shared by the IO manager,
the sensors and the asset checks."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dagster import MetadataValue

from echomq_core import EchoMQ, FlowRef, FlowSnapshot

from .handles import EmptyFlow

#: Keys naming a flow: in an ``AssetSpec``'s definition metadata (an external flow, see
#: :func:`flow_metadata`), in a materialization's metadata, and in a sensor's run tags.
FLOW_QUEUE = "echomq/queue"
FLOW_PARENT_ID = "echomq/parent_id"
#: Materialization metadata of a partitioned asset as earlier releases wrote it, the same
#: {partition key: [queue, parent id]} map in every partition's event: still read (by the
#: sensors), no longer written - each partition's materialization names its own flow.
FLOW_PARTITIONS = "echomq/flows"
#: Metadata of an empty plan's output and inputs (:class:`EmptyFlow`): its queue and the id
#: its flow would have had. Apart from FLOW_QUEUE / FLOW_PARENT_ID: no flow is behind them.
EMPTY_PLAN = "echomq/empty_plan"
EMPTY_PARENT_ID = "echomq/empty_parent_id"
#: How EchoMQResource.add_flow logs a barrier flow it added inside a run (then the flow's
#: ``{"queue": ..., "parent_id": ...}`` as JSON): the cancel sensors find in the run's event
#: log the flows of a step that failed before its output was stored.
ADDED_LOG_PREFIX = "EchoMQ flow added: "
#: How many child ids (with their errors) metadata and errors show at most.
SHOWN_CHILDREN = 20


def flow_metadata(queue: str, parent_id: str | None = None) -> dict[str, str]:
    """Definition metadata for an ``AssetSpec`` that stands for a flow added outside
    Dagster::

        AssetSpec("nightly_scores", metadata=flow_metadata("scores", "JOB-nightly-42"))
            .with_io_manager_key("echomq_io")

    Without ``parent_id`` the spec stands for whichever flow of ``queue`` a run was launched
    for: an ``echomq_flow_sensor`` watching ``queues=[queue]`` puts it in the run's tags.
    """
    meta = {FLOW_QUEUE: queue}
    if parent_id is not None:
        meta[FLOW_PARENT_ID] = parent_id
    return meta


def capped(children: Mapping[str, str]) -> dict[str, str]:
    """At most :data:`SHOWN_CHILDREN` child ids with their errors (cut to 300 characters)."""
    return {k: v[:300] for k, v in sorted(children.items())[:SHOWN_CHILDREN]}


def added_metadata(flow: FlowRef, snap: FlowSnapshot, page: str | None = None) -> dict[str, Any]:
    """What is true of a flow when it is added: where it is and how many children it has
    (and its dashboard page, when one is configured)."""
    meta: dict[str, Any] = {
        FLOW_QUEUE: flow.queue,
        FLOW_PARENT_ID: flow.parent_id,
        "N": MetadataValue.int(snap.total),
    }
    if page:
        meta["flow_page"] = MetadataValue.url(page)
    return meta


def empty_metadata(flow: EmptyFlow) -> dict[str, Any]:
    """What an empty plan's output and its readers' inputs record: its queue and the parent
    id it planned, and N = 0. Not under :data:`FLOW_QUEUE` / :data:`FLOW_PARENT_ID`, which
    name a flow on the server (the sensor waits for those)."""
    return {
        EMPTY_PLAN: flow.queue,
        EMPTY_PARENT_ID: flow.parent_id,
        "N": MetadataValue.int(0),
    }


def settled_metadata(client: EchoMQ, snap: FlowSnapshot, page: str | None = None) -> dict[str, Any]:
    """A settled flow's final counts, and the ids and errors of the children that failed
    it or whose failure was ignored (at most :data:`SHOWN_CHILDREN` each)."""
    meta: dict[str, Any] = {
        FLOW_QUEUE: snap.queue,
        FLOW_PARENT_ID: snap.parent_id,
        "outcome": snap.outcome,
        "N": MetadataValue.int(snap.total),
        "processed": MetadataValue.int(snap.processed),
        "ignored": MetadataValue.int(snap.ignored),
        "failed": MetadataValue.int(snap.failed),
        "repairs": MetadataValue.int(snap.repairs),
    }
    if snap.allowed is not None:  # a success threshold: failures it may tolerate
        meta["allowed_failures"] = MetadataValue.int(snap.allowed)
    if snap.ignored:
        meta["ignored_children"] = MetadataValue.json(
            capped(client.ignored_failures(snap.queue, snap.parent_id))
        )
    if snap.failed:
        meta["failed_children"] = MetadataValue.json(
            capped(client.failed_children(snap.queue, snap.parent_id))
        )
    if snap.outcome == "cancelled" and snap.error:
        meta["cancelled"] = snap.error
    if page:
        meta["flow_page"] = MetadataValue.url(page)
    return meta


def decode_partitions(raw: Any) -> dict[str, FlowRef]:
    """The flows of a :data:`FLOW_PARTITIONS` entry (metadata may arrive wrapped or plain)."""
    data = json.loads(getattr(raw, "value", raw) if not isinstance(raw, str) else raw)
    if isinstance(data, str):
        data = json.loads(data)
    return {str(k): FlowRef(str(v[0]), str(v[1])) for k, v in data.items()}
