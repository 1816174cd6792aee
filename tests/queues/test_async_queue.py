"""Plain jobs on the asyncio client (issue 27): ``AsyncEchoMQ.queue`` gives an
:class:`~echomq_core.AsyncQueue` that drives the same operations as :class:`~echomq_core.Queue`
- the same checks, the same commands per call - on standalone and Cluster, and the jobs it
adds are the sync client's jobs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from echomq_core import (
    AsyncEchoMQ,
    AsyncQueue,
    AsyncWorker,
    EchoMQ,
    InvalidArgument,
    InvalidJobId,
    InvalidPayload,
    Job,
    JobNotFound,
    JobSpec,
    LeaseLost,
)

from ..conftest import Backend
from ..waiting import eventually_async

#: A job id as an Airflow-derived caller makes it (slashes in it).
JID = "JOB-af/dag/t/2"


def _async(backend: Backend, prefix: str, body: Callable[[AsyncEchoMQ], Awaitable[Any]]) -> Any:
    """Run ``body`` on a fresh asyncio client of the same keyspace, closed after."""

    async def main() -> Any:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        try:
            return await body(amq)
        finally:
            await amq.close()

    return asyncio.run(main())


def test_async_add_get_job_stats(backend: Backend, prefix: str, mq: EchoMQ) -> None:
    async def body(amq: AsyncEchoMQ) -> tuple[str, list[str], Any, Any, dict[str, int]]:
        q = amq.queue("work", max_attempts=5)
        assert isinstance(q, AsyncQueue)
        one = await q.add({"n": 0}, priority=3)
        more = await q.add_bulk([{"n": 1}, JobSpec({"n": 2}, id=JID, max_attempts=2)])
        again = await q.add({"other": True}, job_id=JID)  # a re-add changes nothing
        assert again == JID
        info, info2 = await q.get_job(one), await amq.get_job("work", JID)
        return one, more, info, info2, await q.stats()

    one, more, info, info2, stats = _async(backend, prefix, body)
    assert more[1] == JID and len({one, *more}) == 3
    assert (info.state, info.payload, info.max_attempts) == ("pending", {"n": 0}, 5)
    assert (info2.payload, info2.max_attempts) == ({"n": 2}, 2)
    assert stats["pending"] == 3
    # the sync client sees the same jobs, and the queue is in the registry for the Pumps
    assert mq.queue("work").stats() == stats
    assert "work" in mq.queues()
    assert sorted(j.payload["n"] for j in mq.queue("work").claim(10)) == [0, 1, 2]


def test_async_claim_complete_fail(backend: Backend, prefix: str, mq: EchoMQ) -> None:
    mq.queue("work").add_bulk([{"n": i} for i in range(3)])

    async def body(amq: AsyncEchoMQ) -> tuple[list[bool], list[str]]:
        q = amq.queue("work", max_attempts=1)
        jobs = await q.claim(3)
        assert [j.payload["n"] for j in jobs] == [0, 1, 2]
        assert await q.heartbeat(jobs) == [True] * 3
        assert await q.fail(jobs[1], "boom", retry=False) is True  # dead
        assert await q.release([jobs[2]]) == [True]
        with pytest.raises(LeaseLost):
            await q.complete(jobs[2], "late")  # given back: the lease is gone
        return await q.complete_many([(jobs[0], {"ok": 0})]), [j.id for j in jobs]

    statuses, ids = _async(backend, prefix, body)
    assert statuses == [True]
    q = mq.queue("work")
    stats = q.stats()
    assert (stats["completed"], stats["dead"], stats["pending"]) == (1, 1, 1)
    infos = [q.get_job(i) for i in ids]
    assert [i.state for i in infos] == ["completed", "dead", "pending"]
    assert (infos[0].result, infos[1].error, infos[2].attempts) == ({"ok": 0}, "boom", 0)


def test_async_bad_input_is_refused_before_anything_is_sent(
    backend: Backend, prefix: str, mq: EchoMQ
) -> None:
    async def body(amq: AsyncEchoMQ) -> None:
        q = amq.queue("work")
        with pytest.raises(InvalidArgument, match="iterable of jobs"):
            await q.add_bulk("not a list")
        with pytest.raises(InvalidArgument, match="duplicate job ids"):
            await q.add_bulk([JobSpec(1, id="JOB-a"), JobSpec(2, id="JOB-a")])
        with pytest.raises(InvalidPayload):
            await q.add_bulk([{"fine": 1}, {"bad": object()}])
        with pytest.raises(InvalidArgument, match="priority"):
            await q.add(1, priority=-1)
        with pytest.raises(InvalidJobId):
            await q.get_job("bad id with spaces")
        with pytest.raises(JobNotFound, match="no job 'JOB-nope'"):
            await q.get_job("JOB-nope")
        with pytest.raises(InvalidArgument):
            amq.queue("work", max_attempts=0)
        assert await q.add_bulk([]) == []

    _async(backend, prefix, body)
    assert not any(mq.queue("work").stats().values())  # nothing half-written


def test_async_and_sync_queues_send_the_same_steps(
    backend: Backend, prefix: str, mq: EchoMQ
) -> None:
    """A bulk add, a claim and the reads cost the same round trips from either client: one
    step for an add of 2000 jobs (no round trip per job)."""
    sync_steps: list[int] = []
    real = mq.connection.execute

    def counted(calls: Any) -> Any:
        sync_steps.append(len(calls))
        return real(calls)

    mq.connection.execute = counted  # type: ignore[method-assign]
    sq = mq.queue("sync")
    sq.add_bulk(list(range(2000)))
    sq.claim(10)
    sq.stats()
    mq.connection.execute = real  # type: ignore[method-assign]

    async def body(amq: AsyncEchoMQ) -> list[int]:
        steps: list[int] = []
        areal = amq.connection.execute

        async def acounted(calls: Any) -> Any:
            steps.append(len(calls))
            return await areal(calls)

        amq.connection.execute = acounted  # type: ignore[method-assign]
        q = amq.queue("async")
        await q.add_bulk(list(range(2000)))
        await q.claim(10)
        await q.stats()
        return steps

    async_steps = _async(backend, prefix, body)
    assert async_steps == sync_steps
    # the queue's shard count and group rule, read once per process (two calls), then: add
    # (1), claim (2), stats (1)
    assert sync_steps[0] == 2 and len(sync_steps) <= 5


def test_async_worker_runs_through_async_queues(backend: Backend, prefix: str) -> None:
    """The asyncio worker's queues are AsyncQueues of its own client: the jobs an AsyncQueue
    adds are run, and the worker's queue handles answer awaited reads."""

    async def double(job: Job) -> int:
        return int(job.payload) * 2

    async def body(amq: AsyncEchoMQ) -> tuple[dict[str, int], list[Any]]:
        ids = await amq.queue("work").add_bulk(list(range(20)))
        worker = AsyncWorker(amq, {"work": double}, pump=False)
        await worker.start()
        try:
            assert isinstance(worker.queues["work"], AsyncQueue)
            await eventually_async(lambda: worker.completed == 20, 30, "20 jobs completed")
            stats = await worker.queues["work"].stats()
        finally:
            await worker.stop()
        return stats, [(await amq.get_job("work", i)).result for i in ids]

    stats, results = _async(backend, prefix, body)
    assert (stats["completed"], stats["pending"], stats["active"]) == (20, 0, 0)
    assert results == [2 * i for i in range(20)]


def test_a_cancel_during_a_call_is_never_swallowed(backend: Backend, prefix: str) -> None:
    """A task cancelled while a call waits for its reply ends cancelled. redis.asyncio returns
    the reply instead in about 40 % of such cancels (redis-py 8.1 and 8.2): a trigger the
    triggerer stopped then polled on for ever. 300 cancels at random points of a loop of
    calls, each task must end cancelled without a call having returned after its cancel."""

    async def body(amq: AsyncEchoMQ) -> tuple[int, int]:
        q = amq.queue("cancel-swallow")
        late = ended = 0
        rng = __import__("random").Random(7)
        for _ in range(300):
            returned_late = False

            async def loop() -> None:
                nonlocal returned_late
                while True:
                    await q.stats()
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        returned_late = True  # a call returned although a cancel was made
                        return
                    await asyncio.sleep(0)

            task = asyncio.create_task(loop())
            await asyncio.sleep(rng.random() * 0.005)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                ended += 1
            late += returned_late
        return late, ended

    assert _async(backend, prefix, body) == (0, 300)
