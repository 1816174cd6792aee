"""What a worker process spends of its own per job, counted rather than timed: the thread
wake-ups between its runners and its fetcher, what the asyncio client does per argument of a
command, what an asyncio worker makes per job. Counts do not move with the machine's load;
the CPU time they stand for is measured by ``bench/worker_cpu.py``."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from echomq_core import AsyncEchoMQ, AsyncWorker, EchoMQ, Job, Queue, Worker
from echomq_core.wire.connection import connect_async
from echomq_core.work.running import Intake

from ..conftest import Backend
from ..waiting import eventually, eventually_async

JOBS = 3000


def run_until(
    worker: Worker, q: Queue, completed: int, then: Callable[[], Any] = lambda: None
) -> Any:
    """Start ``worker``, wait (bounded) until ``q`` has ``completed`` jobs completed, call
    ``then`` (before the stop, which wakes every thread) and stop the worker; what ``then``
    returned."""
    worker.start()
    try:
        eventually(lambda: q.stats()["completed"] >= completed, 60, lambda: q.stats())
        return then()
    finally:
        worker.stop()


class CountingCondition(threading.Condition):
    """A condition that counts its notifies (each may wake a thread that waits on it)."""

    def __init__(self, lock: Any) -> None:
        super().__init__(lock)
        self.notifies = 0

    def notify(self, n: int = 1) -> None:
        self.notifies += 1
        super().notify(n)


class CountingEncoder:
    """redis-py's encoder of a connection, counting the arguments it encodes."""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder
        self.calls = 0

    def encode(self, value: Any) -> bytes:
        self.calls += 1
        return self.encoder.encode(value)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.encoder, name)


def test_fast_jobs_do_not_wake_the_fetcher_per_job(mq: EchoMQ) -> None:
    """No-op jobs at concurrency 1: the fetcher is woken about once per claim (when the
    buffer holds less than a batch), not on every job a runner takes - each wake is a thread switch
    that finds nothing to claim. The results are all recorded, every job once."""
    q = mq.queue("cost")
    q.add_bulk(range(JOBS))
    worker = Worker(mq, {"cost": lambda job: None}, concurrency=1)
    counted = CountingCondition(worker._lock)
    worker._want_jobs = counted
    run_until(worker, q, JOBS)
    assert worker.completed == JOBS
    # claims ramp 1, 2, 4 ... 500 then take 500 each: about 15 claims for 3,000 jobs
    assert counted.notifies <= JOBS // 30, counted.notifies


class WakeCountingCondition(CountingCondition):
    """A condition that also counts the threads its notifies ask to wake."""

    def __init__(self, lock: Any) -> None:
        super().__init__(lock)
        self.woken = 0

    def notify(self, n: int = 1) -> None:
        self.woken += n
        super().notify(n)


def test_no_op_jobs_keep_one_runner_of_many(mq: EchoMQ) -> None:
    """No-op jobs at concurrency 50 are fast and CPU-bound: one runner takes them and the
    others rest (under the GIL a second thread could only take turns with the first). A
    claim wakes one runner, not one per job: the CPU share of a call is read over the call
    alone, where it once was read against the runner's whole turn (its lock, its waits for
    the GIL) and a no-op looked like waiting - every claim then woke all 50 runners."""
    jobs = 2 * JOBS
    q = mq.queue("cost3")
    q.add_bulk(range(jobs))
    # fast_job=1.0: the no-ops count as fast however loaded the machine (a loaded machine
    # stretches their wall time past the default 5 ms, and slow handlers are spread)
    worker = Worker(mq, {"cost3": lambda job: None}, concurrency=50, fast_job=1.0)
    counted = WakeCountingCondition(worker._lock)
    worker._jobs_ready = counted
    woken = run_until(worker, q, jobs, lambda: counted.woken)  # before the stop wakes all
    assert worker.completed == jobs
    # one per claim (about 20) and the rests' own; a claim that woke a runner per job would
    # alone make it the number of jobs
    assert woken <= jobs // 3, woken


def test_short_waiting_jobs_are_spread_over_the_runners(mq: EchoMQ) -> None:
    """Jobs that are fast (under ``fast_job``) but wait rather than compute (a 1 ms sleep,
    as a small network call) still run on several runners at once."""
    q = mq.queue("cost4")
    q.add_bulk(range(400))
    running, peak = [0], [0]
    guard = threading.Lock()

    def handle(job: Job) -> None:
        with guard:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.001)
        with guard:
            running[0] -= 1

    worker = Worker(mq, {"cost4": handle}, concurrency=8)
    run_until(worker, q, 400)
    assert worker._intake.spread
    assert peak[0] > 1, peak


