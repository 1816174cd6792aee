"""The exchanges of a worker with the server between its handlers, written once for the
threaded and the asyncio worker: claim from its queues in turn (:func:`claim_turn`), read
the jobs claimed ahead (:func:`read_ahead`), record a batch of results (:func:`record`),
give jobs back (:func:`give_back`), extend leases (:func:`extend_leases`).

Each is a :data:`Routine`: a generator that yields the operations to run (each a
:class:`~echomq_core.client.queue.QueueOps` operation, so keys, arguments and replies exist once)
and receives their results, or the error one raised thrown in - so what a failure means
(logged, the leases left to expire, the other queues still served) is decided here too. The
threaded worker drives a routine with :func:`drive` on its sync connection, the routine
taking the worker's lock where it touches what the worker holds; the asyncio worker drives it
with :func:`adrive` and no lock (one loop). A routine runs the same operations in the same
order as a hand-written loop would: the commands per job do not change with the driver.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from ..client.queue import QueueOps
from ..errors import EchoMQError, PartlyWritten, ServerFull
from ..flows import sharding
from ..flows.sharding import logical_of
from ..hooks import LifecycleHooks, fire
from ..models import Job, Settlement
from ..queues import claiming, settling
from ..queues.registry import lease_token
from ..wire.calls import Op
from .running import Failed, InHand, RateWindows

T = TypeVar("T")
log = logging.getLogger("echomq_core.worker")

#: The warnings of a failed claim (its queue, the error), as logged on ``echomq_core.work.worker``.
CLAIM_FAILED = "claim from %r failed: %s"
AHEAD_FAILED = "reading the jobs claimed ahead from %r failed: %s"


#: A worker's exchange with the server: yields operations, receives each one's result (or its
#: error thrown in), returns its own result. Driven by :func:`drive` or :func:`adrive`.
Routine = Generator[Op[Any], Any, T]


def drive(routine: Generator[Any, Any, T], perform: Callable[[Any], Any]) -> T:
    """Run ``routine`` with a synchronous ``perform``: each operation's result is sent in,
    whatever it raised is thrown in (the routine decides what it means)."""
    try:
        op = next(routine)
        while True:
            try:
                result = perform(op)
            except BaseException as exc:  # the routine's except / finally decide
                op = routine.throw(exc)
            else:
                op = routine.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def adrive(routine: Generator[Any, Any, T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """:func:`drive` with an asyncio ``perform`` (a cancellation is thrown in too, so the
    routine's ``finally`` runs before it propagates)."""
    try:
        op = next(routine)
        while True:
            try:
                result = await perform(op)
            except BaseException as exc:
                op = routine.throw(exc)
            else:
                op = routine.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


class LoopState(Protocol):
    """What the exchanges need of a worker (its :class:`~echomq_core.work.loop.Loop`): what it
    holds, the lock over that (a null context on one event loop), its hooks and counts, where
    jobs leased to it go and what takes back results a full server refused."""

    hand: InHand
    lock: AbstractContextManager[Any]
    hooks: LifecycleHooks | None
    completed: int
    failed: int
    #: puts leased jobs in the buffer; returns those it does not take (the worker is stopping)
    buffer: Callable[[list[Job]], list[Job]]

    def keep(self, done: list[tuple[Job, bytes]], failed: list[Failed]) -> bool:
        """Take back results a full server refused, for a later batch call (False: refused,
        their leases expire)."""


def claim_turn(
    queues: Mapping[str, QueueOps],
    names: Sequence[str],
    turn: int,
    want: int,
    ahead: bool,
    windows: RateWindows,
    stopping: Callable[[], bool],
    warn: Callable[..., None] = log.warning,
) -> Routine[tuple[list[Job], float, bool]]:
    """One turn of a worker's fetcher: claim up to ``want`` jobs from the first of its queues
    that has any, starting at ``names[turn % len(names)]`` (the caller moves ``turn`` on after
    a take, so no queue starves). A queue whose rate window is spent (``windows``) is skipped
    unless it holds jobs claimed ahead, and claims nothing ahead while spent; ``ahead`` (fast
    handlers): see :meth:`QueueOps.claim_op <echomq_core.client.queue.QueueOps.claim_op>`. A claim
    that fails is logged by ``warn`` (a worker's :class:`~echomq_core.wire.patience.Outage`: backed
    off while the server is down; unless ``stopping()``) and the next queue tried. Returns the jobs
    (empty: none anywhere), the seconds their claim took, and whether a claim failed (the
    caller then waits before the next turn)."""
    failed = False
    for step in range(len(names)):
        name = names[(turn + step) % len(names)]
        queue = queues[name]
        spent = windows.closed(name)
        if spent and queue.ahead is None:  # its rate window is spent: not before it opens
            continue
        sent = time.monotonic()
        try:
            jobs = yield queue.claim_op(want, ahead=ahead and not spent)
        except EchoMQError as exc:
            if not stopping():
                warn(CLAIM_FAILED, name, exc)
            failed = True
            continue
        windows.note(name, jobs)
        if jobs:
            return jobs, time.monotonic() - sent, failed
    return [], 0.0, failed


def read_ahead(queues: Mapping[str, QueueOps]) -> Routine[list[tuple[list[Job], float]]]:
    """Read the jobs claimed ahead (the rows of the leases each queue holds unread, claiming
    nothing more): each queue's jobs and the seconds their read took, for the caller's buffer
    (or to give back: the worker is stopping). A failed read leaves their leases to expire
    (logged)."""
    read: list[tuple[list[Job], float]] = []
    for name, queue in queues.items():
        if queue.ahead is None:
            continue
        sent = time.monotonic()
        try:
            jobs = yield queue.claim_op(1)  # returns the held jobs, claims nothing
        except EchoMQError as exc:
            log.warning(AHEAD_FAILED, name, exc)
            continue
        read.append((jobs, time.monotonic() - sent))
    return read


def offer(queue: QueueOps, room: int) -> settling.Hand | None:
    """The hand-off a worker with ``room`` free runners offers with its results (None: none):
    a fresh lease token naming the worker, the queue's lease."""
    return settling.Hand(lease_token(queue.holder), queue.lease_ms, room) if room > 0 else None


def record(
    loop: LoopState,
    queue: QueueOps,
    done: list[tuple[Job, bytes]],
    failed: list[Failed],
    offered: settling.Hand | None = None,
) -> Routine[None]:
    """Record one queue's batch of results for ``loop`` (its worker's hand, hooks, counts and
    lock): the completions in one call, the failed attempts in another, counted, logged and
    their hooks fired. A batch the server could not take is logged and its leases stay: the
    jobs come back when they expire (at-least-once). Either way the jobs leave the worker's
    hands (under the lock) - a later claim of the same id is another :class:`Job` and stays.
    Except for a server that refused them for lack of memory (:class:`~echomq_core.ServerFull`:
    nothing of the call was written): those results are kept (:func:`keep_refused`) for a
    later batch call, and the jobs stay in hand - so a full server costs no completed work,
    only a delay. With ``offered``, the capped children the batch's gates admit are leased
    to this worker at once: their rows are read in one more round trip and put in its buffer
    (see :func:`take_handed`). A job whose run spawned children of its own (``job.adopted``)
    is not completed: its run ends waiting for them
    (:func:`~echomq_core.flows.spawning.await_children`), in one more call for all such jobs."""
    kept: set[str] = set()
    completed = settled = None
    ran = done
    try:
        if done:
            completed = yield queue.settle_completed_op(done, offered)
            if completed.waits:  # the jobs whose runs spawned children of their own
                waiting = [job for job, _ in done if job.adopted]
                log_waiting(queue.name, waiting, completed.waits)
                # only the others were completed (counted, logged, their hooks fired)
                pairs = zip(done, completed.statuses, strict=True)
                completed.statuses = [s for (job, _), s in pairs if not job.adopted]
                done = [(job, raw) for job, raw in done if not job.adopted]
            loop.completed += sum(completed.statuses)
            log_lost(queue.name, done, completed.statuses)
            if completed.voided:  # a re-run that spawned fewer than an earlier run counted
                log.info("%d spawned child(ren) that an earlier run counted and never landed "
                         "settled as never landed in %r", completed.voided, queue.name)  # fmt: skip
            if offered is not None and completed.handed:
                room = offered.room - len(completed.handed)
                offered = settling.Hand(offered.token, offered.lease_ms, room)
        if failed:
            settled = yield queue.settle_failed_op(failed, offered)
            loop.failed += len(failed)
        if offered is not None:
            ids = (completed.handed if completed else []) + (settled.handed if settled else [])
            if ids:
                yield from take_handed(loop, queue, ids, offered.token)
        log_failures(queue.name, failed, settled)
        fire_hooks(loop.hooks, done, completed, failed, settled, queue.client.shard_cache)
    except ServerFull as exc:
        kept = keep_refused(loop, queue, exc, done, completed, failed)
    except EchoMQError as exc:
        log.warning(
            "could not record %d result(s) in %r: %s", len(done) + len(failed), queue.name, exc
        )
    finally:
        with loop.lock:
            hand = loop.hand
            for job in [j for j, _ in ran] + [f[0] for f in failed]:
                if job.id in kept:
                    continue
                if hand.inflight.get((queue.name, job.id)) is job:  # not a later claim's
                    del hand.inflight[(queue.name, job.id)]
                if hand.lost:
                    hand.lost.discard((job.shard, job.id, job.token))


def keep_refused(
    loop: LoopState,
    queue: QueueOps,
    exc: ServerFull,
    done: list[tuple[Job, bytes]],
    completed: Settlement | None,
    failed: list[Failed],
) -> set[str]:
    """:func:`record`'s batch met a full server: nothing of the refused call was written, so
    what it carried waits for the next one (:meth:`Loop.keep <echomq_core.work.loop.Loop.keep>`,
    under the lock; a job that waits for children of its own may have been recorded before
    the refusal: not kept, its lease expires and it runs again, as any lost completion). A
    step of several calls cut between them (:class:`~echomq_core.PartlyWritten`) says what
    it wrote: that is recorded as done (counted, hooks fired), only the rest is kept. Returns
    the ids kept (their jobs stay in hand)."""
    part = exc if isinstance(exc, PartlyWritten) else None
    shards = queue.client.shard_cache
    left_failed = failed
    if completed is None:
        left_done = [(j, raw) for j, raw in done if not j.adopted]
        if part is not None:
            done, completed, left_done = part.written, part.settled, part.refused
            loop.completed += sum(completed.statuses)
            log_lost(queue.name, done, completed.statuses)
    else:
        left_done = []
        if part is not None:
            # the calls carried the queue's rows of these records, in their order
            ids = {row[0].id for row in part.written}
            wrote = [f for f in failed if f[0].id in ids]
            left_failed = [f for f in failed if f[0].id not in ids]
            loop.failed += len(wrote)
            log_failures(queue.name, wrote, part.settled)
            fire_hooks(loop.hooks, [], None, wrote, part.settled, shards)
    kept: set[str] = set()
    with loop.lock:
        if loop.keep(left_done, left_failed):
            kept = {j.id for j, _ in left_done} | {f[0].id for f in left_failed}
    how = "kept for the next batch call" if kept else "their leases will expire"
    log.warning(
        "server full: %d result(s) in %r not recorded, %s: %s",
        len(left_done) + len(left_failed),
        queue.name,
        how,
        exc,
    )
    if completed is not None:
        fire_hooks(loop.hooks, done, completed, [], None, shards)
    return kept


def take_handed(loop: LoopState, queue: QueueOps, ids: list[str], token: str) -> Routine[None]:
    """Read the rows of the jobs a hand-off leased to this worker under ``token`` and put them
    in its buffer (those it cannot take are given back: the worker is stopping). Rows that
    cannot be read leave the leases to expire: the jobs come back to pending then, as a lost
    claim's would."""
    try:
        client = queue.client
        jobs = yield claiming.leased(client.keys, queue.name, ids, token, client.serializer)
        queue.label(jobs)  # a shard's: shown under the logical name, as claimed ones are
    except EchoMQError as exc:
        log.warning(
            "could not read %d handed-off job(s) of %r (their leases will expire): %s",
            len(ids),
            queue.name,
            exc,
        )
        return
    back = loop.buffer(jobs)
    if back:
        yield from give_back(loop, {queue.name: queue}, back)


def give_back(loop: LoopState, queues: Mapping[str, QueueOps], jobs: list[Job]) -> Routine[None]:
    """Give ``jobs`` back to pending untouched (one call per queue): those still in the
    worker's hands, taken out of them under its lock (a job recorded meanwhile is not given
    back). One that cannot be given back is logged: its lease expires instead."""
    by_queue: dict[str, list[Job]] = {}
    hand = loop.hand
    with loop.lock:
        for job in jobs:
            if hand.inflight.get((job.shard, job.id)) is job:
                del hand.inflight[(job.shard, job.id)]
                by_queue.setdefault(job.shard, []).append(job)
    for name, items in by_queue.items():
        try:
            yield queues[name].release_op(items)
        except EchoMQError as exc:
            log.warning(
                "could not give back %d job(s) of %r (their leases will expire): %s",
                len(items),
                name,
                exc,
            )


def extend_leases(
    loop: LoopState, queues: Mapping[str, QueueOps], jobs: list[Job], what: str
) -> Routine[None]:
    """Extend the leases of ``jobs`` (one call per queue) and note those found gone (under
    the worker's lock): they must not start, and their results change nothing. A failed call
    is logged (``what`` for ``queue`` failed) and the other queues are still served."""
    by_queue: dict[str, list[Job]] = {}
    for job in jobs:
        by_queue.setdefault(job.shard, []).append(job)
    for name, items in by_queue.items():
        try:
            held = yield queues[name].heartbeat_op(items)
        except EchoMQError as exc:
            log.warning("%s for %r failed: %s", what, name, exc)
            continue
        if not all(held):  # the common case takes no lock
            with loop.lock:
                loop.hand.note_lost(items, held)


def log_waiting(queue: str, jobs: list[Job], replies: list[Any]) -> None:
    """Log how the first runs of jobs that spawned children of their own ended."""
    for job, reply in zip(jobs, replies, strict=True):
        if reply == "f":
            log.info("%s in %r failed: a child of its own died under fail-parent", job.id, queue)
        elif not reply:
            log.info("%s in %r: not recorded, its lease was gone (it runs again)", job.id, queue)
        else:
            what = "waits for" if reply == "h" else "is released: it runs again on"
            log.debug("%s in %r %s its %d own children", job.id, queue, what, job.adopted)


def log_lost(queue: str, done: list[tuple[Job, bytes]], statuses: list[int]) -> None:
    """One INFO line per batch for the completions the server refused because their lease
    was gone: the job was recovered after its lease expired (a handler slower than the lease,
    a worker cut off from the server) and may have run again elsewhere, or its flow was
    cancelled - the usual case, so not a warning (the same script answer for both). The
    result is dropped; whoever holds the job now records its own."""
    lost = [job.id for (job, _), status in zip(done, statuses, strict=True) if not status]
    if lost:
        shown = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
        log.info(
            "%d completion(s) in %r not recorded, their lease was gone (expired, or the flow "
            "was cancelled): %s",
            len(lost),
            queue,
            shown,
        )


def log_failures(queue: str, failed: list[Failed], settled: Settlement | None) -> None:
    """One WARNING per failed attempt the server recorded (queue, job id, attempt k of n, what
    became of it, the error line); with INFO on (``-v``) the traceback follows in the same
    record. An attempt whose lease was lost is logged as not recorded."""
    if not failed or not log.isEnabledFor(logging.WARNING):
        return
    statuses = settled.statuses if settled is not None else [None] * len(failed)
    verbose = log.isEnabledFor(logging.INFO)
    for (job, error, _, trace), status in zip(failed, statuses, strict=True):
        fate = {0: "lease lost, not recorded", 1: "will retry", 2: "dead"}.get(
            status if status is not None else -1, "not recorded"
        )
        tail = f"\n{trace.rstrip()}" if verbose and trace else ""
        log.warning(
            "job %s in %r failed, attempt %d of %d (%s): %s%s",
            job.id,
            queue,
            job.attempts + 1,
            job.max_attempts,
            fate,
            error,
            tail,
        )


def fire_hooks(
    hooks: LifecycleHooks | None,
    done: list[tuple[Job, bytes]],
    completed: Settlement | None,
    failed: list[Failed],
    settled: Settlement | None,
    shards: Mapping[str, sharding.Shards] | None = None,
) -> None:
    """The hooks of one recorded batch: ``job_completed`` / ``job_dead`` per job the server
    accepted, ``flow_released`` / ``flow_failed`` per parent the batch settled (each through
    :func:`~echomq_core.hooks.fire`: logged, never raised), a parent in a sharded queue under
    its logical name (``shards``: the client's shard cache)."""
    if hooks is None:
        return
    if completed is not None:
        for (job, raw), status in zip(done, completed.statuses, strict=True):
            if status:
                fire(hooks, "job_completed", job=job, result=raw)
        _flow_hooks(hooks, completed, shards or {})
    if settled is not None:
        for (job, error, *_), status in zip(failed, settled.statuses, strict=True):
            if status == 2:
                fire(hooks, "job_dead", job=job, error=error)
        _flow_hooks(hooks, settled, shards or {})


def _flow_hooks(
    hooks: LifecycleHooks, settled: Settlement, shards: Mapping[str, sharding.Shards]
) -> None:
    for queue, parent_id in settled.released:
        fire(hooks, "flow_released", queue=logical_of(shards, queue), parent_id=parent_id)
    for queue, parent_id in settled.failed:
        fire(hooks, "flow_failed", queue=logical_of(shards, queue), parent_id=parent_id)
