"""The asyncio worker: one event loop runs ``concurrency`` handlers at once.

Using::

    async def fetch(job: Job) -> dict[str, Any]:
        async with httpx.AsyncClient() as http:
            return (await http.get(job.payload["url"])).json()

    mq = AsyncEchoMQ(url)
    await AsyncWorker(mq, {"pages": fetch}, concurrency=200).run()

or ``echomq worker --async``. Async handlers (``async def``, or any callable whose
``__call__`` is one) are awaited on the loop, so 200 handlers that wait on the network cost
200 tasks, not 200 threads. Sync handlers run in a pool of ``concurrency`` threads, so a sync
handler never blocks the loop.

It is the threaded :class:`~echomq_core.work.worker.Worker` with tasks for threads - the same
loop (:mod:`echomq_core.work.loop`: what to claim, when to flush, what to record, when to
nap, what a stop gives back), the same operations
(:class:`~echomq_core.client.queue.QueueOps`, driven through its :class:`~echomq_core.AsyncQueue`
s), the same scripts, the same exchanges with the server
(:mod:`echomq_core.work.routines`), the same claim sizes, outcome rules and hooks
(:mod:`echomq_core.work.running`), the same options
(:class:`~echomq_core.control.options.WorkerOptions`): one fetcher task claims into a local buffer,
N runner tasks take jobs from it, one flusher task records results in batches, one heartbeat task
extends leases every ``lease / 3`` seconds; jobs of a cancelled flow that were claimed but not
started are dropped.

Time limits (a job's own, its queue's, the worker's ``timeout``): an async handler past its
limit is cancelled; a sync one cannot be stopped and is abandoned (its thread runs on, and the
pool is replaced so the slot is free). Either way the attempt fails with ``TimeoutError`` and
whatever the call returns later is refused by its lease token.

Shutdown (SIGTERM, SIGINT or :meth:`AsyncWorker.stop`): as the threaded worker - stop
claiming, give unstarted jobs back, let running handlers finish for up to ``grace`` seconds,
record their results, then give back (and cancel) whatever still runs. A second signal skips
the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..client.async_queue import AsyncQueue
from ..control.options import PumpOptions, WorkerOptions
from ..errors import EchoMQError
from ..flows import spawning
from ..hooks import LifecycleHooks
from ..models import Job
from ..queues import adding
from ..queues.hints import BLOCK_SLICE, wait_for_hint
from ..wire.patience import WAIT_FOR_SERVER, apatiently
from .driven import REGISTERING
from .loop import WIND_DOWN, Wait, fetching, flushing
from .routines import adrive, give_back
from .running import draining_text
from .tasks import TaskRunners

if TYPE_CHECKING:
    from ..client.async_client import AsyncEchoMQ

log = logging.getLogger("echomq_core.worker")
Handler = Callable[[Job], Any]
#: The loop's lock: one event loop runs every task, so none is needed.
_NO_LOCK = contextlib.nullcontext()


def is_async(handler: Any) -> bool:
    """True for ``async def`` handlers and callables whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


