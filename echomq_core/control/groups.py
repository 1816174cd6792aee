"""Fairness groups: who a job is fair to, and the queue's rule that names it.

Using::

    q.add_bulk([JobSpec(row, group=row["customer"]) for row in rows])   # the caller names it
    mq.set_group_rule("reports", "customer")     # or the queue takes it from the payload:
    q.add({"customer": "acme", "day": "2026-12-07"})                     # group "acme"
    mq.group_rule("reports")                     # "customer"
    mq.set_group_rule("reports", None)           # no rule
    mq.set_group_weight("reports", "acme", 3)    # acme gets 3 jobs per turn, the others 1

A queue whose jobs carry groups is claimed in turns: one job of each group with waiting work
per turn (lua/includes/fair.lua), so one tenant's 200,000-job backfill does not starve fifty
tenants' 100-job daily runs in the same queue. Groups are not declared: there may be 100,000
of them, most idle; what an idle one leaves behind is swept (lua/fair_prune.lua). A group's
weight (1 to :data:`MAX_WEIGHT`, 1 unless set) is how many of its jobs one turn holds.

The rule lives in the queue's ``config`` hash (field ``group_from``: the name of a top-level
key of a mapping payload). It is applied on the host when a job or a flow's child is added
without a group of its own: a mapping payload that holds the key gives its value (a string,
or an int written in decimal) as the group; any other payload, or a value of another type,
gives none. A value that is not a valid group (empty, over
:data:`~echomq_core.wire.keyspace.MAX_GROUP_BYTES` bytes, control characters) is refused with
:class:`~echomq_core.InvalidArgument` naming the key, before anything is written. Each process
reads a queue's rule with its shards (the step an add needs anyway), then again - riding in
an add's first step - once what it knows is :data:`RULE_TTL` seconds old: a rule set or changed
is followed by every producer from its second add after that (:class:`Rules`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..checks import check_int
from ..checks import text as _s
from ..errors import InvalidArgument
from ..wire.calls import Call, Op
from ..wire.keyspace import Keyspace, check_group, check_queue

#: The config hash field that holds a queue's group rule.
RULE_FIELD = "group_from"
#: How long a process trusts the rule it read of a queue, in seconds.
RULE_TTL = 5.0


def check_rule(rule: Any) -> str | None:
    """A group rule: the payload key to take the group from (1-128 printable characters), or
    None (``"none"`` too) for no rule; else :class:`InvalidArgument`."""
    if rule is None or rule == "none":
        return None
    if not isinstance(rule, str) or not rule or len(rule) > 128 or not rule.isprintable():
        raise InvalidArgument(
            f"a group rule is the payload key to take the group from (1-128 printable "
            f"characters) or None, got {rule!r:.80}"
        )
    return rule


def set_rule(ks: Keyspace, queue: str, rule: Any) -> Op[None]:
    """Store (or with None clear) ``queue``'s group rule."""
    check_queue(queue)
    rule = check_rule(rule)
    if rule is None:
        yield [Call.cmd("HDEL", ks.config(queue), RULE_FIELD)]
    else:
        yield [Call.cmd("HSET", ks.config(queue), RULE_FIELD, rule)]


def get_rule(ks: Keyspace, queue: str) -> Op[str | None]:
    """``queue``'s group rule as stored (None: no rule)."""
    check_queue(queue)
    (raw,) = yield [Call.cmd("HGET", ks.config(queue), RULE_FIELD)]
    return None if raw is None else _s(raw)


#: The most jobs a group may get per turn.
MAX_WEIGHT = 1000


def set_weight(ks: Keyspace, shards: Sequence[str], group: Any, weight: Any) -> Op[None]:
    """Give ``group`` ``weight`` jobs per turn in the queue of ``shards`` (every shard's turns
    alike); None or 1 is the default, one per turn. :class:`InvalidArgument` for a bad group
    or weight, before anything is written."""
    group = check_group(group)
    weight = 1 if weight is None else check_int("weight", weight, 1, MAX_WEIGHT)
    field = "w:" + group
    if weight == 1:
        yield [Call.cmd("HDEL", ks.fair(q), field) for q in shards]
    else:
        yield [Call.cmd("HSET", ks.fair(q), field, weight) for q in shards]


def get_weight(ks: Keyspace, shard: str, group: Any) -> Op[int]:
    """``group``'s weight in ``shard`` (1 unless set)."""
    (raw,) = yield [Call.cmd("HGET", ks.fair(shard), "w:" + check_group(group))]
    return 1 if raw is None else int(raw)


