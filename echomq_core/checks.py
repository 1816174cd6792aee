"""The argument checks every public entry point shares, and their bounds: one home, imported
by the queue, the client, the worker, the Pump and the flow planner alike (never the other way
round, so no module of the core imports another in a circle).

Each check returns the value it accepts and raises :class:`~echomq_core.InvalidArgument` (or
:class:`~echomq_core.InvalidPayload`) naming the argument it refuses, before anything is sent.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import InvalidArgument, InvalidPayload


def text(value: Any) -> str:
    """A reply value (bytes from redis-py, or already a str) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """An int option in [low, high], else :class:`InvalidArgument` naming it."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise InvalidArgument(f"{name} must be an int {bound}, got {value!r}")
    return value


#: Upper bounds of the time options, in seconds: far beyond any sane use, and small enough
#: that every one of them stays exact as milliseconds in a Lua number (2^53).
MAX_LEASE = 7 * 86400.0
MAX_DELAY = 366 * 86400.0
MAX_TIMEOUT = 7 * 86400.0
#: The most attempts a job may be given.
MAX_ATTEMPTS = 1_000_000


def check_seconds(name: str, value: Any, low: float = 0.0, high: float | None = None) -> float:
    """A finite number of seconds in [low, high], else :class:`InvalidArgument` naming it (NaN
    and infinity are refused: they cannot become milliseconds or a thread wait)."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not value >= low
        or not math.isfinite(value)
        or (high is not None and value > high)
    ):
        bound = f"between {low} and {high:g}" if high is not None else f">= {low}"
        raise InvalidArgument(f"{name} must be a finite number of seconds {bound}, got {value!r}")
    return float(value)


def timeout_ms(name: str, value: Any) -> int | None:
    """A handler time limit in whole milliseconds (None: no limit of its own)."""
    if value is None:
        return None
    return max(1, int(check_seconds(name, value, 0.001, MAX_TIMEOUT) * 1000))


def encode_checked(serializer: Any, value: Any, limit: int) -> bytes:
    """Serialise ``value`` and enforce the size limit (:class:`InvalidPayload`)."""
    try:
        data = serializer.dumps(value)
    except InvalidPayload:
        raise
    except Exception as exc:
        raise unserialisable(exc) from None
    if type(data) is not bytes:
        data = as_bytes(data)
    if len(data) > limit:
        raise InvalidPayload(f"serialised value is {len(data)} bytes; the limit is {limit}")
    return data


def unserialisable(exc: Exception) -> InvalidPayload:
    """The error for a value the serializer raised ``exc`` on."""
    return InvalidPayload(f"value cannot be serialised: {type(exc).__name__}: {exc}")


def as_bytes(data: Any) -> bytes:
    """A serializer's output as bytes: a str encoded, bytes as they are (a subclass too), anything
    else :class:`InvalidPayload`."""
    if isinstance(data, str):
        return data.encode()
    if not isinstance(data, bytes):
        raise InvalidPayload(f"serializer returned {type(data).__name__}, not bytes")
    return data
