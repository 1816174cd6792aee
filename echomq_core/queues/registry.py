"""Worker processes announce themselves: who serves which queues, how busy, since when.

Each :class:`~echomq_core.Worker` and :class:`~echomq_core.AsyncWorker` writes its entry at
start (:func:`beat_op`), again on every lease heartbeat (``lease / 3``), and deletes it at a
clean stop (:func:`leave_op`). The entry is a hash (host, pid, queues, concurrency, in flight,
started, beat) whose PEXPIRE is three beats, so a worker that dies (SIGKILL, a lost host)
disappears within one lease with nobody deleting it; the registry zset (ids by last beat)
lets readers list workers without SCAN. Readers (:func:`read_workers`) drop members whose
hash is gone; every beat also drops members not seen for a day, so the zset stays bounded
when nobody reads it. Staleness is decided by the server's expiry, not by comparing clocks.

One beat: one round trip of four commands (HSET, PEXPIRE, ZADD, ZREMRANGEBYSCORE), per worker
every ``lease / 3`` - nothing per job.

Lease tokens name their holder (:func:`lease_token`): ``<tail>.<claimed ms, hex>.<random>``,
where ``tail`` is the random end of the claiming worker's id ('' for a claim made outside a
worker). The token is made once per claim anyway, so who holds a lease and since when cost
no command: the dashboard reads them from the token (:func:`read_token`) and finds the worker
in the registry by its tail (:func:`find_holders`); complete.lua copies them onto the row it
already writes (``started``, ``worker``), fail.lua into the attempt it appends to the row's
``history``. The time is the claiming host's clock. At 29
characters the token is shorter than the uuid4 hex it replaced and stays under the server's
listpack value limit (64), so the leases hash keeps its encoding. Tokens of older workers (32
hex characters, no dots) keep working: they read as an unknown holder and no start time.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..checks import text as _s
from ..errors import EchoMQError
from ..wire.calls import Call, Op
from ..wire.keyspace import Keyspace

log = logging.getLogger("echomq_core.worker")

#: The most entries one read returns (the newest beats first).
READ_LIMIT = 1000
#: Registry members not beaten for this long are dropped by any worker's beat (ms).
FORGET_MS = 86_400_000


#: A lease token made by :func:`lease_token`: holder tail, claim time (ms, hex), random part.
_TOKEN = re.compile(r"([0-9a-f]{0,8})\.([0-9a-f]{1,12})\.[0-9a-f]+")


def lease_token(worker_id: str = "") -> str:
    """A fresh lease token for one claim (or hand-off) by ``worker_id`` ('' outside a worker):
    unique per call like a uuid4 (32 random bits besides the worker's own 32 and the ms)."""
    tail = worker_id.rsplit("-", 1)[-1] if worker_id else ""
    return f"{tail}.{time.time_ns() // 1_000_000:x}.{secrets.token_hex(4)}"


def read_token(token: str | None) -> tuple[str | None, int | None]:
    """(holder tail or None, claim time in ms or None) of a lease token; (None, None) for a
    token :func:`lease_token` did not make (an older worker's)."""
    found = _TOKEN.fullmatch(token) if token else None
    if found is None:
        return None, None
    return found.group(1) or None, int(found.group(2), 16)


def new_id() -> str:
    """A worker id: host, pid and a random tail (a restarted process is a new worker)."""
    host = socket.gethostname().split(".")[0][:40] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(slots=True)
class WorkerEntry:
    """What one worker process says of itself (times in ms since the epoch)."""

    id: str
    queues: list[str]
    concurrency: int
    kind: str = "thread"  # thread | asyncio
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    started: int = field(default_factory=lambda: int(time.time() * 1000))
    inflight: int = 0
    beat: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "kind": self.kind,
            "queues": list(self.queues),
            "concurrency": self.concurrency,
            "inflight": self.inflight,
            "started_ms": self.started,
            "beat_ms": self.beat,
        }


def beat_op(ks: Keyspace, entry: WorkerEntry, ttl_ms: int) -> Op[None]:
    """Write ``entry`` (its ``beat`` set to now) with a ``ttl_ms`` expiry and its registry
    member; drop members not seen for :data:`FORGET_MS`. One round trip."""
    entry.beat = int(time.time() * 1000)
    key = ks.worker(entry.id)
    yield [
        Call.cmd(
            "HSET",
            key,
            "host",
            entry.host,
            "pid",
            entry.pid,
            "kind",
            entry.kind,
            "queues",
            " ".join(entry.queues),
            "concurrency",
            entry.concurrency,
            "inflight",
            entry.inflight,
            "started",
            entry.started,
            "beat",
            entry.beat,
        ),
        Call.cmd("PEXPIRE", key, ttl_ms),
        Call.cmd("ZADD", ks.workers(), entry.beat, entry.id),
        Call.cmd("ZREMRANGEBYSCORE", ks.workers(), "-inf", entry.beat - FORGET_MS),
    ]


