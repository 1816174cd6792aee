"""Waiting out a server that cannot take a call yet, for workers and Pumps: their start-up
steps (:func:`patiently`, :func:`apatiently`: retried under one bound, saying what they wait
for - a Cluster master failing over, a full server, a server that does not answer) and the
warnings of an outage once they run (:class:`Outage`: backed off, its end said).

Only errors that time cures are waited out (:data:`PASSING`); any other is raised at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import ConnectionLost, ServerFull

T = TypeVar("T")

#: How long (s) a worker or Pump keeps trying its start-up reads and writes against a server
#: that cannot take them yet (unreachable, a Cluster master failing over, full) before it
#: gives up: the default of ``echomq worker --wait-for-server`` and of the in-process
#: ``wait_for_server`` parameter.
WAIT_FOR_SERVER = 300.0
#: The first and the longest pause (s) between two start-up tries.
FIRST_PAUSE, LONGEST_PAUSE = 0.5, 5.0
#: The errors a start-up step waits out: time (a failover, freed memory, a server that comes
#: up) cures them; any other error (a bad name, a refused argument) is raised at once.
PASSING = (ConnectionLost, ServerFull)


def waiting_for(exc: BaseException, is_cluster: bool) -> str:
    """What a start-up step that raised ``exc`` (one of :data:`PASSING`) waits for, in words
    for the log."""
    if isinstance(exc, ServerFull):
        return "the server is full (maxmemory): waiting for memory to be freed"
    text = str(exc)
    if any(word in text for word in ("CLUSTERDOWN", "MASTERDOWN", "failover", "no known owner")):
        return "a Cluster master in failover"
    if is_cluster:
        return "a Cluster node that does not answer (a master down or in failover)"
    return "the server, which does not answer"


class Patience:
    """The bound and the log of one start-up step that waits out :data:`PASSING` errors (see
    :func:`patiently`); shared by the sync and the asyncio loop."""

    def __init__(self, what: str, bound: float, is_cluster: bool, logger: logging.Logger):
        self.what, self.bound, self.is_cluster, self.logger = what, bound, is_cluster, logger
        self.began = time.monotonic()
        self.tries = 0
        self.pause = FIRST_PAUSE

    def retry_in(self, exc: BaseException) -> float:
        """The step failed with ``exc``: the seconds to wait before the next try, logged at
        WARNING with what it waits for; raises once the bound is spent."""
        self.tries += 1
        left = self.began + self.bound - time.monotonic()
        if left <= 0:
            if self.tries > 1:
                raise type(exc)(
                    f"{exc} ({self.what}: gave up after {self.tries} tries in "
                    f"{time.monotonic() - self.began:.0f}s; the bound is {self.bound:g}s)"
                ) from exc
            raise exc
        wait = min(self.pause, left)
        self.pause = min(LONGEST_PAUSE, self.pause * 2)
        self.logger.warning(
            "%s: %s (try %d: %s); trying again in %.1fs, for up to %.0fs more",
            self.what,
            waiting_for(exc, self.is_cluster),
            self.tries,
            exc,
            wait,
            left,
        )
        return wait

    def done(self) -> None:
        """The step went through: said at INFO if it had to wait."""
        if self.tries:
            took = time.monotonic() - self.began
            self.logger.info("%s: done after %d tries in %.1fs; going on", self.what,
                             self.tries + 1, took)  # fmt: skip


def patiently(
    step: Callable[[], T], *, what: str, bound: float, is_cluster: bool, logger: logging.Logger
) -> T:
    """Run the start-up ``step`` (``what`` it does, for the log), trying again while the server
    cannot take it yet (:data:`PASSING`: unreachable, a Cluster master failing over, a full
    server), for up to ``bound`` seconds: the pause between tries doubles from
    :data:`FIRST_PAUSE` to :data:`LONGEST_PAUSE`, each wait logged at WARNING with what it waits
    for (:func:`waiting_for`), the step that went through after waiting at INFO. The last
    error is raised once the bound is spent (``bound`` 0: at once) - every start-up step is
    bounded as an unreachable server is (``--wait-for-server``), so a fleet restarted during a
    failover waits it out instead of exiting."""
    patience = Patience(what, bound, is_cluster, logger)
    while True:
        try:
            result = step()
        except PASSING as exc:
            time.sleep(patience.retry_in(exc))
        else:
            patience.done()
            return result


async def apatiently(
    step: Callable[[], Awaitable[T]],
    *,
    what: str,
    bound: float,
    is_cluster: bool,
    logger: logging.Logger,
) -> T:
    """:func:`patiently` for an asyncio ``step`` (an :class:`~echomq_core.AsyncWorker`'s
    start)."""
    import asyncio  # only the asyncio worker's start needs it

    patience = Patience(what, bound, is_cluster, logger)
    while True:
        try:
            result = await step()
        except PASSING as exc:
            await asyncio.sleep(patience.retry_in(exc))
        else:
            patience.done()
            return result


#: The first pause (s) between two warnings of one outage, and the longest (it doubles).
OUTAGE_FIRST, OUTAGE_LONGEST = 1.0, 30.0


class Outage:
    """The warnings of a worker or Pump whose server went away, backed off: the first failure
    is logged at once, the next ones at most once per pause (1 s doubling to 30 s; the number
    hidden meanwhile is said), and the first success after it logs one WARNING that says the
    server is back and how long it was gone - instead of several warnings a second while the
    server is down and silence when it returns. :meth:`up` is one attribute read while the
    server answers: it costs the hot paths nothing."""

    def __init__(self, logger: logging.Logger, who: str) -> None:
        self.logger, self.who = logger, who
        self.since = 0.0  # monotonic start of the outage; 0: the server answers
        self._next = 0.0
        self._pause = OUTAGE_FIRST
        self._hidden = 0
        self._lock = threading.Lock()

    def warning(self, message: str, *args: Any) -> None:
        """Log ``message % args`` at WARNING, unless the outage was warned about less than a
        pause ago (then it is counted, and said with the next warning)."""
        now = time.monotonic()
        with self._lock:
            if not self.since:
                self.since, self._pause, self._hidden = now, OUTAGE_FIRST, 0
            elif now < self._next:
                self._hidden += 1
                return
            else:
                self._pause = min(OUTAGE_LONGEST, self._pause * 2)
            hidden, self._hidden = self._hidden, 0
            self._next = now + self._pause
            down, pause = now - self.since, self._pause
        tail = f" ({hidden} more failure(s) not shown)" if hidden else ""
        self.logger.warning(
            "%s: " + message + "%s; failing for %.0fs, trying again (the next warning in %.0fs "
            "at the earliest)",
            self.who,
            *args,
            tail,
            down,
            pause,
        )

    def up(self) -> None:
        """A call went through: if the server was failing, say it is back (once)."""
        if not self.since:
            return
        with self._lock:
            since, self.since = self.since, 0.0
            hidden, self._hidden = self._hidden, 0
        if since:
            self.logger.warning(
                "%s: reconnected: calls go through again after %.1fs of failures (%d not shown)",
                self.who,
                time.monotonic() - since,
                hidden,
            )
