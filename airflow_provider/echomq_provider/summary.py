"""What a waiting task says of a flow: its progress line, and once it is released, its
summary (the XCom) and its values in spec order - one home for the sensor and the waiting
operator (:mod:`echomq_provider.waiting`, on a worker) and for the trigger (in the triggerer,
when it ends the task itself)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, NamedTuple

from echomq_core import AsyncEchoMQ, EchoMQ, EchoMQError, FlowSnapshot, ReleasedRead
from echomq_core.integration import traceback_tail

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
    client: EchoMQ, snap: FlowSnapshot, *, return_values: bool, close_flow: bool
) -> Reading:
    """What a waiting task returns once its flow is released (``snap``): the values in spec
    order (``return_values``; HSCAN pages), the summary, and a barrier flow closed
    (``close_flow``) - the core's :meth:`~echomq_core.EchoMQ.read_released`, on a worker."""
    return reading(
        client.read_released(
            snap, values=return_values, close=close_flow, page=VALUES_PAGE, failures=MAX_REPORTED
        )
    )


async def aread_released(
    client: AsyncEchoMQ, snap: FlowSnapshot, *, return_values: bool, close_flow: bool
) -> Reading:
    """:func:`read_released` with the async client (the trigger, in the triggerer)."""
    read = await client.read_released(
        snap, values=return_values, close=close_flow, page=VALUES_PAGE, failures=MAX_REPORTED
    )
    return reading(read)


def reading(read: ReleasedRead) -> Reading:
    """The task's view of what the core read: values and failed children by label."""
    snap, parent_id = read.snap, read.snap.parent_id
    values = None if read.values is None else values_in_order(parent_id, snap.total, read.values)
    summary = summary_of(snap, read.ignored)
    if read.failed:
        summary["failed_children"] = {
            str(child_label(parent_id, child)): error for child, error in read.failed.items()
        }
    return Reading(snap, summary, values, read.closed)


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
    error and the tail of its last attempt's traceback (whole lines, at most
    :data:`~echomq_core.integration.SHOWN_TRACEBACK` characters) - a
    readable size in Airflow's log and UI. Empty when none died (a flow cancelled with no
    dead child) or they cannot be read (the failure being raised matters more)."""
    try:
        first = client.first_failure(queue, parent_id)
    except EchoMQError:
        return ""
    if first is None:
        return ""
    text = f"\nFirst failed child {first.job_id} (queue {first.queue!r}): {first.error}"
    if first.traceback:
        text += "\n" + traceback_tail(first.traceback)
    return text