def leave_op(ks: Keyspace, worker_id: str) -> Op[None]:
    """A clean stop: the entry and its registry member go at once."""
    yield [Call.cmd("DEL", ks.worker(worker_id)), Call.cmd("ZREM", ks.workers(), worker_id)]


_FIELDS = ("host", "pid", "kind", "queues", "concurrency", "inflight", "started", "beat")


def _entry(name: str, row: Sequence[Any]) -> WorkerEntry:
    host, pid, kind, queues, concurrency, inflight, started, beat = (_s(v) for v in row)
    return WorkerEntry(
        name,
        queues.split(),
        int(concurrency),
        kind,
        host,
        int(pid),
        int(started),
        int(inflight),
        int(beat),
    )


def read_workers(ks: Keyspace, limit: int = READ_LIMIT) -> Op[list[WorkerEntry]]:
    """The live workers, newest beat first (at most ``limit``): two round trips - the
    registry's newest members, one HMGET per member - plus one ZREM of the members whose
    hash has expired (their worker stopped beating)."""
    (ids,) = yield [Call.cmd("ZRANGE", ks.workers(), 0, limit - 1, "REV")]
    names = [_s(i) for i in ids]
    if not names:
        return []
    rows = yield [Call.cmd("HMGET", ks.worker(n), *_FIELDS) for n in names]
    out: list[WorkerEntry] = []
    gone: list[str] = []
    for name, row in zip(names, rows, strict=True):
        if row[0] is None:
            gone.append(name)
        else:
            out.append(_entry(name, row))
    if gone:
        yield [Call.cmd("ZREM", ks.workers(), *gone)]
    return out


def find_holders(ks: Keyspace, tails: Sequence[str]) -> Op[dict[str, WorkerEntry]]:
    """The live worker of each lease-token tail (:func:`read_token`) that has one: the
    registry's ids (one ZRANGE, at most :data:`READ_LIMIT`), then one HMGET per id that
    matches a tail - two round trips, nothing read of the workers no lease names."""
    wanted = {t for t in tails if t}
    if not wanted:
        return {}
    (ids,) = yield [Call.cmd("ZRANGE", ks.workers(), 0, READ_LIMIT - 1, "REV")]
    hits = [(n, n.rsplit("-", 1)[-1]) for n in map(_s, ids)]
    hits = [(n, t) for n, t in hits if t in wanted]
    if not hits:
        return {}
    rows = yield [Call.cmd("HMGET", ks.worker(n), *_FIELDS) for n, _ in hits]
    return {t: _entry(n, row) for (n, t), row in zip(hits, rows, strict=True) if row[0] is not None}


class Presence:
    """One worker's entry and the calls that keep it: :meth:`beat` at start and on every
    lease heartbeat, :meth:`leave` at a clean stop (``a``-prefixed twins for the asyncio
    worker). The entry expires ``lease`` seconds (three beats of ``lease / 3``) after the last
    beat. A beat or a leave the server refuses is logged, never raised: the worker's jobs do
    not depend on it."""

    def __init__(
        self, ks: Keyspace, queues: Sequence[str], concurrency: int, kind: str, lease: float
    ) -> None:
        self.ks = ks
        self.entry = WorkerEntry(new_id(), list(queues), concurrency, kind)
        self.ttl_ms = max(1, int(lease * 1000))

    def beat(self, perform: Callable[[Op[None]], Any], inflight: int) -> None:
        self.entry.inflight = inflight
        try:
            perform(beat_op(self.ks, self.entry, self.ttl_ms))
        except EchoMQError as exc:
            log.warning("worker %s: could not beat: %s", self.entry.id, exc)

    def leave(self, perform: Callable[[Op[None]], Any]) -> None:
        try:
            perform(leave_op(self.ks, self.entry.id))
        except EchoMQError as exc:
            log.warning("worker %s: could not unregister (it expires): %s", self.entry.id, exc)

    async def abeat(self, perform: Callable[[Op[None]], Awaitable[Any]], inflight: int) -> None:
        self.entry.inflight = inflight
        try:
            await perform(beat_op(self.ks, self.entry, self.ttl_ms))
        except EchoMQError as exc:
            log.warning("worker %s: could not beat: %s", self.entry.id, exc)

    async def aleave(self, perform: Callable[[Op[None]], Awaitable[Any]]) -> None:
        try:
            await perform(leave_op(self.ks, self.entry.id))
        except EchoMQError as exc:
            log.warning("worker %s: could not unregister (it expires): %s", self.entry.id, exc)


def per_queue(entries: Sequence[WorkerEntry]) -> dict[str, int]:
    """How many live workers serve each queue."""
    counts: dict[str, int] = {}
    for e in entries:
        for q in e.queues:
            counts[q] = counts.get(q, 0) + 1
    return counts


__all__ = [
    "FORGET_MS",
    "READ_LIMIT",
    "Presence",
    "WorkerEntry",
    "beat_op",
    "find_holders",
    "lease_token",
    "leave_op",
    "new_id",
    "per_queue",
    "read_token",
    "read_workers",
]
