"""The threaded worker's runners: ``concurrency`` threads that take jobs from the buffer under
the worker's lock and run their handlers, and the watchdog that abandons a handler past its
time limit (Python cannot kill a thread: a fresh runner takes the slot, and whatever the
abandoned call returns later is refused by its lease token). What they decide with - when a
buffered job's lease is re-checked, a call's time limit, where a result goes - is the
worker's :class:`~echomq_core.work.loop.Loop`; :class:`~echomq_core.work.worker.Worker` is
made of these and of the loop's routines on threads."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..client.sync_queue import Queue
from ..models import Job
from . import batching
from .driven import Driven
from .loop import NAP, time_limit, timed_out
from .routines import drive
from .running import Outcome, outcome

if TYPE_CHECKING:
    from ..client.clients import EchoMQ

log = logging.getLogger("echomq_core.worker")
Handler = Callable[[Job], Any]

#: How often the watchdog looks for handlers past their time limit (s).
WATCH_EVERY = 0.1


@dataclass(eq=False)
class Slot:
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


class ThreadRunners(Driven[Queue]):
    """The runner threads of a :class:`~echomq_core.work.worker.Worker` and their watchdog
    (what the runners share is the worker's, under its lock)."""

    client: EchoMQ
    _lock: threading.Lock
    _stop: threading.Event
    _jobs_ready: threading.Condition
    _want_jobs: threading.Condition
    _results_ready: threading.Condition
    _fetcher_waits: bool
    _flusher_waits: bool
    _awake: int
    _runners: list[threading.Thread]
    _slots: list[Slot]
    _encode: Any
    _loops: threading.local

    def _spawn(self, index: int) -> None:
        """Start runner ``index`` (again, when the watchdog abandoned the previous one)."""
        slot = Slot(index)
        thread = threading.Thread(
            target=self._runner, args=(slot,), daemon=True, name=f"echomq-runner-{index}"
        )
        with self._lock:
            self._slots.append(slot)
            self._runners.append(thread)
        thread.start()

    def _runner(self, slot: Slot) -> None:
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

    def _run_jobs(self, slot: Slot) -> None:
        """Take jobs from the buffer and run them. The hot path takes the lock once per job:
        recording one job's result, waiting for the next, taking it and starting it."""
        lock, handlers, queues, loop = self._lock, self.handlers, self.queues, self._loop
        recheck = loop.recheck
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
                        self._nap()
                    if self._stop.is_set() or slot.abandoned:
                        return
                    job, claimed = self._hand.buffer.popleft()
                    if self._hand.buffer:
                        self._wake_fetcher()  # maybe below the depth: the next claim may start
                    now = time.monotonic()
                    # buffered jobs claimed long ago have their leases re-checked (one
                    # runner at a time) before the next starts
                    check = now - claimed >= recheck and loop.check_due(now)
                    if not check and not self._hand.lost:  # nothing to check: start it now
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

    def _run_batches(self, slot: Slot) -> None:
        """:meth:`_run_jobs` for a worker with batch handlers: each call takes the buffer's
        head and the jobs of its queue behind it (:func:`~echomq_core.work.batching.take`; one job
        for a queue of one-job handlers), its time limit the smallest of theirs."""
        lock, queues, loop = self._lock, self.queues, self._loop
        recheck = loop.recheck
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
                        self._nap()
                    if self._stop.is_set() or slot.abandoned:
                        return
                    taken = batching.take(self._hand.buffer, self.batches)
                    if self._hand.buffer:
                        self._wake_fetcher()
                    now = time.monotonic()
                    check = now - taken[0][1] >= recheck and loop.check_due(now)
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
            with lock:
                self._begin(slot, jobs[0], time_limit(jobs, queues), time.monotonic())
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

    def _finish_batch(self, slot: Slot, done: list[batching.Done]) -> bool:
        """:meth:`_finish` for a call of one or more jobs (under the lock)."""
        took = time.monotonic() - slot.started
        slot.job, slot.jobs, slot.deadline = None, [], 0.0
        if slot.abandoned:  # the watchdog failed these jobs and freed the slot
            for job, result in done:
                if isinstance(result, bytes):  # presented with its gone token: refused
                    self._loop.add_result(job, result)
            return True
        self._hand.running -= 1
        self._intake.observe(took)
        for job, result in done:
            self._loop.add_result(job, result)
        return False

    def _begin(self, slot: Slot, job: Job, limit_ms: int | None, now: float) -> None:
        """Runner ``slot`` starts ``job`` now (under the lock)."""
        slot.job, slot.limit, slot.started = job, (limit_ms or 0) / 1000, now
        slot.deadline = now + slot.limit if limit_ms else 0.0
        self._hand.running += 1

    def _finish(
        self, slot: Slot, job: Job, result: Outcome, cpu: tuple[float, float] | None
    ) -> bool:
        """Runner ``slot``'s call of ``job`` returned ``result`` (under the lock). True when
        the watchdog abandoned the call meanwhile: the runner's thread ends."""
        took = time.monotonic() - slot.started
        slot.job, slot.deadline = None, 0.0
        if slot.abandoned:  # the watchdog failed this job and freed the slot
            if isinstance(result, bytes):  # presented with its gone token: refused
                self._loop.add_result(job, result)
            return True
        self._hand.running -= 1
        self._intake.observe(took, cpu)
        self._loop.add_result(job, result)
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

    def _nap(self) -> None:
        """A runner waits (under the lock) for jobs in the buffer, :data:`NAP` at most (the
        fetcher told first: there is room), not counted awake meanwhile."""
        self._wake_fetcher()
        self._awake -= 1
        self._jobs_ready.wait(NAP)
        self._awake += 1

    def _wake_flusher(self) -> None:
        """Wake the flusher if it waits for results (under the lock), once per wait (as
        :meth:`_wake_fetcher`)."""
        if self._flusher_waits:
            self._flusher_waits = False
            self._results_ready.notify()

    def _rest(self, slot: Slot) -> bool:
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

    def _check_leases(self, taken: list[Job]) -> None:
        """:meth:`Loop.check_leases <echomq_core.work.loop.Loop.check_leases>`."""
        drive(self._loop.check_leases(self.queues, taken), self.client.perform)

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

    def _watch(self) -> None:
        """Abandon every runner whose handler is past its deadline: fail that job
        (``TimeoutError``, retried by the usual policy) and start a fresh runner in its
        place."""
        now = time.monotonic()
        taken: list[Slot] = []
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
                error = timed_out(slot.limit)
                for each in slot.jobs or [job]:  # a batch call: every job of it
                    self._loop.add_result(each, error)
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
