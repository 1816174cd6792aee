"""Reads of flows: one flow's results, counts, failures and state (each one read command, or one
script), a queue's root flows (:func:`list_flows`), a node's cap in use (:func:`flow_cap`) -
and, for a read of a flow that is not there, an error that says why (:func:`explained`)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, TypeVar

from ..checks import text as _s
from ..errors import JobNotFound
from ..models import FlowCap, FlowSnapshot, FlowSummary, Serializer
from ..wire.calls import Call, Op, scored
from ..wire.keyspace import Keyspace

T = TypeVar("T")


def pairs(flat: Any) -> dict[str, bytes]:
    """A hash read (a dict, or a flat list from a script) as {field: raw value}."""
    if isinstance(flat, dict):
        return {_s(k): v for k, v in flat.items()}
    return {_s(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


#: How many known queue names a missing flow's error lists.
SHOWN_QUEUES = 20


def missing_flow(prefix: str, queue: str, parent_id: str, names: Sequence[str]) -> JobNotFound:
    """The error of a read of flow ``parent_id`` in ``queue`` that is not there, given the
    keyspace's registered queue names: when ``queue`` is not one of them, the closest ones
    are suggested (as ``echomq queue stats`` does), since a typo'd queue or prefix is the
    likeliest cause; else the id is wrong, the flow was never added, or its retention ended."""
    why = "never added (a wrong id?), or expired with its retention"
    known = sorted(set(names))
    if queue in known:
        return JobNotFound(f"no flow {parent_id!r} in queue {queue!r}: {why}")
    if not known:
        return JobNotFound(
            f"no flow {parent_id!r} in queue {queue!r}: there are no queues under prefix "
            f"{prefix!r} (wrong prefix?)"
        )
    close = difflib.get_close_matches(queue, known, n=3, cutoff=0.6)
    listed = [*close, *(n for n in known if n not in close)][:SHOWN_QUEUES]
    more = f" and {len(known) - len(listed):,} more" if len(known) > len(listed) else ""
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return JobNotFound(
        f"no flow {parent_id!r} in queue {queue!r}: no queue {queue!r} under prefix "
        f"{prefix!r}{hint} (known: {', '.join(listed)}{more})"
    )


def not_found(ks: Keyspace, queue: str, parent_id: str) -> Op[JobNotFound]:
    """:func:`missing_flow` with the registry read (one round trip, on the error path only)."""
    (members,) = yield [Call.cmd("SMEMBERS", ks.queues())]
    return missing_flow(ks.prefix, queue, parent_id, [_s(m) for m in members])


def explained(ks: Keyspace, queue: str, parent_id: str, op: Op[T]) -> Op[T]:
    """``op``, a read of flow ``parent_id`` (of logical queue ``queue``) that raises
    :class:`JobNotFound` when there is no such flow; that error is replaced by
    :func:`not_found`'s, which names the queue and suggests the closest registered ones."""
    try:
        return (yield from op)
    except JobNotFound:
        pass
    raise (yield from not_found(ks, queue, parent_id)) from None


def _absent(queue: str, parent_id: str) -> JobNotFound:
    # the bare error of the reads below; the clients replace it through explained()
    return JobNotFound(f"no flow {parent_id!r} in queue {queue!r}")


def _of_flow(ks: Keyspace, queue: str, parent_id: str, read: Call) -> Op[Any]:
    """The reply of ``read``, a read of flow ``parent_id``'s keys, with the flow's row checked
    in the same round trip (EXISTS beside it, on the same slot): :class:`JobNotFound` when
    there is no such flow, so a typo'd id is not an empty result."""
    reply, exists = yield [read, Call.cmd("EXISTS", ks.job(queue, parent_id))]
    if not exists:
        raise _absent(queue, parent_id)
    return reply


def children_values(
    ks: Keyspace, queue: str, parent_id: str, ser: Serializer
) -> Op[dict[str, Any]]:
    """{child id: result} of every child that completed so far (HGETALL of ``:processed``);
    :class:`JobNotFound` when there is no such flow."""
    flat = yield from _of_flow(
        ks, queue, parent_id, Call.cmd("HGETALL", ks.processed(queue, parent_id))
    )
    return {k: ser.loads(v) for k, v in pairs(flat).items()}


def dependencies(ks: Keyspace, queue: str, parent_id: str) -> Op[int]:
    """Outstanding children (GET of ``:dependencies``); 0 when there is no counter (a plain
    job); :class:`JobNotFound` when there is no such row."""
    value = yield from _of_flow(
        ks, queue, parent_id, Call.cmd("GET", ks.dependencies(queue, parent_id))
    )
    return max(0, int(value)) if value is not None else 0


def ignored_failures(ks: Keyspace, queue: str, parent_id: str) -> Op[dict[str, str]]:
    """{child id: error} of children that died under ignore-dependency (``:unsuccessful``);
    :class:`JobNotFound` when there is no such flow."""
    flat = yield from _of_flow(
        ks, queue, parent_id, Call.cmd("HGETALL", ks.unsuccessful(queue, parent_id))
    )
    return {k: _s(v) for k, v in pairs(flat).items()}


def failed_children(ks: Keyspace, queue: str, parent_id: str) -> Op[dict[str, str]]:
    """{child id: error} of children that died and failed the parent (``:failed``);
    :class:`JobNotFound` when there is no such flow."""
    flat = yield from _of_flow(
        ks, queue, parent_id, Call.cmd("HGETALL", ks.failed(queue, parent_id))
    )
    return {k: _s(v) for k, v in pairs(flat).items()}


