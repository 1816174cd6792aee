"""The dashboard's reads of a sharded queue (:mod:`echomq_core.flows.sharding`) under its logical
name: a page of its jobs merged from every shard, the oldest pending head over its shards, its
per-minute tallies summed. A plain queue (one shard) reads exactly as
:mod:`echomq_core.seeing.browse` and :mod:`echomq_core.queues.throughput` read it.

Why a merge and not one shard's page after another: each state's set is ordered by a score
that means the same on every shard (a lease deadline, a due time, a time of death or finish;
for pending the priority, then the shard's own arrival number, so shards interleave), so the
first ``offset + limit`` of each shard hold the page's rows whatever the shards' sizes. The
price is that a page reads ``K * (offset + limit)`` members (ids and scores only, one round
trip), so a merged list pages down to :data:`MAX_OFFSET`; a job further down is reached by
its id (its shard is a function of it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import InvalidArgument
from ..queues.throughput import Minute, read_minutes
from ..seeing.browse import (
    PAGE,
    STATES,
    QueuePage,
    _row,
    _scored,
    oldest_pending,
    queue_page,
    raise_state,
    with_leases,
)
from ..seeing.browse import ROW as ROW_FIELDS
from ..wire.calls import Call, Op
from ..wire.keyspace import Keyspace

#: The deepest offset a merged list of a sharded queue serves (each page reads the first
#: ``offset + limit`` members of every shard).
MAX_OFFSET = 10_000


def page_over(
    ks: Keyspace, shards: Sequence[str], state: str, offset: int = 0, limit: int = PAGE
) -> Op[QueuePage]:
    """A page of the jobs of a queue of ``shards`` (``shards[0]`` its name) in ``state``, in
    the server's order over every shard (see the module doc); each row's links take the
    logical name (a job page finds the shard from the id). Cost: two round trips - a ZCARD and
    a ZRANGE of ``offset + limit`` per shard, then an HMGET per row on its shard (an active
    page: the lease token too, and the workers it names). Refused with
    :class:`InvalidArgument` past :data:`MAX_OFFSET`."""
    if len(shards) == 1:
        return (yield from queue_page(ks, shards[0], state, offset, limit))
    if state not in STATES:
        raise_state(state)
    if offset > MAX_OFFSET:
        raise InvalidArgument(
            f"offset {offset:,} is past {MAX_OFFSET:,}: the list of sharded queue "
            f"{shards[0]!r} merges its {len(shards)} shards and pages that deep at most; "
            "find a job further down by its id"
        )
    keys = [ks.queue_key(s, state) for s in shards]
    newest_first = state in ("dead", "completed")
    rev = ["REV"] if newest_first else []
    replies = yield [
        *(Call.cmd("ZCARD", k) for k in keys),
        *(Call.cmd("ZRANGE", k, 0, offset + limit - 1, *rev, "WITHSCORES") for k in keys),
    ]
    k = len(shards)
    merged = sorted(
        ((score, shard, job_id)
         for shard, flat in zip(shards, replies[k:], strict=True)
         for job_id, score in _scored(flat)),
        key=lambda entry: entry[0],
        reverse=newest_first,
    )[offset : offset + limit]  # fmt: skip
    out = QueuePage(shards[0], state, sum(int(n) for n in replies[:k]), offset)
    if not merged:
        return out
    calls = [Call.cmd("HMGET", ks.job(shard, j), *ROW_FIELDS) for _, shard, j in merged]
    active = state == "active"
    if active:
        calls += [Call.cmd("HGET", ks.leases(shard), j) for _, shard, j in merged]
    got = yield calls
    rows, leases = got[: len(merged)], got[len(merged) :]
    out.rows = [_row(shard, j, sc, r) for (sc, shard, j), r in zip(merged, rows, strict=True)]
    if active:
        yield from with_leases(ks, out, leases)
    return out


def oldest_over(ks: Keyspace, shards: Mapping[str, Sequence[str]]) -> Op[dict[str, float | None]]:
    """:func:`~echomq_core.seeing.browse.oldest_pending` of each logical queue (``shards``: its
    physical queues): the oldest of its shards' heads (the same two round trips)."""
    ages = yield from oldest_pending(ks, [s for names in shards.values() for s in names])
    out: dict[str, float | None] = {}
    for queue, names in shards.items():
        found = [a for a in (ages.get(s) for s in names) if a is not None]
        out[queue] = max(found) if found else None
    return out


def minutes_over(ks: Keyspace, shards: Sequence[str], minutes: int = 60) -> Op[list[Minute]]:
    """:func:`~echomq_core.queues.throughput.read_minutes` of a queue of ``shards``: each minute's
    tallies summed over the shards (one round trip, one HGETALL per shard)."""
    from ..flows.sharding import together

    parts: list[list[Minute]] = yield from together([read_minutes(ks, s, minutes) for s in shards])
    if len(parts) == 1:
        return parts[0]
    return [
        Minute(
            same[0].at,
            sum(m.completed for m in same),
            sum(m.failed for m in same),
            sum(m.deaths for m in same),
        )
        for same in zip(*parts, strict=True)
    ]
