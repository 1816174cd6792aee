"""The worker: runs handlers for one or more queues, in batches, and shuts down losing nothing.

Using::

    mq = EchoMQ(url)
    Worker(mq, {"work": handle, "reports": summarise}, concurrency=4).run()

A handler takes the claimed :class:`~echomq_core.Job` and returns the result (anything the
serializer takes). An exception fails the attempt with its text (retried with backoff up to
``max_attempts``, then dead) - ``KeyboardInterrupt``, ``SystemExit`` and ``GeneratorExit``
raised by a handler included: they end the attempt, never the runner; Ctrl-C and SIGTERM reach
the process through its signal handlers, not through a handler. :class:`~echomq_core.Unrecoverable`
buries the job at once; a result that cannot be serialised buries the job with that error. The
worker survives all of them.

Time limits: a job's own ``timeout`` (``JobSpec``, ``Child``), else its queue's, else the
worker's ``timeout``. A handler still running past it is abandoned: the job's lease is no
longer extended, a failed attempt is recorded (``TimeoutError``, retried by the usual policy),
and a fresh runner takes the slot. Python cannot kill a thread, so the abandoned call runs on;
whatever it returns later is refused by its lease token and changes nothing.

Design (shared with :class:`~echomq_core.work.async_worker.AsyncWorker`: both drive the one
loop of :mod:`echomq_core.work.loop`): one *fetcher* thread claims jobs into a local buffer, and
``concurrency`` runner threads take them from it one at a time. While handlers are fast, a
claim doubles in size up to ``max_batch`` and the next is made while the buffer still holds
what the runners finish during its round trip (:class:`~echomq_core.work.running.Intake`), each
claim leasing the next batch ahead in the round trip that reads its rows, so no-op jobs cost
one round trip per batch whatever the concurrency; as soon as handlers are slow, a claim
takes only as many jobs as there are free runners (a worker never sits on work other workers
could take). One *flusher* thread records the results of every runner as one
pipelined ``complete`` / ``fail`` when the oldest result is ``flush_after`` old, when
``max_batch`` results are waiting, or at once when the worker has nothing else in hand (so the
fan-in of a finished child is not held back); the server's work on one batch overlaps the
handlers of the next. An idle fetcher blocks on its queues' wake-up hint instead of sleeping,
so work added later starts at once. One heartbeat thread extends the leases of everything in
flight every ``lease / 3`` seconds and watches time limits. Only the fetcher, the flusher and
the heartbeat talk to the server: a worker holds a few connections of its client's pool
whatever its concurrency, where one connection per runner used to be the rule.

Shutdown (SIGTERM, SIGINT or :meth:`stop`): runners stop claiming, finish the job in hand,
give unstarted jobs back to pending (no attempt counted) and flush results. Jobs still
running after ``grace`` seconds are given back too; a handler that finishes later finds its
lease gone and changes nothing. A second signal skips the wait. Nothing is lost and nothing
is left leased: anything the process could not give back (it was SIGKILLed) returns to
pending when its lease expires.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..client.sync_queue import Queue
from ..control.options import PumpOptions, WorkerOptions
from ..flows import spawning
from ..hooks import LifecycleHooks
from ..models import Job
from ..queues.hints import HintWatch
from ..wire.patience import WAIT_FOR_SERVER, patiently
from .driven import REGISTERING
from .loop import NAP, WIND_DOWN, Wait, fetching, flushing
from .routines import drive, give_back
from .running import draining_text
from .threads import WATCH_EVERY, Slot, ThreadRunners

if TYPE_CHECKING:
    from ..client.clients import EchoMQ

log = logging.getLogger("echomq_core.worker")
Handler = Callable[[Job], Any]


class Worker(ThreadRunners):
    """Runs ``handlers`` ({queue name: callable}) until stopped. Options:

    * ``concurrency`` (1): runner threads, i.e. jobs run at once.
    * ``max_batch`` (500): the most jobs one claim takes (fast handlers only).
    * ``batch`` (1): jobs per handler call. Above 1 the handler gets a list of up to that many
      jobs of one queue and returns a list of their results; ``batch={queue: n}`` for some
      queues only (the others keep one-job calls). See :mod:`echomq_core.work.batching`.
    * ``lease`` (30 s): lease per claim; heartbeats every lease / 3 keep long jobs leased.
    * ``poll`` (0.05 s) / ``max_poll`` (0.5 s): an idle worker waits for work starting at
      ``poll`` and backing off to ``max_poll`` while every queue is empty. It waits *blocked*
      on the queues' wake-up hint (BZPOPMIN), which every add, land, release, promotion and
      recovery sets, so new jobs start at once, not at the next poll; the timeout only bounds
      how late a due retry is noticed without a Pump. In a Cluster, a worker whose queues lie
      on different slots (a sharded queue's shards) blocks on each slot's hint, one waiter
      thread per slot (:class:`~echomq_core.queues.hints.HintWatch`). A sharded queue's handler
      serves every shard, claimed in turn. A
      queue whose rate limit lets no start through yet (:meth:`EchoMQ.set_rate_limit
      <echomq_core.EchoMQ.set_rate_limit>`) is not claimed from, nor its hint waited on,
      until the claim's reported time of the next start; with every queue held so the
      fetcher sleeps until the first of them. Jobs in the local buffer were claimed: they
      count as starts.
    * ``grace`` (30 s): how long a graceful stop waits for running handlers.
    * ``timeout`` (None): the default handler time limit in seconds for every queue; a queue's
      own (``queue_options``) and a job's own win. None: no limit.
    * ``queue_options``: passed to each :class:`Queue` (max_attempts, backoff, keep_completed,
      timeout).
    * ``hooks``: a :class:`~echomq_core.hooks.LifecycleHooks` (``job_completed``, ``job_dead``,
      ``flow_released``, ``flow_failed``; usually a :class:`~echomq_core.hooks.Hooks`), or None.
    * ``pump`` (True): the worker also does the Pump's work for its own queues, in a thread of
      its own: it drains their outboxes (the cross-queue fan-in of the children it runs),
      returns their expired leases to pending and sweeps their retention, under the same
      leases that let several Pumps and workers take turns (see :class:`~echomq_core.Pump`),
      so a flow settles with nothing but workers running. A
      :class:`~echomq_core.control.options.PumpOptions` tunes it; False leaves it all to
      ``echomq pump``.
    """

    _KIND = "thread"
    _QUEUE = Queue
    client: EchoMQ

    def __init__(
        self,
        client: EchoMQ,
        handlers: Mapping[str, Handler],
        *,
        options: WorkerOptions | None = None,
        queue_options: Mapping[str, Any] | None = None,
        hooks: LifecycleHooks | None = None,
        pump: bool | PumpOptions = True,
        wait_for_server: float = WAIT_FOR_SERVER,
        **settings: Any,
    ) -> None:
        """``settings`` are :class:`~echomq_core.control.options.WorkerOptions` fields by name
        (``concurrency=4, lease=60``), applied over ``options`` (or the defaults);
        ``batch`` may also be a ``{queue: size}`` mapping (:mod:`echomq_core.work.batching`).

        Construction reads the queues' shard configuration and registers them: while the
        server cannot take that yet (unreachable, a Cluster master failing over, full) it
        waits, logging what it waits for, for up to ``wait_for_server`` seconds (default
        :data:`~echomq_core.wire.patience.WAIT_FOR_SERVER`, as ``echomq worker --wait-for-server``;
        0 raises at once), then raises the last :class:`~echomq_core.ConnectionLost` or
        :class:`~echomq_core.ServerFull` - a fleet restarted during a failover waits it out."""
        self._configure(client, handlers, options, queue_options, hooks, pump, settings)
        shards = patiently(
            lambda: client.perform(self._read_shards()),
            what=self._reading_shards(),
            bound=wait_for_server,
            is_cluster=client.connection.is_cluster,
            logger=log,
        )
        self._serve_shards(shards)
        self._spawner = spawning.SyncSpawner(client)  # what job.spawn() calls
        self._stop = threading.Event()
        self._halt = threading.Event()  # second signal: do not wait for handlers
        self._beat_stop = threading.Event()
        self._lock = threading.Lock()
        self._jobs_ready = threading.Condition(self._lock)  # runners wait for the buffer
        self._want_jobs = threading.Condition(self._lock)  # the fetcher waits for free slots
        self._results_ready = threading.Condition(self._lock)  # the flusher waits for results
        self._fetcher_waits = False  # the fetcher waits on _want_jobs
        self._flusher_waits = False  # the flusher waits on _results_ready
        self._awake = 0  # runners not waiting for the buffer
        loop = self._make_loop(self._lock, self._stop)  # its rules run under self._lock
        loop.buffer, loop.wake_fetcher = self._buffer, self._wake_fetcher
        loop.wake_flusher = self._wake_flusher
        self._runners: list[threading.Thread] = []
        self._slots: list[Slot] = []
        self._helpers: list[threading.Thread] = []
        self._beater: threading.Thread | None = None
        self._loops = threading.local()  # each runner's event loop for async handlers
        self._encode = client.encode
        self._hints = HintWatch(
            client.perform, self._stop, "waiting for work", self._outage.warning
        )

        def register() -> None:
            for name in self.handlers:  # once per name: a retry does not write them again
                client.register_queue(name)

        patiently(
            register,
            what=REGISTERING,
            bound=wait_for_server,
            is_cluster=client.connection.is_cluster,
            logger=log,
        )

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> Worker:
        """Start the runner, fetcher, flusher and heartbeat threads and return (for in-process
        use)."""
        self._stop.clear()
        self._halt.clear()
        self._beat_stop.clear()
        self._loop.closing = False
        self._runners, self._slots = [], []
        self._hints = HintWatch(
            self.client.perform, self._stop, "waiting for work", self._outage.warning
        )
        for i in range(self.options.concurrency):
            self._spawn(i)
        self._helpers = [
            threading.Thread(target=self._fetcher, daemon=True, name="echomq-fetch"),
            threading.Thread(target=self._flusher, daemon=True, name="echomq-flush"),
        ]
        for thread in self._helpers:
            thread.start()
        self.presence.beat(self.client.perform, 0)
        self._beater = threading.Thread(
            target=self._heartbeats, daemon=True, name="echomq-heartbeat"
        )
        self._beater.start()
        if self.pump is not None:
            self.pump.start()
        return self

    def stop(self, *, wait: bool = True) -> None:
        """Stop claiming; with ``wait``, let running jobs finish for up to ``grace`` seconds,
        then give back whatever is still in flight."""
        self._stop.set()
        if not wait:
            self._halt.set()
        deadline = self._loop.deadline(wait)
        with self._lock:
            self._jobs_ready.notify_all()
            self._want_jobs.notify_all()
            # abandoned runners are not waited for: their calls hang
            live = [t for t, s in zip(self._runners, self._slots, strict=True) if not s.abandoned]
        self._give_back(self._loop.unstarted())
        for thread in live:  # in slices: a second signal (``_halt``) ends the wait at once
            while thread.is_alive() and not self._halt.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                thread.join(min(left, NAP))
        with self._lock:
            self._loop.closing = True
            self._results_ready.notify_all()
        for thread in self._helpers:  # the fetcher gives back a claim made during the stop
            left = deadline - time.monotonic()
            thread.join(WIND_DOWN if self._halt.is_set() else max(WIND_DOWN, left))
        self._give_back(list(self._hand.inflight.values()))
        self._beat_stop.set()
        if self._beater is not None:
            self._beater.join(WIND_DOWN)
            self.presence.leave(self.client.perform)
        if self.pump is not None:
            self.pump.stop_after_last_tick()

    def run(self, *, install_signals: bool = True) -> None:
        """Run in the foreground until SIGTERM/SIGINT (or :meth:`stop` from elsewhere)."""
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        self.start()
        while not self._stop.is_set():
            self._stop.wait(NAP)
        if self.signalled is not None and not self._halt.is_set():
            with self._lock:
                # an abandoned runner's job was failed already: not in flight
                running = [
                    j for s in self._slots if s.job and not s.abandoned for j in s.jobs or [s.job]
                ]
            log.warning(draining_text(self.signalled, running, self.options.grace))
        self.stop(wait=not self._halt.is_set())

    def _on_signal(self, signum: int, frame: Any) -> None:
        """SIGTERM / SIGINT: stop claiming and drain (:meth:`run` says what it waits for);
        a second one gives back the running jobs at once."""
        self._signal(signum)  # no lock: the main thread may hold it (a signal during stop())

    # -- the fetcher and the flusher: the loop's routines, on threads --------------------
    def _fetcher(self) -> None:
        drive(fetching(self._loop, self.queues, self._outage), self._perform)

    def _flusher(self) -> None:
        drive(flushing(self._loop, self.queues), self._perform)

    def _perform(self, op: Any) -> Any:
        """Run one step of the loop's routines: an operation on the client, or a
        :class:`~echomq_core.work.loop.Wait`."""
        if type(op) is Wait:
            return self._wait(op)
        return self.client.perform(op)

    def _wait(self, wait: Wait) -> bool:
        """A pause of the fetcher or the flusher. Waiting for room or for results, the part
        looks again under the lock first (a wake given since it looked is not missed), and
        flags that it waits so that runners wake it (:meth:`_wake_fetcher`); room: True when
        the fetcher may claim now."""
        if wait.what == Wait.ROOM:
            with self._lock:
                if self._hand.want() <= 0:
                    self._fetcher_waits = True
                    self._want_jobs.wait(wait.seconds)
                    self._fetcher_waits = False
                return self._hand.want() > 0
        if wait.what == Wait.RESULTS:
            with self._lock:
                left = self._loop.flush_wait()
                if left is not None and left > 0:
                    self._flusher_waits = True
                    self._results_ready.wait(left)
                    self._flusher_waits = False
        elif wait.what == Wait.WORK:
            self._idle(wait.seconds)
        else:
            self._stop.wait(wait.seconds)
        return True

    def _buffer(self, jobs: list[Job]) -> list[Job]:
        """:meth:`Loop.take_in <echomq_core.work.loop.Loop.take_in>` under the lock, waking runners;
        returns the jobs when the worker is stopping (the caller gives them back)."""
        with self._lock:
            if not self._loop.take_in(jobs):
                return jobs
            # one runner for fast CPU-bound jobs (the others would only take turns)
            self._jobs_ready.notify(len(jobs) if self._intake.spread else 1)
            return []

    def _idle(self, seconds: float) -> None:
        """Wait up to ``seconds`` for work: blocked on the wake-up hints where possible
        (:meth:`Loop.idle_hints <echomq_core.work.loop.Loop.idle_hints>`)."""
        names, keys, is_cluster = (
            list(self.handlers),
            self.client.keys,
            self.client.connection.is_cluster,
        )
        groups, seconds = self._loop.idle_hints(names, keys, is_cluster, seconds)
        if groups:
            self._hints.wait(groups, seconds)
        else:
            self._stop.wait(seconds)

    def _give_back(self, jobs: list[Job]) -> None:
        """:func:`~echomq_core.work.routines.give_back`, under this worker's lock."""
        drive(give_back(self._loop, self.queues, jobs), self.client.perform)

    # -- heartbeats and time limits -------------------------------------------------------
    def _heartbeats(self) -> None:
        """Extend the leases of everything in flight every ``lease / 3`` seconds and, every
        :data:`WATCH_EVERY`, abandon handlers past their time limit."""
        every = self._loop.beat_every
        next_beat = time.monotonic() + every
        while not self._beat_stop.wait(min(every, WATCH_EVERY)):
            self._watch()
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + every
            inflight = drive(self._loop.heartbeat(self.queues), self.client.perform)
            self.presence.beat(self.client.perform, inflight)
