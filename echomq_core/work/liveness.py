"""``/healthz`` of a worker or Pump process: alive means its own loops still turn.

Served beside ``/metrics`` on ``--metrics-port``
(:class:`~echomq_core.seeing.process_metrics.MetricsServer`), for a Kubernetes ``livenessProbe``
(``deploy/kubernetes/``) or any supervisor. What it checks is the process, not the server it talks
to: a loop that still runs while the server is away (it retries) is alive, so an outage of the
server does not restart every worker at once; a loop that is stuck (a call that never returns, an
event loop blocked by a sync handler) or a thread that died is not, and a restart is what it needs.

* A worker (:meth:`Liveness.watch_worker`): its heartbeat loop - the one that extends leases
  and beats in the workers registry every ``lease / 3`` - has started a beat within
  ``lease + 5`` s (a late beat is what lets its leases run out), and, for a threaded worker,
  its fetcher, flusher and heartbeat threads are alive.
* A Pump (:meth:`Liveness.watch_pump`): a tick started within ``max(60, 10 x interval)`` s
  (a tick waits at most about ``interval`` for work, so a gap that long is a stuck tick).

The answer: ``200 ok`` or ``503`` with one line per problem. Nothing is read from the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class Liveness:
    """The checks of one process; :meth:`problems` runs them (empty: alive)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._checks: list[Callable[[], str | None]] = []

    def problems(self) -> list[str]:
        return [p for p in (check() for check in self._checks) if p]

    def add(self, check: Callable[[], str | None]) -> None:
        self._checks.append(check)

    def stamp(self, what: str, allowance: float) -> Callable[[], None]:
        """A check that fails once ``allowance`` seconds pass without a call of the function
        returned (``what`` names the loop)."""
        last = [self._clock()]

        def mark() -> None:
            last[0] = self._clock()

        def check() -> str | None:
            late = self._clock() - last[0]
            if late > allowance:
                return f"{what}: nothing for {late:.0f} s (allowed {allowance:.0f} s)"
            return None

        self.add(check)
        return mark

    def watch_worker(self, worker: Any) -> None:
        """Check ``worker`` (threaded or asyncio): its beats, and a threaded one's threads."""
        lease = float(worker.options.lease)
        mark = self.stamp("worker heartbeat loop", lease + 5)
        presence = worker.presence
        beat, abeat = presence.beat, presence.abeat

        def beating(*args: Any, **kwargs: Any) -> Any:
            mark()
            return beat(*args, **kwargs)

        async def abeating(*args: Any, **kwargs: Any) -> Any:
            mark()
            return await abeat(*args, **kwargs)

        presence.beat, presence.abeat = beating, abeating
        if hasattr(worker, "_helpers"):  # threaded: the threads it started, once it has
            self.add(lambda: _threads_alive(worker))

    def watch_pump(self, pump: Any) -> None:
        """Check ``pump``: its ticks keep starting."""
        mark = self.stamp("pump ticks", max(60.0, 10 * float(pump.interval)))
        tick = pump.tick

        def ticking() -> Any:
            mark()
            return tick()

        pump.tick = ticking


def _threads_alive(worker: Any) -> str | None:
    """None, or which of a started threaded worker's fetcher, flusher and heartbeat threads
    no longer run."""
    if worker._beater is None:  # not started: nothing to check yet
        return None
    dead = [t.name for t in (*worker._helpers, worker._beater) if not t.is_alive()]
    return f"worker thread(s) not running: {', '.join(dead)}" if dead else None


def health_app(liveness: Liveness, inner: Callable[..., Any]) -> Callable[..., Any]:
    """A WSGI app answering ``/healthz`` from ``liveness`` and everything else with ``inner``
    (the metrics)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") != "/healthz":
            return inner(environ, start_response)
        problems = liveness.problems()
        body = ("\n".join(problems) if problems else "ok").encode() + b"\n"
        status = "503 Service Unavailable" if problems else "200 OK"
        start_response(
            status,
            [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return app
