"""The asyncio worker's runners: ``concurrency`` tasks that take jobs from the buffer and run
their handlers - async ones awaited on the loop, sync ones in a pool of ``concurrency``
threads - each call within its time limit (an async call past it is cancelled; a sync one
cannot be stopped and is abandoned, the pool replaced so the slot is free). What they decide
with - when a buffered job's lease is re-checked, a call's time limit, where a result goes -
is the worker's :class:`~echomq_core.work.loop.Loop`;
:class:`~echomq_core.work.async_worker.AsyncWorker` is made of these and of the loop's routines
on tasks."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..client.async_queue import AsyncQueue
from ..models import Job
from . import batching
from .driven import Driven
from .loop import time_limit, timed_out
from .routines import adrive
from .running import Outcome, failure

if TYPE_CHECKING:
    from ..client.async_client import AsyncEchoMQ

log = logging.getLogger("echomq_core.worker")


class TaskRunners(Driven[AsyncQueue]):
    """The runner tasks of an :class:`~echomq_core.work.async_worker.AsyncWorker` (one event
    loop: what they share needs no lock)."""

    client: AsyncEchoMQ
    connection: Any
    _stop: asyncio.Event
    _want_jobs: asyncio.Event
    _idle_runners: deque[asyncio.Future[None]]
    _async: dict[str, bool]
    _pool: ThreadPoolExecutor | None

    async def _runner(self, index: int) -> None:
        loop, hand = self._loop, self._hand
        while not self._stop.is_set():
            if not hand.buffer:
                await self._idle_runner()
                continue
            job, claimed = hand.buffer.popleft()
            self._want_jobs.set()  # maybe low: the next claim may start
            now = time.monotonic()
            if now - claimed >= loop.recheck and loop.check_due(now):
                await self._check_leases([job])
            if hand.drop_if_lost(job):
                continue
            await self._run_one(job)

    async def _idle_runner(self) -> None:
        """Wait, as an idle runner, for a job in the buffer (the fetcher is told: room)."""
        self._want_jobs.set()
        waiter = asyncio.get_running_loop().create_future()
        self._idle_runners.append(waiter)
        await waiter

    async def _batch_runner(self, index: int) -> None:
        """:meth:`_runner` for a worker with batch handlers: each call takes the buffer's head
        and the jobs of its queue behind it (:func:`~echomq_core.work.batching.take`)."""
        loop = self._loop
        while not self._stop.is_set():
            if not self._hand.buffer:
                await self._idle_runner()
                continue
            taken = batching.take(self._hand.buffer, self.batches)
            self._want_jobs.set()
            jobs = [job for job, _ in taken]
            now = time.monotonic()
            if now - taken[0][1] >= loop.recheck and loop.check_due(now):
                await self._check_leases(jobs)
            if self._hand.lost:  # a cancelled flow's buffered children: not started
                jobs = [job for job in jobs if not self._hand.drop_if_lost(job)]
            if jobs:
                await self._run_batch(jobs)

    async def _run_batch(self, jobs: list[Job]) -> None:
        """:meth:`_run_one` for one call of one or more jobs; its time limit is the smallest
        of theirs, and past it every job of the call fails."""
        limit_ms = time_limit(jobs, self.queues)
        started = time.monotonic()
        self._hand.running += 1
        try:
            if not limit_ms:
                done = await self._invoke_batch(jobs)
            else:
                call = asyncio.ensure_future(self._invoke_batch(jobs))
                try:
                    await asyncio.wait([call], timeout=limit_ms / 1000)
                except asyncio.CancelledError:  # stopping past the grace: jobs given back
                    call.cancel()
                    raise
                if not call.done():
                    self._abandon(call, jobs, limit_ms / 1000)
                    return
                done = call.result()
        finally:
            self._hand.running -= 1
        self._intake.observe(time.monotonic() - started)
        for job, result in done:
            self._loop.add_result(job, result)

    def _abandon(self, call: asyncio.Future[Any], jobs: list[Job], limit: float) -> None:
        """A batch call ran past its time limit: cancel it (async) or leave its thread (sync)
        and fail every job of it."""
        self.abandoned += 1
        if self._async[jobs[0].shard]:
            call.cancel()
        else:
            self._pool_lost()
        log.warning(
            "a call of %d job(s) in %r ran past its time limit (%gs): failed the attempts (%d "
            "call(s) abandoned so far)",
            len(jobs),
            jobs[0].shard,
            limit,
            self.abandoned,
        )
        error = timed_out(limit)
        for job in jobs:
            self._loop.add_result(job, error)

    async def _invoke_batch(self, jobs: list[Job]) -> list[batching.Done]:
        """Run one call: a batch handler on ``jobs``, or a one-job handler on its job."""
        shard = jobs[0].shard
        if shard not in self.batches:
            return [(jobs[0], await self._invoke(jobs[0]))]
        run, out = batching.undecodable(jobs)
        if not run:
            return out
        for job in run:
            job.spawner = self._spawner
        try:
            value = await self._call(shard, run)  # a batch handler takes a list
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # classified by failure()
            return out + batching.raised(run, exc)
        return out + batching.read(self.client.encode, jobs[0].queue, run, value)

    async def _run_one(self, job: Job) -> None:
        queue = self.queues[job.shard]
        limit_ms = job.timeout_ms or queue.timeout_ms
        started = time.monotonic()
        self._hand.running += 1
        try:
            if not limit_ms:  # the common case costs no task of its own
                result = await self._invoke(job)
            else:
                timed = await self._invoke_within(job, limit_ms / 1000)
                if timed is None:
                    return
                result = timed
        finally:
            self._hand.running -= 1
        self._intake.observe(time.monotonic() - started)
        self._loop.add_result(job, result)

    async def _invoke_within(self, job: Job, limit: float) -> Outcome | None:
        """:meth:`_invoke` with a time limit; None when the call ran past it (the attempt is
        failed here, the call cancelled or, in a thread, abandoned)."""
        handler = asyncio.ensure_future(self._invoke(job))
        try:
            await asyncio.wait([handler], timeout=limit)
        except asyncio.CancelledError:  # stopping past the grace: the job is given back
            handler.cancel()
            raise
        if handler.done():
            return handler.result()
        self.abandoned += 1
        if self._async[job.shard]:
            handler.cancel()
        else:  # a thread cannot be stopped: later calls get a fresh pool
            self._pool_lost()
        log.warning(
            "job %s in %r ran past its time limit (%gs): failed the attempt (%d call(s) "
            "abandoned so far)",
            job.id,
            job.shard,
            limit,
            self.abandoned,
        )
        self._loop.add_result(job, timed_out(limit))
        return None

    async def _invoke(self, job: Job) -> Outcome:
        """Run one handler: the encoded result, or (error text, retry?)."""
        if job.decode_error is not None:
            return (job.decode_error, False, None)
        job.spawner = self._spawner
        try:
            return self.client.encode(await self._call(job.shard, job))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # classified by failure()
            return failure(job, exc)

    async def _call(self, shard: str, arg: Any) -> Any:
        """The handler of ``shard`` called on ``arg`` (a job, or a batch handler's list): an
        async one awaited on the loop, a sync one in the pool (an awaitable it returns, then
        awaited here)."""
        handler: Any = self.handlers[shard]
        if self._async[shard]:
            return await handler(arg)
        value = await asyncio.get_running_loop().run_in_executor(self._threads(), handler, arg)
        if inspect.isawaitable(value):
            value = await value
        return value

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            size = self.options.concurrency
            self._pool = ThreadPoolExecutor(size, thread_name_prefix="echomq-sync")
        return self._pool

    def _pool_lost(self) -> None:
        """A sync call was abandoned: its thread stays busy, so later calls get a new pool
        (the old one ends its threads as their calls return)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    async def _check_leases(self, taken: list[Job]) -> None:
        """:meth:`Loop.check_leases <echomq_core.work.loop.Loop.check_leases>`."""
        await adrive(self._loop.check_leases(self.queues, taken), self.connection.perform)
