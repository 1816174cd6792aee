"""A rate limit over a sharded queue (echomq_core.control.rates): each shard spaces its starts by
its share, so the logical queue never starts more than the limit in any span of the window; set
before or after the shards.

Starts are measured independently of the claim script's counter, as in test_rate_limit: a
claim scores each job in its shard's ``active`` at (server time of the claim + lease), and the
handler reads that score back: the workers' lease is 600 s and their buffer's lease check is
off (test_rate_limit.unextended), so nothing has moved it since."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from echomq_core import AsyncEchoMQ, AsyncWorker, EchoMQ, InvalidArgument, Job, Worker
from echomq_core.control.rates import shares
from echomq_core.seeing.metrics import QueueCollector
from echomq_core.wire.calls import Call

from ..conftest import Backend
from ..waiting import eventually
from .test_rate_limit import WORKER_LEASE, most_in_a_window, unextended


def _config(mq: EchoMQ, queue: str, field: str) -> str | None:
    (raw,) = mq.connection.execute([Call.cmd("HGET", mq.keys.config(queue), field)])
    return None if raw is None else raw.decode()


def _rates(mq: EchoMQ, names: tuple[str, ...]) -> list[str | None]:
    return [_config(mq, q, "rate") for q in names]


def test_shares_sum_to_the_limit_and_differ_by_one() -> None:
    assert shares(10, 3) == [4, 3, 3]
    assert shares(9, 3) == [3, 3, 3]
    assert shares(7, 1) == [7]
    for limit in range(3, 200):
        for k in (2, 3, 5, 64):
            if limit >= k:
                got = shares(limit, k)
                assert sum(got) == limit and max(got) - min(got) <= 1 and min(got) >= 1


def test_a_limit_set_after_the_shards_is_split_over_them(mq: EchoMQ) -> None:
    names = mq.set_shards("rs", 3)
    mq.set_rate_limit("rs", "10/s")
    assert _rates(mq, names) == ["4 1000", "3 1000", "3 1000"]
    rate = mq.rate_limit("rs")
    assert rate is not None and (rate.limit, rate.window_ms, rate.used) == (10, 1000, 0)
    assert str(rate) == "10/s"
    mq.set_rate_limit("rs", None)
    assert mq.rate_limit("rs") is None
    assert _rates(mq, names) == [None, None, None] and _config(mq, "rs", "rate_total") is None


def test_a_burst_is_split_over_the_shards_at_least_one_each(mq: EchoMQ) -> None:
    names = mq.set_shards("rsb", 3)
    mq.set_rate_limit("rsb", "10/s", burst=5)
    assert _rates(mq, names) == ["4 1000 2", "3 1000 2", "3 1000"]
    assert _config(mq, "rsb", "rate_total") == "10 1000 5"
    rate = mq.rate_limit("rsb")
    assert rate is not None and str(rate) == "10/s burst 5" and rate.ready == 5
    mq.set_rate_limit("rsb", "10/s", burst=2)  # below the shard count: each keeps 1
    assert _rates(mq, names) == ["4 1000", "3 1000", "3 1000"]
    back = mq.set_shards("rsb", 1)  # joined again: the whole burst with the limit
    assert _rates(mq, back) == ["10 1000 2"]


def test_a_limit_set_before_the_shards_is_split_and_joined_again(mq: EchoMQ) -> None:
    mq.set_rate_limit("rb", "12/500ms")
    mq.set_retention("rb", completed_count=5)
    names = mq.set_shards("rb", 3)
    assert _rates(mq, names) == ["4 500", "4 500", "4 500"]
    rate = mq.rate_limit("rb")
    assert rate is not None and rate.text == "12/500ms"
    assert all(_config(mq, q, "rate_total") is None for q in names[1:])
    # the shards copied the other settings, not shard 0's share as their own
    assert {_config(mq, q, "completed_count") for q in names} == {"5"}
    back = mq.set_shards("rb", 1)
    assert back == ("rb",) and _rates(mq, names) == ["12 500", None, None]
    assert _config(mq, "rb", "rate_total") is None
    rate = mq.rate_limit("rb")
    assert rate is not None and rate.text == "12/500ms"


def test_a_limit_below_the_shard_count_is_refused_with_nothing_written(mq: EchoMQ) -> None:
    names = mq.set_shards("rl3", 3)
    with pytest.raises(InvalidArgument, match=r"at least 3 per window.*6/3s"):
        mq.set_rate_limit("rl3", "2/s")
    assert mq.rate_limit("rl3") is None and _rates(mq, names) == [None, None, None]
    mq.set_rate_limit("rl1", "2/s")
    with pytest.raises(InvalidArgument, match="at least 3 per window"):
        mq.set_shards("rl1", 3)
    assert mq.shards("rl1") == ("rl1",) and _config(mq, "rl1", "rate") == "2 1000"


def test_the_metrics_show_the_whole_limit(mq: EchoMQ) -> None:
    mq.set_shards("rm", 3)
    mq.set_rate_limit("rm", "30/min", burst=30)  # 10 each: a shard starts all it has at once
    mq.queue("rm").add_bulk(list(range(9)))
    claimed = 0
    for _ in range(6):  # the shards in turn: each claim takes from one
        claimed += len(mq.queue("rm").claim(3))
    (reading,) = QueueCollector(mq, ["rm"]).read()
    assert reading.rate is not None
    assert (reading.rate.limit, reading.rate.window_ms, reading.rate.used) == (30, 60_000, 9)
    assert (reading.rate.ready, reading.rate.next_in) == (21, 0.0)
    assert claimed == 9
    rate = mq.rate_limit("rm")
    assert rate is not None and (rate.used, rate.limit, rate.burst, rate.ready) == (9, 30, 30, 21)
    # the shard with the most jobs booked 6 s (its interval) for each
    assert 0 < rate.resets_in <= 54.0 and rate.next_in == 0.0


def _recorder(mq: EchoMQ, seen: list[tuple[int, str]], lock: threading.Lock) -> Any:
    def handle(job: Job) -> None:
        (score,) = mq.connection.execute([Call.cmd("ZSCORE", mq.keys.active(job.shard), job.id)])
        with lock:
            seen.append((int(float(score)) - int(WORKER_LEASE * 1000), job.shard))

    return handle


def test_workers_never_exceed_the_limit_over_the_shards(backend: Backend, prefix: str) -> None:
    """Two threaded workers and an asyncio one share a 15 per 250 ms limit over 3 shards: no
    span of 250 ms holds more than 15 starts in total, whichever shards they came from."""
    limit, window_ms, total = 15, 250, 180
    mq = backend.client(prefix)
    names = mq.set_shards("rapi", 3)
    mq.set_rate_limit("rapi", f"{limit}/{window_ms}ms")
    mq.queue("rapi").add_bulk(range(total))
    seen: list[tuple[int, str]] = []
    lock = threading.Lock()
    clients = [backend.client(prefix) for _ in range(3)]
    workers = [
        Worker(c, {"rapi": _recorder(c, seen, lock)}, concurrency=4, lease=WORKER_LEASE, pump=False)
        for c in clients[:2]
    ]
    for w in workers:
        unextended(w)
    stop = threading.Event()

    def run_async() -> None:
        async def main() -> None:
            amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
            handle = _recorder(clients[2], seen, lock)

            async def call(job: Job) -> None:
                await asyncio.to_thread(handle, job)

            worker = AsyncWorker(amq, {"rapi": call}, concurrency=3, lease=WORKER_LEASE, pump=False)
            unextended(worker)
            await worker.start()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await worker.stop()
            await amq.close()

        asyncio.run(main())

    aio = threading.Thread(target=run_async)
    try:
        for w in workers:
            w.start()
        aio.start()
        eventually(lambda: len(seen) >= total, 90, lambda: f"{len(seen)} of {total} started")
    finally:
        stop.set()
        for w in workers:
            w.stop()
        aio.join(30)
        for c in clients:
            c.close()
    assert len(seen) == total
    assert most_in_a_window([at for at, _ in seen], window_ms) <= limit, sorted(seen)
    # every shard started jobs, and none more than its share in any span of the window
    assert {shard for _, shard in seen} == set(names)
    for name in names:
        mine = [at for at, shard in seen if shard == name]
        assert most_in_a_window(mine, window_ms) <= limit // 3, (name, sorted(mine))
    assert mq.queue("rapi").stats()["completed"] == total
    mq.close()


def test_the_async_client_splits_and_reads_the_limit(backend: Backend, mq: EchoMQ) -> None:
    names = mq.set_shards("ra", 3)

    async def main() -> tuple[Any, Any]:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=mq.keys.prefix)
        try:
            await amq.set_rate_limit("ra", "9/s")
            got = await amq.rate_limit("ra")
            with pytest.raises(InvalidArgument, match="at least 3 per window"):
                await amq.set_rate_limit("ra", "2/s")
            await amq.set_rate_limit("ra", None)
            return got, await amq.rate_limit("ra")
        finally:
            await amq.close()

    got, gone = asyncio.run(main())
    assert got is not None and (got.limit, got.window_ms) == (9, 1000) and gone is None
    assert _rates(mq, names) == [None, None, None]
