"""The server reaching ``maxmemory`` under ``noeviction`` in the middle of a flow.

A server that is full refuses writes; EchoMQ's promise is that a refused call wrote nothing
(scripts are refused at their first write) and says so with a typed, retryable error
(:class:`~echomq_core.ServerFull`), that an add cut by it is completed by its retry, that the
Pump neither loses nor poisons the signals it could not deliver meanwhile, and that
everything resumes once memory is freed. Each test starts its own server (it changes the
server's configuration) and fills it with the flow's own realistic payloads, not a stub.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from echomq_core import Child, EchoMQ, JobNotFound, Pump, ServerError, ServerFull
from echomq_core.server import EmbeddedServer

pytestmark = pytest.mark.slow

PAYLOAD = "s3://warehouse/events/date=2026-12-01/part-{:06d}.parquet " + "x" * 400


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer().start()
    try:
        yield srv
    finally:
        srv.stop()


def _limit(admin: redis.Redis, headroom: int) -> None:
    """Let the server hold ``headroom`` bytes more than it holds now, then refuse writes."""
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", used + headroom)


def _children(n: int, queue: str) -> list[Child]:
    return [Child({"path": PAYLOAD.format(i)}, queue=queue) for i in range(n)]


def test_an_add_cut_by_a_full_server_raises_server_full_and_its_retry_completes_it(
    server: EmbeddedServer,
) -> None:
    """A 20,000-child flow (about 9 MB of rows) into a server with 3 MB of room: the add is cut
    mid-way with ServerFull (a ServerError, so generic handlers still catch it); a plain add
    is refused the same way and writes nothing; once memory is freed, the same add converges
    to exactly the requested flow and it completes with every child counted once."""
    admin = redis.Redis.from_url(server.url)
    mq = EchoMQ(server.url, prefix="mm")
    parents, work = "mm-parents", "mm-work"
    pid = "JOB-af/etl/fan_out/2026-12-01"
    children = _children(20_000, work)
    _limit(admin, 3_000_000)
    with pytest.raises(ServerFull, match="maxmemory") as cut:
        mq.add_flow(parents, children, parent_id=pid, barrier=True)
    assert isinstance(cut.value, ServerError)
    landed = mq.queue(work).stats()["pending"]
    assert 0 < landed < 20_000, landed  # cut mid-way, as a real full server cuts it
    admin.config_set("maxmemory", 1)  # still full (the cut add's buffers freed some room)
    keys = admin.dbsize()
    with pytest.raises(ServerFull):
        mq.queue(work).add({"path": "one more"}, job_id="JOB-plain-1")
    assert admin.dbsize() == keys  # refused: nothing written
    with pytest.raises(JobNotFound):
        mq.queue(work).get_job("JOB-plain-1")

    admin.config_set("maxmemory", 0)  # memory freed (a bigger maxmemory)
    ref = mq.add_flow(parents, children, parent_id=pid, barrier=True)
    assert len(ref.children) == 20_000
    q = mq.queue(work)
    assert q.stats()["pending"] == 20_000
    while jobs := q.claim(1000):
        q.complete_many([(j, j.payload["path"][-20:]) for j in jobs])
    pump = Pump(mq, [parents, work], sweep_every=None)
    while pump.tick().delivered:
        pass
    snap = mq.snapshot(parents, pid)
    assert (snap.parent_state, snap.processed, snap.total) == ("released", 20_000, 20_000)
    assert len(mq.children_values(parents, pid)) == 20_000
    mq.close()


def test_the_pump_keeps_what_it_could_not_deliver_and_delivers_it_once_memory_is_freed(
    server: EmbeddedServer,
) -> None:
    """Children completed into the outbox, then the server is full: the Pump's ticks fail with
    ServerFull (more ticks than its ``max_tries``) and nothing is poisoned or counted; freed,
    one tick delivers every signal exactly once."""
    admin = redis.Redis.from_url(server.url)
    mq = EchoMQ(server.url, prefix="mp")
    parents, work = "mp-parents", "mp-work"
    pid = "JOB-af/etl/fan_out/pump"
    mq.add_flow(parents, _children(2_000, work), parent_id=pid, barrier=True)
    q = mq.queue(work)
    while jobs := q.claim(500):
        q.complete_many([(j, "ok") for j in jobs])
    assert q.stats()["outbox"] == 2_000
    _limit(admin, 0)
    admin.config_set("maxmemory", 1)  # every write refused from now on
    pump = Pump(mq, [parents, work], max_tries=2, sweep_every=None)
    for _ in range(5):
        with pytest.raises(ServerFull):
            pump.tick()
    assert mq.snapshot(parents, pid).processed == 0
    assert q.stats()["poison"] == 0 and q.stats()["outbox"] == 2_000
    admin.config_set("maxmemory", 0)
    while pump.tick().delivered:
        pass
    snap = mq.snapshot(parents, pid)
    assert (snap.parent_state, snap.processed) == ("released", 2_000)
    assert q.stats()["poison"] == 0 and q.stats()["outbox"] == 0
    mq.close()
