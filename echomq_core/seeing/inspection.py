"""Inspection reads: a flow as a tree of sub-flows, a queue's root flows by state, and the
server memory they hold. Read by ``echomq flow show`` / ``flow ls`` / ``queue stats`` and by the
dashboard, which each render them their own way.

The server keeps no list of a parent's children: a parent holds a counter and three hashes of
the children that settled. So the sub-flows of a parent are found by looking, not by reading
a list. The candidates are

* the default child ids ``<parent id>.<i>`` for i < N (what ``Child`` derives when no id is
  given; ``<parent id>.g<n>.<i>`` in generation n of a replaced flow: ``keyspace.child_stem``),
  and
* every child id already recorded in the parent's ``:processed``, ``:unsuccessful`` and
  ``:failed`` hashes (so settled children with explicit ids are found too);

each looked up in the parent's queue and in every registered queue, in one pipelined read,
and kept when its row is a parent (``total``) whose ``parent`` field names this parent in this
queue. What is not found: an UNSETTLED sub-flow whose id was given explicitly - it is counted
in the parent's numbers, just not expanded. Flows above :data:`MAX_PROBES` lookups are shown
with their counts only.

:func:`flow_memory` estimates the memory of a queue's root flows from a sample (see
:class:`FlowMemory`); :func:`flow_counts` counts them, one round trip.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..client.clients import EchoMQ
from ..errors import EchoMQError, InvalidInput
from ..flows import sharding
from ..flows.reads import pairs
from ..models import FlowSnapshot
from ..wire.calls import Call, Lenient, Op
from ..wire.keyspace import FLOW_INDEXES, JOB_ID_RE, Keyspace, check_job_id, child_stem

MAX_PROBES = 50_000
MAX_DEPTH = 16


@dataclass(slots=True)
class FlowNode:
    snap: FlowSnapshot
    subflows: list[FlowNode] = field(default_factory=list)
    note: str | None = None  # why sub-flows were not looked for
    #: the logical queue ``snap.queue`` is a shard of (``snap.queue`` itself if not sharded)
    logical: str = ""

    @property
    def queue(self) -> str:
        """The queue as users name it: the logical one of a sharded queue's node."""
        return self.logical or self.snap.queue

    @property
    def shard(self) -> str | None:
        """The physical shard holding the node, when it is not the logical queue itself."""
        return self.snap.queue if self.queue != self.snap.queue else None

    def to_dict(self) -> dict[str, Any]:
        out = self.snap.to_dict()
        out["queue"] = self.queue
        if self.shard is not None:
            out["shard"] = self.shard
        out["released"] = self.snap.released
        out["subflows"] = [child.to_dict() for child in self.subflows]
        if self.note:
            out["note"] = self.note
        return out


def read_tree(mq: EchoMQ, queue: str, parent_id: str, *, depth: int = MAX_DEPTH) -> FlowNode:
    """Flow node ``parent_id`` of physical queue ``queue`` (a shard's own name for a sharded
    queue: :meth:`EchoMQ.home`) and its sub-flows; every node names its logical queue and,
    when sharded, its shard (the registry's shard configs are read once, one round trip)."""
    registered = mq.queues()
    mq.perform(sharding.resolve(mq.keys, mq.shard_cache, [queue, *registered]))
    return _read_tree(mq, queue, parent_id, depth, registered)


def _read_tree(
    mq: EchoMQ, queue: str, parent_id: str, depth: int, registered: list[str]
) -> FlowNode:
    node = FlowNode(mq.snapshot(queue, parent_id))
    node.logical = sharding.logical_of(mq.shard_cache, queue)
    total = node.snap.total
    if total == 0:
        return node
    if depth <= 0:
        node.note = f"deeper sub-flows not shown (depth limit {MAX_DEPTH})"
        return node
    queues = [queue, *(q for q in registered if q != queue)]
    if total * len(queues) > MAX_PROBES:
        node.note = f"sub-flows not listed: {total:,} children x {len(queues)} queues is too many"
        return node
    found = mq.perform(_find_subflows(mq.keys, queue, parent_id, total, queues))
    for child_queue, child_id in found:
        node.subflows.append(_read_tree(mq, child_queue, child_id, depth - 1, registered))
    return node


