"""The drain of the outboxes (the steps and the why: :mod:`echomq_core.pump.pump`): a page of
each outbox read under its lease, delivered to the parents, its delivered prefix trimmed; and
the poison list read and replayed."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import EchoMQError, InvalidInput
from ..flows import lifecycle
from ..models import Job, Settlement
from ..wire.calls import CHUNK, Call, Durable, Op
from ..wire.keyspace import JOB_ID_RE, Keyspace, check_job_id, check_queue


@dataclass(slots=True)
class Signal:
    kind: str
    child: str
    parent_queue: str
    parent: str
    value: bytes


_KINDS = {b"c": "c", b"i": "i", b"f": "f"}
#: The kind of a threshold flow's follow-up signal ('x': cancel its unstarted children), which
#: the Pump runs itself (lifecycle.stop_unstarted) instead of delivering it to a parent.
_STOP = b"x"
#: A child id, checked on the raw bytes of a signal (the rule of keyspace.JOB_ID_RE).
_CHILD_ID = re.compile(JOB_ID_RE.pattern.encode()).fullmatch


def parse_signal(entry: bytes) -> Signal:
    """Split an outbox entry; raise :class:`InvalidInput` if it is malformed."""
    parts = entry.split(b"\n", 4)
    if len(parts) != 5:
        raise InvalidInput("malformed signal: expected 5 fields")
    kind, child, pq, parent, value = parts
    if kind not in _KINDS and kind != _STOP:
        raise InvalidInput(f"malformed signal: unknown kind {kind[:10]!r}")
    return Signal(
        kind.decode(),
        check_job_id(child.decode()),
        check_queue(pq.decode()),
        check_job_id(parent.decode()),
        value,
    )


@dataclass(slots=True)
class TickStats:
    delivered: int = 0
    poisoned: int = 0
    promoted: int = 0
    recovered: int = 0
    buried: int = 0
    swept: int = 0
    stopped: int = 0  # children of threshold flows cancelled (lifecycle.stop_unstarted)
    expired: list[tuple[str, str]] = field(default_factory=list)  # (queue, root) flows expired
    blocked: dict[str, str] = field(default_factory=dict)  # queue -> reason of a blocked head
    released: list[tuple[str, str]] = field(default_factory=list)  # (queue, parent id)
    failed: list[tuple[str, str]] = field(default_factory=list)
    poisoned_entries: list[tuple[str, str]] = field(default_factory=list)  # (queue, reason)
    dead: list[tuple[Job, str]] = field(default_factory=list)  # buried here: (job, error)
    drained: list[str] = field(default_factory=list)  # queues whose outbox had signals
    # queues whose outbox lease another drainer holds -> whether signals are waiting there
    others: dict[str, bool] = field(default_factory=dict)

    @property
    def busy(self) -> bool:
        return bool(self.delivered or self.poisoned or self.promoted or self.recovered)


def drain(
    ks: Keyspace, queues: Sequence[str], pump_id: str, *, page: int, lease_ms: int, max_tries: int
) -> Op[TickStats]:
    """One pass over the outboxes of ``queues`` (three round trips in all)."""
    stats = TickStats()
    pages = yield from _read_pages(ks, queues, pump_id, page, lease_ms, stats)
    if not pages:
        return stats
    stats.drained = list(pages)
    # Per queue, the first entry that did not deliver and why ("" = transient: no ageing).
    # Everything before it delivered; the trim removes exactly that prefix.
    bad: dict[str, tuple[int, str]] = {}
    groups, stops = _grouped(pages, bad)
    yield from _deliver(ks, groups, bad, stats)
    yield from _stop_unstarted(ks, stats, stops)
    yield from _trim(ks, pages, pump_id, bad, max_tries, stats)
    return stats


def _read_pages(
    ks: Keyspace, queues: Sequence[str], pump_id: str, page: int, lease_ms: int, stats: TickStats
) -> Op[dict[str, list[bytes]]]:
    """Take (or renew) each outbox's lease and read a page of the outboxes held (one round
    trip); the queues whose lease another drainer holds go to ``stats.others``."""
    reads = yield [
        call
        for q in queues
        for call in (
            Call.lua("outbox_lease", [*ks.queue_keys(q), ks.outbox_lease(q)], [pump_id, lease_ms]),
            Call.cmd("LRANGE", ks.outbox(q), 0, page - 1),
        )
    ]
    pages: dict[str, list[bytes]] = {}
    for i, queue in enumerate(queues):
        held = int(reads[2 * i])
        if held == 1 and reads[2 * i + 1]:
            pages[queue] = list(reads[2 * i + 1])
        elif held == 2:
            stats.others[queue] = bool(reads[2 * i + 1])
    return pages


def _mark(bad: dict[str, tuple[int, str]], queue: str, index: int, reason: str) -> None:
    """Note that entry ``index`` of ``queue``'s page did not deliver, unless one before did not."""
    if queue not in bad or index < bad[queue][0]:
        bad[queue] = (index, reason)


