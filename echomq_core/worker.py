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
the rest of that runner's batch is given back and a fresh runner takes the slot. Python cannot
kill a thread, so the abandoned call runs on; whatever it returns later is refused by its
lease token and changes nothing.

Design: ``concurrency`` runner threads, each looping claim -> run -> complete on its own. A
runner claims a *batch* whose size adapts to the handler: it doubles while jobs take under
``fast_job`` seconds (no-op jobs then cost one claim and one completion per batch) and falls
back to 1 as soon as jobs are slow (so one runner never sits on work other runners could
take). Results are handed to the runner's flusher thread as one pipelined ``complete`` when
the batch is done or the oldest result is ``flush_after`` old (so a slow batch does not hold
back the fan-in of a finished child); the flusher records them while the runner claims and
runs the next batch, so the server's work on one batch overlaps the handlers of the next (at
most one batch waits: back-pressure). An idle runner blocks on its queues' wake-up hint
instead of sleeping, so work added later starts at once. One heartbeat thread extends the
leases of everything in flight every ``lease / 3`` seconds.

Shutdown (SIGTERM, SIGINT or :meth:`stop`): runners stop claiming, finish the job in hand,
give unstarted jobs back to pending (no attempt counted) and flush results. Jobs still
running after ``grace`` seconds are given back too; a handler that finishes later finds its
lease gone and changes nothing. A second signal skips the wait. Nothing is lost and nothing
is left leased: anything the process could not give back (it was SIGKILLed) returns to
pending when its lease expires.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue as queue_mod
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot

from . import ops
from .errors import EchoMQError, InvalidArgument, InvalidPayload, Unrecoverable
from .hooks import LifecycleHooks, fire
from .keyspace import check_queue
from .models import Job, Settlement
from .options import WorkerOptions, build
from .queue import Queue

if TYPE_CHECKING:
    from .client import EchoMQ

log = logging.getLogger(__name__)
Handler = Callable[[Job], Any]
#: The longest single BZPOPMIN of an idle runner (s): well inside redis-py's default socket
#: timeout (5 s), so a long ``max_poll`` is waited in slices, never as a read that times out,
#: and a stopping worker's idle runners see the stop within one slice.
BLOCK_SLICE = 1.0
#: One batch's results on their way to the server: (queue, completed, failed).
_Results = tuple[Queue, list[tuple[Job, bytes]], list[tuple[Job, str, bool]]]
#: How often the watchdog looks for handlers past their time limit (s).
WATCH_EVERY = 0.1


@dataclass(eq=False)
class _Slot:
    """One runner's state, shared with the watchdog (under the worker's lock): the job whose
    handler runs now, its deadline, the rest of its batch and the results not yet handed to
    the flusher - what the watchdog takes over when it abandons the runner."""

    index: int
    out: queue_mod.Queue[_Results | None]
    queue: Queue | None = None
    job: Job | None = None
    deadline: float = 0.0  # monotonic; 0: no limit
    limit: float = 0.0
    rest: list[Job] = field(default_factory=list)
    done: list[tuple[Job, bytes]] = field(default_factory=list)
    failed: list[tuple[Job, str, bool]] = field(default_factory=list)
    abandoned: bool = False