def _find_subflows(
    ks: Keyspace, queue: str, parent_id: str, total: int, queues: list[str]
) -> Op[list[tuple[str, str]]]:
    """(queue, id) of each child of ``parent_id`` that is itself a parent (two round trips)."""
    *recorded, gen = yield [
        *(Call.cmd("HKEYS", key) for key in ks.parent_keys(queue, parent_id)[2:]),
        Call.cmd("HGET", ks.job(queue, parent_id), "gen"),  # a replaced flow's generation
    ]
    stem = child_stem(parent_id, _s(gen) if gen else "")
    candidates = dict.fromkeys(f"{stem}{i}" for i in range(total))
    for keys in recorded:
        candidates.update(dict.fromkeys(_s(k) for k in keys))
    probes: list[tuple[str, str]] = []
    for child_id in candidates:
        try:
            check_job_id(child_id)
        except InvalidInput:
            continue  # a default id grown past the id length limit: it cannot exist
        probes += [(q, child_id) for q in queues]
    if not probes:
        return []
    rows = yield [
        Call.cmd("HMGET", ks.job(q, cid), "total", "parent", "parent_queue") for q, cid in probes
    ]
    found = []
    for (child_queue, child_id), (row_total, up, up_queue) in zip(probes, rows, strict=True):
        if row_total is None or up is None or _s(up) != parent_id:
            continue
        # parent_queue is written only when the parent lives in another queue than the child
        if (_s(up_queue) if up_queue else child_queue) == queue:
            found.append((child_queue, child_id))
    return found


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- the memory of a queue's flows ----------------------------------------------------------

#: Root flows measured per state; the rest is extrapolated from their average.
MEMORY_SAMPLE = 10
#: Child rows measured per measured root (its children all live in one or a few queues).
CHILD_SAMPLE = 3


@dataclass(slots=True)
class FlowMemory:
    """The root flows of one queue by state, and an estimate of the memory they hold.

    ``bytes[state]`` = the average of up to :data:`MEMORY_SAMPLE` sampled roots x the count.
    A sampled root weighs its own keys (row, counter, result hashes, explicit record: each
    ``MEMORY USAGE``) plus its children's rows, from up to :data:`CHILD_SAMPLE` of them
    (average x N; the children live in their own queues, often on other nodes). Not counted:
    rows below the first level of a nested flow, index entries. ``available`` is False when
    the server refuses ``MEMORY USAGE`` (an ACL user without it): the counts stand alone.
    """

    counts: dict[str, int]
    available: bool = True
    reason: str | None = None
    sampled: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int | None:
        return sum(self.bytes.values()) if self.available else None

    @staticmethod
    def merged(parts: list[FlowMemory]) -> FlowMemory:
        """One logical queue's flows from its shards' (a sharded queue): counts, samples and
        estimates summed; unavailable if any part is."""
        if len(parts) == 1:
            return parts[0]
        out = FlowMemory({state: 0 for state in FLOW_INDEXES})
        for part in parts:
            for state, n in part.counts.items():
                out.counts[state] = out.counts.get(state, 0) + n
            for state, n in part.sampled.items():
                out.sampled[state] = out.sampled.get(state, 0) + n
            for state, n in part.bytes.items():
                out.bytes[state] = out.bytes.get(state, 0) + n
            if not part.available:
                out.available, out.reason = False, part.reason
        return out

    def memory_dict(self) -> dict[str, Any]:
        if not self.available:
            return {"available": False, "reason": self.reason}
        return {
            "available": True,
            "bytes": self.total_bytes,
            "by_state": {
                state: {"sampled": self.sampled.get(state, 0), "bytes": self.bytes.get(state, 0)}
                for state in FLOW_INDEXES
            },
        }


def flow_counts(
    ks: Keyspace, queue: str, states: Sequence[str] = FLOW_INDEXES
) -> Op[dict[str, int]]:
    """The number of root flows of ``queue`` in each of ``states`` (one round trip; the five
    flow indexes by default, :data:`~echomq_core.wire.keyspace.FLOW_LISTS` adds ``completed``)."""
    cards = yield [Call.cmd("ZCARD", ks.flows(queue, state)) for state in states]
    return {state: int(n) for state, n in zip(states, cards, strict=True)}