class Rules:
    """A client's view of its queues' group rules. A queue's rule is first read with its
    shards, in the step an add needs anyway (:func:`~echomq_core.flows.sharding.resolve_for_add`);
    after that an add uses what is known and, once it is older than :data:`RULE_TTL` s, reads
    it again in the add's own first step (:meth:`refresh`) - never a round trip of its own. A
    changed rule is so followed from the second add after the TTL, by every producer."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[str | None, float]] = {}

    def forget(self, queue: str) -> None:
        """Drop what is known of ``queue`` (this client just changed its rule)."""
        self._seen.pop(queue, None)

    def unseen(self, queues: Iterable[str]) -> list[str]:
        """The queues whose rule was never read."""
        return sorted(q for q in set(queues) if q not in self._seen)

    def read_calls(self, ks: Keyspace, queues: Sequence[str]) -> list[Call]:
        """The reads of ``queues``' rules, one HGET each (their replies go to :meth:`take`)."""
        return [Call.cmd("HGET", ks.config(q), RULE_FIELD) for q in queues]

    def take(self, queues: Sequence[str], replies: Sequence[Any]) -> None:
        """Remember the rules :meth:`read_calls` read."""
        until = time.monotonic() + RULE_TTL
        for queue, raw in zip(queues, replies, strict=True):
            self._seen[queue] = (None if raw is None else _s(raw), until)

    def current(self, queues: Iterable[str]) -> dict[str, str]:
        """The known rules of ``queues`` that have one (queue -> payload key)."""
        out = {}
        for queue in queues:
            rule = self._seen.get(queue, (None, 0.0))[0]
            if rule is not None:
                out[queue] = rule
        return out

    def refresh(self, ks: Keyspace, queues: Iterable[str]) -> Op[None]:
        """Read again the rules of ``queues`` older than :data:`RULE_TTL` (one step, meant to
        ride in another operation's step: :func:`~echomq_core.flows.sharding.together`; none
        when every one is fresh)."""
        now = time.monotonic()
        stale = sorted(q for q in set(queues) if self._seen.get(q, (None, 0.0))[1] <= now)
        if stale:
            self.take(stale, (yield self.read_calls(ks, stale)))


def group_of(payload: Any, rule: str, good: set[str] | None = None) -> str | None:
    """The group ``rule`` (a payload key) gives ``payload``: None when the payload is not a
    mapping, lacks the key, or holds a value that is neither a str nor an int there;
    :class:`InvalidArgument` naming the key for a value that is not a valid group. ``good``:
    groups already checked (a bulk add names a few groups many times), added to."""
    if type(payload) is not dict and not isinstance(payload, Mapping):
        return None
    value = payload.get(rule)
    if type(value) is not str:
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        value = str(value)
    if good is None or value not in good:
        check_group(value, f"group (payload key {rule!r})")
        if good is not None:
            good.add(value)
    return value


@dataclass(frozen=True, slots=True)
class GroupLoad:
    """A queue's fairness groups at one moment (:func:`load`): how many have work queued,
    and the busiest, as ``(group, turns queued)`` - with every job of a group pending, its
    turns are its pending jobs. ``complete``: every group was looked at (False when the queue
    has more groups than one read looks at, :data:`LOAD_LIMIT`)."""

    waiting: int = 0
    busiest: list[tuple[str, int]] = field(default_factory=list)
    complete: bool = True


#: The most group fields one :func:`load` looks at per physical queue.
LOAD_LIMIT = 20_000


def load(ks: Keyspace, shards: Sequence[str], top: int = 5) -> Op[GroupLoad]:
    """The :class:`GroupLoad` of a queue of ``shards`` (one step; each shard read on its slot,
    lua/fair_top.lua). Over several shards: ``waiting`` adds the shards' counts (a group with
    work on k shards counts k times), and a group's jobs queued add up the shards where it is
    among the ``top`` busiest."""
    top = check_int("top", top, 1, 1000)
    replies = yield [
        Call.lua("fair_top", [ks.fair(q), ks.pending(q)], [top, LOAD_LIMIT]) for q in shards
    ]
    waiting, complete, queued = 0, True, dict[str, int]()
    for reply in replies:
        waiting += int(reply[0])
        complete = complete and int(reply[1]) == 1
        for i in range(2, len(reply), 2):  # a group on several shards: its jobs added up
            group = _s(reply[i])
            queued[group] = queued.get(group, 0) + int(reply[i + 1])
    busiest = sorted(queued.items(), key=lambda pair: (-pair[1], pair[0]))
    return GroupLoad(waiting, busiest[:top], complete)
