"""How a test waits for a condition: :func:`eventually` (and :func:`eventually_async` inside an
event loop).

A test whose precondition depends on timing reaches it through a condition it can read (a
count, a state, a port that answers), polled until it holds, never through a sleep of a
guessed length. ``eventually(predicate, timeout, what)`` calls ``predicate`` every ``every``
seconds until it returns something truthy, and returns that value; when ``timeout`` seconds
pass first, the test fails with an ``AssertionError`` naming ``what`` - a text, or a callable
called at that moment, so the failure can show how far things got (the queue's counts, the
last error seen). An exception raised by ``predicate`` ends the wait at once: a predicate that
should tolerate one (a server still restarting) catches it itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
#: What a wait is for: a text, or a callable that describes the state when the wait gives up.
What = str | Callable[[], object]


def _failure(what: What, timeout: float) -> AssertionError:
    told = what() if callable(what) else what
    return AssertionError(f"timed out after {timeout:g} s waiting for {told}")


def eventually(
    predicate: Callable[[], T], timeout: float = 30.0, what: What = "the condition",
    *, every: float = 0.02,
) -> T:  # fmt: skip
    """``predicate()``'s first truthy value, polled every ``every`` s for ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise _failure(what, timeout)
        time.sleep(every)
    return value


async def eventually_async(
    predicate: Callable[[], T], timeout: float = 30.0, what: What = "the condition",
    *, every: float = 0.02,
) -> T:  # fmt: skip
    """As :func:`eventually`, pausing with ``asyncio.sleep`` so the event loop runs meanwhile."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise _failure(what, timeout)
        await asyncio.sleep(every)
    return value


def past_first_lease(client: Any, active: str, first: dict[str, float], lease_ms: float) -> bool:
    """Whether a heartbeat has moved every job's lease past its claim's deadline plus one lease:
    one came after the claim's own lease had run out, so without heartbeats every job would
    have expired by now. ``first`` holds each job's score in the ``active`` set at the claim.

    A heartbeat test holds its handlers until this holds (a gate it controls), instead of
    sleeping a few lease lengths and hoping the heartbeat thread was scheduled in time.
    """
    return all(float(client.zscore(active, i) or 0) > at + lease_ms for i, at in first.items())