def _grouped(
    pages: dict[str, list[bytes]], bad: dict[str, tuple[int, str]]
) -> tuple[dict[tuple[bytes, bytes], _Group], list[tuple[str, int, Signal]]]:
    """The signals of the pages per parent, and the ``'x'`` signals: (queue, index, signal)."""
    # The loop below runs once per signal (100,000s per second): split, one regex on the child
    # id, list appends. Each (parent queue, parent) is checked once per page (_Group).
    groups: dict[tuple[bytes, bytes], _Group] = {}
    stops: list[tuple[str, int, Signal]] = []  # 'x' signals: (queue, index, signal)
    for queue, entries in pages.items():
        for index, entry in enumerate(entries):
            parts = entry.split(b"\n", 4)
            if parts[0] == _STOP:
                try:
                    stops.append((queue, index, parse_signal(entry)))
                except InvalidInput as exc:
                    _mark(bad, queue, index, str(exc))
                continue
            group = groups.get((parts[2], parts[3])) if len(parts) == 5 else None
            if group is None or parts[0] not in _KINDS or not _CHILD_ID(parts[1]):
                try:
                    sig = parse_signal(entry)  # raises, naming what is wrong
                except InvalidInput as exc:
                    _mark(bad, queue, index, str(exc))
                    continue
                group = groups[(parts[2], parts[3])] = _Group(sig.parent_queue, sig.parent)
            group.kinds += parts[0]
            group.args += (parts[1], parts[4])
            group.where.append((queue, index))
    return groups, stops


def _deliver(
    ks: Keyspace,
    groups: dict[tuple[bytes, bytes], _Group],
    bad: dict[str, tuple[int, str]],
    stats: TickStats,
) -> Op[None]:
    """Deliver the groups on the parents' slots, up to ``CHUNK`` signals a call (one round
    trip); what did not deliver is marked in ``bad``."""
    calls: list[Call] = []
    placed: list[tuple[str, list[_Group]]] = []  # (parent queue, the groups of one call)
    by_queue: dict[str, list[_Group]] = defaultdict(list)
    for group in groups.values():
        by_queue[group.parent_queue].append(group)
    for parent_queue, parents in by_queue.items():
        batch: list[_Group] = []
        size = 0
        for group in parents:
            batch.append(group)
            size += len(group.where)
            if size >= CHUNK:
                calls.append(_deliver_call(ks, parent_queue, batch))
                placed.append((parent_queue, batch))
                batch, size = [], 0
        if batch:
            calls.append(_deliver_call(ks, parent_queue, batch))
            placed.append((parent_queue, batch))
    # trim nothing a failover of the parent's master could lose
    replies = (yield Durable(calls)) if calls else []
    for reply, (parent_queue, batch) in zip(replies, placed, strict=True):
        if isinstance(reply, EchoMQError):  # transient (connection, server): retry, no ageing
            for group in batch:
                for queue, index in group.where:
                    _mark(bad, queue, index, "")
            continue
        settled = Settlement([])
        settled.absorb(parent_queue, reply)
        stats.released += settled.released
        stats.failed += settled.failed
        if min(settled.statuses, default=0) < 0:  # rare: a parent that does not exist
            statuses = iter(settled.statuses)
            for group in batch:
                for (queue, index), st in zip(group.where, statuses, strict=False):
                    if st < 0:
                        _mark(
                            bad,
                            queue,
                            index,
                            f"parent {group.parent} does not exist in {group.parent_queue!r}",
                        )


