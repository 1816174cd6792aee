"""The one worker loop: what the threaded and the asyncio worker decide, written once.

Both workers (see :mod:`echomq_core.work.worker`) have one *fetcher* that claims into a local
buffer, N *runners*, one *flusher* that records results in batches and one *heartbeat*. What
they decide - how much to claim and when, when to read the jobs claimed ahead, when to record
the waiting results and what to offer with them, when a buffered job's lease is re-checked,
how long an idle part naps, what a stop gives back - is decided here, by :class:`Loop` (what
a worker holds and the rules over it) and by the routines :func:`fetching` and
:func:`flushing` (the fetcher's and the flusher's loops). Those are generators, as the
exchanges of :mod:`echomq_core.work.routines` are: they yield the operations to run, and a
:class:`Wait` where the loop pauses; a driver runs them - on threads
(:func:`~echomq_core.work.routines.drive`, a :class:`Wait` on a condition of the worker's
lock) or on tasks (:func:`~echomq_core.work.routines.adrive`, on an :class:`asyncio.Event`).
The runners stay each driver's own (threads that take turns under a lock, tasks that await):
they call the loop's rules.

Nothing here is per job beyond what the workers did themselves: the loops yield per claim and
per batch, never per job, and a claim stays one round trip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from ..client.queue import QueueOps
from ..control.options import WorkerOptions
from ..hooks import LifecycleHooks
from ..models import Job
from ..queues.hints import hint_groups
from ..wire.calls import Op
from ..wire.keyspace import Keyspace
from ..wire.patience import Outage
from .routines import Routine, claim_turn, extend_leases, give_back, offer, read_ahead, record
from .running import (
    Failed,
    InHand,
    Intake,
    Outcome,
    RateWindows,
    split,
)

log = logging.getLogger("echomq_core.worker")
T = TypeVar("T")

#: How long a waiting part (a runner, the fetcher, the flusher, a stop waiting for runners)
#: naps before it looks at the stop flag again (s): a flag set without ``stop()`` (which wakes
#: them at once) is seen within this.
NAP = 0.2
#: The longest a fetcher waits for room while it holds jobs claimed ahead, unread (s; at
#: most a quarter of the lease): then it reads them into the buffer, where heartbeats extend
#: their leases. Runners free room within milliseconds while handlers are fast.
HOLD = 0.02
#: Buffered jobs claimed longer ago than this (s; at most a third of the lease) have their
#: leases re-checked (one call) before the next starts: a cancelled flow's claimed children
#: are dropped, not started.
RECHECK = 0.25
#: The least a stop waits for the fetcher, the flusher and the heartbeat to end (s): the
#: fetcher gives back a claim made during the stop, the flusher records the last results.
WIND_DOWN = 1.0
#: :meth:`Loop.flush_wait`: nothing waits and nothing will come, the flusher ends.
DONE = -1.0


@dataclass(frozen=True, slots=True)
class Wait:
    """A pause :func:`fetching` or :func:`flushing` asks its driver for: ``what`` (one of
    the kinds below) for up to ``seconds``."""

    what: str
    seconds: float

    #: a runner is free or the buffer ran low (the driver answers True: claim now)
    ROOM: ClassVar[str] = "room"
    #: results are due (:meth:`Loop.flush_wait`)
    RESULTS: ClassVar[str] = "results"
    #: ``seconds`` or a stop
    SLEEP: ClassVar[str] = "sleep"
    #: the queues' wake-up hints, ``seconds`` at most (an idle fetcher)
    WORK: ClassVar[str] = "work"


#: The fetcher's and the flusher's loops: :data:`~echomq_core.work.routines.Routine` s that also
#: yield a :class:`Wait` where they pause.
Looping = Generator[Op[Any] | Wait, Any, T]


class Loop:
    """What one worker holds (:class:`~echomq_core.work.running.InHand`, its claim sizing,
    rate windows, counts) and the rules over it, whatever drives it: the threaded worker
    calls the rules under ``lock``, the asyncio one with a null context. ``buffer`` is the
    driver's: put leased jobs in the buffer and wake runners (returns the jobs it does not take:
    the worker is stopping). ``wake_fetcher`` / ``wake_flusher``: wake those parts (the threaded
    one under the lock)."""

    def __init__(
        self,
        options: WorkerOptions,
        per_call: int,
        hooks: LifecycleHooks | None,
        lock: AbstractContextManager[Any],
        stop: Any,
    ) -> None:
        self.options = options
        self.intake = Intake(options.concurrency, options.max_batch, options.fast_job, per_call)
        self.hand = InHand(options, self.intake)
        self.windows = RateWindows()
        self.hooks = hooks
        self.lock = lock
        self.stop = stop  # a threading.Event or an asyncio.Event: only is_set() is read
        self.completed = 0  # completions the server recorded
        self.failed = 0  # failed attempts the server recorded
        self.closing = False  # the runners are done: the flusher ends once nothing waits
        self.recheck = min(RECHECK, options.lease / 3)
        self.checked = 0.0  # when leases were last re-checked (monotonic)
        self.checking = False  # a runner re-checks them now
        self.hold = min(HOLD, options.lease / 4)
        #: the heartbeat's period: three beats in a lease, so one lost beat loses no lease
        self.beat_every = options.lease / 3
        self.buffer: Callable[[list[Job]], list[Job]] = lambda jobs: jobs
        self.wake_fetcher: Callable[[], Any] = lambda: None
        self.wake_flusher: Callable[[], Any] = lambda: None

    # -- the runners ----------------------------------------------------------------------
    def add_result(self, job: Job, result: Outcome) -> None:
        """Hand one result to the flusher (under the lock): woken when the batch is due, and
        the fetcher too while handlers are slow (a runner is free: claim for it)."""
        self.hand.add_result(job, result)
        if self.hand.flush_now(self.stop.is_set()):
            self.wake_flusher()
        if not self.intake.fast:
            self.wake_fetcher()

    def take_in(self, jobs: list[Job]) -> bool:
        """Take leased jobs (claimed, or handed off with results) into hand and the buffer
        (under the lock); False when the worker is stopping: in hand only, for the caller to
        give back. The driver wakes runners for them."""
        inflight = self.hand.inflight
        for job in jobs:
            inflight[(job.shard, job.id)] = job
        if self.stop.is_set():
            return False
        now = time.monotonic()
        self.hand.buffer.extend((job, now) for job in jobs)
        return True

    def idle_hints(
        self, names: list[str], keys: Keyspace, is_cluster: bool, seconds: float
    ) -> tuple[list[list[str]], float]:
        """How an idle fetcher of ``names`` waits for work, ``seconds`` at most: the wake-up
        hint keys it blocks on, grouped by slot (one BZPOPMIN each; none: a plain sleep), and
        for how long - while rate windows are spent, not past the first opening, and on
        their queues' hints not at all (see :class:`~echomq_core.work.running.RateWindows`)."""
        wake, seconds = self.windows.idle_plan(names, seconds)
        if wake is None or self.stop.is_set():
            return [], seconds
        return hint_groups([keys.wake(q) for q in wake], is_cluster), seconds

    def check_due(self, now: float) -> bool:
        """A runner took a job that waited ``recheck`` or longer in the buffer (the caller
        compares, on its hot path): True (and the check noted as under way, under the lock)
        when the buffered jobs' leases are to be re-checked before it starts - no check ran
        for ``recheck`` and none runs now (:meth:`check_leases`)."""
        if now - self.checked < self.recheck or self.checking:
            return False
        self.checking, self.checked = True, now
        return True

    def check_leases(self, queues: Mapping[str, QueueOps], taken: list[Job]) -> Routine[None]:
        """Extend the leases of the buffered jobs (and ``taken``), noting those found gone:
        they are dropped, not started (:meth:`InHand.drop_if_lost`)."""
        try:
            with self.lock:
                jobs = [*taken, *(j for j, _ in self.hand.buffer)]
            yield from extend_leases(self, queues, jobs, "lease check")
        finally:
            with self.lock:
                self.checking = False

    def heartbeat(self, queues: Mapping[str, QueueOps]) -> Routine[int]:
        """Extend the lease of every job in hand (every ``lease / 3``); returns how many."""
        with self.lock:
            jobs = list(self.hand.inflight.values())
        yield from extend_leases(self, queues, jobs, "heartbeat")
        return len(jobs)

    # -- the flusher ----------------------------------------------------------------------
    def flush_wait(self) -> float | None:
        """None: record the waiting results now (:meth:`InHand.flush_now`); else how long
        the flusher waits first (s), or :data:`DONE` when nothing waits and the worker is
        closing (under the lock)."""
        hand = self.hand
        if hand.results and hand.flush_now(self.stop.is_set()):
            return None
        if not hand.results:
            return DONE if self.closing else NAP
        return max(0.001, hand.wait_left(time.monotonic()))

    def keep(self, done: list[tuple[Job, bytes]], failed: list[Failed]) -> bool:
        """:meth:`InHand.keep` (under the lock): a closing worker keeps nothing."""
        return self.hand.keep(done, failed, self.closing)

    # -- a stop ---------------------------------------------------------------------------
    def deadline(self, wait: bool) -> float:
        """Until when (monotonic) a stop waits for running handlers: ``grace`` seconds with
        ``wait``, else not at all."""
        return time.monotonic() + (self.options.grace if wait else 0.0)

    def unstarted(self) -> list[Job]:
        """Empty the buffer (under the lock): the jobs a stop gives back untouched."""
        with self.lock:
            jobs = [job for job, _ in self.hand.buffer]
            self.hand.buffer.clear()
        return jobs


