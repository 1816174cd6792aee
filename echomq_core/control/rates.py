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

Over a sharded queue (:mod:`echomq_core.flows.sharding`) the limit is split, as a flow's cap is:
each shard's ``rate`` holds its share (``limit // K``, the remainder one each to the first
shards) and its own claims count its own window, so the shards' starts in a window add up to
at most ``limit`` with every claim still one single-slot script and no exchange between
shards; shard 0 keeps the whole limit in ``rate_total`` for reads. The price is skew: a shard
cannot borrow another's unused share, so when the load sits on some shards only (the others
drained, or ids that happen to hash together) the queue starts fewer than ``limit`` per
window - at worst one share. Ids spread by CRC-32, so a bulk load keeps the shards within a few
per cent of each other until its tail. A limit below K is refused (a shard with a share of 0
would never start its jobs): give it over a longer window (``10/10s`` rather than ``1/s``).
On a Cluster each master's clock aligns its shards' windows, so the bound holds per server
window; clocks apart by ``d`` can let one window of another clock see up to ``limit`` plus the
starts of ``d``.

Not done: a limit per key (per tenant) within one queue - use one queue per key.
"""

from __future__ import annotations

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


def stored(rate: Any, total: Any) -> tuple[int, int] | None:
    """``(limit, window ms)`` of a queue's limit from its ``config`` fields :data:`FIELD` and
    :data:`TOTAL` (a sharded queue's whole limit, else its own); None when it has none."""
    if rate is None:
        return None
    limit, window = (int(x) for x in _s(total if total is not None else rate).split())
    return limit, window


def shares(limit: int, count: int) -> list[int]:
    """``limit`` split over ``count`` shards: equal parts, the remainder one each to the first
    shards (so they sum to ``limit`` and differ by at most one)."""
    base, extra = divmod(limit, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def writes(ks: Keyspace, shards: Sequence[str], parsed: tuple[int, int] | None) -> list[Call]:
    """The commands that store ``parsed`` (``(limit, window ms)``, None: no limit) over the
    physical queues ``shards`` of one queue (``shards[0]`` its own name). Refused with
    :class:`InvalidArgument`, before anything is written, for a limit below the shard count."""
    configs = [ks.config(q) for q in shards]
    if parsed is None:
        return [Call.cmd("HDEL", c, FIELD, TOTAL) for c in configs]
    limit, window = parsed
    if len(shards) == 1:
        return [Call.cmd("HSET", configs[0], FIELD, f"{limit} {window}"),
                Call.cmd("HDEL", configs[0], TOTAL)]  # fmt: skip
    if limit < len(shards):
        text = RateLimit(limit, window).text
        raise InvalidArgument(
            f"rate {text} over queue {shards[0]!r}'s {len(shards)} shards: each shard counts "
            f"its own share of the limit, so it must be at least {len(shards)} per window; "
            f"give it over a longer window (e.g. {limit * len(shards)}/"
            f"{RateLimit(1, window * len(shards)).text[2:]})"
        )
    out = [
        Call.cmd("HSET", c, FIELD, f"{share} {window}")
        for c, share in zip(configs, shares(limit, len(shards)), strict=True)
    ]
    return [*out, Call.cmd("HSET", configs[0], TOTAL, f"{limit} {window}")]


def set_rate(ks: Keyspace, queue: str, value: Any, shards: Sequence[str] | None = None) -> Op[None]:
    """Store ``value`` (checked first: nothing is written for a bad one) as ``queue``'s rate
    limit, or remove it (None); the queue is registered with it. ``shards``: the queue's
    physical queues when it is sharded (each gets its share, :func:`writes`). Takes effect at
    the next claim of every worker; a worker sleeping on a spent window sees it when it wakes
    (at the window's end, or within :data:`~echomq_core.work.running.RATE_RECHECK`). Over shards
    the shares are written in one step (one pipeline per node), not atomically: a claim in
    between may count under one shard's old share and another's new one."""
    calls = writes(ks, shards or [queue], parse_rate(value))
    # the queue joins the registry with its first setting, so `queue stats` lists it
    yield [*calls, Call.cmd("SADD", ks.queues(), queue)]


def get_rate(ks: Keyspace, queue: str, shards: Sequence[str] | None = None) -> Op[RateLimit | None]:
    """``queue``'s rate limit and its current window (one script per physical queue, on its
    slot, whose clock decides the windows; one step); None when the queue has no limit. Over
    shards: the whole limit, the starts of every shard's window summed, the latest reset."""
    names = list(shards or [queue])
    calls = [Call.lua("rate", [ks.config(q), ks.rate_window(q)], []) for q in names]
    if len(names) > 1:
        calls.append(Call.cmd("HGET", ks.config(names[0]), TOTAL))
    replies = yield calls
    readings = [r for r in replies[: len(names)] if r]
    if not readings:
        return None
    limit, window = (int(x) for x in _s(readings[0][0]).split())
    if len(names) > 1 and replies[-1] is not None:
        limit, window = (int(x) for x in _s(replies[-1]).split())
    used = sum(int(r[1]) for r in readings)
    return RateLimit(limit, window, used, max(int(r[2]) for r in readings) / 1000)
