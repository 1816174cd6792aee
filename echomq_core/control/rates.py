"""A queue's rate limit: job starts spread evenly at ``limit`` per window, across every worker,
decided on the server.

Using::

    mq.set_rate_limit("vendor-api", "100/s")     # or "6000/min", "5/500ms", "1000/h"
    mq.set_rate_limit("vendor-api", "100/s", burst=20)  # up to 20 at once after a pause
    mq.rate_limit("vendor-api")  # limit 100, window_ms 1000, burst 1, used 1, next_in 0.004
    mq.set_rate_limit("vendor-api", None)        # no limit ("none" too)

The setting lives in the queue's ``config`` hash (field ``rate``, ``"<limit> <window ms>"``,
then ``" <burst>"`` when the burst is above 1), beside the retention settings, so every worker
and every plain ``Queue.claim`` honours the same one. The ``claim`` script reads it on each
claim (one HGET; absent: the claim is as it always was) and runs a generic cell rate algorithm
(GCRA) on the server's clock, in µs: starts are due one emission interval ``T = window /
limit`` apart; the queue's ``rate:tat`` (one string that deletes itself when it stops holding
anything back) is the theoretical arrival time of the next one; a start conforms when it comes
no earlier than ``TAT - tau``, the tolerance ``tau = (burst - 1) * T``. A claim takes as many
jobs as conform now (burst 1: one), moves the TAT on by ``T`` each, and when none conforms (or
none more, after its own) says how many µs until one does, rounded up. A worker then sleeps
until that moment instead of polling or taking wake-up hints meant for others.

The guarantee: with the default burst of 1, consecutive starts are at least ``T`` apart on the
server's clock, so every span of the window's length - sliding, from any start point - holds at
most ``limit`` starts (what a vendor enforcing a sliding "N per second" counts), and the
starts over a long run come at ``limit`` per window, no faster. With ``burst=b`` up to ``b``
may start at once after a pause long enough (``(b - 1) * T``, the burst refills at one per
``T``), so a window can hold up to ``limit + b - 1``; the long-run rate is the same. (A fixed
window aligned to the clock, what this was before, let a burst at the end of one window and
one at the start of the next put twice ``limit`` into one span of a window.)

The price of burst 1: the limit is reached only as closely as the claimers are punctual. A
start that comes after its time pushes every later one back (a later one may not make up for
it: that would put two starts less than ``T`` apart), so the long-run rate is the limit less
the claims' lateness - a worker's sleep and round trip, a fraction of a ms, which is a few per
cent of ``T`` at ``100/s`` and a good share of it at ``1000/s`` (``bench/results/issue50``:
0.93x and 0.78x the limit with 3 local worker processes on a busy machine). A burst takes the
lateness up: with ``burst=b`` a start up to ``(b - 1) * T`` late is made up by the next (1.00x
at ``1000/s`` with a burst of 10, 1,009 starts in the busiest second). And since a claim takes
one job per ``T`` (the tolerance's more), a burst-1 limit above what one-at-a-time claims reach
(thousands per second per worker) holds the queue below it: give such a limit a burst of about
a claim's batch. While several workers wait on one limit, each claims once per ``T`` and one
of them wins (about ``workers`` claims per start).

What counts as a start: a job handed out by a claim - whether a runner starts it at once or
it waits in a worker's local buffer; a job given back unstarted (a stopping worker) or
claimed again after its lease expired counts again. So the limit is never exceeded, and a
stop can cost a little of the allowance.

:meth:`~echomq_core.EchoMQ.rate_limit` reads it back as a :class:`RateLimit`: the limit, the
burst, ``used`` (the starts booked ahead of the server's clock: ``ceil((TAT - now) / T)``;
``ready`` more may start now, ``burst - used``), ``next_in`` (seconds until the next start
conforms: 0.0 when one may start now) and ``resets_in`` (seconds until nothing is booked and
the whole burst is ready: ``TAT - now``).

Over a sharded queue (:mod:`echomq_core.flows.sharding`) the limit is split, as a flow's cap is:
each shard's ``rate`` holds its share (``limit // K``, the remainder one each to the first
shards; the burst alike, at least 1 each) and its own claims keep its own TAT at ``T = window
/ share``, so the shards' starts in any span of a window add up to at most ``limit`` (``+
burst - 1`` with a burst) with every claim still one single-slot script and no exchange
between shards; shard 0 keeps the whole limit in ``rate_total`` for reads. The price is skew:
a shard cannot borrow another's unused share, so when the load sits on some shards only (the
others drained, or ids that happen to hash together) the queue starts fewer than ``limit``
per window - at worst one share. Ids spread by CRC-32, so a bulk load keeps the shards within
a few per cent of each other until its tail. A limit below K is refused (a shard with a share
of 0 would never start its jobs): give it over a longer window (``10/10s`` rather than
``1/s``). On a Cluster each master's clock times its shards' starts; the spacing holds per
shard whatever the clocks, so the bound holds as stated.

Not done: a limit per key (per tenant) within one queue - use one queue per key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..checks import text as _s
from ..errors import InvalidArgument
from ..models import Job
from ..wire.calls import Call, Op
from ..wire.keyspace import Keyspace

#: The config hash field that holds the limit (``"<limit> <window ms>"``): a sharded queue's
#: shards hold their shares there, what their claims count.
FIELD = "rate"
#: The field of a sharded queue's shard 0 that holds its whole limit (absent unsharded).
TOTAL = "rate_total"
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
    limit lets the next start through when none more conforms now (after this claim, or
    found so before it), else 0.0. A worker does not claim from the queue again before then."""

    __slots__ = ("opens_in",)

    def __init__(self, jobs: list[Job] | None = None, opens_in: float = 0.0) -> None:
        super().__init__(jobs or ())
        self.opens_in = opens_in


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A queue's rate limit and where its starts stand: ``limit`` starts per ``window_ms``,
    spread evenly (one per ``window_ms / limit``), up to ``burst`` at once after a pause.
    Read from the server (:meth:`~echomq_core.EchoMQ.rate_limit`): ``used``, the starts booked
    ahead of the server's clock (``ceil((TAT - now) / T)``, 0 when idle; the whole burst is
    free again ``resets_in`` seconds from the read, when nothing is booked); ``next_in``,
    seconds until the next start is allowed (0.0: one may start now). See
    :mod:`echomq_core.control.rates`."""

    limit: int
    window_ms: int
    used: int = 0
    resets_in: float = 0.0
    burst: int = 1
    next_in: float = 0.0

    @property
    def window(self) -> float:
        """The window in seconds."""
        return self.window_ms / 1000

    @property
    def interval(self) -> float:
        """The emission interval in seconds: how far apart starts come at the limit."""
        return self.window_ms / 1000 / self.limit

    @property
    def ready(self) -> int:
        """How many may start now (``burst - used``, at least 0)."""
        return max(0, self.burst - self.used)

    @property
    def text(self) -> str:
        """The limit as ``set_rate_limit`` takes it: ``100/s``, ``5/500ms`` (the burst apart)."""
        for ms in sorted(_SHORT, reverse=True):
            if self.window_ms % ms == 0:
                n = self.window_ms // ms
                return f"{self.limit}/{'' if n == 1 else n}{_SHORT[ms]}"
        raise AssertionError("1 ms divides every window")  # pragma: no cover

    def __str__(self) -> str:
        return self.text if self.burst == 1 else f"{self.text} burst {self.burst}"

    @classmethod
    def booked(cls, field: Any, backlog_us: int) -> RateLimit:
        """The reading of one queue: its ``rate`` field and ``TAT - now`` in µs, as the rate
        script returns them."""
        limit, window, burst = _fields(field)
        period = window * 1000 / limit
        used = max(0, math.ceil(backlog_us / period - 1e-9))
        next_in = max(0.0, backlog_us - (burst - 1) * period) / 1e6
        return cls(limit, window, used, backlog_us / 1e6, burst, next_in)


def _fields(value: Any) -> tuple[int, int, int]:
    """``(limit, window ms, burst)`` of a stored ``rate`` field (no burst: 1)."""
    parts = [int(x) for x in _s(value).split()]
    return parts[0], parts[1], parts[2] if len(parts) > 2 else 1


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


def parse_burst(burst: Any, parsed: tuple[int, int] | None) -> int:
    """The burst of a limit ``parsed`` (:func:`parse_rate`): ``burst``, an int 1 ..
    :data:`MAX_LIMIT`, or None for 1. Refused with :class:`InvalidArgument` otherwise, and for
    a burst given with no limit."""
    if burst is None:
        return 1
    if parsed is None:
        raise InvalidArgument(f"burst={burst!r:.60} with no rate limit: a burst needs a rate")
    if isinstance(burst, bool) or not isinstance(burst, int):
        raise InvalidArgument(f"a burst is an int of 1 or more, got {burst!r:.60}")
    if not 1 <= burst <= MAX_LIMIT:
        raise InvalidArgument(f"invalid burst {burst}: it must be 1..{MAX_LIMIT:,}")
    return burst


def _text(limit: int, window: int, burst: int) -> str:
    """A ``rate`` field's value (the burst only when above 1, as before bursts existed)."""
    return f"{limit} {window}" if burst == 1 else f"{limit} {window} {burst}"