def test_fast_jobs_are_claimed_in_one_round_trip_per_batch(mq: EchoMQ) -> None:
    """Once no-op jobs ramped the claims up to ``max_batch``, each round trip that reads a
    batch's rows also claims the next batch (``claim(ahead=True)``): the rows steps without a
    claim are the ramp's and a few around waits, not one per batch."""
    jobs = 4 * JOBS
    q = mq.queue("cost5")
    q.add_bulk(range(jobs))
    # fast_job=1.0: the no-ops count as fast however loaded the machine (their wall time,
    # not their work, is what a loaded machine stretches past the default)
    worker = Worker(mq, {"cost5": lambda job: None}, concurrency=50, fast_job=1.0)
    steps: list[tuple[str, ...]] = []
    execute = mq.connection.execute

    def recorded(calls: Any) -> Any:
        steps.append(tuple(c.script.name for c in calls if c.script is not None))
        return execute(calls)

    mq.connection.execute = recorded  # type: ignore[method-assign]
    run_until(worker, q, jobs)
    assert worker.completed == jobs
    rows = [s for s in steps if "rows" in s]
    alone = [s for s in rows if "claim" not in s]
    # 24 batches of 500: without claims ahead every one of them reads its rows alone
    assert len(rows) - len(alone) >= 12, (len(rows), len(alone))


@pytest.mark.parametrize("after", [300, 2000, 7000])
def test_a_stopped_worker_leaves_nothing_leased(mq: EchoMQ, after: int) -> None:
    """Stopped while it claims batch after batch (jobs claimed ahead, unread, included),
    a worker leaves no job leased: everything it did not finish is pending again."""
    jobs = 4 * JOBS
    q = mq.queue(f"cost6-{after}")
    q.add_bulk(range(jobs))
    worker = Worker(mq, {q.name: lambda job: None}, concurrency=50, fast_job=1.0)  # claims ahead
    run_until(worker, q, after)
    stats = q.stats()
    assert stats["active"] == 0, stats
    assert stats["completed"] + stats["pending"] == jobs, stats
    assert all(queue.ahead is None for queue in worker.queues.values())


def test_a_woken_flusher_is_notified_once(mq: EchoMQ) -> None:
    """Runners finishing jobs while the flusher is being woken do not notify it again: once
    per wait. Many jobs, one runner: the notifies stay below the batch calls' count times a
    small factor, far below one per job."""
    q = mq.queue("cost2")
    q.add_bulk(range(JOBS))
    worker = Worker(mq, {"cost2": lambda job: None}, concurrency=1, flush_after=0.001)
    counted = CountingCondition(worker._lock)
    worker._results_ready = counted
    run_until(worker, q, JOBS)
    assert worker.completed == JOBS
    assert counted.notifies <= JOBS // 10, counted.notifies


def test_the_asyncio_client_packs_commands_in_c() -> None:
    """An asyncio client's connections pack a command with hiredis, to the same bytes as
    redis-py's own packer, without its per-argument pass through the encoder (a batch
    completion has thousands of arguments); a TLS URL keeps its TLS connection class, and an
    argument hiredis does not take (a ``bytearray``) is packed the redis-py way."""
    import redis.asyncio
    import redis.asyncio.connection

    client: Any = connect_async("redis://127.0.0.1:1/0").client
    pool = client.connection_pool
    conn = pool.connection_class(**pool.connection_kwargs)
    conn.encoder = counting = CountingEncoder(conn.encoder)
    ids = (f"JOB-{i}" for i in range(2000))
    args: tuple[Any, ...] = ("EVALSHA", "f" * 40, 2, "emq:{q}:a", "emq:{q}:b", *ids, 1.5)
    packed = conn.pack_command(*args)
    assert counting.calls == 0
    plain = redis.asyncio.connection.Connection.pack_command(conn, *args)
    assert b"".join(packed) == b"".join(plain)
    odd = conn.pack_command("SET", "k", bytearray(b"v"))
    assert b"".join(odd) == b"".join(
        redis.asyncio.connection.Connection.pack_command(conn, "SET", "k", b"v")
    )
    tls_client: Any = connect_async("rediss://127.0.0.1:1/0").client
    tls = tls_client.connection_pool.connection_class
    assert issubclass(tls, redis.asyncio.SSLConnection)


@pytest.mark.onlystandalone
def test_an_asyncio_client_round_trips_through_the_fast_packer(
    backend: Backend, prefix: str
) -> None:
    """The packed commands reach a real server intact: a pipeline of many arguments, values
    of every type EchoMQ sends (str, bytes, int, float)."""

    async def main() -> None:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        client: Any = amq.connection.client
        try:
            fields = {f"f{i}": v for i, v in enumerate(["é", b"\x00\xff", 7, 2.5] * 250)}
            await client.hset(f"{prefix}:h", mapping=fields)
            got = await client.hgetall(f"{prefix}:h")
            assert len(got) == 1000
            assert got[b"f0"] == "é".encode() and got[b"f1"] == b"\x00\xff"
            assert got[b"f2"] == b"7" and got[b"f3"] == b"2.5"
        finally:
            await amq.close()

    asyncio.run(main())