def _trim(
    ks: Keyspace,
    pages: dict[str, list[bytes]],
    pump_id: str,
    bad: dict[str, tuple[int, str]],
    max_tries: int,
    stats: TickStats,
) -> Op[None]:
    """Remove each outbox's delivered prefix; age a head that did not deliver, and poison it
    after ``max_tries`` (one round trip)."""
    trims = []
    for queue, entries in pages.items():
        delivered, reason = bad.get(queue, (len(entries), ""))
        blocked = entries[delivered] if reason else b""
        if reason:
            stats.blocked[queue] = reason
        trims.append(
            Call.lua(
                "trim_outbox",
                [
                    *ks.queue_keys(queue),
                    ks.outbox_lease(queue),
                    ks.outbox_head(queue),
                    ks.poison(queue),
                ],
                [pump_id, delivered, entries[0], blocked, max_tries, reason],
            )
        )
    results = yield trims
    for (trimmed, poisoned), queue in zip(results, pages, strict=True):
        stats.delivered += max(0, int(trimmed))
        stats.poisoned += int(poisoned)
        if int(poisoned):
            stats.poisoned_entries.append((queue, stats.blocked.get(queue, "")))


def _stop_unstarted(
    ks: Keyspace, stats: TickStats, stops: list[tuple[str, int, Signal]]
) -> Op[None]:
    """Threshold follow-ups (lifecycle.stop_unstarted): for every flow this drain failed, at
    once (a plain fail-parent flow costs the one read that finds no ``tipped`` mark), then for
    every ``'x'`` signal of the page. They run before the trim: a drainer that dies in between
    leaves the ``'x'`` signals for the next one, which finds done what was done (one read)."""
    done: set[tuple[str, str]] = set()
    for queue, parent_id in stats.failed:
        stats.stopped += yield from lifecycle.stop_unstarted(ks, queue, parent_id)
        done.add((queue, parent_id))
    for _, _, sig in stops:
        if (sig.parent_queue, sig.parent) not in done:
            mark = sig.value.decode(errors="replace")
            stats.stopped += yield from lifecycle.stop_unstarted(
                ks, sig.parent_queue, sig.parent, mark
            )


@dataclass(slots=True)
class _Group:
    """The signals of one page for one parent: their kinds (one byte each), their
    (child id, value) pairs, and where each sits (source queue, index in its page)."""

    parent_queue: str
    parent: str
    kinds: bytearray = field(default_factory=bytearray)
    args: list[bytes] = field(default_factory=list)
    where: list[tuple[str, int]] = field(default_factory=list)


def _deliver_call(ks: Keyspace, parent_queue: str, batch: list[_Group]) -> Call:
    keys = [*ks.queue_keys(parent_queue)]
    argv: list[Any] = [parent_queue, len(batch)]
    for group in batch:
        keys += ks.settle_keys(parent_queue, group.parent)
        argv += [group.parent, len(group.where), bytes(group.kinds), *group.args]
    return Call.lua("deliver", keys, argv)


def poison_list(ks: Keyspace, queue: str, count: int) -> Op[list[tuple[str, bytes]]]:
    """The oldest ``count`` poisoned signals of a queue: (reason, entry)."""
    (items,) = yield [Call.cmd("LRANGE", ks.poison(queue), 0, count - 1)]
    out = []
    for item in items:
        head, _, entry = bytes(item).partition(b"\n")
        stamp, _, reason = head.partition(b" ")  # '<ms> <reason>' (the retention reads the ms)
        if not stamp.isdigit():  # written before entries carried a time
            reason = head
        out.append((reason.decode(errors="replace"), entry))
    return out


def poison_replay(ks: Keyspace, queue: str, count: int) -> Op[int]:
    """Move up to ``count`` poisoned signals back to the outbox; the number moved."""
    keys = [*ks.queue_keys(queue), ks.poison(queue), ks.outbox_head(queue)]
    (n,) = yield [Call.lua("replay_poison", keys, [count])]
    return int(n)
