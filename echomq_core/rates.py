"""A queue's rate limit: at most ``limit`` job starts per window, across every worker, decided
on the server.

Using::

    mq.set_rate_limit("vendor-api", "100/s")     # or "6000/min", "5/500ms", "1000/h"
    mq.rate_limit("vendor-api")                  # RateLimit(100/s, used 37, resets in 0.412 s)
    mq.set_rate_limit("vendor-api", None)        # no limit ("none" too)

The setting lives in the queue's ``config`` hash (field ``rate``, ``"<limit> <window ms>"``),
beside the retention settings, so every worker and every plain ``Queue.claim`` honours the
same one. The ``claim`` script reads it on each claim (one HGET; absent: the claim is as it
always was), counts starts in a fixed window aligned to the server's clock (``rate:window``:
its start and count, expiring by itself when the window ends), takes at most what the window
has left, and when the window is spent says how many ms until the next one opens. A worker
then sleeps until that moment instead of polling or taking wake-up hints meant for others.

What counts as a start: a job handed out by a claim - whether a runner starts it at once or
it waits in a worker's local buffer; a job given back unstarted (a stopping worker) or
claimed again after its lease expired counts again. So the limit is never exceeded, and a
stop can cost a little of a window's allowance.

Why a fixed window: it holds the count exactly for every window (what a vendor's "N per
second" quota counts), costs one small hash per queue that deletes itself, and two commands
per claim. Its known edge: a burst at the end of one window and one at the start of the next
can put up to twice ``limit`` into a span of one window that straddles the boundary; a
smaller window (``"10/100ms"`` rather than ``"100/s"``) spreads the starts when that matters.

Not done: a limit per key (per tenant) within one queue - use one queue per key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .calls import Call, Op
from .checks import text as _s
from .errors import InvalidArgument
from .keyspace import Keyspace
from .models import Job

#: The config hash field that holds the limit (``"<limit> <window ms>"``).
FIELD = "rate"
MAX_LIMIT = 10**9
#: The window's bounds (ms): below 10 ms a server's timer and a round trip blur it; above a
#: day a window is a quota, not a rate.
MIN_WINDOW_MS, MAX_WINDOW_MS = 10, 86_400_000
#: Units a rate's window takes, in ms.
UNITS = {
    "ms": 1,
    "s": 1000,
    "sec": 1000,
    "second": 1000,
    "min": 60_000,
    "minute": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
}
_RATE_RE = re.compile(r"\s*(\d+)\s*/\s*(\d*)\s*([a-z]+)\s*", re.IGNORECASE)
_SHORT = {1: "ms", 1000: "s", 60_000: "min", 3_600_000: "h", 86_400_000: "d"}


class Claimed(list[Job]):
    """The jobs a claim leased (a list), and ``opens_in``: seconds until the queue's rate
    window opens again when this claim spent it (or found it spent), else 0.0. A worker does
    not claim from the queue again before then."""

    __slots__ = ("opens_in",)

    def __init__(self, jobs: list[Job] | None = None, opens_in: float = 0.0) -> None:
        super().__init__(jobs or ())
        self.opens_in = opens_in


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A queue's rate limit and its current window: ``limit`` starts per ``window_ms``;
    ``used`` starts so far in the current window, which ends in ``resets_in`` seconds (0 and
    0.0 when no window is open)."""

    limit: int
    window_ms: int
    used: int = 0
    resets_in: float = 0.0

    @property
    def window(self) -> float:
        """The window in seconds."""
        return self.window_ms / 1000

    @property
    def text(self) -> str:
        """The limit as ``set_rate_limit`` takes it: ``100/s``, ``5/500ms``."""
        for ms in sorted(_SHORT, reverse=True):
            if self.window_ms % ms == 0:
                n = self.window_ms // ms
                return f"{self.limit}/{'' if n == 1 else n}{_SHORT[ms]}"
        raise AssertionError("1 ms divides every window")  # pragma: no cover

    def __str__(self) -> str:
        return self.text


def parse_rate(value: Any) -> tuple[int, int] | None:
    """``(limit, window ms)`` of a rate given as ``"<limit>/<unit>"`` or
    ``"<limit>/<n><unit>"`` (units: ms, s, min, h, d and their long names), or a
    :class:`RateLimit`; None for ``None`` or ``"none"`` (no limit). Anything else is refused
    with :class:`InvalidArgument` naming the value."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if isinstance(value, RateLimit):
        value = value.text
    if not isinstance(value, str):
        raise InvalidArgument(f"a rate is a string like '100/s' or None, got {value!r:.60}")
    match = _RATE_RE.fullmatch(value)
    if match is None:
        raise InvalidArgument(
            f"invalid rate {value!r:.60}: write <starts>/<unit> or <starts>/<n><unit>, "
            "e.g. '100/s', '6000/min', '5/500ms', or 'none'"
        )
    count, times, unit = match.groups()
    unit = unit.lower()
    unit_ms = UNITS.get(unit, UNITS.get(unit[:-1]) if unit.endswith("s") else None)
    if unit_ms is None:
        raise InvalidArgument(
            f"invalid rate {value!r:.60}: unknown unit {unit!r} (one of {', '.join(UNITS)})"
        )
    limit, window = int(count), (int(times) if times else 1) * unit_ms
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgument(f"invalid rate {value!r:.60}: starts must be 1..{MAX_LIMIT:,}")
    if not MIN_WINDOW_MS <= window <= MAX_WINDOW_MS:
        raise InvalidArgument(
            f"invalid rate {value!r:.60}: the window must be 10 ms .. 1 day, got {window} ms"
        )
    return limit, window


def set_rate(ks: Keyspace, queue: str, value: Any) -> Op[None]:
    """Store ``value`` (checked first: nothing is written for a bad one) as ``queue``'s rate
    limit, or remove it (None); the queue is registered with it. Takes effect at the next
    claim of every worker; a worker sleeping on a spent window sees it when it wakes (at the
    window's end, or within :data:`~echomq_core.running.RATE_RECHECK`)."""
    parsed = parse_rate(value)
    config = ks.config(queue)
    write = (
        Call.cmd("HDEL", config, FIELD)
        if parsed is None
        else Call.cmd("HSET", config, FIELD, f"{parsed[0]} {parsed[1]}")
    )
    # the queue joins the registry with its first setting, so `queue stats` lists it
    yield [write, Call.cmd("SADD", ks.queues(), queue)]


def get_rate(ks: Keyspace, queue: str) -> Op[RateLimit | None]:
    """``queue``'s rate limit and its current window (one script, on the queue's slot, whose
    clock decides the windows); None when the queue has no limit."""
    (reply,) = yield [Call.lua("rate", [ks.config(queue), ks.rate_window(queue)], [])]
    if not reply:
        return None
    limit, window = (int(x) for x in _s(reply[0]).split())
    return RateLimit(limit, window, int(reply[1]), int(reply[2]) / 1000)
