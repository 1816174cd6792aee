"""Reading a barrier flow from outside, the way an orchestrator does: whether a parent is a
barrier at all, and what a reader takes of one once it is released.

A barrier flow (``add_flow(barrier=True)``) is read by someone other than a worker - an Airflow
sensor or waiting operator, its trigger, a Dagster IO manager - and closed by that reader. Two
reads here, each one operation for either driver (``EchoMQ.read_released`` on a worker,
``await AsyncEchoMQ.read_released`` in a triggerer):

* :func:`worker_run` - which of some flows are run by a worker (no barrier mark on the
  parent's row): a reader refuses those, since it could never close them. The snapshot does
  not say it, and a held flow is what a reader must judge.
* :func:`read_released` - what a reader returns once its flow is released: the results (HSCAN
  pages), the ignored failures, the failed children a success threshold tolerated (a bounded
  sample: they go into a task's summary), and the flow closed when it is a barrier flow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..models import FlowRef, FlowSnapshot, Serializer
from ..wire.calls import Call, Op
from ..wire.keyspace import Keyspace
from .lifecycle import close_flow
from .reads import ignored_failures, scan_page

#: Results per HSCAN page of :func:`read_released`'s values.
VALUES_PAGE = 1000
#: The most failed children :func:`read_released` reads of a flow released with failures.
SHOWN_FAILURES = 20


@dataclass(frozen=True, slots=True)
class ReleasedRead:
    """What :meth:`EchoMQ.read_released <echomq_core.EchoMQ.read_released>` read of a released
    flow.

    ``snap``: the snapshot it was given, its ``parent_state`` the one the close left when it
    closed the flow. ``values``: ``(child id, result)`` of every completed child, in no
    particular order (None unless asked for). ``ignored``: {child id: error} of the children
    that died under ignore-failure. ``failed``: at most ``failures`` of the fail-parent children
    a success threshold tolerated, {child id: error}. ``closed``: the state the close left
    (None: not closed - not asked, or not a barrier flow waiting for its reader)."""

    snap: FlowSnapshot
    values: list[tuple[str, Any]] | None
    ignored: dict[str, str]
    failed: dict[str, str]
    closed: str | None


def worker_run(ks: Keyspace, flows: Sequence[FlowRef]) -> Op[list[FlowRef]]:
    """The flows of ``flows`` whose parent exists and is run by a worker (no ``barrier`` mark
    on its row), read in one pipelined step whatever their number. A missing flow is not
    listed (a wait names it)."""
    if not flows:
        return []
    keys = [ks.job(f.queue, f.parent_id) for f in flows]
    rows = yield [Call.cmd("HMGET", k, "state", "barrier") for k in keys]
    return [f for f, (state, barrier) in zip(flows, rows, strict=True) if state and not barrier]


def read_released(
    ks: Keyspace,
    ser: Serializer,
    snap: FlowSnapshot,
    *,
    values: bool,
    close: bool,
    page: int = VALUES_PAGE,
    failures: int = SHOWN_FAILURES,
) -> Op[ReleasedRead]:
    """What a reader takes of its flow once released (``snap``, the read that found it so):
    see :class:`ReleasedRead`. ``values``: read every result, ``page`` per round trip.
    ``close``: close a released barrier flow (its ``closed`` retention starts)."""
    queue, parent_id = snap.queue, snap.parent_id
    pairs: list[tuple[str, Any]] | None = None
    if values:
        key, cursor, pairs = ks.processed(queue, parent_id), 0, []
        while True:
            cursor, found = yield from scan_page(key, cursor, page)
            pairs += [(child, ser.loads(raw)) for child, raw in found.items()]
            if cursor == 0:
                break
    ignored = yield from ignored_failures(ks, queue, parent_id)
    failed: dict[str, bytes] = {}
    if snap.failed:  # released with failures: a success threshold tolerated them
        _, failed = yield from scan_page(ks.failed(queue, parent_id), 0, failures)
    closed = None
    if close and snap.parent_state == "released":  # a barrier flow, now read
        closed = yield from close_flow(ks, queue, parent_id)
        snap = dataclasses.replace(snap, parent_state=closed)  # closing changes only that
    shown = {
        child: error.decode(errors="replace") for child, error in sorted(failed.items())[:failures]
    }
    return ReleasedRead(snap, pairs, ignored, shown, closed)
