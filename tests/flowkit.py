"""Helpers for flow tests: drive queues and Pumps by hand, step by step, on a real server."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import redis

from echomq_core import EchoMQ, Job, Pump
from echomq_core.pump.drain import TickStats, drain
from echomq_core.wire.connection import Call, Op

from .conftest import Backend

Handler = Callable[[Job], Any]


def cmd(mq: EchoMQ, *args: Any) -> Any:
    """One server command through ``mq``'s connection (routed by its key on a Cluster)."""
    return mq.connection.execute([Call.cmd(*args)])[0]


def invariant(mq: EchoMQ, queue: str, node_id: str) -> Any:
    """The flow's snapshot, once its three record hashes and its counter are checked to add up
    to its total (processed + ignored + failed + dependencies = total)."""
    snap = mq.snapshot(queue, node_id)
    assert snap.processed + snap.ignored + snap.failed + snap.dependencies == snap.total, snap
    return snap


def default_handler(job: Job) -> Any:
    return {"id": job.id, "payload": job.payload}


def work_off(
    mq: EchoMQ,
    queues: Iterable[str],
    handler: Handler = default_handler,
    *,
    die: Callable[[Job], bool] = lambda job: False,
    pump: Pump | None = None,
    rounds: int = 10_000,
) -> TickStats:
    """Claim and settle everything in ``queues`` (complete, or fail where ``die``), ticking
    ``pump`` between rounds, until nothing is pending and every outbox is empty. Returns the
    sum of the Pump's tick stats."""
    names = list(queues)
    if pump is None:  # our own Pump: its leases are given up when we return
        pump = Pump(mq, names)
        try:
            return work_off(mq, names, handler, die=die, pump=pump, rounds=rounds)
        finally:
            pump.release_leases()
    total = TickStats()
    for _ in range(rounds):
        moved = False
        for name in names:
            q = mq.queue(name)
            jobs = q.claim(500)
            if not jobs:
                continue
            moved = True
            done = [(j, handler(j)) for j in jobs if not die(j)]
            dead = [(j, f"died: {j.id}", False) for j in jobs if die(j)]
            if done:
                assert all(q.complete_many(done))
            if dead:
                assert all(s == 2 for s in q.fail_many(dead))
        stats = pump.tick()
        total.released += stats.released
        total.failed += stats.failed
        total.delivered += stats.delivered
        total.poisoned += stats.poisoned
        if not moved and not stats.busy and all(mq.queue(n).stats()["outbox"] == 0 for n in names):
            return total
    raise AssertionError("work_off did not settle")


def run_steps(mq: EchoMQ, op: Op[Any], steps: int, *, partial: int | None = None) -> None:
    """Execute the first ``steps`` steps of ``op``; with ``partial``, also the first
    ``partial`` calls of the next step (a pipeline cut short), then abandon it (a crash)."""
    step = next(op)
    for _ in range(steps):
        try:
            step = op.send(mq.connection.execute(step))
        except StopIteration:
            return
    if partial:
        mq.connection.execute(step[:partial])
    op.close()


def deliver_without_trim(
    mq: EchoMQ, queues: list[str], pump_id: str, lease_ms: int = 10_000
) -> None:
    """A Pump that reads and delivers a page, then dies before it trims."""
    run_steps(mq, drain(mq.keys, queues, pump_id, page=10_000, lease_ms=lease_ms, max_tries=5), 2)


def keys_of(backend: Backend, prefix: str) -> dict[str, Any]:
    """Every key under ``prefix`` on every node, with its type and value (for 'unchanged')."""
    out: dict[str, Any] = {}
    for server in backend.servers:
        r = redis.Redis(host=server.host, port=server.port)
        for key in r.scan_iter(match=f"{prefix}:*", count=1000):
            kind = r.type(key).decode()
            if kind == "hash":
                value: Any = r.hgetall(key)
            elif kind == "zset":
                value = r.zrange(key, 0, -1, withscores=True)
            elif kind == "list":
                value = r.lrange(key, 0, -1)
            elif kind == "set":
                value = r.smembers(key)
            elif kind == "stream":
                value = r.xrange(key)
            else:
                value = r.get(key)
            out[key.decode()] = (kind, value)
        r.close()
    return out


def _unstamped(field: bytes, value: Any) -> Any:
    """A row's field without its arrival stamp: ``run``'s created word (lua/includes/run.lua)."""
    if field != b"run" or not isinstance(value, bytes):
        return value
    words = value.split(b" ")
    return b" ".join([*words[:4], b"-", *words[5:]]) if len(words) > 4 else value


def normalised(backend: Backend, prefix: str) -> dict[str, Any]:
    """The keyspace with the prefix cut off and arrival stamps (seq counters, pending scores,
    the 'created' field and ``run``'s created word) dropped: what the data IS, not when it
    arrived - so an add that was cut and retried can be compared with one that ran clean."""
    out: dict[str, Any] = {}
    for key, (kind, value) in keys_of(backend, prefix).items():
        name = key[len(prefix) :]
        if name.endswith(":seq"):
            continue
        if kind == "zset":
            value = sorted(member for member, _ in value)
        elif kind == "hash":
            value = {k: _unstamped(k, v) for k, v in value.items() if k != b"created"}
        out[name] = (kind, value)
    return out
