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

Design (shared with :class:`~echomq_core.work.async_worker.AsyncWorker`, see
:mod:`echomq_core.work.running`): one *fetcher* thread claims jobs into a local buffer, and
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

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..client.sync_queue import Queue
from ..control.options import PumpOptions, WorkerOptions, build
from ..flows import sharding, spawning
from ..hooks import LifecycleHooks
from ..models import Job
from ..pump.pump import worker_pump
from ..queues.hints import HintWatch, hint_groups
from ..queues.registry import Presence
from ..wire.patience import WAIT_FOR_SERVER, Outage, patiently
from . import batching
from .routines import (
    claim_turn,
    drive,
    extend_leases,
    give_back,
    offer,
    read_ahead,
    record,
)
from .running import (
    HOLD,
    Failed,
    InHand,
    Intake,
    OptionAttributes,
    Outcome,
    RateWindows,
    draining_text,
    logical_names,
    make_queues,
    outcome,
    serving,
    split,
)

if TYPE_CHECKING:
    from ..client.clients import EchoMQ

log = logging.getLogger("echomq_core.worker")
Handler = Callable[[Job], Any]
#: How often the watchdog looks for handlers past their time limit (s).
WATCH_EVERY = 0.1
#: How long a waiting runner or fetcher sleeps before it looks at the stop flag again (s): a
#: flag set without :meth:`Worker.stop` (which wakes them at once) is seen within this.
NAP = 0.2


@dataclass(eq=False)
class _Slot:
    """One runner's state, shared with the watchdog (under the worker's lock): the job whose
    handler runs now and its deadline - what the watchdog takes over when it abandons the
    runner."""

    index: int
    job: Job | None = None
    started: float = 0.0  # monotonic
    deadline: float = 0.0  # monotonic; 0: no limit
    limit: float = 0.0
    abandoned: bool = False
    #: the jobs of the batch call running now (``job`` is the first); empty for one-job calls
    jobs: list[Job] = field(default_factory=list)