def stored(rate: Any, total: Any) -> tuple[int, int, int] | None:
    """``(limit, window ms, burst)`` of a queue's limit from its ``config`` fields
    :data:`FIELD` and :data:`TOTAL` (a sharded queue's whole limit, else its own); None when it
    has none."""
    if rate is None:
        return None
    return _fields(total if total is not None else rate)


def shares(limit: int, count: int) -> list[int]:
    """``limit`` split over ``count`` shards: equal parts, the remainder one each to the first
    shards (so they sum to ``limit`` and differ by at most one)."""
    base, extra = divmod(limit, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def writes(ks: Keyspace, shards: Sequence[str], parsed: tuple[int, int, int] | None) -> list[Call]:
    """The commands that store ``parsed`` (``(limit, window ms, burst)``, None: no limit) over
    the physical queues ``shards`` of one queue (``shards[0]`` its own name). Refused with
    :class:`InvalidArgument`, before anything is written, for a limit below the shard count.
    Each shard gets its share of the limit and of the burst (at least 1)."""
    configs = [ks.config(q) for q in shards]
    if parsed is None:
        return [Call.cmd("HDEL", c, FIELD, TOTAL) for c in configs]
    limit, window, burst = parsed
    if len(shards) == 1:
        return [Call.cmd("HSET", configs[0], FIELD, _text(limit, window, burst)),
                Call.cmd("HDEL", configs[0], TOTAL)]  # fmt: skip
    if limit < len(shards):
        text = RateLimit(limit, window).text
        raise InvalidArgument(
            f"rate {text} over queue {shards[0]!r}'s {len(shards)} shards: each shard counts "
            f"its own share of the limit, so it must be at least {len(shards)} per window; "
            f"give it over a longer window (e.g. {limit * len(shards)}/"
            f"{RateLimit(1, window * len(shards)).text[2:]})"
        )
    parts = zip(configs, shares(limit, len(shards)), shares(burst, len(shards)), strict=True)
    out = [Call.cmd("HSET", c, FIELD, _text(share, window, max(1, b))) for c, share, b in parts]
    return [*out, Call.cmd("HSET", configs[0], TOTAL, _text(limit, window, burst))]


def set_rate(
    ks: Keyspace,
    queue: str,
    value: Any,
    shards: Sequence[str] | None = None,
    burst: Any = None,
) -> Op[None]:
    """Store ``value`` (checked first, and ``burst`` with it: nothing is written for a bad
    one) as ``queue``'s rate limit, or remove it (None); the queue is registered with it.
    ``burst``: how many may start at once after a pause (None: 1; a :class:`RateLimit` given
    as ``value`` brings its own). ``shards``: the queue's physical queues when it is sharded
    (each gets its share, :func:`writes`). Takes effect at the next claim of every worker; a
    worker sleeping on the limit sees it when it wakes (at the next allowed start, or within
    :data:`~echomq_core.work.running.RATE_RECHECK`). Over shards the shares are written in one
    step (one pipeline per node), not atomically: a claim in between may run under one shard's
    old share and another's new one."""
    if burst is None and isinstance(value, RateLimit):
        burst = value.burst
    parsed = parse_rate(value)
    burst = parse_burst(burst, parsed)
    calls = writes(ks, shards or [queue], None if parsed is None else (*parsed, burst))
    # the queue joins the registry with its first setting, so `queue stats` lists it
    yield [*calls, Call.cmd("SADD", ks.queues(), queue)]


def get_rate(ks: Keyspace, queue: str, shards: Sequence[str] | None = None) -> Op[RateLimit | None]:
    """``queue``'s rate limit and what its starts have booked (one script per physical queue,
    on its slot, whose clock times the starts; one step); None when the queue has no limit.
    Over shards: the whole limit and burst, the booked starts summed, the soonest next start,
    the latest reset."""
    names = list(shards or [queue])
    calls = [Call.lua("rate", [ks.config(q), ks.rate_tat(q)], []) for q in names]
    if len(names) > 1:
        calls.append(Call.cmd("HGET", ks.config(names[0]), TOTAL))
    replies = yield calls
    readings = [RateLimit.booked(r[0], int(r[1])) for r in replies[: len(names)] if r]
    if not readings:
        return None
    if len(names) == 1:
        return readings[0]
    total = replies[-1] if replies[-1] is not None else replies[0][0]
    return summed(readings, RateLimit.booked(total, 0))


def summed(parts: Sequence[RateLimit], whole: RateLimit) -> RateLimit:
    """The reading of a sharded queue: ``whole``'s limit, window and burst, the ``used`` of
    ``parts`` (its shards) summed, the soonest ``next_in`` and the latest ``resets_in``."""
    return RateLimit(
        whole.limit,
        whole.window_ms,
        sum(p.used for p in parts),
        max(p.resets_in for p in parts),
        whole.burst,
        min(p.next_in for p in parts),
    )