def test_an_asyncio_worker_gives_its_jobs_one_spawner(backend: Backend, prefix: str) -> None:
    """The spawner a job's ``spawn()`` calls is made once per start of the worker, not once
    per job."""
    seen: list[Any] = []

    async def handle(job: Job) -> None:
        seen.append(job.spawner)

    async def main() -> None:
        mq = EchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        mq.queue("spawners").add_bulk(range(50))
        mq.close()
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        worker = AsyncWorker(amq, {"spawners": handle}, concurrency=4)
        await worker.start()
        try:
            await eventually_async(lambda: worker.completed == 50, 30, "50 completions")
        finally:
            await worker.stop()
            await amq.close()

    asyncio.run(main())
    assert len(seen) == 50
    assert len({id(s) for s in seen}) == 1
    assert all(callable(s) for s in seen)


@pytest.mark.parametrize("concurrency", [4, 50])
def test_a_backlog_is_claimed_in_batches_that_double_from_the_first(
    mq: EchoMQ, concurrency: int
) -> None:
    """A worker started on a backlog claims one job per runner first (it knows nothing of
    its handlers yet), then twice what each claim took, up to ``max_batch``: at concurrency
    50, 50, 100, 200, 400, 500 - not six claims of 50 while the target doubles up from 1."""
    q = mq.queue("ramp")
    q.add_bulk(range(2000))
    worker = Worker(mq, {"ramp": lambda job: None}, concurrency=concurrency, fast_job=1.0)
    queue = worker.queues["ramp"]
    sizes: list[int] = []
    claim_op = queue.claim_op  # the fetcher's claims (routines.claim_turn)

    def recorded(count: int = 1, **options: Any) -> Any:
        jobs = yield from claim_op(count, **options)
        if jobs:
            sizes.append(len(jobs))
        return jobs

    queue.claim_op = recorded  # type: ignore[method-assign]
    worker.start()
    try:
        eventually(lambda: q.stats()["completed"] == 2000, 60, lambda: (q.stats(), sizes))
    finally:
        worker.stop()
    ramp = [concurrency]
    while ramp[-1] < 500:
        ramp.append(min(500, ramp[-1] * 2))
    assert sizes[: len(ramp)] == ramp, sizes


def test_an_asyncio_worker_claims_ahead_and_leaves_nothing_leased(
    backend: Backend, prefix: str
) -> None:
    """The asyncio worker claims ahead as the threaded one does, and a stop in the middle
    of it leaves no job leased."""
    jobs = 4 * JOBS
    mq = EchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
    q = mq.queue("cost7")
    q.add_bulk(range(jobs))
    steps: list[tuple[str, ...]] = []

    async def main() -> None:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        execute = amq.connection.execute

        async def recorded(calls: Any) -> Any:
            steps.append(tuple(c.script.name for c in calls if c.script is not None))
            return await execute(calls)

        amq.connection.execute = recorded  # type: ignore[method-assign]
        worker = AsyncWorker(amq, {"cost7": lambda job: None}, concurrency=50, fast_job=1.0)
        await worker.start()
        try:
            await eventually_async(
                lambda: worker.completed >= jobs // 2, 60, "half the jobs completed"
            )
        finally:
            await worker.stop()
            await amq.close()
        assert all(queue.ahead is None for queue in worker.queues.values())

    try:
        asyncio.run(main())
        stats = q.stats()
    finally:
        mq.close()
    assert stats["active"] == 0, stats
    assert stats["completed"] + stats["pending"] == jobs, stats
    assert any("rows" in s and "claim" in s for s in steps), steps[:10]


def test_a_claim_is_made_as_deep_as_a_round_trip_needs() -> None:
    """The fetcher claims again once fewer jobs are buffered than the runners finish while a
    claim is on its way and its reply waits for the GIL: two batches for no-op jobs, half a
    batch (as ever) for jobs of a millisecond on one runner, in between for jobs of a
    millisecond that wait, spread over 50 runners."""
    switch = sys.getswitchinterval()

    def depth(seconds: float, cpu: float) -> int:
        intake = Intake(concurrency=50, max_batch=500, fast_job=0.005)
        for _ in range(30):
            intake.observe(seconds, (cpu, seconds))
            intake.claimed(500, 0.003)
        return intake.depth

    assert depth(1e-6, 1e-6) == 1000  # no-op: two batches
    assert depth(0.001, 0.001) == 250  # CPU-bound, one runner: half a batch
    waiting = depth(0.001, 0.0)  # 50 runners wait side by side
    assert waiting == int((0.003 + switch) * 50 / 0.001) or waiting == 1000, waiting
    assert 250 < waiting <= 1000