def time_limit(jobs: list[Job], queues: Mapping[str, QueueOps]) -> int | None:
    """The time limit of one call of ``jobs`` (ms, None: none): the smallest of theirs, each
    a job's own, else its queue's (whose default is the worker's ``timeout``)."""
    limits = [job.timeout_ms or queues[job.shard].timeout_ms for job in jobs]
    return min((ms for ms in limits if ms), default=None)


def timed_out(limit: float) -> Outcome:
    """The failed attempt of a call that ran past its time limit (retried as any)."""
    return (f"TimeoutError: the handler ran longer than {limit:g}s", True, None)


def fetching(loop: Loop, queues: Mapping[str, QueueOps], outage: Outage) -> Looping[None]:
    """The fetcher: claim while there is room, until the worker stops. While handlers are
    fast each claim leases the next batch ahead in the round trip that reads its rows
    (:meth:`QueueOps.claim_op <echomq_core.client.queue.QueueOps.claim_op>`'s ``ahead``,
    once the ramp reached ``max_batch``: each claim then asks the same); those are read
    into the buffer when no room comes within :data:`HOLD`, so no lease is held unread
    through a wait. A claim that failed waits ``idle`` before the next; a turn that found
    nothing waits on the wake-up hints, backing off from ``poll`` to ``max_poll``. The
    queues are claimed from in turn, starting one further after each take (none starves)."""
    options, intake, hand, stopping = loop.options, loop.intake, loop.hand, loop.stop.is_set
    names, windows, warn = list(queues), loop.windows, outage.warning
    idle, turn = options.poll, 0
    try:
        while not stopping():
            with loop.lock:
                want = hand.want()
                ahead = intake.fast and intake.batch >= options.max_batch
            if want <= 0:
                held = any(q.ahead for q in queues.values())
                roomy = yield Wait(Wait.ROOM, loop.hold if held else NAP)
                if held and not roomy:  # no room within HOLD: the held jobs join the buffer
                    yield from take_ahead(loop, queues)
                continue
            claim = claim_turn(queues, names, turn, want, ahead, windows, stopping, warn)
            jobs, seconds, failed = yield from claim
            if failed:  # a claim failed: not again at once
                yield Wait(Wait.SLEEP, idle)
            else:
                outage.up()  # one attribute read while the server answers
            if jobs:
                turn += 1
                yield from take(loop, queues, jobs, seconds)
                idle = options.poll
            else:
                yield Wait(Wait.WORK, idle)
                idle = min(options.max_poll, idle * 2)
    finally:  # a stopping worker gives back what it claimed ahead
        yield from take_ahead(loop, queues)


