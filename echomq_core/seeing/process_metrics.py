"""Prometheus metrics of one worker or Pump process (the server-side gauges:
:mod:`echomq_core.seeing.metrics`); needs the ``metrics`` extra, as that module does.

:class:`ProcessMetrics` (``echomq worker|pump --metrics-port``): counters and histograms of
what this process did - jobs completed,
failed attempts, retries, deaths, handler duration, claim batch sizes, flows released and
failed, signals delivered and poisoned, Pump tick duration. Nothing here touches the worker's
or the Pump's code: completions and deaths come through the lifecycle hooks
(:class:`MeteredHooks` wraps any other :class:`~echomq_core.hooks.LifecycleHooks`), handler
timing through a wrapper around each handler (:meth:`ProcessMetrics.wrap_handlers`), batch
sizes through a wrapper around each of the worker's queues' ``claim``
(:meth:`ProcessMetrics.watch_worker`), and the Pump's counts through a wrapper around its
``tick`` (:meth:`ProcessMetrics.watch_pump`).
"""

from __future__ import annotations

import inspect
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app

from ..checks import check_int
from ..errors import Unrecoverable
from ..models import Job
from ..work.liveness import Liveness, health_app

if TYPE_CHECKING:
    from ..hooks import LifecycleHooks
    from ..pump.drain import TickStats
    from ..pump.pump import Pump
    from ..work.async_worker import AsyncWorker
    from ..work.worker import Worker

#: Handler durations (s): from a no-op handler (~10 us) to a long batch step.
DURATION_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0)
#: Claim batch sizes: the worker doubles a batch from 1 up to max_batch (5000 at most).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 5000)


