"""Reading a flow from Dagster: how a step waits for it, and its results as a stream.

Waiting (:func:`wait_settled`) polls the flow's snapshot until it is released, failed or
cancelled (the core's :class:`~echomq_core.FlowWait` judges each read and sets the next
pause), and logs progress every ``log_every`` seconds. It gives up with the core's
``FlowTimeout`` after ``timeout`` seconds in all, or sooner when for ``stall_timeout`` seconds
no child settled and no job of the children's queues was running (leased) - the usual reason
is that no worker serves those queues, and the error names them rather than blocking the step
for the full timeout. Children that run long (leased, no settle yet) are not a stall.

Where a flow's handle lives: :mod:`dagster_echomq.handles`; what it leaves in metadata:
:mod:`dagster_echomq.metadata`; the errors of a flow that cannot be read:
:mod:`dagster_echomq.failures`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from dagster import DagsterLogManager

from echomq_core import EchoMQ, FlowRef, FlowSnapshot, FlowTimeout, FlowWait
from echomq_core.integration import MISSING, STALLED, TIMED_OUT

from .failures import flow_error


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
    up). What each read means and when the next comes: :class:`echomq_core.FlowWait`.
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
        verdict = client.verdict(wait)
        snap = verdict.snap
        if verdict.kind == MISSING:  # the core's error: queue and id, and the closest queues
            raise client.missing_flow_error(flow.queue, flow.parent_id)
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