class AsyncWorker(TaskRunners):
    """Runs ``handlers`` ({queue name: callable}) on the running event loop until stopped.
    Options as :class:`~echomq_core.work.worker.Worker` (``concurrency`` is the number of handler
    tasks, and of threads for sync handlers)."""

    _KIND = "asyncio"
    _QUEUE = AsyncQueue
    client: AsyncEchoMQ

    def __init__(
        self,
        client: AsyncEchoMQ,
        handlers: Mapping[str, Handler],
        *,
        options: WorkerOptions | None = None,
        queue_options: Mapping[str, Any] | None = None,
        hooks: LifecycleHooks | None = None,
        pump: bool | PumpOptions = True,
        wait_for_server: float = WAIT_FOR_SERVER,
        **settings: Any,
    ) -> None:
        """Options as :class:`~echomq_core.work.worker.Worker`'s. Construction makes no round trip;
        :meth:`start` reads the queues' shard configuration and registers them, waiting up to
        ``wait_for_server`` seconds while the server cannot take that yet (unreachable, a
        Cluster master failing over, full), logging what it waits for; 0 raises at once."""
        self._configure(client, handlers, options, queue_options, hooks, pump, settings)
        self.wait_for_server = wait_for_server
        self.connection = client.connection
        self._pump_stop = asyncio.Event()
        self._pump_task: asyncio.Task[None] | None = None
        #: the idle fetcher's blocked waits, one per slot (:meth:`_idle_slots`)
        self._slot_waits: dict[tuple[str, ...], asyncio.Future[Any]] = {}
        #: a second signal ended the drain: sync handlers may still run in the pool's threads
        self.halted = False
        self._stop = asyncio.Event()
        self._halt = asyncio.Event()
        self._want_jobs = asyncio.Event()  # a runner is free or the buffer ran low
        self._results_ready = asyncio.Event()  # results should be recorded now
        loop = self._make_loop(_NO_LOCK, self._stop)
        loop.buffer, loop.wake_fetcher = self._buffer, self._want_jobs.set
        loop.wake_flusher = self._results_ready.set
        self._pool: ThreadPoolExecutor | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._runners: list[asyncio.Task[Any]] = []
        self._started = False
        self._idle_runners: deque[asyncio.Future[None]] = deque()  # woken one per job
        self._shutdown: asyncio.Future[None] | None = None
        self._spawner: Callable[..., Any] | None = None  # what job.spawn() calls: start()

    def _serve(
        self, handlers: Mapping[str, Handler], logical: Mapping[str, str] | None = None
    ) -> None:
        """:meth:`Driven._serve <echomq_core.work.driven.Driven._serve>`, and which handlers are
        async. :meth:`start` calls it again with every shard of a sharded queue once their
        names are read (construction cannot await the read)."""
        super()._serve(handlers, logical)
        self._async = {name: is_async(fn) for name, fn in self.handlers.items()}

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> AsyncWorker:
        """Register the queues and start the tasks on the running loop; returns at once."""
        if self._started:
            return self
        bound, is_cluster = self.wait_for_server, self.connection.is_cluster
        shards = await apatiently(
            lambda: self.connection.perform(self._read_shards()),
            what=self._reading_shards(),
            bound=bound,
            is_cluster=is_cluster,
            logger=log,
        )
        self._serve_shards(shards)
        await apatiently(
            lambda: self.connection.execute(adding.register(self.client.keys, list(self.handlers))),
            what=REGISTERING,
            bound=bound,
            is_cluster=is_cluster,
            logger=log,
        )
        await self.presence.abeat(self.connection.perform, 0)
        # one spawner for the loop the handlers run on (a restarted worker's may be another)
        self._spawner = spawning.AsyncSpawner(self.client, asyncio.get_running_loop())
        self._started = True
        runner = self._batch_runner if self.batches else self._runner
        self._runners = [
            asyncio.create_task(runner(i), name=f"echomq-runner-{i}")
            for i in range(self.options.concurrency)
        ]
        self._tasks = [
            asyncio.create_task(self._fetcher(), name="echomq-fetch"),
            asyncio.create_task(self._flusher(), name="echomq-flush"),
            asyncio.create_task(self._heartbeats(), name="echomq-heartbeat"),
        ]
        if self.pump is not None:
            self._pump_stop.clear()
            self._pump_task = asyncio.create_task(
                self.pump.arun(self._pump_stop), name="echomq-pump"
            )
        return self

    async def run(self, *, install_signals: bool = True) -> None:
        """Run until SIGTERM/SIGINT (or :meth:`stop` from elsewhere), then drain."""
        loop = asyncio.get_running_loop()
        installed = []
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
        try:
            await self.start()
            await self._stop.wait()
            if self.signalled is not None and not self._halt.is_set():
                log.warning(draining_text(self.signalled, self._in_flight(), self.options.grace))
            await self.stop(wait=not self._halt.is_set())
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    def _in_flight(self) -> list[Job]:
        """The jobs whose handlers run now: leased, not waiting in the buffer."""
        buffered = {id(job) for job, _ in self._hand.buffer}
        return [job for job in self._hand.inflight.values() if id(job) not in buffered]

    def _on_signal(self, signum: int) -> None:
        """SIGTERM / SIGINT: stop claiming and drain (:meth:`run` says what it waits for);
        a second one gives back the running jobs at once."""
        if self._signal(signum):
            self.halted = True
        self._wake_all()

    def _wake_all(self) -> None:
        self._want_jobs.set()
        self._results_ready.set()
        self._wake_runners(len(self._idle_runners))

    def _wake_runners(self, count: int) -> None:
        """Wake up to ``count`` idle runners (one per job put in the buffer)."""
        while count > 0 and self._idle_runners:
            waiter = self._idle_runners.popleft()
            if not waiter.done():
                waiter.set_result(None)
                count -= 1

    async def stop(self, *, wait: bool = True) -> None:
        """Stop claiming; with ``wait``, let running handlers finish for up to ``grace``
        seconds, then give back (and cancel) whatever still runs. A second call waits for
        the first one's shutdown."""
        if self._shutdown is None:
            self._shutdown = asyncio.ensure_future(self._drain(wait))
        await asyncio.shield(self._shutdown)

    async def _drain(self, wait: bool) -> None:
        self._stop.set()
        if not wait:
            self._halt.set()
        self._wake_all()
        await self._give_back(self._loop.unstarted())
        runners = [t for t in self._runners if not t.done()]
        if runners:
            # a second signal (``_halt``) ends the wait at once
            halted = asyncio.ensure_future(self._halt.wait())
            deadline = self._loop.deadline(wait)
            pending = set(runners)
            while pending and not self._halt.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                _, pending = await asyncio.wait(
                    [*pending, halted], timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(halted)
            halted.cancel()
            if pending:  # past the grace: their jobs go back, their handlers are cancelled
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        self._loop.closing = True
        self._results_ready.set()
        helpers = [t for t in self._tasks if t.get_name() != "echomq-heartbeat"]
        # (a task can be cancelled, but not inside a blocked read: two slices of it at most)
        await asyncio.wait(helpers, timeout=max(WIND_DOWN, BLOCK_SLICE * 2))
        await self._give_back(list(self._hand.inflight.values()))
        waits = list(self._slot_waits.values())
        self._slot_waits.clear()
        for task in self._tasks:
            task.cancel()
        for wait_task in waits:
            wait_task.cancel()
        await asyncio.gather(*self._tasks, *waits, return_exceptions=True)
        if self._started:
            await self.presence.aleave(self.connection.perform)
        if self.pump is not None and self._pump_task is not None:
            await self.pump.astop_after_last_tick(self._pump_stop, self._pump_task)
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    # -- the fetcher and the flusher: the loop's routines, on tasks ----------------------
    async def _fetcher(self) -> None:
        await adrive(fetching(self._loop, self.queues, self._outage), self._perform)

    async def _flusher(self) -> None:
        await adrive(flushing(self._loop, self.queues), self._perform)

    async def _perform(self, op: Any) -> Any:
        """Run one step of the loop's routines: an operation on the connection, or a
        :class:`~echomq_core.work.loop.Wait`."""
        if type(op) is Wait:
            return await self._wait(op)
        return await self.connection.perform(op)

    async def _wait(self, wait: Wait) -> bool:
        """A pause of the fetcher or the flusher (nothing runs between the loop's look and
        this wait: one event loop); room: True when the fetcher may claim now."""
        if wait.what == Wait.ROOM:
            self._want_jobs.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._want_jobs.wait(), wait.seconds)
            return self._hand.want() > 0
        if wait.what == Wait.RESULTS:
            self._results_ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._results_ready.wait(), wait.seconds)
        elif wait.what == Wait.WORK:
            await self._idle(wait.seconds)
        else:
            await self._sleep(wait.seconds)
        return True

    def _buffer(self, jobs: list[Job]) -> list[Job]:
        """:meth:`Loop.take_in <echomq_core.work.loop.Loop.take_in>`, waking a runner per job;
        returns the jobs when the worker is stopping (the caller gives them back)."""
        if not self._loop.take_in(jobs):
            return jobs
        self._wake_runners(len(jobs))
        return []

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _idle(self, seconds: float) -> None:
        """Wait up to ``seconds`` for work: blocked on the wake-up hints where possible
        (:meth:`Loop.idle_hints <echomq_core.work.loop.Loop.idle_hints>`)."""
        names, keys, is_cluster = list(self.handlers), self.client.keys, self.connection.is_cluster
        groups, seconds = self._loop.idle_hints(names, keys, is_cluster, seconds)
        if not groups:
            await self._sleep(seconds)
            return
        if len(groups) > 1:
            await self._idle_slots(groups, seconds)
            return
        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            op = wait_for_hint(groups[0], min(left, BLOCK_SLICE))
            try:
                if await self.connection.perform(op):
                    return
            except EchoMQError as exc:
                if not self._stop.is_set():
                    self._outage.warning("waiting for work failed: %s", exc)
                    await self._sleep(left)
                return

    async def _idle_slots(self, groups: list[list[str]], seconds: float) -> None:
        """:meth:`_idle` for queues on several slots (a sharded queue's shards on a Cluster):
        one BZPOPMIN task per slot at once, ending at the first hint. A task still blocked when
        the wait ends is kept for the next one, so a hint it pops later is not lost to this
        worker (:class:`~echomq_core.queues.hints.HintWatch` is the threaded worker's twin)."""
        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for group in groups:
                key = tuple(group)
                if key not in self._slot_waits:
                    op = wait_for_hint(group, min(left, BLOCK_SLICE))
                    self._slot_waits[key] = asyncio.ensure_future(self.connection.perform(op))
            done, _ = await asyncio.wait(
                list(self._slot_waits.values()), timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            woken = False
            for key, task in list(self._slot_waits.items()):
                if task not in done:
                    continue
                del self._slot_waits[key]
                exc = task.exception()
                if exc is None:
                    woken = woken or bool(task.result())
                elif not self._stop.is_set():
                    self._outage.warning("waiting for work failed: %s", exc)
            if woken:
                return

    async def _give_back(self, jobs: list[Job]) -> None:
        """:func:`~echomq_core.work.routines.give_back`."""
        await adrive(give_back(self._loop, self.queues, jobs), self.connection.perform)

    # -- heartbeats -----------------------------------------------------------------------
    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self._loop.beat_every)
            inflight = await adrive(self._loop.heartbeat(self.queues), self.connection.perform)
            await self.presence.abeat(self.connection.perform, inflight)
