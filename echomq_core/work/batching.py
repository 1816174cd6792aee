"""Batch handlers: one call with up to ``batch`` jobs of one queue, for vectorised work (a bulk
insert, a model that scores 256 rows at once). Shared by the threaded and the asyncio worker.

Using::

    def score(jobs: list[Job]) -> list[Any]:
        rows = model.predict([job.payload for job in jobs])   # one call for the lot
        return [float(r) for r in rows]                       # one result per job, in order

    Worker(mq, {"score": score, "emails": send}, batch={"score": 256}).run()
    Worker(mq, {"score": score}, batch=256).run()                # every queue's handler
    # echomq worker score emails --app app:HANDLERS --batch score=256   (--batch 256: all)

What a call returns, job by job: a list (or tuple) of one entry per job, in the order given;
an entry that is an exception instance fails that job's attempt only (``Unrecoverable``
buries it), any other entry is its result. A raise fails every job of the call. A return that
is not a list, or a list of another length, fails every job of the call with an
``InvalidArgument`` naming what was expected and what came (retried as any failed attempt: a
bug in the handler should show, not be guessed around). A job whose payload cannot be decoded
is failed on its own and never handed to the call.

How a batch is formed: a free runner takes the job at the head of the worker's local buffer
and, behind it, the jobs of the same (physical) queue that are there now, up to ``batch``
(a claim's jobs lie together in the buffer). It does not wait for more: a batch holds what is
buffered, so a trickle of jobs runs at once in small calls and a backlog runs in full ones.
The fetcher claims for whole calls: ``batch`` jobs per free runner (:class:`~echomq_core.
running.Intake`, ``per_call``), so one claim of a backlog fills a call.

Everything else is per job, as for a one-job handler: every job of a running call stays
leased (the heartbeat extends every job in hand every ``lease / 3``); the lease check before
a start drops the buffered jobs of a cancelled flow from the batch (the others run); results
are recorded by the same pipelined ``complete`` / ``fail`` calls, so retries, deaths, fan-in
of flows and hooks are those of single jobs. A time limit applies per call: the smallest of
its jobs' limits (a job's own, else its queue's, else the worker's), so no job runs past its
own; past it every job of the call fails with ``TimeoutError``. A stopping worker gives back
what it has not started and lets running calls finish for ``grace`` seconds; a call still
running then has all its jobs given back (its late results are refused by their tokens).
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from ..control.options import check_batch
from ..errors import InvalidArgument
from ..models import Job
from .running import Outcome, failure

#: One job and its outcome.
Done = tuple[Job, Outcome]


def sizes(
    default: int,
    per_queue: Mapping[str, Any] | None,
    logical: Mapping[str, str],
    max_batch: int,
) -> dict[str, int]:
    """{physical queue: batch size} of the queues whose handler takes lists (size above 1).
    ``per_queue`` names queues as the handlers do (a sharded queue by its logical name,
    ``logical`` maps each served queue to it); a queue it does not name takes ``default``.
    A size that is not an int from 1 to ``max_batch``, or a queue that has no handler, is an
    :class:`InvalidArgument`."""
    given = dict(per_queue or {})
    unknown = sorted(set(given) - set(logical.values()))
    if unknown:
        raise InvalidArgument(
            f"batch names queue(s) {', '.join(map(repr, unknown))} that have no handler "
            f"(handlers: {', '.join(sorted(set(logical.values())))})"
        )
    for name, value in given.items():
        check_batch(f"batch[{name!r}]", value, max_batch)
    out = {}
    for served, name in logical.items():
        size = given.get(name, default)
        if size > 1:
            out[served] = size
    return out


def split_setting(settings: dict[str, Any]) -> Mapping[str, Any] | None:
    """Take a per-queue ``batch={queue: n}`` out of a worker's keyword settings (the rest are
    :class:`~echomq_core.control.options.WorkerOptions` fields); an int stays, for every queue."""
    batch = settings.get("batch")
    if isinstance(batch, Mapping):
        del settings["batch"]
        return batch
    return None


def take(buffer: deque[tuple[Job, float]], batch: Mapping[str, int]) -> list[tuple[Job, float]]:
    """The next call's jobs: the buffer's head and the jobs of its queue right behind it, up
    to that queue's batch size (1 for a queue of one-job calls)."""
    first = buffer.popleft()
    shard = first[0].shard
    size = batch.get(shard, 1)
    taken = [first]
    while len(taken) < size and buffer and buffer[0][0].shard == shard:
        taken.append(buffer.popleft())
    return taken


def undecodable(jobs: list[Job]) -> tuple[list[Job], list[Done]]:
    """(the jobs to hand to the call, the failures of those whose payload cannot be decoded:
    buried on their own, as a one-job call would)."""
    if all(job.decode_error is None for job in jobs):
        return jobs, []
    run: list[Job] = []
    bad: list[Done] = []
    for job in jobs:
        if job.decode_error is None:
            run.append(job)
        else:
            bad.append((job, (job.decode_error, False, None)))
    return run, bad


def raised(jobs: list[Job], exc: BaseException) -> list[Done]:
    """The call raised: every job of it failed with that error."""
    return [(job, failure(job, exc)) for job in jobs]


def read(encode: Callable[[Any], bytes], queue: str, jobs: list[Job], returned: Any) -> list[Done]:
    """What a call returned, job by job (see the module's doc)."""
    if not isinstance(returned, list | tuple):
        return raised(
            jobs,
            InvalidArgument(
                f"the batch handler of {queue!r} returned a {type(returned).__name__}, not a "
                f"list of {len(jobs)} results (one per job, in order)"
            ),
        )
    if len(returned) != len(jobs):
        return raised(
            jobs,
            InvalidArgument(
                f"the batch handler of {queue!r} returned {len(returned)} results for "
                f"{len(jobs)} jobs (expected {len(jobs)}: one per job, in order)"
            ),
        )
    out: list[Done] = []
    for job, value in zip(jobs, returned, strict=True):
        if isinstance(value, BaseException):
            out.append((job, failure(job, value)))
            continue
        try:
            out.append((job, encode(value)))
        except BaseException as exc:  # a result that cannot be stored: that job only
            out.append((job, failure(job, exc)))
    return out


def call(
    encode: Callable[[Any], bytes],
    queue: str,
    jobs: list[Job],
    handler: Callable[[list[Job]], Any],
    settle: Callable[[Any], Any],
) -> list[Done]:
    """Run a batch ``handler`` on ``jobs`` (the threaded worker; an awaitable it returns is
    given to ``settle``) and read the outcome of each job."""
    run, out = undecodable(jobs)
    if not run:
        return out
    try:
        returned = handler(run)
        if not isinstance(returned, list) and inspect.isawaitable(returned):
            returned = settle(returned)
    except BaseException as exc:  # classified by failure()
        return out + raised(run, exc)
    return out + read(encode, queue, run, returned)
