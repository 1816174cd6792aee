"""What failed in a flow, and why: its dead children with their errors and tracebacks; and,
for a flow that does not settle, what holds it up (:func:`stall_reading`).

A flow's parent records each dead child's id and one-line error (``:failed`` for fail-parent
children, ``:unsuccessful`` for ignored ones); the traceback of the child's last attempt is on
the child's own row (the ``traceback`` field the fail script keeps), in whichever of the
parent's child queues holds it. :func:`child_failures` joins the two in a bounded number of
round trips, whatever N: one for the parent's records, one for the rows of the children it
reports (each looked up in every child queue the parent recorded, pipelined), and one more per
level when a failed child is itself a flow (its own first failures stand for it: what a user
debugging a nested fan-out wants is the leaf that raised).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..checks import text as _s
from ..models import ChildFailure
from ..wire.calls import Call, Op
from ..wire.keyspace import Keyspace, derived_index

#: How deep a failed sub-flow is followed to the leaf that raised (trees are rarely deeper).
MAX_DEPTH = 8


def child_failures(ks: Keyspace, queue: str, parent_id: str, limit: int) -> Op[list[ChildFailure]]:
    """The flow's dead children, fail-parent failures first, then ignored ones, at most
    ``limit`` (each kind in spec order among the first page its hash scan returns: a flow
    with many ignored failures is not read whole); [] when nothing died or there is no such
    flow. A failed child that is a flow
    of its own is replaced by its own failures (up to :data:`MAX_DEPTH` levels)."""
    found: list[ChildFailure] = []
    yield from _collect(ks, queue, parent_id, limit, 0, found)
    return found


def _collect(
    ks: Keyspace, queue: str, parent_id: str, limit: int, depth: int, found: list[ChildFailure]
) -> Op[None]:
    want = limit - len(found)
    if want <= 0:
        return
    failed, ignored, cq = yield [
        Call.cmd("HSCAN", ks.failed(queue, parent_id), 0, "COUNT", want),
        Call.cmd("HSCAN", ks.unsuccessful(queue, parent_id), 0, "COUNT", want),
        Call.cmd("HGET", ks.job(queue, parent_id), "cq"),
    ]
    chosen = [(k, v, False) for k, v in _page(failed)]
    chosen += [(k, v, True) for k, v in _page(ignored)]
    chosen = sorted(chosen, key=lambda c: (c[2], _order(parent_id, c[0])))[:want]
    if not chosen:
        return
    queues = _s(cq).split() if cq else [queue]
    calls = [
        Call.cmd("HMGET", ks.job(q, child_id), "error", "traceback", "total")
        for child_id, _, _ in chosen
        for q in queues
    ]
    rows = yield calls
    for i, (child_id, error, ignored_) in enumerate(chosen):
        here = rows[i * len(queues) : (i + 1) * len(queues)]
        at = next((j for j, row in enumerate(here) if any(v is not None for v in row)), None)
        if at is None:  # the row expired with its flow, or was never landed: the record stays
            found.append(ChildFailure(queue, child_id, _s(error), None, ignored_))
            continue
        row_error, trace, total = here[at]
        if total is not None and depth < MAX_DEPTH and not ignored_:
            before = len(found)
            yield from _collect(ks, queues[at], child_id, limit, depth + 1, found)
            if len(found) > before:
                continue
        found.append(
            ChildFailure(
                queues[at],
                child_id,
                _s(row_error) if row_error is not None else _s(error),
                _s(trace) if trace is not None else None,
                ignored_,
            )
        )
        if len(found) >= limit:
            return


def _page(reply: Any) -> list[tuple[str, bytes]]:
    """The fields of one HSCAN reply (cursor, flat field/value list)."""
    _, flat = reply
    if isinstance(flat, dict):
        return [(_s(k), v) for k, v in flat.items()]
    return [(_s(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]


def _order(parent_id: str, child_id: str) -> tuple[int, str]:
    """Children in spec order where their ids are derived (:func:`derived_index`), else by
    id."""
    index = derived_index(parent_id, child_id)
    return (1 << 62, child_id) if index is None else (index, "")


class Stall(NamedTuple):
    """What a flow that does not settle shows in its direct children's queues: whether a job of
    one of them is running (leased: a child that runs long is not a stall), and why it may not
    be settling ('' when nothing stands out)."""

    busy: bool
    hint: str


def stall_reading(ks: Keyspace, queue: str, parent_id: str) -> Op[Stall]:
    """Read :class:`Stall` from the flow's direct children's queues (two round trips). The
    hint names an outbox holding signals that no drainer holds the lease of (no worker serves
    that queue and no Pump runs), and jobs pending that nothing claims."""
    (cq,) = yield [Call.cmd("HGET", ks.job(queue, parent_id), "cq")]
    queues = _s(cq).split() if cq else []
    if not queues:
        return Stall(False, "")
    replies = yield [
        call
        for q in queues
        for call in (
            Call.cmd("LLEN", ks.outbox(q)),
            Call.cmd("EXISTS", ks.outbox_lease(q)),
            Call.cmd("ZCARD", ks.pending(q)),
            Call.cmd("ZCARD", ks.active(q)),
        )
    ]
    said = []
    busy = False
    for i, q in enumerate(queues):
        outbox, drained, pending, active = (int(x) for x in replies[4 * i : 4 * i + 4])
        busy = busy or active > 0
        if outbox and not drained:
            said.append(
                f"the outbox of {q!r} holds {outbox} signal(s) and nothing drains it (run a "
                f"worker for {q!r}, or `echomq pump {q}`)"
            )
        if pending and not active:
            said.append(
                f"{q!r} has {pending} pending job(s) and none running: does a worker serve it?"
            )
    return Stall(busy, "; ".join(said))


#: The most characters of a traceback a failure message shows (its tail, whole lines): what
#: the Airflow provider and the Dagster integration put in a failed task's or step's message.
SHOWN_TRACEBACK = 4096


def traceback_tail(text: str, limit: int = SHOWN_TRACEBACK) -> str:
    """The end of ``text`` (where the exception is), at most ``limit`` characters cut at a
    line start, behind a line that says how much was cut: a traceback sized for a failure
    message in an orchestrator's log and UI (the row keeps up to
    :data:`~echomq_core.models.MAX_TRACEBACK` bytes)."""
    text = text.rstrip("\n")
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    if "\n" in cut:
        cut = cut[cut.index("\n") + 1 :].lstrip("\n")  # whole lines, no blank one first
    return f"[... {len(text) - len(cut)} characters cut]\n{cut}"
