"""Reading a flow from Dagster: where its handle lives, how a step waits for it, what
metadata it leaves. Shared by the IO manager and the sensor.

Handles: an asset's flow is stored in the EchoMQ server as the named reference
``dagster:<asset key>[/<partition>]`` (key ``<prefix>:ref:dagster:...``, see
``EchoMQ.save_ref``; it is deleted with its flow when the flow expires), one per partition.
The handle lives in the server rather than on a local disk so that any process that reaches
the flow reaches its handle: a step process of the multiprocess executor, a container of a
Kubernetes executor, a later run, the sensor. An :class:`EmptyFlow` (a fan-out over an empty
plan whose readers get an empty result) is stored under the same name, marked ``"empty"``,
with no flow behind it: it expires after its queue's ``unclosed_age`` retention instead.

Waiting (:func:`wait_settled`) polls the flow's snapshot until it is released, failed or
cancelled (the core's :class:`~echomq_core.flows.waiting.FlowWait` judges each read and sets the
next pause), and logs progress every ``log_every`` seconds. It gives up with the core's
``FlowTimeout`` after ``timeout`` seconds in all, or sooner when for ``stall_timeout`` seconds
no child settled and no job of the children's queues was running (leased) - the usual reason
is that no worker serves those queues, and the error names them rather than blocking the step
for the full timeout. Children that run long (leased, no settle yet) are not a stall.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagster import DagsterLogManager, Failure, MetadataValue

from echomq_core import (
    ChildFailure,
    EchoMQ,
    FlowRef,
    FlowSnapshot,
    FlowTimeout,
    InvalidFlow,
    InvalidInput,
    ParentFailed,
)
from echomq_core.flows.reads import not_found
from echomq_core.flows.waiting import MISSING, STALLED, TIMED_OUT, FlowWait
from echomq_core.wire.connection import Call

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
#: How much of the first failed child's traceback a FlowFailedError shows: its last 4 KiB
#: (the row keeps 16 KiB), the frames nearest the raise, readable on the step's page.
TRACEBACK_SHOWN = 4096


class FlowFailedError(ParentFailed, Failure):
    """Raised when a flow an asset depends on has a failed parent (a fail-the-parent child
    died) or was cancelled. ``failed`` maps each failed child id to its error;
    ``first_failure`` is the first of them with its last traceback
    (``echomq_core.ChildFailure``; None when no child died, e.g. a cancelled flow).

    It is the core's :class:`ParentFailed` (``except ParentFailed`` catches it) and a Dagster
    ``Failure``, so Dagster fails the step at once - no retry policy can revive a failed
    parent; re-executing the run from failure repairs it instead (see the IO manager) - and
    shows the failed children as metadata of the step failure. The message ends with the
    first failed child's id, error and the tail of its traceback (at most
    :data:`TRACEBACK_SHOWN` characters, whole lines): what the step's page shows first.
    """

    def __init__(
        self,
        queue: str,
        parent_id: str,
        failed: Mapping[str, str],
        reason: str | None = None,
        first_failure: ChildFailure | None = None,
    ) -> None:
        super().__init__(queue, parent_id, dict(failed))
        self.first_failure = first_failure
        message = str(self.args[0])
        if reason:
            message += f"; cancelled: {reason}"
        if first_failure is not None:
            message += f"\n\nfirst failed child: {first_failure.job_id} in "
            message += f"{first_failure.queue!r}: {first_failure.error}"
            if first_failure.traceback:
                message += f"\n{tail(first_failure.traceback)}"
        self.args = (message,)
        # Failure.__init__ ran through the MRO with the first line as description; the UI
        # shows the description and this metadata next to the step failure.
        self.description = message
        self.metadata = {
            "queue": MetadataValue.text(queue),
            "parent_id": MetadataValue.text(parent_id),
            "failed_count": MetadataValue.int(len(self.failed)),
            "failed_children": MetadataValue.json(capped(self.failed)),
        }
        if reason:
            self.metadata["cancelled"] = MetadataValue.text(reason)
        if first_failure is not None:
            self.metadata["first_failed_child"] = MetadataValue.text(first_failure.job_id)
            if first_failure.traceback:
                self.metadata["first_traceback"] = MetadataValue.text(tail(first_failure.traceback))
        self.allow_retries = False


def tail(traceback: str, limit: int | None = None) -> str:
    """The end of ``traceback`` (where the exception is), at most ``limit`` characters
    (:data:`TRACEBACK_SHOWN`) cut at a line start, marked when cut."""
    limit = TRACEBACK_SHOWN if limit is None else limit
    text = traceback.rstrip("\n")
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    if "\n" in cut:
        cut = cut[cut.index("\n") + 1 :].lstrip("\n")  # whole lines, no blank one first
    return f"[... {len(text) - len(cut)} characters cut]\n{cut}"


class NotABarrierFlow(InvalidFlow):
    """Raised when Dagster is handed a flow added without ``barrier=True`` to read: an
    asset's output, an input (an ``AssetSpec`` naming it, a sensor-launched run).

    Such a flow's parent is a job: released, it goes to a worker of its queue, which runs it
    on the children's results, and its completion ends the flow. A Dagster reader cannot end
    it (``close_flow`` refuses a worker-run flow), so it would be read while its parent waits
    for a worker - for good where no worker serves that queue - and nothing would mark it
    read. Nothing is read or requested for it; add flows that Dagster reads with
    ``barrier=True`` (``EchoMQResource.add_flow``'s default). ``queue`` and ``parent_id``
    name the flow.
    """

    def __init__(self, queue: str, parent_id: str, refused: str) -> None:
        super().__init__(
            f"flow {parent_id} in {queue!r} was added without barrier=True: its parent is a job "
            f"for a worker of {queue!r}, whose completion ends the flow, and no reader can "
            f"close it; {refused} - add flows that Dagster reads with add_flow(..., barrier=True)"
        )
        self.queue = queue
        self.parent_id = parent_id


def worker_run(client: EchoMQ, flows: Sequence[FlowRef]) -> list[FlowRef]:
    """The flows of ``flows`` whose parent exists and is run by a worker (no ``barrier``
    mark on its row), read in one pipelined step whatever their number. A missing flow is
    not listed (the wait names it)."""
    if not flows:
        return []
    # The row's own fields: the core's reads (snapshot, get_job) do not say whether a held
    # parent is a barrier, and a held flow is what the IO manager must judge.
    keys = [client.keys.job(f.queue, f.parent_id) for f in flows]
    rows = client.connection.execute([Call.cmd("HMGET", k, "state", "barrier") for k in keys])
    return [f for f, (state, barrier) in zip(flows, rows, strict=True) if state and not barrier]


@dataclass(frozen=True, slots=True)
class EmptyFlow(FlowRef):
    """The handle of a fan-out over an empty plan whose readers get an empty result
    (``EchoMQResource.fan_out(..., on_empty="empty")``): a ``FlowRef`` that names no flow on
    the server - a flow of no children is refused - so the asset's output has the type a
    flow's output has. The IO manager stores it as a marked handle and loads it as the empty
    result of a flow's read (``{}``, or a :class:`FlowStream` that yields nothing), without a
    wait or a Pump; the sensor requests no run for it (there is nothing to release).
    ``parent_id`` is the id the flow would have had (the metadata shows it)."""


def empty_body(flow: EmptyFlow) -> str:
    """What the handle of an empty plan holds: a flow's handle, marked empty."""
    return json.dumps({"queue": flow.queue, "parent_id": flow.parent_id, "empty": True})


class FlowStream(Iterable[tuple[str, Any]]):
    """A flow's results as ``(child id, result)`` pairs, read from the server one page
    (``EchoMQIOManager.page`` results) at a time, so memory stays flat at any N. Annotate an
    input with it to get one. ``total`` / ``processed``: the flow's counts.

    Each ``for`` (each ``iter()``) reads the flow again from its first page, so a step can
    make several passes (count, then write) without holding the results: the pairs are on
    the server, not in the stream. The flow is closed (when the IO manager closes what it
    reads) the first time a pass is read to its end; a closed flow keeps its results for its
    ``closed`` retention, so later passes read the same pairs."""

    def __init__(
        self,
        flow: FlowRef,
        snap: FlowSnapshot,
        pages: Callable[[], Iterator[tuple[str, Any]]],
    ):
        self.flow = flow
        self.total = snap.total
        self.processed = snap.processed
        self._pages = pages

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return self._pages()

    def __repr__(self) -> str:
        return f"FlowStream({self.flow.queue!r}, {self.flow.parent_id!r}, total={self.total})"


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


def handle_name(identifier: Sequence[str]) -> str:
    """The name the handle of one asset partition (or op output) is stored under."""
    return "dagster:" + "/".join(identifier)


def store_handle(client: EchoMQ, identifier: Sequence[str], flow: FlowRef) -> None:
    """Store ``flow`` as the handle of ``identifier``, replacing what was stored (an earlier
    run's flow, or empty plan). An :class:`EmptyFlow` has no flow to expire with, so its
    handle lives as long as an unread flow of its queue may (``unclosed_age``)."""
    if not isinstance(flow, EmptyFlow):
        client.save_ref(handle_name(identifier), flow)
        return
    key = client.keys.ref(handle_name(identifier))
    age = client.retention(flow.queue)["unclosed_age"]
    expiry = () if age is None else ("PX", max(1, int(float(age) * 1000)))
    client.connection.execute([Call.cmd("SET", key, empty_body(flow), *expiry)])


def read_handle(client: EchoMQ, identifier: Sequence[str]) -> FlowRef | None:
    """The flow last stored for ``identifier`` (an :class:`EmptyFlow` for an empty plan),
    or None if nothing was stored."""
    name = handle_name(identifier)
    (raw,) = client.connection.execute([Call.cmd("GET", client.keys.ref(name))])
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:  # written by something else: refused by type, as EchoMQ.load_ref does
        raise InvalidInput(f"reference {name!r} does not hold JSON: {raw[:80]!r}") from None
    flow = FlowRef.from_dict(data)
    if isinstance(data, dict) and data.get("empty") is True:
        return EmptyFlow(flow.queue, flow.parent_id)
    return flow


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


def flow_error(client: EchoMQ, snap: FlowSnapshot) -> FlowFailedError:
    """The error for a flow that failed or was cancelled, with its first failed child's
    traceback (one bounded read, ``child_failures``)."""
    failed = client.failed_children(snap.queue, snap.parent_id)
    reason = snap.error if snap.outcome == "cancelled" else None
    first = [f for f in client.child_failures(snap.queue, snap.parent_id, limit=1) if not f.ignored]
    return FlowFailedError(
        snap.queue, snap.parent_id, failed, reason or None, first[0] if first else None
    )


def wait_settled(
    client: EchoMQ,
    flow: FlowRef,
    *,
    timeout: float,
    stall_timeout: float | None,
    poll: float,
    log: DagsterLogManager | None = None,
    log_every: float = 10.0,
    queues: Sequence[str] = (),
) -> FlowSnapshot:
    """Poll until ``flow`` is released, failed or cancelled; return that snapshot.

    Raises ``JobNotFound`` at once if there is no such flow (expired, or another prefix),
    ``FlowTimeout`` after ``timeout`` s, or after ``stall_timeout`` s without a child
    settling while none ran (the message names the children's ``queues`` and what holds them
    up). What each read means and when the next comes: :class:`echomq_core.flows.waiting.FlowWait`.
    """
    wait = FlowWait(
        flow.queue,
        flow.parent_id,
        poll=poll,
        timeout=timeout,
        stall_timeout=stall_timeout,
        missing_ok=False,
    )
    next_log = wait.started + log_every
    where = f" in {', '.join(queues)}" if queues else ""
    while True:
        verdict = client.perform(wait.read(client.keys))
        snap = verdict.snap
        if verdict.kind == MISSING:  # the core's error: queue and id, and the closest queues
            raise client.perform(not_found(client.keys, flow.queue, flow.parent_id))
        if verdict.kind == STALLED:
            raise FlowTimeout(
                f"flow {flow.parent_id} in {flow.queue!r}: no child settled for "
                f"{stall_timeout}s ({snap.dependencies} outstanding{where}); "
                + (
                    verdict.hint
                    or "are workers running for those queues, and a Pump if they differ from "
                    "the parent's?"
                )
            )
        if verdict.kind == TIMED_OUT:
            why = f"; {verdict.hint}" if verdict.hint else ""
            raise FlowTimeout(
                f"flow {flow.parent_id} in {flow.queue!r} not released after {timeout}s "
                f"({snap.dependencies} outstanding{where}){why}"
            )
        if verdict.done:
            return snap
        now = time.monotonic()
        if log is not None and now >= next_log:
            next_log = now + log_every
            log.info(
                f"EchoMQ flow {flow.parent_id}: {snap.settled}/{snap.total} children settled "
                f"({snap.processed} processed, {snap.ignored} ignored), "
                f"{snap.dependencies} outstanding after {verdict.waited:.0f}s"
            )
        time.sleep(verdict.pause)


def wait_released(client: EchoMQ, flow: FlowRef, *, timeout: float, poll: float) -> FlowSnapshot:
    """Wait until ``flow`` is released; :class:`FlowFailedError` if it failed or was
    cancelled (:func:`wait_settled` without a stall limit or logging)."""
    snap = wait_settled(client, flow, timeout=timeout, stall_timeout=None, poll=poll)
    if snap.outcome != "released":
        raise flow_error(client, snap)
    return snap


def decode_partitions(raw: Any) -> dict[str, FlowRef]:
    """The flows of a :data:`FLOW_PARTITIONS` entry (metadata may arrive wrapped or plain)."""
    data = json.loads(getattr(raw, "value", raw) if not isinstance(raw, str) else raw)
    if isinstance(data, str):
        data = json.loads(data)
    return {str(k): FlowRef(str(v[0]), str(v[1])) for k, v in data.items()}
