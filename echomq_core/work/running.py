"""What the threaded and the asyncio worker hold and read alike: how much to claim
(:class:`Intake`), what is in hand and when results are due (:class:`InHand`), which queues'
rate windows are spent (:class:`RateWindows`), how a handler's outcome is read
(:func:`outcome`), a worker's queues (:func:`make_queues`). The loop that decides with them is
:mod:`echomq_core.work.loop`; the exchanges with the server are in
:mod:`echomq_core.work.routines`.

Both workers have the same shape (see :mod:`echomq_core.work.worker`): one *fetcher* claims jobs
into a local buffer, N *runners* take jobs from it one at a time, one *flusher* records the
results of all runners in batched ``complete`` / ``fail`` calls, one *heartbeat* extends
leases and watches time limits. Only the fetcher, the flusher and the heartbeat talk to the
server, so a worker holds a handful of connections whatever its concurrency, and a claim or a
completion serves many runners: the commands per job do not grow with concurrency.
"""

from __future__ import annotations

import inspect
import logging
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..client.queue import QueueOps
from ..control.options import WorkerOptions
from ..errors import (
    InvalidArgument,
    InvalidPayload,
    Unrecoverable,
)
from ..models import Job
from ..wire.keyspace import check_queue

Q = TypeVar("Q", bound=QueueOps)

log = logging.getLogger("echomq_core.worker")

#: A handler's outcome: the encoded result, or (error text, retry?, traceback or None).
Outcome = bytes | tuple[str, bool, str | None]
#: A failed attempt of a worker: (job, error text, retry?, traceback or None).
Failed = tuple[Job, str, bool, str | None]
#: One queue's results: (job, encoded result) completed, failed attempts.
Batch = tuple[list[tuple[Job, bytes]], list[Failed]]
#: Weight of the newest handler duration in the running average that decides fast or slow.
SMOOTHING = 0.3
#: Results waiting or on their way, in batches of ``max_batch``, beyond which a worker claims
#: nothing more until the flusher catches up (back-pressure). Four: a flusher that gets the
#: GIL late (a runner busy on no-op jobs keeps it up to the 5 ms switch interval) does not
#: stall the claims too.
BEHIND = 4
#: The longest an idle fetcher sleeps on a rate limit before it claims again (s): the next
#: allowed start comes first for fast limits; for slow ones (``/min``, ``/h``) this bounds
#: how late a removed or raised limit is seen. One claim per this, per queue: no spinning.
RATE_RECHECK = 5.0


class RateWindows:
    """The queues a fetcher must not claim from yet: their rate limit lets no start through
    before a time a claim said (:class:`~echomq_core.control.rates.Claimed`), until when
    (monotonic). The fetcher skips them, and its idle wait neither blocks on their wake-up
    hints (a hint taken there would be one another worker could use now, and is no use before
    then) nor lasts past the first such time: an idle worker sleeps until then instead of
    polling. (The name is from the fixed windows the limit once counted.)"""

    def __init__(self) -> None:
        self.until: dict[str, float] = {}

    def note(self, name: str, claimed: Any) -> None:
        """Read what a claim from ``name`` said of its window."""
        opens_in = float(getattr(claimed, "opens_in", 0.0))
        if opens_in > 0:
            self.until[name] = time.monotonic() + opens_in
        elif self.until:
            self.until.pop(name, None)

    def closed(self, name: str) -> bool:
        """True while ``name``'s window is spent (the fetcher does not claim from it)."""
        until = self.until.get(name)
        if until is None:
            return False
        if until <= time.monotonic():
            del self.until[name]
            return False
        return True

    def idle_plan(self, names: list[str], seconds: float) -> tuple[list[str] | None, float]:
        """How an idle fetcher of ``names`` waits: the queues whose hints it blocks on (None:
        a plain sleep) and for how long. With every queue's window spent it sleeps until the
        first one opens (at most :data:`RATE_RECHECK`), not the poll interval."""
        if not self.until:
            return names, seconds
        opening = max(0.0, min(self.until.values()) - time.monotonic())
        open_names = [n for n in names if not self.closed(n)]
        if not open_names:
            return None, min(opening, RATE_RECHECK)
        return open_names, min(seconds, opening)


