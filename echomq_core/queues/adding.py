"""Adding jobs: the ``add`` script's calls, chunked per :data:`~echomq_core.wire.calls.CHUNK`
jobs and sent as one pipeline (a bulk add costs one round trip, not one per job); the registry
of queue names; the cyclic collector paused around bulk calls.

Queue operations are written once, as generators driven by the sync and the async connection
(:mod:`echomq_core.wire.calls`): each builds keys and arguments, yields one step (a list of
calls sent as one pipeline) at a time, reads the replies and returns a result.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Sized
from contextlib import contextmanager
from typing import Any

from ..wire import collector
from ..wire.calls import Call, Op, chunks
from ..wire.keyspace import Keyspace

#: A bulk call of at least this many items pauses the cyclic garbage collector (gc_paused).
GC_PAUSE_AT = 5_000


@contextmanager
def gc_paused(items: Any) -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a bulk call of ``items`` builds its
    objects (specs, planned nodes, packed commands), when there are at least
    :data:`GC_PAUSE_AT` of them (an iterable without a length is not paused for).

    Building a flow of hundreds of thousands of children allocates enough objects to set off
    many collections, and each older-generation one walks every tracked object of the process:
    the bigger the heap (an Airflow task's), the more each costs (docs/benchmarks.md gives the
    figures). What the call allocates is freed by reference counting, or by the first
    collection after it. The pause is process-wide: a collector that was already off
    (the caller's choice) stays off; one paused by another thread's bulk call comes back when
    that call ends.
    """
    if not isinstance(items, Sized) or len(items) < GC_PAUSE_AT:
        yield
        return
    with collector.paused():
        yield


def register(ks: Keyspace, queues: Sequence[str]) -> list[Call]:
    """The call that records queue names in the registry (none when there is nothing new)."""
    return [Call.cmd("SADD", ks.queues(), *queues)] if queues else []


#: A job to add: ``(id, payload, max_attempts, delay_ms, priority, timeout_ms, group)``.
Row = tuple[str, bytes, int, int, int, int | None, str | None]


def add(
    ks: Keyspace,
    queue: str,
    jobs: Sequence[Row],
    *,
    check: bool,
    new_queues: Sequence[str] = (),
    stem: str | None = None,
) -> Op[int]:
    """Add jobs (:data:`Row`); returns how many were added (ids that existed are left
    untouched). ``check=False`` only for host-generated ids. Jobs sharing their options share
    a script call; ``new_queues`` rides along in the same pipeline (the registry), so the whole
    call is one round trip. A job's fairness group travels in its record (lua/add.lua), so
    jobs of many groups still share a call.

    ``stem``: every id is ``stem`` plus its index in hex, the indexes increasing in ``jobs``
    order (queue.py's generated ids). A chunk whose ids are then consecutive (the usual bulk
    add: first and last tell, the order gives the rest) sends the stem and its first index
    instead of an id per job: the script checks the stem once and formats each id itself
    (lua/add.lua says why that is cheaper and as safe)."""
    calls = register(ks, new_queues)
    skip = len(calls)
    groups: dict[tuple[int, int, int, int | None], list[tuple[str, bytes, str | None]]] = {}
    for job_id, payload, max_attempts, delay_ms, priority, limit, group in jobs:
        key = (max_attempts, delay_ms, priority, limit)
        groups.setdefault(key, []).append((job_id, payload, group))
    fixed = ks.queue_keys(queue)
    rows = ks.job_prefix(queue)
    fair = ks.fair(queue)
    cut = len(stem) if stem else 0
    for (max_attempts, delay_ms, priority, limit), items in groups.items():
        for part in chunks(items):
            grouped = any(group is not None for _, _, group in part)
            argv: list[Any] = ["1" if check else "0", max_attempts, delay_ms, priority]
            argv.append("" if limit is None else limit)
            start = _start(stem, cut, part[0][0], part[-1][0], len(part)) if stem else None
            argv += ("", "") if start is None else (stem, start)
            argv.append("1" if grouped else "")
            if not grouped and start is not None:  # the usual bulk add: payloads only
                argv += [payload for _, payload, _ in part]
            else:
                for job_id, payload, group in part:
                    if start is None:
                        argv.append(job_id)
                    argv.append(payload)
                    if grouped:
                        argv.append(group or "")
            keys = [*fixed, *(rows + job_id for job_id, _, _ in part), fair]
            calls.append(Call.lua("add", keys, argv))
    replies = yield calls
    return sum(int(r) for r in replies[skip:])


def _start(stem: str | None, cut: int, first: str, last: str, n: int) -> int | None:
    """The index of ``first`` when a chunk of ``n`` generated ids runs ``first`` .. ``last``
    without a gap (``stem`` + consecutive hex indexes), else None."""
    if not stem or not first.startswith(stem):
        return None
    try:
        start = int(first[cut:], 16)
    except ValueError:
        return None
    if first != f"{stem}{start:x}" or last != f"{stem}{start + n - 1:x}":
        return None
    return start
