"""Retention: how long each end state is kept, stored on the server, and the sweep that
forgets what is past it - a flow as a unit, in every queue its nodes live in.

Settings are per queue, by age and by count, in the queue's ``config`` hash, so every
worker, Pump and reader honours the same ones (``EchoMQ.set_retention`` /
``echomq queue config``). What each one keeps:

==============  =======  =====================================================================
setting         default  applies to
==============  =======  =====================================================================
``completed``   1 day    completed jobs; a worker-run root flow once its parent ran (the flow)
``closed``      1 day    flows read from outside (``barrier=True``) once a reader closed them
``unclosed``    7 days   released barrier flows that nobody closed
``failed``      7 days   failed root flows (kept for inspection and repair)
``dead``        7 days   dead jobs; a worker-run root whose parent died (the flow)
``cancelled``   7 days   cancelled flows
``poison``      7 days   poisoned signals
==============  =======  =====================================================================

Each has an age (``<name>_age``, seconds, None: no age limit) and a count (``<name>_count``,
the newest kept; None: no count limit, the default). Flows still held are never swept.

The sweep (run by the Pump every ``sweep_every`` seconds) is O(expired): per queue, one
script picks at most ``limit`` due entries per state and takes the queue's sweep lease (only
when something is due: an idle Pump writes nothing; one Pump sweeps a queue at a time); a
second re-checks each and forgets it. A plain job's row goes with its entry. A flow child's
index entry goes, its row stays: it belongs to its flow. A root flow expires as a unit: its
row, counter, result hashes and explicit-id record, then - on each child queue's slot - its
children's rows and index entries, then the same for every inner node below it, then the
named references that point to it. A failed flow whose children still run waits until they
settle (re-checked each minute), so nothing a live flow needs is deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..checks import text as _s
from ..errors import InvalidArgument
from ..wire.calls import Call, Op, chunks
from ..wire.keyspace import Keyspace
from .plan import child_candidates
from .reads import pairs
from .refs import ref_body

DAY = 86_400.0
#: The settings, in the order the scripts take them, with their defaults (seconds / counts).
SETTINGS: dict[str, float | int | None] = {
    "completed_age": DAY,
    "completed_count": None,
    "dead_age": 7 * DAY,
    "dead_count": None,
    "failed_age": 7 * DAY,
    "failed_count": None,
    "closed_age": DAY,
    "closed_count": None,
    "unclosed_age": 7 * DAY,
    "unclosed_count": None,
    "cancelled_age": 7 * DAY,
    "cancelled_count": None,
    "poison_age": 7 * DAY,
    "poison_count": None,
}
#: The longest age a setting takes (10 years): beyond that, say None (no limit).
MAX_AGE = 3650 * DAY
MAX_COUNT = 10**12


def _encode(name: str, value: Any) -> str:
    """A setting as the config hash stores it: ms for ages, counts as is, '-1' for None."""
    if value is None:
        return "-1"
    if name.endswith("_age"):
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not 0 <= value <= MAX_AGE
        ):
            raise InvalidArgument(
                f"{name} must be seconds between 0 and {MAX_AGE:g}, or None; got {value!r}"
            )
        return str(int(value * 1000))
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
        raise InvalidArgument(f"{name} must be an int >= 0, or None; got {value!r}")
    return str(value)


def _decode(name: str, raw: Any) -> float | int | None:
    text = _s(raw)
    if text == "-1":
        return None
    return int(text) / 1000 if name.endswith("_age") else int(text)


def defaults_argv() -> list[str]:
    """The defaults as the scripts take them ('' = unlimited)."""
    return ["" if v is None else _encode(k, v) for k, v in SETTINGS.items()]


def get_config(ks: Keyspace, queue: str) -> Op[dict[str, float | int | None]]:
    """Every setting of ``queue``: what is stored, else the default."""
    (flat,) = yield [Call.cmd("HGETALL", ks.config(queue))]
    stored = pairs(flat)
    out: dict[str, float | int | None] = {}
    for name, default in SETTINGS.items():
        out[name] = _decode(name, stored[name]) if name in stored else default
    return out


def set_config(ks: Keyspace, queue: str, settings: Mapping[str, Any]) -> Op[None]:
    """Store ``settings`` (name -> seconds / count / None); unknown names are refused."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise InvalidArgument(
            f"unknown retention setting(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)}"
        )
    fields: list[str] = []
    for name, value in settings.items():
        fields += [name, _encode(name, value)]
    if fields:
        yield [Call.cmd("HSET", ks.config(queue), *fields)]


