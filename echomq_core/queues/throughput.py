"""Completed jobs, failed attempts and deaths per minute per queue, over the last 24 hours.

Workers write the tallies in the calls they already make: each completion or failure script
call (up to 500 jobs) counts what it did in the same script (``lua/includes/tally.lua``) -
one hash write per call, not per job, no command or round trip of its own, and written with
the batch or not at all (a full server refuses the call whole). The
server's clock (TIME inside the script) picks the minute, so workers with skewed clocks agree.

Storage: one hash per queue (``minutes``, see :mod:`echomq_core.wire.keyspace`), one field per
minute of the day (minute number mod 1440) holding ``<minute> <completed> <failed> <deaths>``
(failed counts every failed attempt, deaths only the last one of a job: it went to dead, or a
flow's child failed for good): at most 1,440 fields, so the memory is bounded whatever the
traffic, and a field whose minute number is not in the window asked for (yesterday's) is read
as zero. The hash expires 25 h after the last batch. Counts are of what the server recorded: a
completion or failure whose lease was lost meanwhile is not counted, and a death is a job the
call sent to dead.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import check_int
from ..checks import text as _s
from ..wire.calls import Call, Op
from ..wire.keyspace import Keyspace

#: Minutes kept: one day.
DAY = 1440


@dataclass(frozen=True, slots=True)
class Minute:
    """One minute's tallies: ``at`` is the minute's start (ms since the epoch); ``failed``
    counts failed attempts, ``deaths`` the jobs among them that died."""

    at: int
    completed: int
    failed: int
    deaths: int = 0


def read_minutes(ks: Keyspace, queue: str, minutes: int = 60) -> Op[list[Minute]]:
    """The last ``minutes`` minutes (1-1440) of ``queue``, oldest first, the current minute
    last, zeros where nothing was tallied. One round trip: TIME and one HGETALL (at most 1,440
    fields)."""
    check_int("minutes", minutes, 1, DAY)
    now, flat = yield [Call.cmd("TIME"), Call.cmd("HGETALL", ks.minutes(queue))]
    current = int(now[0]) // 60
    first = current - minutes + 1
    counts: dict[int, tuple[int, ...]] = {}
    pairs = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=True)
    for _, value in pairs:
        parts = _s(value).split()
        if len(parts) != 4:
            continue
        at = int(parts[0])
        if first <= at <= current:
            counts[at] = tuple(int(p) for p in parts[1:])
    return [Minute(m * 60_000, *counts.get(m, (0, 0, 0))) for m in range(first, current + 1)]


__all__ = ["DAY", "Minute", "read_minutes"]
