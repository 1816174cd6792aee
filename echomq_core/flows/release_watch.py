"""Release watchers: the released barrier flows of a queue, each taken once.

A flow added outside an orchestrator (a service, a script, another scheduler) is released when
its last child settles. A watcher - the Airflow provider's event trigger
(:class:`~echomq_provider.triggers.released.EchoFlowReleasedTrigger`), or a script's loop over
:meth:`EchoMQ.take_released <echomq_core.EchoMQ.take_released>` - takes the flows released
after its cursor, in release order, so that something runs on each of them.

The cursor is ``<release ms>:<parent id>`` of the last flow the watcher took, kept on the
queue's slot under the watcher's name. A poll reads the queue's ``flows:released`` index past
the cursor: one round trip, which also renews the cursor's life. A take moves the cursor by
compare and set (``watch.lua``), so two readers of one watcher - two triggerers, a restarted
one while the old one still runs - never take the same flow: the one that loses gets the
cursor the winner set and reads on from there. A flow released while no reader ran is taken
by the next poll.

What a watcher sees: barrier flows released after it first polled (it starts at the then
current time, not at the queue's first flow), and still released when it polls (a flow another
reader closed or cancelled first is not announced). With ``close=True`` the watcher closes
what it takes, as a sensor closes what it read: the flow's ``closed`` retention starts, and
whoever runs on the announcement reads the flow until it ends.

Taken at most once: a reader that dies after the take and before it handed the flow on (the
Airflow triggerer between the take and the metadata database's write of the event, under a
second) loses that announcement; the flow itself is still there, in ``echomq flow ls``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..checks import check_int
from ..checks import text as _s
from ..errors import InvalidArgument
from ..wire.calls import Call, Lenient, Op, scored
from ..wire.keyspace import QUEUE_NAME_RE, Keyspace, check_queue

#: How long a watcher's cursor outlives its last poll, seconds (a week): a watcher gone longer
#: starts again from the time it comes back.
CURSOR_TTL = 7 * 86400
#: The most flows one take returns.
MAX_TAKE = 1000


@dataclass(frozen=True, slots=True)
class Released:
    """A released flow a watcher took: its reference, release time and size."""

    queue: str
    parent_id: str
    released_ms: int
    total: int
    ignored: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # every field, in their order (all plain values)


def check_watcher(name: object) -> str:
    """A watcher's name: what its cursor is kept under (:class:`InvalidArgument` otherwise)."""
    if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
        raise InvalidArgument(
            f"invalid watcher name {name!r:.80}: use 1-128 of letters, digits and . _ - / @ + "
            "(the name its cursor is kept under; give each watcher of a queue its own)"
        )
    return name


def _cursor(text: str) -> tuple[int, str]:
    ms, _, parent_id = text.partition(":")
    return int(ms), parent_id


def take_released(
    ks: Keyspace,
    queue: str,
    watcher: str,
    cursor: str | None,
    *,
    limit: int = 100,
    close: bool = False,
    ttl: float = CURSOR_TTL,
) -> Op[tuple[str, list[Released]]]:
    """One poll of watcher ``watcher``: the flows of ``queue`` released after ``cursor`` (at
    most ``limit``), taken - no other reader of this watcher gets them. ``cursor``: what the
    last poll returned, or None (read it from the server; a new watcher starts now). Returns
    the cursor to pass next and what this poll took: nothing when another reader took first
    (its cursor is returned: poll again)."""
    check_queue(queue)
    check_watcher(watcher)
    limit = check_int("limit", limit, 1, MAX_TAKE)
    if not isinstance(close, bool):
        raise InvalidArgument(f"close must be True or False, got {close!r}")
    key, ttl_ms = ks.watch(queue, watcher), int(ttl * 1000)
    if cursor is None:
        stored, now = yield [Call.cmd("GET", key), Call.cmd("TIME")]
        if stored is not None:
            cursor = _s(stored)
        else:  # a new watcher: from now on
            start = f"{int(now[0]) * 1000 + int(now[1]) // 1000}:"
            ((_, after),) = yield [Call.lua("watch", [key], ["", start, ttl_ms])]
            return _s(after), []
    after_ms, after_id = _cursor(cursor)
    found: list[tuple[str, int]] = []
    offset, page = 0, limit + 64
    while len(found) < limit:
        reply, _ = yield [
            Call.cmd(
                "ZRANGEBYSCORE", ks.flows(queue, "released"), after_ms, "+inf",
                "WITHSCORES", "LIMIT", offset, page,
            ),
            Call.cmd("PEXPIRE", key, ttl_ms),
        ]  # fmt: skip
        pairs = scored(reply)
        for member, score in pairs:
            pid, ms = _s(member), int(float(score))
            if (ms, pid) > (after_ms, after_id):
                found.append((pid, ms))
        if len(pairs) < page or found:  # the index ends, or only ties at after_ms came back
            break
        offset += page
    found = found[:limit]
    if not found:
        return cursor, []
    last = f"{found[-1][1]}:{found[-1][0]}"
    ((took, now_cursor),) = yield [Call.lua("watch", [key], [cursor, last, ttl_ms])]
    if not took:  # another reader took them first
        return _s(now_cursor), []
    rows = yield [Call.cmd("HMGET", ks.job(queue, pid), "total", "tolerated") for pid, _ in found]
    if close:  # lenient: one closed or cancelled meanwhile does not stop the others
        yield Lenient(
            [
                Call.lua("close", [*ks.queue_keys(queue), ks.job(queue, pid)], [pid])
                for pid, _ in found
            ]
        )
    taken = [
        Released(queue, pid, ms, int(total or 0), int(tolerated or 0))
        for (pid, ms), (total, tolerated) in zip(found, rows, strict=True)
        if total is not None  # expired since the read: nothing to announce
    ]
    return last, taken