@dataclass(slots=True)
class SweepStats:
    """What one sweep forgot: index entries and plain rows, flows, child rows, poison."""

    swept: int = 0
    flows: list[tuple[str, str]] = field(default_factory=list)  # (queue, root id) expired
    rows: int = 0
    poison: int = 0
    groups: int = 0  # fairness groups' turns dropped (lua/fair_prune.lua)


_CODES = ("c", "d", "f", "x", "u", "k")


def sweep(
    ks: Keyspace,
    queues: Sequence[str],
    pump_id: str,
    *,
    lease_ms: int,
    limit: int,
    cursors: dict[str, str] | None = None,
) -> Op[SweepStats]:
    """One retention pass over ``queues`` (see the module doc). Two round trips when nothing
    is due; then per expiring flow one more per tree level. In the first, each queue's
    fairness groups that are behind the claims are dropped, a slice of ``limit`` fields per
    pass (lua/fair_prune.lua), from where the last pass stopped (``cursors``: queue -> cursor,
    kept by the caller)."""
    defaults = defaults_argv()
    cursors = {} if cursors is None else cursors
    prunes = [
        Call.lua("fair_prune", [ks.fair(q), ks.pending(q)], [cursors.get(q, "0"), limit])
        for q in queues
    ]
    replies = yield [
        *(
            Call.lua(
                "retain",
                [*ks.queue_keys(q), ks.config(q), ks.sweep_lease(q), ks.poison(q)],
                [pump_id, lease_ms, limit, *defaults],
            )
            for q in queues
        ),
        *prunes,
    ]
    picks = replies[: len(queues)]
    stats = SweepStats()
    for queue, (cursor, dropped) in zip(queues, replies[len(queues) :], strict=True):
        cursors[queue] = _s(cursor)
        stats.groups += int(dropped)
    calls, where = [], []
    for queue, pick in zip(queues, picks, strict=True):
        stats.poison += int(pick[6])
        keys = [*ks.queue_keys(queue), ks.config(queue), ks.sweep_lease(queue)]
        argv: list[Any] = [pump_id, *defaults]
        for code, ids in zip(_CODES, pick[:6], strict=True):
            for raw in ids:
                job_id = _s(raw)
                keys += ks.node_keys(queue, job_id)
                argv += [code, job_id]
        if len(argv) > 1 + len(defaults):
            keys.append(ks.flows(queue, "completed"))  # last: an expiring root's entry goes
            calls.append(Call.lua("expire", keys, argv))
            where.append(queue)
    if not calls:
        return stats
    replies = yield calls
    nodes: list[tuple[str, list[Any]]] = []
    for queue, (swept, roots) in zip(where, replies, strict=True):
        stats.swept += int(swept)
        for info in roots:
            stats.flows.append((queue, _s(info[0])))
            nodes.append((queue, info))
    yield from forget_tree(ks, nodes, stats)
    return stats


def row_calls(
    script: str, fixed: Sequence[str], base: str, ids: Sequence[str], head: Sequence[Any]
) -> list[Call]:
    """One ``script`` call per chunk of ``ids`` (of one queue): the keys ``fixed`` and then the
    chunk's rows (``base`` + id), the arguments ``head`` and then the chunk's ids - how a walk
    of a flow's tree visits the children of a node in one of their queues."""
    return [
        Call.lua(script, [*fixed, *(base + i for i in part)], [*head, *part])
        for part in chunks(ids)
    ]