@dataclass
class ProcessMetrics:
    """Counters and histograms of one worker or Pump process, in their own registry."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    server: MetricsServer | None = None
    #: what ``/healthz`` checks: the worker and Pump watched (:meth:`watch_worker`, ...)
    liveness: Liveness = field(default_factory=Liveness)

    def serve(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve this registry and ``/healthz`` over HTTP (see :class:`MetricsServer`);
        :meth:`close` stops."""
        self.server = MetricsServer(self.registry, port, host, self.liveness)
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def __post_init__(self) -> None:
        r, q = self.registry, ["queue"]

        def counter(name: str, doc: str, labels: list[str] = q) -> Counter:
            return Counter(name, doc, labels, registry=r)

        self.completed = counter("echomq_jobs_completed", "Completions recorded (lease current)")
        self.failed = counter("echomq_job_attempts_failed", "Handler calls that raised")
        self.retried = counter(
            "echomq_jobs_retried", "Failed attempts with attempts left (scheduled for a retry)"
        )
        self.dead = counter("echomq_jobs_dead", "Jobs that died (last attempt failed, or buried)")
        self.duration = Histogram(
            "echomq_handler_duration_seconds",
            "Time a handler call took (one job, or one batch handler's call of many)",
            q,
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.batch = Histogram(
            "echomq_claim_batch_size",
            "Jobs per non-empty claim",
            q,
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.released = counter("echomq_flows_released", "Flows this process released")
        self.flows_failed = counter("echomq_flows_failed", "Flows this process failed")
        self.poisoned = counter("echomq_signals_poisoned", "Signals moved to the poison list")
        self.pump = counter(
            "echomq_pump_events",
            "What the Pump did: delivered, promoted, recovered, buried, swept",
            ["event"],
        )
        self.tick = Histogram(
            "echomq_pump_tick_duration_seconds",
            "Time one Pump tick took",
            buckets=DURATION_BUCKETS,
            registry=r,
        )

    # -- worker ---------------------------------------------------------------------------
    def wrap_handlers(self, handlers: Mapping[str, Callable[[Job], Any]]) -> dict[str, Any]:
        """The same handlers, timed; a raise is counted as a failed attempt (and a retry when
        the job has attempts left and the error is not :class:`Unrecoverable`), then re-raised
        unchanged for the worker to record."""
        return {queue: self._timed(queue, fn) for queue, fn in handlers.items()}

    def _timed(self, queue: str, fn: Callable[[Job], Any]) -> Callable[[Job], Any]:
        duration = self.duration.labels(queue)
        failed, retried = self.failed.labels(queue), self.retried.labels(queue)

        def note(job: Job | list[Job], exc: BaseException) -> None:
            for each in job if isinstance(job, list) else (job,):  # a batch call: every job
                failed.inc()
                if not isinstance(exc, Unrecoverable) and each.attempts + 1 < each.max_attempts:
                    retried.inc()

        def entries(job: Job | list[Job], result: Any) -> Any:
            # a batch call's per-job exceptions (echomq_core.work.batching): each a failed attempt
            if isinstance(job, list) and isinstance(result, list | tuple):
                for each, entry in zip(job, result, strict=False):
                    if isinstance(entry, BaseException):
                        note(each, entry)
            return result

        async def awaited(job: Job | list[Job], pending: Awaitable[Any], started: float) -> Any:
            # an async handler: the worker awaits what it returns; time and count that
            try:
                return entries(job, await pending)
            except BaseException as exc:
                note(job, exc)
                raise
            finally:
                duration.observe(time.perf_counter() - started)

        def timed(job: Job | list[Job]) -> Any:
            started = time.perf_counter()
            try:
                result = fn(job)  # type: ignore[arg-type]
            except BaseException as exc:
                note(job, exc)
                duration.observe(time.perf_counter() - started)
                raise
            if inspect.isawaitable(result):
                return awaited(job, result, started)
            duration.observe(time.perf_counter() - started)
            return entries(job, result)

        timed.__name__ = getattr(fn, "__name__", "handler")
        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        return timed

    def watch_worker(self, worker: Worker | AsyncWorker) -> None:
        """Record the size of every non-empty claim of ``worker``, threaded or asyncio (wraps
        each of its queues' ``claim_op``, the one operation both workers claim through; the
        workers' code is not touched); and its loops for ``/healthz``."""
        self.liveness.watch_worker(worker)
        for name, queue in worker.queues.items():
            claim_op, batch = queue.claim_op, self.batch.labels(name)

            def metered(
                *args: Any, _claim_op: Any = claim_op, _batch: Any = batch, **kw: Any
            ) -> Any:
                jobs = yield from _claim_op(*args, **kw)
                if jobs:
                    _batch.observe(len(jobs))
                return jobs

            queue.claim_op = metered  # type: ignore[method-assign]

    # -- Pump -----------------------------------------------------------------------------
    def watch_pump(self, pump: Pump) -> Pump:
        """Count what each tick of ``pump`` did and time it (wraps its ``tick``), and watch
        its ticks for ``/healthz``."""
        self.liveness.watch_pump(pump)
        tick = pump.tick

        def metered() -> TickStats:
            started = time.perf_counter()
            try:
                stats = tick()
            finally:
                self.tick.observe(time.perf_counter() - started)
            for event in ("delivered", "promoted", "recovered", "buried", "swept"):
                n = getattr(stats, event)
                if n:
                    self.pump.labels(event).inc(n)
            return stats

        pump.tick = metered  # type: ignore[method-assign]
        return pump

    def hooks(self, inner: LifecycleHooks | None = None) -> MeteredHooks:
        """Lifecycle hooks that count, then pass every event on to ``inner`` (plugins)."""
        return MeteredHooks(self, inner)


class MeteredHooks:
    """A :class:`~echomq_core.hooks.LifecycleHooks` that counts each event, then calls the
    same method of ``inner`` (through :func:`~echomq_core.hooks.fire`: logged, never raised)."""

    def __init__(self, metrics: ProcessMetrics, inner: LifecycleHooks | None = None) -> None:
        self.metrics = metrics
        self.inner = inner

    def _pass(self, event: Any, **kwargs: Any) -> None:
        if self.inner is not None:
            from ..hooks import fire

            fire(self.inner, event, **kwargs)

    def job_completed(self, *, job: Job, result: bytes) -> None:
        self.metrics.completed.labels(job.queue).inc()
        self._pass("job_completed", job=job, result=result)

    def job_dead(self, *, job: Job, error: str) -> None:
        self.metrics.dead.labels(job.queue).inc()
        self._pass("job_dead", job=job, error=error)

    def flow_released(self, *, queue: str, parent_id: str) -> None:
        self.metrics.released.labels(queue).inc()
        self._pass("flow_released", queue=queue, parent_id=parent_id)

    def flow_failed(self, *, queue: str, parent_id: str) -> None:
        self.metrics.flows_failed.labels(queue).inc()
        self._pass("flow_failed", queue=queue, parent_id=parent_id)

    def signal_poisoned(self, *, queue: str, reason: str) -> None:
        self.metrics.poisoned.labels(queue).inc()
        self._pass("signal_poisoned", queue=queue, reason=reason)


class MetricsServer:
    """``registry`` served at ``http://host:port/metrics`` (prometheus-client's WSGI app) and,
    with ``liveness``, ``/healthz`` (:mod:`echomq_core.work.liveness`), from a daemon thread, until
    :meth:`close`. Binds 127.0.0.1 unless told otherwise; port 0 picks a free port (read it
    back from :attr:`port`)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        port: int,
        host: str = "127.0.0.1",
        liveness: Liveness | None = None,
    ) -> None:
        check_int("metrics port", port, 0, 65535)
        app = make_wsgi_app(registry)
        if liveness is not None:
            app = health_app(liveness, app)

        class Server(ThreadingMixIn, WSGIServer):
            daemon_threads = True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self._server = make_server(host, port, app, Server, handler_class=_Quiet)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.host = host
        self.port: int = self._server.server_port

    def __repr__(self) -> str:
        return f"MetricsServer(http://{self.host}:{self.port}/metrics)"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


class _Quiet(WSGIRequestHandler):
    """No access log line per scrape or probe on stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


__all__ = ["MeteredHooks", "MetricsServer", "ProcessMetrics"]