def flow_memory(
    ks: Keyspace,
    queue: str,
    *,
    sample: int = MEMORY_SAMPLE,
    children: int = CHILD_SAMPLE,
    rng: random.Random | None = None,
) -> Op[FlowMemory]:
    """Count the root flows of ``queue`` per state and estimate their memory (see
    :class:`FlowMemory`). Four round trips: counts; a random sample of each index (one
    ``ZRANGE r r`` per drawn rank: no command beyond the ones EchoMQ already sends); the
    sampled roots' rows and sizes; their sampled children's sizes."""
    draw = rng or random.Random()
    counts = yield from flow_counts(ks, queue)
    out = FlowMemory(counts, bytes=dict.fromkeys(FLOW_INDEXES, 0))
    roots = yield from _sampled_roots(ks, queue, counts, sample, draw)
    if not roots:
        return out
    probes = Lenient()
    for _, pid in roots:
        keys = ks.node_keys(queue, pid)
        probes.append(Call.cmd("HMGET", ks.job(queue, pid), "total", "cq", "gen"))
        probes.append(Call.cmd("HSCAN", ks.explicit(queue, pid), 0, "COUNT", children))
        probes += [_memory_usage(key) for key in keys]
    replies = yield probes
    refused = next((r for r in replies if isinstance(r, EchoMQError)), None)
    if refused is not None:
        out.available, out.reason = False, f"MEMORY USAGE refused: {refused}"
        return out
    measured, child_calls, child_of = _child_probes(ks, queue, roots, replies, children, draw)
    child_sizes: list[list[int]] = [[] for _ in measured]
    if child_calls:
        sizes = yield child_calls
        refused = next((r for r in sizes if isinstance(r, EchoMQError)), None)
        if refused is not None:
            out.available, out.reason = False, f"MEMORY USAGE refused: {refused}"
            return out
        for at, size in zip(child_of, sizes, strict=True):
            if size is not None:  # a probe of a queue the child does not live in
                child_sizes[at].append(int(size))
    per_state: dict[str, list[int]] = {state: [] for state in FLOW_INDEXES}
    for (state, root_bytes, n), found in zip(measured, child_sizes, strict=True):
        kids = round(sum(found) / len(found) * n) if found else 0
        per_state[state].append(root_bytes + kids)
    for state, flows in per_state.items():
        out.sampled[state] = len(flows)
        if flows:
            out.bytes[state] = round(sum(flows) / len(flows) * counts[state])
    return out


def _sampled_roots(
    ks: Keyspace, queue: str, counts: dict[str, int], sample: int, draw: random.Random
) -> Op[list[tuple[str, str]]]:
    """Up to ``sample`` random root flows of each index: (state, parent id) (one round trip,
    none when every index is empty)."""
    picks: list[str] = []
    ranges = []
    for state, n in counts.items():
        for rank in sorted(draw.sample(range(n), min(n, sample))):
            ranges.append(Call.cmd("ZRANGE", ks.flows(queue, state), rank, rank))
            picks.append(state)
    if not ranges:
        return []
    members = yield ranges
    roots: list[tuple[str, str]] = []
    for state, found in zip(picks, members, strict=True):
        for raw in found:  # empty when the index shrank since it was counted
            roots.append((state, _s(raw)))
    return list(dict.fromkeys(roots))


def _child_probes(
    ks: Keyspace,
    queue: str,
    roots: list[tuple[str, str]],
    replies: list[Any],
    children: int,
    draw: random.Random,
) -> tuple[list[tuple[str, int, int]], Lenient, list[int]]:
    """From the roots' probes: (state, root bytes, N) of each existing root, the
    ``MEMORY USAGE`` calls of up to ``children`` sampled children of each, and the index into
    the first list of each call."""
    width = 2 + len(ks.node_keys(queue, "JOB-x"))
    measured: list[tuple[str, int, int]] = []  # (state, root bytes, N) of each existing root
    child_calls = Lenient()
    child_of: list[int] = []  # index into measured of each child probe
    for i, (state, pid) in enumerate(roots):
        (total, cq, gen), (_, explicit), *sizes = replies[i * width : (i + 1) * width]
        if total is None:
            continue  # expired since it was drawn
        n = int(total)
        measured.append((state, sum(int(size or 0) for size in sizes), n))
        stem = child_stem(pid, _s(gen) if gen else "")
        targets = [
            (child_queue, f"{stem}{index}")
            for index in sorted(draw.sample(range(n), min(n, children)))
            for child_queue in _s(cq or b"").split()
        ]
        given = list(pairs(explicit).items())[:children]  # (child id, its queue)
        targets += [(_s(child_queue), child_id) for child_id, child_queue in given]
        for child_queue, child_id in targets:
            if not JOB_ID_RE.fullmatch(child_id):
                continue  # a derived id grown past the id length limit: it cannot exist
            try:
                key = ks.job(child_queue, child_id)
            except InvalidInput:
                continue
            child_calls.append(_memory_usage(key))
            child_of.append(len(measured) - 1)
    return measured, child_calls, child_of


def _memory_usage(key: str) -> Call:
    """``MEMORY USAGE key``, the command's name in ONE argument so that the key is the second:
    a Cluster routes every command but a script by its second argument
    (:func:`echomq_core.wire.cluster.slot_of`). The ACL permission it needs: ``+memory|usage``."""
    return Call.cmd("MEMORY USAGE", key)
