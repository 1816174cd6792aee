"""The one worker loop's rules (``echomq_core.work.loop``), as both workers drive them: when the
flusher records, waits or ends, when a buffered job's leases are re-checked, what a stop gives
back, and that the threaded and the asyncio worker hold the same loop. The rules need no
server; the workers that drive them are tested against real ones beside this file."""

from __future__ import annotations

import threading
import time

from echomq_core import AsyncEchoMQ, EchoMQ, Job, Worker
from echomq_core.control.options import WorkerOptions
from echomq_core.work.async_worker import AsyncWorker
from echomq_core.work.loop import DONE, NAP, Loop, time_limit, timed_out

from ..conftest import Backend


def _loop(**options: float) -> Loop:
    return Loop(WorkerOptions(**options), 1, None, threading.Lock(), threading.Event())  # type: ignore[arg-type]


def _job(n: int, timeout_ms: int | None = None) -> Job:
    return Job("q", str(n), "token", None, 0, 3, timeout_ms=timeout_ms)


def test_the_flusher_waits_records_and_ends_by_one_rule() -> None:
    loop = _loop(flush_after=0.5, max_batch=10)
    assert loop.flush_wait() == NAP  # nothing waits: a nap
    loop.hand.running = 1  # a handler runs: one result waits for more
    loop.hand.add_result(_job(1), b"1")
    wait = loop.flush_wait()
    assert wait is not None and 0 < wait <= 0.5
    loop.stop.set()  # a stopping worker records what waits at once
    assert loop.flush_wait() is None
    loop.hand.results.clear()
    loop.closing = True
    assert loop.flush_wait() == DONE  # closing with nothing waiting: the flusher ends


def test_leases_are_rechecked_once_per_recheck_by_one_runner() -> None:
    loop = _loop(lease=30.0)
    now = time.monotonic()
    assert loop.check_due(now)
    assert not loop.check_due(now + 10)  # one check at a time
    loop.checking = False
    assert not loop.check_due(now + loop.recheck / 2)  # not again so soon
    assert loop.check_due(now + loop.recheck)


def test_a_stop_takes_no_job_in_and_gives_the_buffer_back() -> None:
    loop = _loop()
    jobs = [_job(n) for n in range(3)]
    assert loop.take_in(jobs[:2]) and len(loop.hand.buffer) == 2
    loop.stop.set()
    assert not loop.take_in(jobs[2:])  # in hand, for the caller to give back
    assert len(loop.hand.inflight) == 3
    assert loop.unstarted() == jobs[:2] and not loop.hand.buffer
    assert loop.deadline(False) <= time.monotonic() < loop.deadline(True)


def test_a_calls_time_limit_is_the_smallest_of_its_jobs() -> None:
    class Queue:
        timeout_ms = 5000

    queues = {"q": Queue()}
    assert time_limit([_job(1, 2000), _job(2), _job(3, 9000)], queues) == 2000  # type: ignore[arg-type]
    assert timed_out(2.0) == ("TimeoutError: the handler ran longer than 2s", True, None)


def test_both_workers_drive_the_same_loop(mq: EchoMQ, backend: Backend, prefix: str) -> None:
    threaded = Worker(mq, {"lq": lambda job: None}, pump=False, lease=0.9)
    client = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
    asynced = AsyncWorker(client, {"lq": lambda job: None}, pump=False, lease=0.9)  # no round trip
    for worker in (threaded, asynced):
        assert type(worker._loop) is Loop
        assert worker._loop.recheck == worker.recheck == min(0.25, 0.9 / 3)
        assert worker._loop.hold == min(0.02, 0.9 / 4) and worker.lease == 0.9