def check_exists(ks: Keyspace, queue: str, parent_id: str) -> Op[None]:
    """:class:`JobNotFound` when there is no row ``parent_id`` in ``queue`` (one EXISTS): for
    a read whose own reply cannot tell an empty flow from no flow, asked only when empty."""
    (exists,) = yield [Call.cmd("EXISTS", ks.job(queue, parent_id))]
    if not exists:
        raise _absent(queue, parent_id)


def first_page(
    ks: Keyspace, queue: str, parent_id: str, count: int
) -> Op[tuple[int, dict[str, bytes]]]:
    """The first HSCAN page of ``:processed`` (as :func:`scan_page`): :class:`JobNotFound`
    when there is no such flow."""
    scan = Call.cmd("HSCAN", ks.processed(queue, parent_id), 0, "COUNT", count)
    nxt, flat = yield from _of_flow(ks, queue, parent_id, scan)
    return int(nxt), pairs(flat)


def child_queues(ks: Keyspace, queue: str, parent_id: str) -> Op[list[str]]:
    """The queues of a flow node's direct children, as its hold recorded them (HGET of the
    row's ``cq``); [] when there is no such flow. A Pump serving these queues' outboxes
    delivers the node's cross-queue children."""
    (raw,) = yield [Call.cmd("HGET", ks.job(queue, parent_id), "cq")]
    return _s(raw).split() if raw else []


def scan_page(key: str, cursor: int, count: int) -> Op[tuple[int, dict[str, bytes]]]:
    """One HSCAN page of a result hash: (next cursor, {field: raw value}); cursor 0 ends."""
    ((nxt, flat),) = yield [Call.cmd("HSCAN", key, cursor, "COUNT", count)]
    return int(nxt), pairs(flat)


def snapshot(ks: Keyspace, queue: str, parent_id: str) -> Op[FlowSnapshot]:
    """Parent state, N, outstanding, the three record counts, a threshold's allowance and a
    cap, read atomically."""
    ((state, total, deps, processed, ignored, failed, error, repairs, *rest),) = yield [
        Call.lua(
            "flow_snapshot",
            [*ks.queue_keys(queue), *ks.parent_keys(queue, parent_id)],
            [parent_id],
        )
    ]
    return FlowSnapshot(
        queue,
        parent_id,
        _s(state) if state else None,
        int(total) if total else 0,
        max(0, int(deps)) if deps else 0,
        int(processed),
        int(ignored),
        int(failed),
        _s(error) if error else None,
        int(repairs),
        int(rest[0]) if rest and rest[0] is not None else None,
        int(rest[1]) if len(rest) > 1 and rest[1] is not None else None,
    )


def flow_cap(ks: Keyspace, queue: str, parent_id: str) -> Op[FlowCap | None]:
    """A node's cap and how much of it is in use (two round trips: the row's cap and child
    queues, then each child queue's gate); None when the node has no cap (or no row)."""
    ((cap, cq),) = yield [Call.cmd("HMGET", ks.job(queue, parent_id), "cap", "cq")]
    if cap is None:
        return None
    queues = _s(cq).split() if cq else []
    calls = []
    for child_queue in queues:
        waiting, counts = ks.gate_keys(child_queue, queue, parent_id)
        calls += [Call.cmd("HMGET", counts, "admitted", "cap"), Call.cmd("ZCARD", waiting)]
    replies = (yield calls) if calls else []
    shares: dict[str, tuple[int, int]] = {}
    waiting_total = 0
    for i, child_queue in enumerate(queues):
        (admitted, share), waiting = replies[2 * i], replies[2 * i + 1]
        if share is not None:
            shares[child_queue] = (int(admitted or 0), int(share))
        waiting_total += int(waiting)
    return FlowCap(
        queue,
        parent_id,
        int(cap),
        sum(a for a, _ in shares.values()),
        waiting_total,
        shares,
    )


def list_flows(
    ks: Keyspace, queue: str, states: Sequence[str], *, offset: int, limit: int
) -> Op[list[FlowSummary]]:
    """Root flows of ``queue`` in ``states`` (each state's index, oldest first): a page of
    ``limit`` starting at ``offset`` of each index. Two round trips."""
    ranges = yield [
        Call.cmd("ZRANGE", ks.flows(queue, state), offset, offset + limit - 1, "WITHSCORES")
        for state in states
    ]
    found: list[tuple[str, str, float]] = []
    for state, flat in zip(states, ranges, strict=True):
        for member, score in scored(flat):
            found.append((state, _s(member), float(score)))
    if not found:
        return []
    calls = [Call.cmd("TIME")]
    for _, pid, _ in found:
        calls.append(
            Call.cmd(
                "HMGET",
                ks.job(queue, pid),
                "state",
                "total",
                "created",
                "error",
                "cap",
                "allow",
                "tolerated",
            )
        )
        calls.append(Call.cmd("GET", ks.dependencies(queue, pid)))
    (now_s, now_us), *replies = yield calls
    now_ms = int(now_s) * 1000 + int(now_us) // 1000
    out = []
    for i, (index, pid, since) in enumerate(found):
        (state, total, created, error, cap, allow, tolerated) = replies[2 * i]
        deps = replies[2 * i + 1]
        n = int(total) if total else 0
        out.append(
            FlowSummary(
                queue,
                pid,
                # a completed root's row still says 'pending' (membership of `completed`
                # says it finished, complete.lua): its index says what it is
                _s(state) if state and index != "completed" else index,
                n,
                n - (max(0, int(deps)) if deps is not None else 0),
                (now_ms - int(created)) / 1000 if created else None,
                (now_ms - int(since)) / 1000,
                _s(error) if error else None,
                None if cap is None else int(cap),
                None if allow is None else int(allow),
                int(tolerated or 0),
            )
        )
    return out