class Intake:
    """How many jobs the fetcher claims next, from how fast handlers are.

    While handlers are *fast* (their running average below ``fast_job`` seconds) a claim
    doubles in size up to ``max_batch`` and the next one is made as soon as fewer jobs are
    buffered than the runners finish while it is on its way and its reply waits for the GIL
    (one switch interval at most; never fewer than half a batch, never more than two), so
    no-op jobs cost one claim and one completion per batch and the runners never wait for a
    round trip. As soon as handlers are slow, a claim takes only as many jobs as there are
    free runners, plus the few that runners will finish while the claim is on its way
    (concurrency x claim time / handler time, rounded: none for a handful of runners on long
    jobs): a worker does not sit on work that another worker could run, and a runner that
    finishes a job finds the next one waiting instead of waiting for a round trip."""

    def __init__(
        self, concurrency: int, max_batch: int, fast_job: float, per_call: int = 1
    ) -> None:
        self.concurrency = concurrency
        #: jobs one runner takes per handler call: 1, or the largest batch size of a worker
        #: with batch handlers (:mod:`echomq_core.work.batching`): a free runner wants that many
        self.per_call = per_call
        self.max_batch = max_batch
        self.fast_job = fast_job
        self.batch = 1
        #: claim again once fewer than this many jobs are buffered (:meth:`claimed`)
        self.depth = 0
        self.average = 0.0
        self.cpu_share = 0.0
        self.claim_time = 0.0
        #: Handlers are fast: their running average is below ``fast_job``. Kept up to date by
        #: :meth:`observe` (read several times per job, so a field rather than a property).
        self.fast = self.average < fast_job
        #: False while handlers are fast and spend their time on the CPU: under the GIL a
        #: second thread cannot run such jobs any sooner, only take turns with the first, so
        #: the threaded worker then keeps one runner busy and lets the others rest.
        self.spread = True

    def observe(self, seconds: float, cpu: tuple[float, float] | None = None) -> None:
        """A handler call took ``seconds`` (a batch call's ``seconds`` are the whole call's,
        as ``running`` counts calls). ``cpu``: (this thread's CPU time, wall time) over the
        call alone, both read around it and nothing else - not ``seconds``, which also holds
        the runner's lock and any wait for the GIL between its calls: a no-op job (about a
        microsecond) measured against those read as mostly waiting (a CPU share near 0.4),
        so fast CPU-bound jobs were spread over every runner, each claim woke all of them,
        and they took turns on the GIL for nothing."""
        self.average += SMOOTHING * (seconds - self.average)
        if cpu is not None:
            used, wall = cpu
            share = min(1.0, used / wall) if wall > 0 else 1.0
            self.cpu_share += SMOOTHING * (share - self.cpu_share)
        self.fast = fast = self.average < self.fast_job
        self.spread = not fast or self.cpu_share < 0.5
        if not fast:
            self.batch = 1

    def want(self, running: int, buffered: int) -> int:
        """How many jobs to claim now (0: none yet)."""
        if not self.fast:
            # (``fast_job=0`` makes every handler slow, before any has been timed)
            ahead = round(self.concurrency * self.claim_time / self.average) if self.average else 0
            calls = self.concurrency - running + ahead
            return max(0, min(self.max_batch, calls * self.per_call - buffered))
        free = max(0, (self.concurrency - running) * self.per_call - buffered)
        if buffered >= max(1, self.depth, self.per_call):
            return 0
        return min(self.max_batch, max(self.batch, free))

    def claimed(self, count: int, seconds: float) -> None:
        """A claim returned ``count`` jobs after ``seconds``: while handlers are fast the next
        one may be twice as big as this one was. Twice what it took, not twice the last
        target: a first claim takes one job per runner (nothing is known of the handlers
        yet, and a worker must not sit on a backlog it may run slowly), so at concurrency 50
        the ramp to ``max_batch`` is 50, 100, 200, 400, 500 - five claims, not ten small
        ones while the target doubled up from 1 below the runners' count."""
        self.claim_time += SMOOTHING * (seconds - self.claim_time)
        if count and self.fast:
            self.batch = min(self.max_batch, max(self.batch, count) * 2)
        # the jobs the runners finish while the next claim is on its way and its reply waits
        # for the GIL (up to one switch interval), between half a batch and two batches
        runners = self.concurrency if self.spread else 1
        needed = (self.claim_time + sys.getswitchinterval()) * runners / max(self.average, 1e-6)
        self.depth = int(min(2 * self.batch, max(self.batch // 2, needed)))


class InHand:
    """What a worker holds between the server and its handlers, and the decisions made from
    it - the same for the threaded and the asyncio worker (the threaded one calls these under
    its lock): the claimed jobs not started yet (``buffer``: (job, when claimed)), every job
    held by (queue, id) (``inflight``), the results waiting for their batch call, and the
    leases found gone."""

    def __init__(self, options: WorkerOptions, intake: Intake) -> None:
        self.options = options
        self.intake = intake
        self.inflight: dict[tuple[str, str], Job] = {}
        self.buffer: deque[tuple[Job, float]] = deque()
        self.results: list[tuple[Job, Outcome]] = []
        self.first_result = 0.0  # when the oldest waiting result came in
        self.capped = False  # a waiting result holds a cap token (its child is gated)
        self.flushing = 0  # results in the batch call on its way
        self.running = 0  # handler calls running now (a batch call counts once)
        self.lost: set[tuple[str, str, str]] = set()  # (queue, id, token) whose lease is gone
        self.dropped = 0  # claimed jobs not started: their lease was gone (a cancelled flow)
        self.full_until = 0.0  # the server was full: kept results wait for this moment
        self.full_pause = 0.0  # the pause before the last retry of kept results (doubles)

    def want(self) -> int:
        """How many jobs to claim now (0 while the flusher is behind: back-pressure)."""
        if len(self.results) + self.flushing >= BEHIND * self.options.max_batch:
            return 0
        return self.intake.want(self.running, len(self.buffer))

    def add_result(self, job: Job, result: Outcome) -> None:
        if not self.results:
            self.first_result = time.monotonic()
            self.capped = False
        if job.parent is not None and job.parent.gated:
            self.capped = True
        self.results.append((job, result))

    def keep(self, done: list[tuple[Job, bytes]], failed: list[Failed], closing: bool) -> bool:
        """Take back results the server refused for lack of memory (nothing of them was
        written; their jobs stay in hand, so their leases keep being extended): they are
        recorded with the next batch call, after a pause that doubles from 50 ms to 1 s. A
        closing worker keeps nothing (False): their leases expire."""
        if closing:
            return False
        self.full_pause = min(1.0, max(0.05, self.full_pause * 2))
        self.full_until = time.monotonic() + self.full_pause
        for job, raw in done:
            self.add_result(job, raw)
        for job, error, retry, trace in failed:
            self.add_result(job, (error, retry, trace))
        return True

    def wait_left(self, now: float) -> float:
        """How long the flusher waits before the waiting results are due (seconds)."""
        return max(self.options.flush_after - (now - self.first_result), self.full_until - now)

    def flush_now(self, stopping: bool) -> bool:
        """Record the waiting results now: enough of them, the oldest is ``flush_after`` old,
        nothing else is in hand (a finished child's fan-in is not held back waiting for a
        batch that will not come), or one holds a cap token (a child of a flow with
        ``max_running``: the next child of its flow cannot start before it is recorded) -
        unless the server was full a moment ago (see :meth:`keep`)."""
        if self.full_until:
            if time.monotonic() < self.full_until:
                return False
            self.full_until = 0.0
        return (
            self.capped
            or len(self.results) >= self.options.max_batch
            or time.monotonic() - self.first_result >= self.options.flush_after
            or (self.running == 0 and not self.buffer)
            or stopping
        )

    def note_lost(self, jobs: list[Job], held: list[bool]) -> None:
        """Remember the jobs of a lease check whose lease is gone."""
        pairs = zip(jobs, held, strict=True)
        self.lost.update((j.shard, j.id, j.token) for j, ok in pairs if not ok)

    def drop_if_lost(self, job: Job) -> bool:
        """True (and the job forgotten) when its lease is gone: it must not start - its flow
        was cancelled, or the lease expired and another worker may hold the job now."""
        key = (job.shard, job.id, job.token)
        if key not in self.lost:
            return False
        self.lost.discard(key)
        if self.inflight.get((job.shard, job.id)) is job:
            del self.inflight[(job.shard, job.id)]
        self.dropped += 1
        log.info("job %s in %r not started: its lease is gone (cancelled flow?)", job.id, job.queue)
        return True


#: Result types that are never awaitable: a handler's usual results skip the ABC check.
_PLAIN = frozenset({int, float, str, bytes, bool, dict, list, tuple})


def outcome(
    encode: Callable[[Any], bytes],
    job: Job,
    handler: Callable[[Job], Any],
    settle: Callable[[Any], Any],
) -> Outcome:
    """Run ``handler(job)`` and read what happened: the encoded result, or (error text,
    retry?, traceback). An awaitable result is first given to ``settle`` (which awaits it).
    ``Unrecoverable`` and results that cannot be stored bury the job;
    ``KeyboardInterrupt``, ``SystemExit`` and ``GeneratorExit`` raised by a handler fail the
    attempt and nothing else (signals reach the process through its own handlers). Called
    once per job: no closure or frame that a plain result does not need."""
    if job.decode_error is not None:
        return (job.decode_error, False, None)
    try:
        result = handler(job)
        if result is not None and type(result) not in _PLAIN and inspect.isawaitable(result):
            result = settle(result)
        return encode(result)
    except BaseException as exc:  # classified by failure()
        return failure(job, exc)


def failure(job: Job, exc: BaseException) -> tuple[str, bool, str | None]:
    """(error text, retry?, traceback) for an exception a handler raised: the text is the
    exception's one line, the traceback the whole chain as Python prints it (the row keeps
    its tail, :data:`~echomq_core.models.MAX_TRACEBACK`)."""
    trace = "".join(traceback.format_exception(exc))
    if isinstance(exc, InvalidPayload):
        return (f"result cannot be stored: {exc}", False, trace)
    if isinstance(exc, Unrecoverable):
        return (f"Unrecoverable: {exc}", False, trace)
    if not isinstance(exc, Exception):
        log.warning(
            "handler for %s raised %s; counted as a failed attempt", job.id, type(exc).__name__
        )
    return (f"{type(exc).__name__}: {exc}", True, trace)


def split(items: list[tuple[Job, Outcome]]) -> dict[str, Batch]:
    """Results by queue: (completed, failed)."""
    out: dict[str, Batch] = {}
    for job, result in items:
        done, failed = out.setdefault(job.shard, ([], []))
        if isinstance(result, bytes):
            done.append((job, result))
        else:
            failed.append((job, *result))
    return out


def make_queues(
    client: Any,
    handlers: Mapping[str, Any],
    opts: WorkerOptions,
    queue_options: Mapping[str, Any] | None,
    kind: Callable[..., Q],
    logical: Mapping[str, str] | None = None,
) -> dict[str, Q]:
    """Check a worker's handlers and queue options; the queue of each handler, made by
    ``kind`` (:class:`~echomq_core.Queue` or :class:`~echomq_core.AsyncQueue`), showing its
    jobs under its ``logical`` name (:func:`logical_names`; default its own)."""
    if not isinstance(handlers, Mapping) or not handlers:
        raise InvalidArgument("a worker needs a mapping of queue names to handlers")
    if queue_options is not None and (
        not isinstance(queue_options, Mapping)
        or set(queue_options) - {"max_attempts", "backoff", "keep_completed", "timeout"}
    ):
        raise InvalidArgument(
            "queue_options takes max_attempts, backoff, keep_completed and timeout (lease "
            f"is the worker's own option), got {queue_options!r:.200}"
        )
    queue_settings = {"timeout": opts.timeout, **dict(queue_options or {})}
    for name, fn in handlers.items():
        check_queue(name)
        if not callable(fn):
            raise InvalidArgument(f"handler for queue {name!r} is not callable")
    queues = {n: kind(client, n, lease=opts.lease, **queue_settings) for n in handlers}
    for queue in queues.values():  # each serves its own shard: the fetcher rotates them
        queue.physical = True
        queue.logical = (logical or {}).get(queue.name, queue.name)
    return queues


def serving(handlers: Mapping[str, Any], shards: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    """A worker's handlers by physical queue: a sharded queue's handler serves each of its
    shards (claimed in turn with the worker's other queues, so no shard starves)."""
    out: dict[str, Any] = {}
    for name, fn in handlers.items():
        for shard in shards.get(name, (name,)):
            out.setdefault(shard, fn)
    return out


def logical_names(
    handlers: Mapping[str, Any], shards: Mapping[str, tuple[str, ...]]
) -> dict[str, str]:
    """Each queue :func:`serving` serves -> the name its jobs show (``job.queue``): a sharded
    queue's shards -> its logical name (the first handler naming a shard wins, as there)."""
    out: dict[str, str] = {}
    for name in handlers:
        for shard in shards.get(name, (name,)):
            out.setdefault(shard, name)
    return out


def draining_text(signum: int, running: list[Job], grace: float) -> str:
    """What a worker stopped by signal ``signum`` says it waits for: the jobs in flight (their
    ids, a few) and the bound, and how to stop at once."""
    name = signal.Signals(signum).name
    ids = ", ".join(f"{job.id} in {job.queue!r}" for job in running[:5])
    more = f" and {len(running) - 5} more" if len(running) > 5 else ""
    if not running:
        return f"{name}: stopping; no job in flight, unstarted jobs given back"
    return (
        f"{name}: stopping; waiting up to {grace:g}s (grace) for {len(running)} job(s) in "
        f"flight: {ids}{more}; unstarted jobs given back; a second Ctrl-C (or signal) gives "
        "the running ones back now"
    )
