"""What a waiting task says of a flow: its progress line, and once it is released, its
summary (the XCom) and its values in spec order - one home for the sensor and the waiting
operator (:mod:`echomq_provider.waiting`, on a worker) and for the trigger (in the triggerer,
when it ends the task itself)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any, NamedTuple

from echomq_core import EchoMQ, EchoMQError, FlowSnapshot
from echomq_core.flows import lifecycle
from echomq_core.flows import reads as flows
from echomq_core.models import Serializer
from echomq_core.wire.connection import Op
from echomq_core.wire.keyspace import Keyspace

from .flow_specs import child_label, labeller

#: The XCom key of the summary when the return value holds the values.
FLOW_KEY = "flow"
#: The most failed or ignored children a summary or an event names (the rest are counted):
#: both live in the metadata DB.
MAX_REPORTED = 20
#: The most seconds between two progress lines.
PROGRESS_EVERY = 30.0
#: Results per HSCAN page when ``return_values`` reads a flow's values.
VALUES_PAGE = 1000
#: The most bytes of a failed child's traceback a failure message shows (its tail).
TRACEBACK_TAIL = 4096


def progress_line(snap: FlowSnapshot) -> str:
    """``Flow <id>: settled k of N (processed p, ignored i, failed f)``."""
    return (
        f"Flow {snap.parent_id}: settled {snap.settled} of {snap.total} (processed "
        f"{snap.processed}, ignored {snap.ignored}, failed {snap.failed})"
    )


def log_progress(log: logging.Logger | Any, snap: FlowSnapshot) -> None:
    """The progress line at INFO, or a warning when there is no such flow."""
    if snap.outcome == "missing":
        log.warning(
            "No flow %s in queue %r (wrong id or prefix?); waiting", snap.parent_id, snap.queue
        )
    else:
        log.info("%s", progress_line(snap))


class Reading(NamedTuple):
    """What :func:`read_released` read of a released flow."""

    snap: FlowSnapshot  # after the close, when it closed the flow
    summary: dict[str, Any]
    values: Any  # with return_values; else None
    closed: str | None  # the state close_flow left, when it closed the flow


def read_released(
    ks: Keyspace, ser: Serializer, snap: FlowSnapshot, *, return_values: bool, close_flow: bool
) -> Op[Reading]:
    """What a waiting task returns once its flow is released (``snap``): the values in spec
    order (``return_values``; HSCAN pages), the summary, and a barrier flow closed
    (``close_flow``) - one operation, driven by the sync client on a worker
    (``client.perform``) and by the async one in the triggerer (``connection.perform``)."""
    queue, parent_id = snap.queue, snap.parent_id
    values = None
    if return_values:
        key, cursor, pairs = ks.processed(queue, parent_id), 0, []
        while True:
            cursor, page = yield from flows.scan_page(key, cursor, VALUES_PAGE)
            pairs += [(child, ser.loads(raw)) for child, raw in page.items()]
            if cursor == 0:
                break
        values = values_in_order(parent_id, snap.total, pairs)
    ignored = yield from flows.ignored_failures(ks, queue, parent_id)
    failed: dict[str, bytes] = {}
    if snap.failed:  # released with failures: a success threshold tolerated them
        _, failed = yield from flows.scan_page(ks.failed(queue, parent_id), 0, MAX_REPORTED)
    closed = None
    if close_flow and snap.parent_state == "released":  # a barrier flow, now read
        closed = yield from lifecycle.close_flow(ks, queue, parent_id)
        snap = dataclasses.replace(snap, parent_state=closed)  # closing changes only that
    summary = summary_of(snap, ignored)
    if failed:
        summary["failed_children"] = {
            str(child_label(parent_id, child)): error.decode(errors="replace")
            for child, error in sorted(failed.items())[:MAX_REPORTED]
        }
    return Reading(snap, summary, values, closed)


def summary_of(snap: FlowSnapshot, ignored: dict[str, str]) -> dict[str, Any]:
    """What a waiting task returns for a released flow (its XCom): the reference and counts,
    and at most :data:`MAX_REPORTED` ignored failures by label - small whatever N."""
    summary = {key: value for key, value in snap.to_dict().items() if key != "parent_state"}
    summary["state"] = snap.parent_state
    summary["ignored_failures"] = {
        str(child_label(snap.parent_id, child)): error
        for child, error in sorted(ignored.items())[:MAX_REPORTED]
    }
    return summary


def values_in_order(parent_id: str, total: int, pairs: Iterable[tuple[str, Any]]) -> Any:
    """``return_values``: the values in spec order (``None`` where a failure was ignored), or
    ``{key: value}`` when the specs gave keys."""
    label_of = labeller(parent_id)
    labelled = [(label_of(child), value) for child, value in pairs]
    if any(isinstance(label, str) for label, _ in labelled):
        return {str(label): value for label, value in labelled}
    ordered: list[Any] = [None] * total
    for label, value in labelled:
        if isinstance(label, int) and 0 <= label < total:
            ordered[label] = value
    return ordered


def released_line(snap: FlowSnapshot) -> str:
    """``Flow <id> released: k results, i ignored failures``."""
    return (
        f"Flow {snap.parent_id} released: {snap.processed} results, {snap.ignored} ignored failures"
    )


def log_released(log: logging.Logger | Any, read: Reading) -> None:
    """:func:`released_line` at INFO; a WARNING when a success threshold let the flow be
    released with failed children, naming how many and (at most :data:`MAX_REPORTED`) which."""
    snap = read.snap
    if not snap.failed:
        log.info("%s", released_line(snap))
        return
    named = ", ".join(read.summary.get("failed_children", {}))
    log.warning(
        "%s; %d of %d children failed (min_success allows %s): %s",
        released_line(snap),
        snap.failed,
        snap.total,
        snap.allowed,
        named,
    )


def first_failure(client: EchoMQ, queue: str, parent_id: str) -> str:
    """What a waiting task's failure message adds: the first fail-parent child that died, its
    error and the tail (:data:`TRACEBACK_TAIL` bytes) of its last attempt's traceback - a
    readable size in Airflow's log and UI. Empty when none died (a flow cancelled with no
    dead child) or they cannot be read (the failure being raised matters more)."""
    try:
        failures = client.child_failures(queue, parent_id, limit=1)
    except EchoMQError:
        return ""
    if not failures or failures[0].ignored:
        return ""
    first = failures[0]
    text = f"\nFirst failed child {first.job_id} (queue {first.queue!r}): {first.error}"
    if first.traceback:
        raw = first.traceback.encode()
        cut = raw[-TRACEBACK_TAIL:].decode(errors="ignore")
        if len(raw) > TRACEBACK_TAIL:
            cut = f"[traceback cut to its last {TRACEBACK_TAIL // 1024} KiB]\n..." + cut
        text += "\n" + cut.rstrip()
    return text
