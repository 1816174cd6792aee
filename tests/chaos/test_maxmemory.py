"""The server reaching ``maxmemory`` under ``noeviction`` in the middle of a flow.

A server that is full refuses writes; EchoMQ's promise is that a refused call wrote nothing
(a full server refuses a script before it runs) and says so with a typed, retryable error
(:class:`~echomq_core.ServerFull`), that an add cut by it is completed by its retry, that the
Pump neither loses nor poisons the signals it could not deliver meanwhile, and that
everything resumes once memory is freed. Each test starts its own server (it changes the
server's configuration) and fills it with the flow's own realistic payloads, not a stub.
The sync tests run with a plain child queue and with a 3-shard one (``shards``): a cut add,
a refused completion and an undelivered signal then span three slots' outboxes and rows.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import pytest
import redis

from echomq_core import (
    AsyncEchoMQ,
    AsyncWorker,
    Child,
    EchoMQ,
    Job,
    JobNotFound,
    Pump,
    ServerError,
    ServerFull,
    Worker,
)
from echomq_core.server import EmbeddedServer

from ..waiting import eventually, eventually_async

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


#: the child queue plain (K = 1) and sharded (K = 3; on standalone the shards cost nothing but
#: their own keys, and the add, the claims and the outboxes go through every shard)
SHARDS = pytest.mark.parametrize("shards", [1, 3], ids=["plain", "3-shard"])


def _pumped(mq: EchoMQ, queues: list[str]) -> list[str]:
    """The physical queues whose outboxes a Pump of ``queues`` drains (every shard)."""
    return [shard for q in queues for shard in mq.shards(q)]


def _children(n: int, queue: str) -> list[Child]:
    return [Child({"path": PAYLOAD.format(i)}, queue=queue) for i in range(n)]


@SHARDS
def test_an_add_cut_by_a_full_server_raises_server_full_and_its_retry_completes_it(
    server: EmbeddedServer, shards: int
) -> None:
    """A 20,000-child flow (about 9 MB of rows) into a server with 3 MB of room: the add is cut
    mid-way with ServerFull (a ServerError, so generic handlers still catch it); a plain add
    is refused the same way and writes nothing; once memory is freed, the same add converges
    to exactly the requested flow and it completes with every child counted once."""
    admin = redis.Redis.from_url(server.url)
    mq = EchoMQ(server.url, prefix="mm")
    parents, work = "mm-parents", "mm-work"
    assert len(mq.set_shards(work, shards)) == shards
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
    pump = Pump(mq, _pumped(mq, [parents, work]), sweep_every=None)
    while pump.tick().delivered:
        pass
    snap = mq.snapshot(parents, pid)
    assert (snap.parent_state, snap.processed, snap.total) == ("released", 20_000, 20_000)
    assert len(mq.children_values(parents, pid)) == 20_000
    mq.close()


@SHARDS
def test_the_pump_keeps_what_it_could_not_deliver_and_delivers_it_once_memory_is_freed(
    server: EmbeddedServer, shards: int
) -> None:
    """Children completed into the outbox, then the server is full: the Pump's ticks fail with
    ServerFull (more ticks than its ``max_tries``) and nothing is poisoned or counted; freed,
    one tick delivers every signal exactly once."""
    admin = redis.Redis.from_url(server.url)
    mq = EchoMQ(server.url, prefix="mp")
    parents, work = "mp-parents", "mp-work"
    assert len(mq.set_shards(work, shards)) == shards
    pid = "JOB-af/etl/fan_out/pump"
    mq.add_flow(parents, _children(2_000, work), parent_id=pid, barrier=True)
    q = mq.queue(work)
    while jobs := q.claim(500):
        q.complete_many([(j, "ok") for j in jobs])
    assert q.stats()["outbox"] == 2_000
    _limit(admin, 0)
    admin.config_set("maxmemory", 1)  # every write refused from now on
    pump = Pump(mq, _pumped(mq, [parents, work]), max_tries=2, sweep_every=None)
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


@SHARDS
def test_a_worker_keeps_the_results_a_full_server_refused_and_records_them_once_freed(
    server: EmbeddedServer, caplog: pytest.LogCaptureFixture, shards: int
) -> None:
    """Four handlers are running when the server fills up: their completions are refused
    (ServerFull, nothing written). The worker keeps them, with their jobs in hand, and records
    them once memory is freed - within their lease, so no child runs twice (without that the
    results were dropped and every one of them ran again after its lease expired)."""
    admin = redis.Redis.from_url(server.url)
    mq = EchoMQ(server.url, prefix="mw")
    parents, work = "mw-parents", "mw-work"
    assert len(mq.set_shards(work, shards)) == shards
    pid = "JOB-af/etl/fan_out/worker"
    mq.add_flow(parents, _children(40, work), parent_id=pid, barrier=True)
    runs: dict[str, int] = {}
    lock = threading.Lock()
    go = threading.Event()

    def handle(job: Job) -> str:
        with lock:
            runs[job.id] = runs.get(job.id, 0) + 1
        go.wait(30)  # the first four wait here until the server is full
        return job.payload["path"][-20:]

    worker = Worker(mq, {work: handle, parents: handle}, concurrency=4, lease=10.0)
    worker.start()
    try:
        eventually(lambda: len(runs) == 4, 30, "four handlers running")
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)  # full: every write refused
        caplog.set_level(logging.WARNING, logger="echomq_core.worker")
        go.set()
        eventually(
            lambda: any("server full" in r.getMessage() and "kept" in r.getMessage()
                        for r in caplog.records),
            30,
            "the worker's results refused and kept",
        )  # fmt: skip
        admin.config_set("maxmemory", 0)  # freed
        eventually(lambda: mq.snapshot(parents, pid).parent_state == "released", 60)
    finally:
        go.set()
        worker.stop()
    snap = mq.snapshot(parents, pid)
    assert (snap.processed, snap.total) == (40, 40)
    assert len(mq.children_values(parents, pid)) == 40
    assert sorted(set(runs.values())) == [1], {k: v for k, v in runs.items() if v != 1}
    mq.close()


def test_the_asyncio_worker_keeps_them_too(
    server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The same with :class:`~echomq_core.AsyncWorker` (one event loop, no lock)."""
    admin = redis.Redis.from_url(server.url)
    sync = EchoMQ(server.url, prefix="ma")
    parents, work = "ma-parents", "ma-work"
    pid = "JOB-af/etl/fan_out/async"
    sync.add_flow(parents, _children(40, work), parent_id=pid, barrier=True)
    runs: dict[str, int] = {}

    async def scenario() -> None:
        client = AsyncEchoMQ(server.url, prefix="ma")
        go = asyncio.Event()

        async def handle(job: Job) -> str:
            runs[job.id] = runs.get(job.id, 0) + 1
            await go.wait()
            return str(job.payload["path"][-20:])

        worker = AsyncWorker(client, {work: handle, parents: handle}, concurrency=4, lease=10.0)
        task = asyncio.create_task(worker.run(install_signals=False))
        try:
            await eventually_async(lambda: len(runs) == 4, 30, "four handlers running")
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", 1)
            caplog.set_level(logging.WARNING, logger="echomq_core.worker")
            go.set()
            await eventually_async(
                lambda: any("server full" in r.getMessage() and "kept" in r.getMessage()
                            for r in caplog.records),
                30,
                "the worker's results refused and kept",
            )  # fmt: skip
            admin.config_set("maxmemory", 0)
            await eventually_async(
                lambda: sync.snapshot(parents, pid).parent_state == "released", 60
            )
        finally:
            go.set()
            await worker.stop()
            await task
            await client.close()

    asyncio.run(scenario())
    assert sync.snapshot(parents, pid).processed == 40
    assert sorted(set(runs.values())) == [1], {k: v for k, v in runs.items() if v != 1}
    sync.close()