#: How a walk visits one child queue of a node: (child queue, script, fixed keys, argv after
#: the node id, candidate child ids); the script gets the candidates' rows after the fixed keys.
#: A node may visit one queue more than once (a repair: its recorded deaths, then the rest).
Visit = tuple[str, str, list[str], list[Any], list[str]]


def walk_tree(
    ks: Keyspace,
    nodes: list[tuple[str, str, Sequence[Any]]],
    children_of: Callable[[str, str, Sequence[Any]], list[Visit]],
    node_call: Callable[[str, str, str], Call],
    go_below: Callable[[Sequence[Any]], bool],
    on_node: Callable[[str, str, Sequence[Any]], None] = lambda q, i, info: None,
) -> Op[tuple[int, int]]:
    """Visit a flow's tree level by level (cancel, repair, and the sweep's forget). Per node
    (queue, id, the reply of its node script), ``children_of`` names a script call per child
    queue; each reply is (children counted, sub-flow ids); each sub-flow's node script
    (``node_call(queue, id, parent)``) runs on its slot, and the walk goes below it when
    ``go_below(its reply)``. Returns (children counted, sub-flows visited)."""
    counted = visited = 0
    for node in nodes:
        on_node(*node)
    while nodes:
        calls, asked = [], []
        for node_queue, node_id, info in nodes:
            visits = children_of(node_queue, node_id, info)
            for child_queue, script, fixed, extra, ids in visits:
                head = [node_id, *extra]
                sent = row_calls(script, fixed, ks.job_prefix(child_queue), ids, head)
                calls += sent
                asked += [(child_queue, node_id)] * len(sent)
        if not calls:
            break
        replies = yield calls
        inner_calls, where = [], []
        for (child_queue, node_id), (count, inner) in zip(asked, replies, strict=True):
            counted += int(count)
            for raw in inner:
                inner_calls.append(node_call(child_queue, _s(raw), node_id))
                where.append((child_queue, _s(raw)))
        nodes = []
        if inner_calls:
            infos = yield inner_calls
            for (child_queue, inner_id), inner_info in zip(where, infos, strict=True):
                visited += 1
                if go_below(inner_info):
                    nodes.append((child_queue, inner_id, inner_info))
                    on_node(child_queue, inner_id, inner_info)
    return counted, visited


def forget_tree(ks: Keyspace, nodes: list[tuple[str, list[Any]]], stats: SweepStats) -> Op[None]:
    """Delete the children of dropped nodes on their own slots, level by level; then the
    references that still point to the dropped roots."""
    refs: list[Call] = []

    def on_node(queue: str, node_id: str, info: Sequence[Any]) -> None:
        for name in _s(info[4]).split():
            refs.append(Call.lua("drop_ref", [ks.ref(name)], [ref_body(queue, node_id)]))

    def children_of(queue: str, node_id: str, info: Sequence[Any]) -> list[Visit]:
        _, total, child_queues, explicit, _, gen = info
        kids = child_candidates(node_id, int(total), _s(child_queues), explicit, _s(gen))
        return [
            (q, "forget", [*ks.queue_keys(q), *ks.gate_keys(q, queue, node_id)], [], ids)
            for q, ids in kids.items()
        ]

    def drop_call(queue: str, node_id: str, parent_id: str) -> Call:
        keys = [*ks.queue_keys(queue), *ks.node_keys(queue, node_id)]
        return Call.lua("drop", keys, [node_id, parent_id])

    def dropped(info: Sequence[Any]) -> bool:
        """A sub-flow's drop reply: its node (its row went: counted; its children are next),
        or empty when it was gone already."""
        if info:
            stats.rows += 1
        return bool(info)

    start: list[tuple[str, str, Sequence[Any]]] = [(q, _s(info[0]), info) for q, info in nodes]
    rows, _ = yield from walk_tree(ks, start, children_of, drop_call, dropped, on_node)
    stats.rows += rows
    if refs:
        yield refs