def take_ahead(loop: Loop, queues: Mapping[str, QueueOps]) -> Routine[None]:
    """:func:`~echomq_core.work.routines.read_ahead`: the jobs claimed ahead join the buffer
    (or are given back: the worker is stopping)."""
    for jobs, seconds in (yield from read_ahead(queues)):
        yield from take(loop, queues, jobs, seconds)


def take(
    loop: Loop, queues: Mapping[str, QueueOps], jobs: list[Job], seconds: float
) -> Routine[None]:
    """Put claimed jobs in the buffer (or give them back: the worker is stopping)."""
    with loop.lock:
        loop.intake.claimed(len(jobs), seconds)
    back = loop.buffer(jobs)
    if back:
        yield from give_back(loop, queues, back)


def flushing(loop: Loop, queues: Mapping[str, QueueOps]) -> Looping[None]:
    """The flusher: record the waiting results when they are due (:meth:`Loop.flush_wait`),
    one queue's batch at a time (:func:`~echomq_core.work.routines.record`), offering the
    free runners' room for the capped children the results let in (a hand-off); ends once
    the worker closes with nothing waiting. A batch that fails to record is logged, and the
    flusher goes on: results would otherwise wait for ever."""
    hand = loop.hand
    while True:
        with loop.lock:
            wait = loop.flush_wait()
            if wait is None:
                items, hand.results = hand.results, []
                hand.flushing = len(items)
        if wait == DONE:
            return
        if wait is not None:
            yield Wait(Wait.RESULTS, wait)
            continue
        try:
            for name, (done, failed) in split(items).items():
                queue = queues[name]
                with loop.lock:
                    room = 0 if loop.stop.is_set() else hand.want()
                yield from record(loop, queue, done, failed, offer(queue, room))
        except Exception:  # never die: results would wait for ever
            log.exception("recording %d result(s) failed; their leases will expire", len(items))
        finally:
            with loop.lock:
                hand.flushing = 0
                loop.wake_fetcher()