class Worker:
    """Runs ``handlers`` ({queue name: callable}) until stopped. Options:

    * ``concurrency`` (1): runner threads, i.e. jobs run at once.
    * ``max_batch`` (500): the most jobs one runner claims at once (fast handlers only).
    * ``lease`` (30 s): lease per claim; heartbeats every lease / 3 keep long jobs leased.
    * ``poll`` (0.05 s) / ``max_poll`` (0.5 s): an idle runner waits for work starting at
      ``poll`` and backing off to ``max_poll`` while every queue is empty. It waits *blocked*
      on the queues' wake-up hint (BZPOPMIN), which every add, land, release, promotion and
      recovery sets, so new jobs start at once, not at the next poll; the timeout only bounds
      how late a due retry is noticed without a Pump. In a Cluster, a worker whose queues lie
      on different slots cannot block on all of them in one command, and polls instead.
    * ``grace`` (30 s): how long a graceful stop waits for running handlers.
    * ``timeout`` (None): the default handler time limit in seconds for every queue; a queue's
      own (``queue_options``) and a job's own win. None: no limit.
    * ``queue_options``: passed to each :class:`Queue` (max_attempts, backoff, keep_completed,
      timeout).
    * ``hooks``: a :class:`~echomq_core.hooks.LifecycleHooks` (``job_completed``, ``job_dead``,
      ``flow_released``, ``flow_failed``; usually a :class:`~echomq_core.hooks.Hooks`), or None.
    """

    def __init__(
        self,
        client: EchoMQ,
        handlers: Mapping[str, Handler],
        *,
        options: WorkerOptions | None = None,
        queue_options: Mapping[str, Any] | None = None,
        hooks: LifecycleHooks | None = None,
        **settings: Any,
    ) -> None:
        """``settings`` are :class:`~echomq_core.options.WorkerOptions` fields by name
        (``concurrency=4, lease=60``), applied over ``options`` (or the defaults)."""
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
        opts = self.options = build(WorkerOptions, options, settings)
        queue_settings = {"timeout": opts.timeout, **dict(queue_options or {})}
        for name, fn in handlers.items():
            check_queue(name)
            if not callable(fn):
                raise InvalidArgument(f"handler for queue {name!r} is not callable")
        self.client = client
        self.handlers = dict(handlers)
        self.queues = {
            n: Queue(client, n, lease=opts.lease, **queue_settings) for n in self.handlers
        }
        self.concurrency = opts.concurrency
        self.max_batch = opts.max_batch
        self.lease = opts.lease
        self.poll = opts.poll
        self.max_poll = opts.max_poll
        self.grace = opts.grace
        self.fast_job = opts.fast_job
        self.flush_after = opts.flush_after
        self.hooks = hooks
        self.completed = 0
        self.failed = 0
        self._stop = threading.Event()
        self._halt = threading.Event()  # second signal: do not wait for handlers
        self._beat_stop = threading.Event()
        self._lock = threading.Lock()
        self._inflight: dict[tuple[str, str], Job] = {}
        self._runners: list[threading.Thread] = []
        self._slots: list[_Slot] = []
        self.abandoned = 0  # handler calls left running past their time limit
        self.dropped = 0  # claimed jobs not started: their lease was gone (a cancelled flow)
        self._lost: set[tuple[str, str, str]] = set()  # (queue, id, token) whose lease is gone
        #: A batch older than this re-checks the leases of its unstarted jobs (one call) before
        #: it starts the next: a cancelled flow's claimed children are dropped, not started.
        self.recheck = min(0.25, self.lease / 3)
        self._wake = self._wake_queues(client, list(self.handlers))
        self._beater: threading.Thread | None = None
        for name in self.handlers:
            client.register_queue(name)

    def __repr__(self) -> str:
        return f"Worker(queues={sorted(self.handlers)}, concurrency={self.concurrency})"

    @staticmethod
    def _wake_queues(client: EchoMQ, names: list[str]) -> list[str] | None:
        """The queues an idle runner can block on in one BZPOPMIN (None: poll instead)."""
        if not client.connection.is_cluster:
            return names
        slots = {key_slot(client.keys.wake(n).encode()) for n in names}
        return names if len(slots) == 1 else None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> Worker:
        """Start the runner and heartbeat threads and return (for in-process use)."""
        self._stop.clear()
        self._halt.clear()
        self._beat_stop.clear()
        self._runners, self._slots = [], []
        for i in range(self.concurrency):
            self._spawn(i)
        self._beater = threading.Thread(
            target=self._heartbeats, daemon=True, name="echomq-heartbeat"
        )
        self._beater.start()
        return self

    def _spawn(self, index: int) -> None:
        """Start runner ``index`` (again, when the watchdog abandoned the previous one)."""
        slot = _Slot(index, queue_mod.Queue(maxsize=1))
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
        deadline = time.monotonic() + (self.grace if wait else 0.0)
        with self._lock:  # abandoned runners are not waited for: their calls hang
            live = [t for t, s in zip(self._runners, self._slots, strict=True) if not s.abandoned]
        for thread in live:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._give_back(list(self._inflight.values()))
        self._beat_stop.set()
        if self._beater is not None:
            self._beater.join(1.0)

    def run(self, *, install_signals: bool = True) -> None:
        """Run in the foreground until SIGTERM/SIGINT (or :meth:`stop` from elsewhere)."""
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        self.start()
        while not self._stop.is_set():
            self._stop.wait(0.2)
        self.stop(wait=not self._halt.is_set())

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._stop.is_set():
            log.warning("second signal: giving back running jobs now")
            self._halt.set()
        else:
            log.info("signal %d: finishing running jobs, then stopping", signum)
        self._stop.set()

    # -- the runner loop ------------------------------------------------------------------
    def _runner(self, slot: _Slot) -> None:
        # Results are recorded by this runner's flusher thread while the runner claims and
        # runs the next batch: the server's work on one batch overlaps the handlers of the
        # next. At most one batch waits to be recorded (back-pressure); the runner hands its
        # last batch over and waits for it before it returns, so stop() sees every result.
        flusher = threading.Thread(
            target=self._flusher, args=(slot.out,), daemon=True, name=f"echomq-flush-{slot.index}"
        )
        flusher.start()
        try:
            self._claim_loop(slot)
        finally:
            slot.out.put(None)
            flusher.join()

    def _flusher(self, out: queue_mod.Queue[_Results | None]) -> None:
        while (item := out.get()) is not None:
            try:
                self._flush(*item)
            except Exception:  # never die: the runner would wait on a full hand-over for ever
                log.exception(
                    "recording %d result(s) failed; their leases will expire",
                    len(item[1]) + len(item[2]),
                )

    def _claim_loop(self, slot: _Slot) -> None:
        names = list(self.handlers)
        batch, idle, turn = 1, self.poll, slot.index
        while not self._stop.is_set() and not slot.abandoned:
            took = False
            for step in range(len(names)):
                name = names[(turn + step) % len(names)]
                try:
                    jobs = self.queues[name].claim(batch)
                except EchoMQError as exc:
                    log.warning("claim from %r failed: %s", name, exc)
                    self._stop.wait(idle)
                    continue
                if jobs:
                    took = True
                    turn += 1
                    batch = self._run_batch(slot, name, jobs, batch)
                    break
            if took:
                idle = self.poll
            else:
                self._idle(idle)
                idle = min(self.max_poll, idle * 2)

    def _idle(self, seconds: float) -> None:
        """Wait up to ``seconds`` for work: blocked on the wake-up hint where possible."""
        if self._wake is None or self._stop.is_set():
            self._stop.wait(seconds)
            return
        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                # in slices: a blocked read must end well inside the socket timeout
                if self.client.run(
                    ops.wait_for_work(self.client.keys, self._wake, min(left, BLOCK_SLICE))
                ):
                    return
            except EchoMQError as exc:
                if not self._stop.is_set():  # a stopping worker's client may be closing
                    log.warning("waiting for work failed: %s", exc)
                    self._stop.wait(left)
                return

    def _run_batch(self, slot: _Slot, name: str, jobs: list[Job], batch: int) -> int:
        """Run one claimed batch; the next batch size (doubled while jobs are fast)."""
        queue, handler = self.queues[name], self.handlers[name]
        with self._lock:
            for job in jobs:
                self._inflight[(name, job.id)] = job
            slot.queue, slot.rest = queue, list(jobs)
        started = first_result = checked = time.monotonic()
        for job in jobs:
            if self._stop.is_set():
                with self._lock:
                    rest, slot.rest = slot.rest, []
                self._give_back(rest)
                break
            if time.monotonic() - checked >= self.recheck:
                checked = time.monotonic()
                self._check_leases(queue, list(slot.rest))
            if self._drop_if_lost(slot, job):
                continue
            limit_ms = job.timeout_ms or queue.timeout_ms
            with self._lock:
                slot.rest.pop(0)
                slot.job, slot.limit = job, (limit_ms or 0) / 1000
                slot.deadline = time.monotonic() + slot.limit if limit_ms else 0.0
            outcome = self._call(handler, job)
            with self._lock:
                slot.job, slot.deadline = None, 0.0
                abandoned = slot.abandoned
                if not abandoned:
                    if not slot.done and not slot.failed:
                        first_result = time.monotonic()
                    if isinstance(outcome, bytes):
                        slot.done.append((job, outcome))
                    else:
                        slot.failed.append((job, outcome[0], outcome[1]))
            if abandoned:  # the watchdog failed this job and took the batch over
                if isinstance(outcome, bytes):  # presented with its gone token: refused
                    slot.out.put((queue, [(job, outcome)], []))
                log.warning(
                    "runner %d: the call that ran %s past its time limit returned; the thread ends",
                    slot.index,
                    job.id,
                )
                return 1
            if time.monotonic() - first_result >= self.flush_after:
                self._hand_over(slot)
        self._hand_over(slot)
        if self._lost:
            with self._lock:
                self._lost.difference_update((j.queue, j.id, j.token) for j in jobs)
        per_job = (time.monotonic() - started) / max(1, len(jobs))
        return min(self.max_batch, batch * 2) if per_job < self.fast_job else 1

    def _check_leases(self, queue: Queue, jobs: list[Job]) -> None:
        """Extend the leases of a batch's unstarted jobs, noting those that are gone."""
        if not jobs:
            return
        try:
            held = queue.heartbeat(jobs)
        except EchoMQError as exc:
            log.warning("lease check for %r failed: %s", queue.name, exc)
            return
        self._note_lost(jobs, held)

    def _note_lost(self, jobs: list[Job], held: list[bool]) -> None:
        lost = [(j.queue, j.id, j.token) for j, ok in zip(jobs, held, strict=True) if not ok]
        if lost:
            with self._lock:
                self._lost.update(lost)

    def _drop_if_lost(self, slot: _Slot, job: Job) -> bool:
        """True (and the job forgotten) when its lease is gone: it must not start - its flow
        was cancelled, or the lease expired and another worker may hold the job now."""
        key = (job.queue, job.id, job.token)
        with self._lock:
            if key not in self._lost:
                return False
            self._lost.discard(key)
            if slot.rest and slot.rest[0] is job:
                slot.rest.pop(0)
            if self._inflight.get((job.queue, job.id)) is job:
                del self._inflight[(job.queue, job.id)]
            self.dropped += 1
        log.info("job %s in %r not started: its lease is gone (cancelled flow?)",
                 job.id, job.queue)
        return True

    def _hand_over(self, slot: _Slot) -> None:
        """Give the results gathered so far to the flusher (waits while it is busy)."""
        with self._lock:
            done, failed, slot.done, slot.failed = slot.done, slot.failed, [], []
        if (done or failed) and slot.queue is not None:
            slot.out.put((slot.queue, done, failed))

    def _call(self, handler: Handler, job: Job) -> bytes | tuple[str, bool]:
        """Run one handler: the encoded result, or (error text, retry?)."""
        if job.decode_error is not None:
            return (job.decode_error, False)
        try:
            result = handler(job)
            if inspect.isawaitable(result):
                result = asyncio.run(_await(result))
            return self.client.encode(result)
        except InvalidPayload as exc:
            return (f"result cannot be stored: {exc}", False)
        except Unrecoverable as exc:
            return (f"Unrecoverable: {exc}", False)
        except Exception as exc:
            return (f"{type(exc).__name__}: {exc}", True)
        except BaseException as exc:  # KeyboardInterrupt, SystemExit, GeneratorExit: the
            # attempt failed; the runner lives on (signals reach the process's handlers)
            log.warning(
                "handler for %s raised %s; counted as a failed attempt", job.id, type(exc).__name__
            )
            return (f"{type(exc).__name__}: {exc}", True)

    def _flush(
        self, queue: Queue, done: list[tuple[Job, bytes]], failed: list[tuple[Job, str, bool]]
    ) -> None:
        try:
            if done:
                settled = queue.settle_completed(done)
                self.completed += sum(settled.statuses)
                if self.hooks is not None:
                    for (job, raw), status in zip(done, settled.statuses, strict=True):
                        if status:
                            fire(self.hooks, "job_completed", job=job, result=raw)
                    self._flow_hooks(self.hooks, settled)
            if failed:
                settled = queue.settle_failed(failed)
                self.failed += len(failed)
                if self.hooks is not None:
                    for (job, error, _), status in zip(failed, settled.statuses, strict=True):
                        if status == 2:
                            fire(self.hooks, "job_dead", job=job, error=error)
                    self._flow_hooks(self.hooks, settled)
        except EchoMQError as exc:
            # The leases stay; the jobs come back when they expire (at-least-once).
            log.warning(
                "could not record %d result(s) in %r: %s", len(done) + len(failed), queue.name, exc
            )
        finally:
            with self._lock:
                for job in [j for j, _ in done] + [j for j, _, _ in failed]:
                    if self._inflight.get((queue.name, job.id)) is job:  # not a later claim's
                        del self._inflight[(queue.name, job.id)]

    @staticmethod
    def _flow_hooks(hooks: LifecycleHooks, settled: Settlement) -> None:
        for queue, parent_id in settled.released:
            fire(hooks, "flow_released", queue=queue, parent_id=parent_id)
        for queue, parent_id in settled.failed:
            fire(hooks, "flow_failed", queue=queue, parent_id=parent_id)

    def _give_back(self, jobs: list[Job]) -> None:
        by_queue: dict[str, list[Job]] = {}
        with self._lock:
            for job in jobs:
                if self._inflight.get((job.queue, job.id)) is job:
                    del self._inflight[(job.queue, job.id)]
                    by_queue.setdefault(job.queue, []).append(job)
        for name, items in by_queue.items():
            try:
                self.queues[name].release(items)
            except EchoMQError as exc:
                log.warning(
                    "could not give back %d job(s) of %r (their leases will expire): %s",
                    len(items),
                    name,
                    exc,
                )

    def _heartbeats(self) -> None:
        """Extend the leases of everything in flight every ``lease / 3`` seconds and, every
        :data:`WATCH_EVERY`, abandon handlers past their time limit."""
        every = self.lease / 3
        next_beat = time.monotonic() + every
        while not self._beat_stop.wait(min(every, WATCH_EVERY)):
            self._watch()
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + every
            with self._lock:
                jobs = list(self._inflight.values())
            by_queue: dict[str, list[Job]] = {}
            for job in jobs:
                by_queue.setdefault(job.queue, []).append(job)
            for name, items in by_queue.items():
                try:
                    self._note_lost(items, self.queues[name].heartbeat(items))
                except EchoMQError as exc:
                    log.warning("heartbeat for %r failed: %s", name, exc)

    def _watch(self) -> None:
        """Abandon every runner whose handler is past its deadline: fail that job
        (``TimeoutError``, retried by the usual policy), record the results its batch had,
        give back the rest, and start a fresh runner in its place."""
        now = time.monotonic()
        taken: list[tuple[_Slot, Job, list[Job], _Results]] = []
        with self._lock:
            for slot in self._slots:
                if slot.abandoned or not slot.deadline or now < slot.deadline:
                    continue
                job, queue = slot.job, slot.queue
                if job is None or queue is None:
                    continue
                slot.abandoned = True
                self.abandoned += 1
                if self._inflight.get((job.queue, job.id)) is job:
                    del self._inflight[(job.queue, job.id)]  # no more heartbeats for it
                error = f"TimeoutError: the handler ran longer than {slot.limit:g}s"
                results = (queue, slot.done, [*slot.failed, (job, error, True)])
                taken.append((slot, job, slot.rest, results))
                slot.rest, slot.done, slot.failed = [], [], []
        for slot, job, rest, results in taken:
            log.warning(
                "job %s in %r ran past its time limit (%gs): failed the attempt, "
                "runner %d replaced (%d call(s) abandoned so far)",
                job.id,
                job.queue,
                slot.limit,
                slot.index,
                self.abandoned,
            )
            self._flush(*results)
            self._give_back(rest)
            if not self._stop.is_set():
                self._spawn(slot.index)


async def _await(awaitable: Any) -> Any:
    return await awaitable
