"""Sharded queues: one logical queue served by K physical queues, each on its own slot.

A queue is one hash tag, so one Cluster slot, so one master: a fan-out into one queue runs on
one master's script thread whatever the Cluster's size. A sharded queue ``q`` is K physical
queues; shard 0 is ``q`` itself (so K = 1 is exactly a plain queue) and shard i > 0 is
``q+s<i>.<n>``, a queue like any other, whose tail ``n`` is picked when the shards are
configured so that on a Cluster the K shards land on distinct masters (from ``CLUSTER SLOTS``,
each master in turn) and on standalone their slots spread over the slot space. Every script
stays single-slot: a child in another shard than its parent's queue is a cross-queue child
(outbox + Pump).

Invariants:

* The names are stored in the logical queue's ``config`` hash (field ``shards``, the K names
  space-separated; absent for K = 1) and never recomputed on read, so every client agrees
  whatever the topology does later; clients cache them per process.
* A job's shard is a function of its id (CRC-32 of the id mod K): the same explicit id always
  lands on the same shard, so a re-add dedupes and a lookup by id knows where to look.
* The shard count changes only while every shard is empty (:class:`QueueInUse` otherwise):
  jobs already placed keep their shard, so a change would strand lookups by id. Processes
  that cached the old names keep using them until restarted (what they add to a shard the new
  names lack waits for a worker that serves it): restart every client after a change.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from ..checks import check_int
from ..checks import text as _s
from ..control.groups import Rules
from ..errors import InvalidArgument, QueueInUse
from ..wire.calls import Call, Op
from ..wire.keyspace import FLOW_INDEXES, Keyspace, check_queue
from ..wire.slots import SLOTS, key_slot

T = TypeVar("T")

#: The most shards a queue takes: more than any Cluster's useful spread of one fan-out, and a
#: bound on what a worker serving it holds (one wake-up waiter per slot on a Cluster).
MAX_SHARDS = 64
#: The ``config`` field holding the shard names.
FIELD = "shards"
#: The longest logical name a sharded queue may have: its shard names add ``+s<i>.<n>``.
MAX_SHARDED_NAME = 112
#: How many tails are tried per shard before giving up (a slot owned by the wanted master is
#: found within a few tries per master; this bounds a topology where it is not).
MAX_TRIES = 200_000

Shards = tuple[str, ...]


def shard_of(shards: Shards, job_id: str) -> str:
    """The physical queue of ``job_id`` in a queue of ``shards``."""
    if len(shards) == 1:
        return shards[0]
    return shards[zlib.crc32(job_id.encode()) % len(shards)]


def logical_of(cache: Mapping[str, Shards], name: str) -> str:
    """The logical queue ``name`` is a shard of, as far as ``cache`` (a client's shard cache)
    knows; ``name`` itself otherwise. What hooks and logs show for a physical queue."""
    for queue, names in cache.items():
        if len(names) > 1 and name in names:
            return queue
    return name


def shard_name(queue: str, index: int, tail: int) -> str:
    return f"{queue}+s{index}.{tail}"


def _slot(name: str) -> int:
    return key_slot(name.encode())


def _owners(reply: Any) -> list[str]:
    """Slot -> master address, from a ``CLUSTER SLOTS`` reply."""
    owner = [""] * SLOTS
    for entry in reply:
        start, end, master = int(entry[0]), int(entry[1]), entry[2]
        where = f"{_s(master[0])}:{int(master[1])}"
        for slot in range(start, end + 1):
            owner[slot] = where
    return owner


def choose(queue: str, count: int, owners: Sequence[str] | None) -> Shards:
    """The names of ``count`` shards of ``queue``: shard 0 is ``queue``; shard i takes the first
    tail whose slot is free of the others and falls, on a Cluster (``owners``: slot -> master),
    on the i-th master after shard 0's in address order (distinct masters while there are
    enough), on standalone in the i-th of ``count`` equal stretches of the slot space from
    shard 0's slot."""
    first = _slot(queue)
    names, used = [queue], {first}
    masters = sorted({o for o in owners if o}) if owners is not None else []
    home = masters.index(owners[first]) if owners is not None and owners[first] in masters else 0
    width = max(1, SLOTS // count)
    for index in range(1, count):
        want = masters[(home + index) % len(masters)] if masters else ""
        low = (first + index * SLOTS // count) % SLOTS
        for tail in range(MAX_TRIES):
            name = shard_name(queue, index, tail)
            slot = _slot(name)
            if slot in used:
                continue
            if owners[slot] == want if owners is not None else (slot - low) % SLOTS < width:
                names.append(check_queue(name))
                used.add(slot)
                break
        else:  # pragma: no cover - a slot map with a master owning (almost) no slot
            raise InvalidArgument(f"no slot found for shard {index} of queue {queue!r}")
    return tuple(names)


def parse(queue: str, raw: Any) -> Shards:
    """The shards a ``config`` field holds (absent: the queue alone)."""
    if raw is None:
        return (queue,)
    names = tuple(_s(raw).split())
    return names if names and names[0] == queue else (queue,)


def load(ks: Keyspace, names: Iterable[str]) -> Op[dict[str, Shards]]:
    """The shards of each queue in ``names``, read in one step (one HGET each)."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    replies = yield [Call.cmd("HGET", ks.config(q), FIELD) for q in wanted]
    return {q: parse(q, raw) for q, raw in zip(wanted, replies, strict=True)}


def resolve(ks: Keyspace, cache: dict[str, Shards], names: Iterable[str]) -> Op[dict[str, Shards]]:
    """The shards of ``names``, from ``cache`` and, for those not in it, the server (one step;
    none when every name is cached), remembered in ``cache``."""
    wanted = set(names)
    missing = [q for q in wanted if q not in cache]
    if missing:
        cache.update((yield from load(ks, missing)))
    return {q: cache[q] for q in wanted}


def resolve_for_add(
    ks: Keyspace, cache: dict[str, Shards], rules: Rules, names: Iterable[str]
) -> Op[tuple[dict[str, Shards], dict[str, str]]]:
    """:func:`resolve`, and the group rules of ``names`` (:mod:`echomq_core.control.groups`):
    those never read are read in the same step as the shards not cached (none when all are
    known). Returns the shards and the rules that exist (queue -> payload key)."""
    wanted = set(names)
    missing = sorted(q for q in wanted if q not in cache)
    unseen = rules.unseen(wanted)
    if missing or unseen:
        reads = [Call.cmd("HGET", ks.config(q), FIELD) for q in missing]
        replies = yield [*reads, *rules.read_calls(ks, unseen)]
        cache.update((q, parse(q, raw)) for q, raw in zip(missing, replies, strict=False))
        rules.take(unseen, replies[len(missing) :])
    return {q: cache[q] for q in wanted}, rules.current(wanted)


#: The per-queue sets that say a queue holds jobs or flows (pending, active, delayed, dead,
#: completed, the root-flow indexes) and its outbox.
_HOLDING = (
    "pending",
    "active",
    "delayed",
    "dead",
    "completed",
    *(f"flows:{state}" for state in FLOW_INDEXES),
)


def holding(ks: Keyspace, queues: Iterable[str]) -> Op[dict[str, int]]:
    """Per queue, how many entries its job and flow indexes and its outbox hold (one step)."""
    names = sorted(set(queues))
    calls = []
    for q in names:
        calls += [Call.cmd("ZCARD", ks.queue_key(q, part)) for part in _HOLDING]
        calls.append(Call.cmd("LLEN", ks.outbox(q)))
    replies = yield calls
    per = len(_HOLDING) + 1
    return {q: sum(int(r) for r in replies[i * per : (i + 1) * per]) for i, q in enumerate(names)}


def configure(ks: Keyspace, queue: str, count: Any, is_cluster: bool) -> Op[Shards]:
    """Give ``queue`` ``count`` shards (1..:data:`MAX_SHARDS`) and return their names.

    Refused with :class:`InvalidArgument` for a count out of range or a name too long to
    shard, and with :class:`QueueInUse` (nothing written) while any current or chosen shard
    holds jobs, flows or outbox signals, or while it has a rate limit below ``count`` per
    window (a rate limit is split over the shards: :mod:`echomq_core.control.rates`). Setting the
    count a queue already has keeps its names. The emptiness check and the write are two
    steps, not one atomic script (the shards are on several slots): configure a queue before
    anything adds to it."""
    check_queue(queue)
    count = check_int("shards", count, 1, MAX_SHARDS)
    if count > 1 and len(queue) > MAX_SHARDED_NAME:
        raise InvalidArgument(
            f"queue name {queue[:60]!r} is {len(queue)} characters; a sharded queue's name "
            f"takes at most {MAX_SHARDED_NAME} (its shards add '+s<i>.<n>')"
        )
    current = (yield from load(ks, [queue]))[queue]
    if len(current) == count:
        return current
    owners = None
    if is_cluster and count > 1:
        (reply,) = yield [Call.cmd("CLUSTER", "SLOTS")]
        owners = _owners(reply)
    names = choose(queue, count, owners) if count > 1 else (queue,)
    # a rate limit is split again over the new shards (refused, before anything is written,
    # when it is below their count: see echomq_core.control.rates)
    from ..control import rates

    read = [Call.cmd("HGET", ks.config(queue), f) for f in (rates.FIELD, rates.TOTAL)]
    limit = rates.stored(*(yield read))
    rate_writes = [] if limit is None else rates.writes(ks, names, limit)
    dropped = [q for q in current if q not in names]  # their shares no longer count
    rate_writes += [Call.cmd("HDEL", ks.config(q), rates.FIELD, rates.TOTAL) for q in dropped]
    held = yield from holding(ks, set(current) | set(names))
    busy = {q: n for q, n in held.items() if n}
    if busy:
        shown = ", ".join(f"{q} ({n})" for q, n in sorted(busy.items()))
        raise QueueInUse(
            f"queue {queue!r} cannot change from {len(current)} to {count} shards: it holds "
            f"jobs or flows ({shown}); the count changes only while every shard is empty"
        )
    if count == 1:
        yield [Call.cmd("HDEL", ks.config(queue), FIELD), *rate_writes]
        return names
    # the new shards take the queue's settings (retention), so every shard sweeps alike; the
    # rate's fields are the shares just computed, not shard 0's
    (flat,) = yield [Call.cmd("HGETALL", ks.config(queue))]
    from .reads import pairs

    own = {FIELD, rates.FIELD, rates.TOTAL}
    settings = [x for k, v in pairs(flat).items() if k not in own for x in (k, v)]
    copies = [Call.cmd("HSET", ks.config(q), *settings) for q in names[1:]] if settings else []
    yield [*copies, *rate_writes, Call.cmd("HSET", ks.config(queue), FIELD, " ".join(names))]
    return names


def together(operations: Sequence[Op[T]]) -> Op[list[T]]:
    """Run ``operations`` side by side: their steps of each round are sent as ONE step (one
    pipeline, one round trip per node), their replies handed back to each. The step type of
    the first (a plain list, Lenient, Durable) decides the whole round's."""
    results: list[Any] = [None] * len(operations)
    steps: dict[int, list[Call]] = {}
    for i, op in enumerate(operations):
        try:
            steps[i] = next(op)
        except StopIteration as stop:
            results[i] = stop.value
    while steps:
        order = list(steps)
        first = steps[order[0]]
        merged: list[Call] = type(first)() if isinstance(first, list) else []
        for i in order:
            merged.extend(steps[i])
        replies = yield merged
        at, nxt = 0, {}
        for i in order:
            n = len(steps[i])
            try:
                nxt[i] = operations[i].send(replies[at : at + n])
            except StopIteration as stop:
                results[i] = stop.value
            at += n
        steps = nxt
    return results


def by_shard(shards: Shards, ids: Iterable[str]) -> Mapping[str, list[str]]:
    """``ids`` grouped by their shard (in the order given)."""
    out: dict[str, list[str]] = {}
    for job_id in ids:
        out.setdefault(shard_of(shards, job_id), []).append(job_id)
    return out


def place(root: Any, shards: Mapping[str, Shards]) -> bool:
    """Move every node of a planned flow (:func:`echomq_core.flows.plan.plan`) that is in a sharded
    queue to its id's shard, and split caps again over the physical queues; False (nothing
    changed) when no queue of the flow is sharded. A node in another slot than its parent is
    then a cross-queue child like any other: its settle goes through its shard's outbox."""
    sharded = {q: names for q, names in shards.items() if len(names) > 1}
    if not sharded:
        return False
    from .plan import split_cap

    todo, capped = [root], []
    while todo:
        node = todo.pop()
        names = sharded.get(node.queue)
        if names is not None:
            node.queue = shard_of(names, node.id)
        if node.shares is not None:
            capped.append(node)
        if node.uniform:  # leaves of one queue below: placed here, without the stack
            names = sharded.get(node.children[0].queue)
            if names is not None:
                node.spread = _spread(node.children, names)
            continue
        todo.extend(node.children)
    for node in capped:
        node.shares = split_cap(node)
    return True


def _spread(children: Sequence[Any], names: Shards) -> dict[str, list[Any]]:
    """Place the leaf ``children`` of one queue on its shards (:func:`shard_of`): each child's
    queue set to its shard's, and the children of each shard in their order, the shards in the
    order of their first child (the land runs flows.add_flow forms, one per shard)."""
    out: dict[str, list[Any]] = {}
    k, crc = len(names), zlib.crc32
    for child in children:
        queue = child.queue = names[crc(child.id.encode()) % k]
        kids = out.get(queue)
        if kids is None:
            kids = out[queue] = []
        kids.append(child)
    return out