class Worker(OptionAttributes):
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
      queue whose rate window is spent (:meth:`EchoMQ.set_rate_limit
      <echomq_core.EchoMQ.set_rate_limit>`) is not claimed from, nor its hint waited on,
      until the claim's reported opening; with every queue spent the fetcher sleeps until the
      first opens. Jobs in the local buffer were claimed: they count as starts.
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
        settings = dict(settings)
        per_queue = batching.split_setting(settings)
        opts = self.options = build(WorkerOptions, options, settings)
        make_queues(client, handlers, opts, queue_options, Queue)  # refuse bad input first
        is_cluster = client.connection.is_cluster
        # a sharded queue is served by serving every shard (one read, cached by the client)
        shards = patiently(
            lambda: client.perform(sharding.resolve(client.keys, client.shard_cache, handlers)),
            what=f"worker: reading the shard configuration of {', '.join(map(repr, handlers))}",
            bound=wait_for_server,
            is_cluster=is_cluster,
            logger=log,
        )
        logical = logical_names(handlers, shards)
        #: {queue: jobs per call} of the queues whose handler takes lists (size above 1)
        self.batches = batching.sizes(opts.batch, per_queue, logical, opts.max_batch)
        handlers = serving(handlers, shards)
        self.queues = make_queues(client, handlers, opts, queue_options, Queue, logical)
        self.pump = worker_pump(client, list(self.queues), pump, hooks)
        self.client = client
        self._spawner = spawning.SyncSpawner(client)  # what job.spawn() calls
        self.handlers = dict(handlers)
        self.hooks = hooks
        #: this process's entry in the workers registry (:mod:`echomq_core.queues.registry`)
        self.presence = Presence(
            client.keys, list(handlers), opts.concurrency, "thread", opts.lease
        )
        for queue in self.queues.values():  # its lease tokens name this worker
            queue.holder = self.presence.entry.id
        self.completed = 0
        self.failed = 0
        #: the signal that stopped :meth:`run` (SIGINT or SIGTERM), None until one came
        self.signalled: int | None = None
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
        self._closing = False
        per_call = max(self.batches.values(), default=1)
        self._intake = Intake(opts.concurrency, opts.max_batch, opts.fast_job, per_call)
        self._hand = InHand(opts, self._intake)  # under self._lock
        self._runners: list[threading.Thread] = []
        self._slots: list[_Slot] = []
        self._helpers: list[threading.Thread] = []
        self.abandoned = 0  # handler calls left running past their time limit
        #: Buffered jobs claimed longer ago than this have their leases re-checked (one call)
        #: before the next starts: a cancelled flow's claimed children are dropped, not started.
        self.recheck = min(0.25, opts.lease / 3)
        self._checked = 0.0
        self._checking = False
        self._wake = self._wake_queues(client, list(self.handlers))
        self._windows = RateWindows()
        self._beater: threading.Thread | None = None
        self._loops = threading.local()  # each runner's event loop for async handlers
        self._encode = client.encode
        #: the fetcher's and hint waits' warnings while the server is down, backed off
        self._outage = Outage(log, f"worker {self.presence.entry.id}")
        self._hints = HintWatch(
            client.perform, self._stop, "waiting for work", self._outage.warning
        )

        def register() -> None:
            for name in self.handlers:  # once per name: a retry does not write them again
                client.register_queue(name)

        patiently(
            register,
            what="worker: registering its queues",
            bound=wait_for_server,
            is_cluster=is_cluster,
            logger=log,
        )

    def __repr__(self) -> str:
        return f"Worker(queues={sorted(self.handlers)}, concurrency={self.concurrency})"

    @staticmethod
    def _wake_queues(client: EchoMQ, names: list[str]) -> list[str] | None:
        """The queues whose hints an idle fetcher blocks on: all of them, one BZPOPMIN per
        slot (:func:`~echomq_core.work.running.wait_on_groups`)."""
        return names

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> Worker:
        """Start the runner, fetcher, flusher and heartbeat threads and return (for in-process
        use)."""
        self._stop.clear()
        self._halt.clear()
        self._beat_stop.clear()
        self._closing = False
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

    def _spawn(self, index: int) -> None:
        """Start runner ``index`` (again, when the watchdog abandoned the previous one)."""
        slot = _Slot(index)
        thread = threading.Thread(
            target=self._runner, args=(slot,), daemon=True, name=f"echomq-runner-{index}"
        )
        with self._lock:
            self._slots.append(slot)
            self._runners.append(thread)
        thread.start()

    def stop(self, *, wait: bool = True) -> None:
        """Stop claiming; with ``wait``, let running jobs finish for up to ``grace`` seconds,
        then give back whatever is still in flight."""
        self._stop.set()
        if not wait:
            self._halt.set()
        deadline = time.monotonic() + (self.options.grace if wait else 0.0)
        with self._lock:
            self._jobs_ready.notify_all()
            self._want_jobs.notify_all()
            unstarted = [job for job, _ in self._hand.buffer]
            self._hand.buffer.clear()
            # abandoned runners are not waited for: their calls hang
            live = [t for t, s in zip(self._runners, self._slots, strict=True) if not s.abandoned]
        self._give_back(unstarted)
        for thread in live:  # in slices: a second signal (``_halt``) ends the wait at once
            while thread.is_alive() and not self._halt.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                thread.join(min(left, NAP))
        with self._lock:
            self._closing = True
            self._results_ready.notify_all()
        for thread in self._helpers:  # the fetcher gives back a claim made during the stop
            thread.join(1.0 if self._halt.is_set() else max(1.0, deadline - time.monotonic()))
        self._give_back(list(self._hand.inflight.values()))
        self._beat_stop.set()
        if self._beater is not None:
            self._beater.join(1.0)
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
            self._stop.wait(0.2)
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
        # no lock here: the main thread may hold it (a second signal during stop())
        if self._stop.is_set():
            log.warning("second signal: giving back the running jobs now")
            self._halt.set()
        else:
            self.signalled = signum
        self._stop.set()

    # -- the fetcher ----------------------------------------------------------------------
    def _fetcher(self) -> None:
        try:
            self._fetch()
        finally:  # a stopping worker gives back what it claimed ahead
            self._read_ahead()

    def _fetch(self) -> None:
        """Claim while there is room. While handlers are fast, each claim leases the next
        batch ahead in the round trip that reads its rows (:meth:`Queue.claim_op
        <echomq_core.Queue.claim_op>`'s ``ahead``): those are read before the fetcher waits,
        so no lease is held unread through a wait."""
        names = list(self.handlers)
        idle, turn = self.options.poll, 0
        hold = min(HOLD, self.options.lease / 4)
        while not self._stop.is_set():
            with self._lock:
                want = self._hand.want()
                # claims ahead once fast handlers ramped the batch up (each claim then asks
                # the same max_batch): the ramp's claims each take what the last one earned
                ahead = self._intake.fast and self._intake.batch >= self.options.max_batch
                if want <= 0:
                    held = any(q.ahead for q in self.queues.values())
                    self._fetcher_waits = True
                    self._want_jobs.wait(hold if held else NAP)
                    self._fetcher_waits = False
                    if not held or self._hand.want() > 0:
                        continue
            if want <= 0:  # no room within HOLD: the held jobs join the buffer
                self._read_ahead()
                continue
            turn_of = claim_turn(
                self.queues,
                names,
                turn,
                want,
                ahead,
                self._windows,
                self._stop.is_set,
                self._outage.warning,
            )
            jobs, seconds, failed = drive(turn_of, self.client.perform)
            if failed:  # a claim failed: not again at once
                self._stop.wait(idle)
            else:
                self._outage.up()  # one attribute read while the server answers
            if jobs:
                turn += 1
                self._take(jobs, seconds)
                idle = self.options.poll
            else:
                self._idle(idle)
                idle = min(self.options.max_poll, idle * 2)

    def _read_ahead(self) -> None:
        """:func:`~echomq_core.work.routines.read_ahead`: the jobs claimed ahead join the buffer
        (or are given back: the worker is stopping)."""
        for jobs, seconds in drive(read_ahead(self.queues), self.client.perform):
            self._take(jobs, seconds)

    def _take(self, jobs: list[Job], seconds: float) -> None:
        """Put claimed jobs in the buffer (or give them back: the worker is stopping)."""
        with self._lock:
            self._intake.claimed(len(jobs), seconds)
        back = self._buffer(jobs)
        if back:
            self._give_back(back)

    def _buffer(self, jobs: list[Job]) -> list[Job]:
        """Put leased jobs (claimed, or handed off with results) in the buffer; returns them
        instead when the worker is stopping (the caller gives them back)."""
        now = time.monotonic()
        with self._lock:
            for job in jobs:
                self._hand.inflight[(job.shard, job.id)] = job
            if self._stop.is_set():
                return jobs
            self._hand.buffer.extend((job, now) for job in jobs)
            # one runner for fast CPU-bound jobs (the others would only take turns)
            self._jobs_ready.notify(len(jobs) if self._intake.spread else 1)
            return []

    def _idle(self, seconds: float) -> None:
        """Wait up to ``seconds`` for work: blocked on the wake-up hint where possible; while
        rate windows are spent, not past the first opening, and on their queues' hints not at
        all (see :class:`~echomq_core.work.running.RateWindows`)."""
        wake, seconds = self._windows.idle_plan(list(self.handlers), self._wake, seconds)
        if wake is None or self._stop.is_set():
            self._stop.wait(seconds)
            return
        hints = [self.client.keys.wake(q) for q in wake]
        groups = hint_groups(hints, self.client.connection.is_cluster)
        self._hints.wait(groups, seconds)

    # -- the runners ----------------------------------------------------------------------
    def _runner(self, slot: _Slot) -> None:
        with self._lock:
            self._awake += 1
        try:
            if self.batches:
                self._run_batches(slot)
            else:  # the per-job loop, untouched by batch handlers
                self._run_jobs(slot)
        finally:
            with self._lock:
                if not slot.abandoned:  # an abandoned runner stopped counting at the time
                    self._awake -= 1

    def _run_jobs(self, slot: _Slot) -> None:
        """Take jobs from the buffer and run them. The hot path takes the lock once per job:
        recording one job's result, waiting for the next, taking it and starting it."""
        lock, handlers, queues, recheck = self._lock, self.handlers, self.queues, self.recheck
        finished: tuple[Job, Outcome, tuple[float, float] | None] | None = None
        calls = 0
        while True:
            gone = started = check = False
            with lock:
                if finished is not None:
                    gone = self._finish(slot, *finished)
                    if not gone:
                        finished = None
                if not gone:
                    while (
                        not self._stop.is_set()
                        and not slot.abandoned
                        and (not self._hand.buffer or self._rest(slot))
                    ):
                        self._wake_fetcher()
                        self._awake -= 1
                        self._jobs_ready.wait(NAP)
                        self._awake += 1
                    if self._stop.is_set() or slot.abandoned:
                        return
                    job, claimed = self._hand.buffer.popleft()
                    if self._hand.buffer:
                        self._wake_fetcher()  # maybe below the depth: the next claim may start
                    now = time.monotonic()
                    # buffered jobs claimed long ago have their leases re-checked (one
                    # runner at a time) before the next starts
                    check = (
                        now - claimed >= recheck
                        and now - self._checked >= recheck
                        and not self._checking
                    )
                    if check:
                        self._checking, self._checked = True, now
                    elif not self._hand.lost:  # nothing to check: start it now
                        self._begin(slot, job, job.timeout_ms or queues[job.shard].timeout_ms, now)
                        started = True
            if gone:
                assert finished is not None
                log.warning(
                    "runner %d: the call that ran %s past its time limit returned; the thread ends",
                    slot.index,
                    finished[0].id,
                )
                return
            if not started:
                if check:
                    self._check_leases([job])
                if self._drop_if_lost(job):
                    continue
                limit_ms = job.timeout_ms or queues[job.shard].timeout_ms
                with lock:
                    self._begin(slot, job, limit_ms, time.monotonic())
            # the CPU share of handlers is sampled (every 8th call): a thread's CPU clock is a
            # system call (0.6 us on the 2-core benchmark VM, 13 times time.monotonic)
            sample = not calls & 7
            calls += 1
            if sample:
                cpu, wall = time.thread_time(), time.perf_counter()
                result = self._call(handlers[job.shard], job)
                spent = (time.thread_time() - cpu, time.perf_counter() - wall)
                finished = (job, result, spent)
            else:
                finished = (job, self._call(handlers[job.shard], job), None)

    def _run_batches(self, slot: _Slot) -> None:
        """:meth:`_run_jobs` for a worker with batch handlers: each call takes the buffer's
        head and the jobs of its queue behind it (:func:`~echomq_core.work.batching.take`; one job
        for a queue of one-job handlers), its time limit the smallest of theirs."""
        lock, queues, recheck = self._lock, self.queues, self.recheck
        finished: list[batching.Done] | None = None
        while True:
            gone = check = False
            with lock:
                if finished is not None:
                    gone = self._finish_batch(slot, finished)
                    if not gone:
                        finished = None
                if not gone:
                    while not self._stop.is_set() and not slot.abandoned and not self._hand.buffer:
                        self._wake_fetcher()
                        self._awake -= 1
                        self._jobs_ready.wait(NAP)
                        self._awake += 1
                    if self._stop.is_set() or slot.abandoned:
                        return
                    taken = batching.take(self._hand.buffer, self.batches)
                    if self._hand.buffer:
                        self._wake_fetcher()
                    now = time.monotonic()
                    check = (
                        now - taken[0][1] >= recheck
                        and now - self._checked >= recheck
                        and not self._checking
                    )
                    if check:
                        self._checking, self._checked = True, now
            if gone:
                assert finished is not None
                log.warning(
                    "runner %d: the call that ran %s past its time limit returned; the thread ends",
                    slot.index,
                    ", ".join(job.id for job, _ in finished[:3]),
                )
                return
            jobs = [job for job, _ in taken]
            if check:
                self._check_leases(jobs)
            if self._hand.lost:  # a cancelled flow's buffered children: not started
                jobs = [job for job in jobs if not self._drop_if_lost(job)]
                if not jobs:
                    continue
            limits = [job.timeout_ms or queues[job.shard].timeout_ms for job in jobs]
            limit_ms = min((ms for ms in limits if ms), default=None)
            with lock:
                self._begin(slot, jobs[0], limit_ms, time.monotonic())
                slot.jobs = jobs
            finished = self._call_batch(jobs)

    def _call_batch(self, jobs: list[Job]) -> list[batching.Done]:
        """Run one call: a batch handler on ``jobs``, or a one-job handler on its job."""
        shard = jobs[0].shard
        handler = self.handlers[shard]
        if shard not in self.batches:
            return [(jobs[0], self._call(handler, jobs[0]))]
        for job in jobs:
            job.spawner = self._spawner
        return batching.call(self._encode, jobs[0].queue, jobs, handler, self._settle)

    def _finish_batch(self, slot: _Slot, done: list[batching.Done]) -> bool:
        """:meth:`_finish` for a call of one or more jobs (under the lock)."""
        took = time.monotonic() - slot.started
        slot.job, slot.jobs, slot.deadline = None, [], 0.0
        if slot.abandoned:  # the watchdog failed these jobs and freed the slot
            for job, result in done:
                if isinstance(result, bytes):  # presented with its gone token: refused
                    self._add_result(job, result)
            return True
        self._hand.running -= 1
        self._intake.observe(took)
        for job, result in done:
            self._add_result(job, result)
        return False

    def _begin(self, slot: _Slot, job: Job, limit_ms: int | None, now: float) -> None:
        """Runner ``slot`` starts ``job`` now (under the lock)."""
        slot.job, slot.limit, slot.started = job, (limit_ms or 0) / 1000, now
        slot.deadline = now + slot.limit if limit_ms else 0.0
        self._hand.running += 1

    def _finish(
        self, slot: _Slot, job: Job, result: Outcome, cpu: tuple[float, float] | None
    ) -> bool:
        """Runner ``slot``'s call of ``job`` returned ``result`` (under the lock). True when
        the watchdog abandoned the call meanwhile: the runner's thread ends."""
        took = time.monotonic() - slot.started
        slot.job, slot.deadline = None, 0.0
        if slot.abandoned:  # the watchdog failed this job and freed the slot
            if isinstance(result, bytes):  # presented with its gone token: refused
                self._add_result(job, result)
            return True
        self._hand.running -= 1
        self._intake.observe(took, cpu)
        self._add_result(job, result)
        return False

    def _wake_fetcher(self) -> None:
        """Wake the fetcher if it waits for free slots and would claim now (under the lock).
        Runners call this on every job; a notify costs even with no thread waiting, and a
        fetcher woken to find a batch or more still in the buffer (fast handlers) is a thread
        switch per job for nothing. ``want()`` only grows when a runner takes a job, finishes
        one or the flusher empties a batch, and each of those calls this: no wake is missed.
        The flag is cleared with the notify: until the woken fetcher gets the GIL, runners
        finishing more jobs need not notify it again (it reads ``want()`` itself when it
        runs)."""
        if self._fetcher_waits and self._hand.want() > 0:
            self._fetcher_waits = False
            self._want_jobs.notify()

    def _wake_flusher(self) -> None:
        """Wake the flusher if it waits for results (under the lock), once per wait (as
        :meth:`_wake_fetcher`)."""
        if self._flusher_waits:
            self._flusher_waits = False
            self._results_ready.notify()

    def _rest(self, slot: _Slot) -> bool:
        """True when this runner should leave the buffer to another (under the lock): handlers
        are fast and CPU-bound (see :attr:`Intake.spread`) and another runner is in a call it
        started less than ``fast_job`` ago - it will be back for the next job in a moment, and
        two threads would only take turns on the GIL. A runner that rests looks again within
        :data:`NAP`, so a call that turns out long does not hold the buffer up for longer."""
        if self._intake.spread or self._awake <= 1:
            return False
        now = time.monotonic()
        return any(
            other is not slot
            and not other.abandoned
            and other.job is not None
            and now - other.started < self.options.fast_job
            for other in self._slots
        )

    def _add_result(self, job: Job, result: Outcome) -> None:
        """Hand one result to the flusher (under the lock)."""
        self._hand.add_result(job, result)
        if self._flush_now():
            self._wake_flusher()
        if not self._intake.fast:
            self._wake_fetcher()  # a runner is free: claim for it

    def _flush_now(self) -> bool:
        """Record the waiting results now (under the lock): see :meth:`InHand.flush_now`."""
        return self._hand.flush_now(self._stop.is_set())

    def _check_leases(self, taken: list[Job]) -> None:
        """Extend the leases of the buffered jobs (and ``taken``), noting those that are gone."""
        try:
            with self._lock:
                jobs = [*taken, *(j for j, _ in self._hand.buffer)]
            routine = extend_leases(self._hand, self.queues, jobs, "lease check", self._lock)
            drive(routine, self.client.perform)
        finally:
            with self._lock:
                self._checking = False

    def _drop_if_lost(self, job: Job) -> bool:
        """:meth:`InHand.drop_if_lost`, under the lock."""
        with self._lock:
            return self._hand.drop_if_lost(job)

    def _call(self, handler: Handler, job: Job) -> Outcome:
        """Run one handler: the encoded result, or (error text, retry?)."""
        job.spawner = self._spawner
        return outcome(self._encode, job, handler, self._settle)

    def _settle(self, awaitable: Any) -> Any:
        """What an awaitable a handler returned comes to: run on this runner thread's event
        loop (one per thread, kept)."""
        loop = getattr(self._loops, "loop", None)
        if loop is None:
            loop = self._loops.loop = asyncio.new_event_loop()
        return loop.run_until_complete(_await(awaitable))

    # -- the flusher ----------------------------------------------------------------------
    def _flusher(self) -> None:
        while True:
            with self._lock:
                while not (self._hand.results and self._flush_now()):
                    if self._closing and not self._hand.results:
                        return
                    self._flusher_waits = True
                    if self._hand.results:
                        left = self._hand.wait_left(time.monotonic())
                        self._results_ready.wait(max(0.001, left))
                    else:
                        self._results_ready.wait(NAP)
                    self._flusher_waits = False
                items, self._hand.results = self._hand.results, []
                self._hand.flushing = len(items)
            try:
                for name, (done, failed) in split(items).items():
                    self._flush(self.queues[name], done, failed)
            except Exception:  # never die: results would wait for ever
                log.exception("recording %d result(s) failed; their leases will expire", len(items))
            finally:
                with self._lock:
                    self._hand.flushing = 0
                    self._wake_fetcher()

    def _flush(self, queue: Queue, done: list[tuple[Job, bytes]], failed: list[Failed]) -> None:
        """:func:`~echomq_core.work.routines.record`, under this worker's lock, offering the free
        runners' room for the capped children the results let in (a hand-off)."""
        with self._lock:
            room = 0 if self._stop.is_set() else self._hand.want()
        routine = record(
            self._hand,
            queue,
            done,
            failed,
            self.hooks,
            self,
            self._lock,
            offer(queue, room),
            self._buffer,
            self._keep,
        )
        drive(routine, self.client.perform)

    def _keep(self, done: list[tuple[Job, bytes]], failed: list[Failed]) -> bool:
        """:meth:`InHand.keep` (called under the lock)."""
        return self._hand.keep(done, failed, self._closing)

    def _give_back(self, jobs: list[Job]) -> None:
        """:func:`~echomq_core.work.routines.give_back`, under this worker's lock."""
        drive(give_back(self._hand, self.queues, jobs, self._lock), self.client.perform)

    # -- heartbeats and time limits -------------------------------------------------------
    def _heartbeats(self) -> None:
        """Extend the leases of everything in flight every ``lease / 3`` seconds and, every
        :data:`WATCH_EVERY`, abandon handlers past their time limit."""
        every = self.options.lease / 3
        next_beat = time.monotonic() + every
        while not self._beat_stop.wait(min(every, WATCH_EVERY)):
            self._watch()
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + every
            with self._lock:
                jobs = list(self._hand.inflight.values())
            routine = extend_leases(self._hand, self.queues, jobs, "heartbeat", self._lock)
            drive(routine, self.client.perform)
            self.presence.beat(self.client.perform, len(jobs))

    def _watch(self) -> None:
        """Abandon every runner whose handler is past its deadline: fail that job
        (``TimeoutError``, retried by the usual policy) and start a fresh runner in its
        place."""
        now = time.monotonic()
        taken: list[_Slot] = []
        with self._lock:
            for slot in self._slots:
                if slot.abandoned or not slot.deadline or now < slot.deadline:
                    continue
                job = slot.job
                if job is None:
                    continue
                slot.abandoned = True
                self.abandoned += 1
                self._hand.running -= 1
                self._awake -= 1
                error = f"TimeoutError: the handler ran longer than {slot.limit:g}s"
                for each in slot.jobs or [job]:  # a batch call: every job of it
                    self._add_result(each, (error, True, None))
                self._results_ready.notify()
                taken.append(slot)
        for slot in taken:
            log.warning(
                "a job in runner %d ran past its time limit (%gs): failed the attempt, "
                "runner replaced (%d call(s) abandoned so far)",
                slot.index,
                slot.limit,
                self.abandoned,
            )
            if not self._stop.is_set():
                self._spawn(slot.index)


async def _await(awaitable: Any) -> Any:
    return await awaitable
