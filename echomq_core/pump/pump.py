"""The Pump: carries cross-queue fan-in signals to their parents, and keeps queues moving.

Each tick, for every queue it serves, the Pump

1. takes (or renews) the queue's outbox lease and reads a page of the outbox WITHOUT removing
   it - one pipeline for all queues;
2. delivers the page on the parents' slots, grouped per parent queue and per parent, so a page
   of signals for one parent costs one script call and one DECRBY - one pipeline;
3. removes exactly the delivered prefix (``trim_outbox`` re-checks the lease and the head,
   so a Pump that lost its lease removes nothing); a head that does not deliver is aged and,
   after ``max_tries`` ticks, moved with its reason to the poison list;
4. promotes due delayed jobs and returns expired leases to pending.

Why read-then-trim instead of pop: a Pump that dies between delivering and trimming leaves
the signals in place, and the next Pump redelivers them - harmless, because a parent records
each child with a set-if-absent guard and only a first record decrements. A pop would lose
them. Why a lease per outbox: two Pumps trimming "N delivered" from the same list would drop
each other's undelivered signals; one drainer at a time, with a short TTL, keeps the order
simple and still fails over in ``lease`` seconds.

An idle Pump waits for the outboxes' wake-up hint (``flow:outbox:wake``, set by every script
that pushes a signal) with one BZPOPMIN, so a signal is picked up as soon as it is written, not
after a sleep. The wait is bounded by the jittered ``interval`` (many Pumps on a quiet system
should not tick in lock-step; maintenance runs on ticks). The hint is popped by one drainer,
so only those that may drain wait on it: a Pump that finds an outbox lease held by another
stops waiting on that outbox's hint, and one that popped a hint just before sets it again
once, for the holder (see :class:`Pump`). A Cluster can block only on keys of
one slot: a Pump whose queues span several slots blocks on the slot of the queue whose outbox
was busy last, and picks up the others' signals at its next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..control.options import PumpOptions, build
from ..errors import EchoMQError, InvalidArgument
from ..flows import retention, sharding
from ..flows.sharding import logical_of
from ..hooks import LifecycleHooks, fire
from ..queues import maintenance
from ..queues.hints import BLOCK_SLICE, HintWatch, hint_groups, wait_for_hint, wake_queues
from ..wire.calls import Call, Lenient, Op
from ..wire.keyspace import check_queue
from ..wire.patience import Outage
from .drain import TickStats, drain

if TYPE_CHECKING:
    from ..client.async_client import AsyncEchoMQ
    from ..client.clients import EchoMQ
    from ..wire.drivers import AsyncConnection

log = logging.getLogger("echomq_core.pump")


class Pump:
    """Runs :func:`~echomq_core.pump.drain.drain` plus the maintenance duties in a loop, as a
    thread, in the caller, or as an asyncio task (:meth:`arun`, with an
    :class:`~echomq_core.AsyncEchoMQ`).

    Options: ``queues`` (None: discover from the registry every ``discover_every`` s; an
    asyncio Pump needs them given; a sharded queue's logical name serves all its shards); the
    settings of :class:`~echomq_core.control.options.PumpOptions`
    (page, max_tries, lease, interval, max_stalls, discover_every, sweep_every - None: this
    Pump never sweeps; how long each end state is kept is the queue's setting on the server,
    see :mod:`echomq_core.flows.retention` - maintain_every), by name or as ``options=``;
    ``hooks`` (a :class:`~echomq_core.hooks.LifecycleHooks`: ``job_dead`` for jobs it buries
    after ``max_stalls`` expired leases, their token '', ``flow_released``, ``flow_failed``,
    ``signal_poisoned``; fired after each tick; None for none).

    Every worker runs one over the queues it serves (see :mod:`echomq_core.work.worker`), so
    several drainers usually share an outbox. Only the holder of an outbox's lease drains it;
    a drainer that sees the lease held by another does not wait on that outbox's wake-up hint
    (the hint would be popped by one that cannot drain: the holder would notice the signal only
    at its next tick), and one that popped a hint just before finding the lease taken sets the
    hint again, once, for the holder. It keeps ticking every ``interval`` to take over a lease
    that lapses.
    """

    def __init__(
        self,
        client: EchoMQ | AsyncEchoMQ,
        queues: Sequence[str] | None = None,
        *,
        options: PumpOptions | None = None,
        pump_id: str | None = None,
        hooks: LifecycleHooks | None = None,
        **settings: Any,
    ) -> None:
        """``settings`` are :class:`~echomq_core.control.options.PumpOptions` fields by name
        (``lease=5, page=500``), applied over ``options`` (or the defaults)."""
        self.client = client
        self.hooks = hooks
        if isinstance(queues, str | bytes):
            raise InvalidArgument(f"queues must be a list of queue names, not a string {queues!r}")
        self.fixed = [check_queue(q) for q in queues] if queues is not None else None
        opts = self.options = build(PumpOptions, options, settings)
        self.page = opts.page
        self.max_tries = opts.max_tries
        self.lease_ms = int(opts.lease * 1000)
        self.interval = opts.interval
        self.max_stalls = opts.max_stalls
        self.discover_every = opts.discover_every
        self.sweep_every = opts.sweep_every
        self._fair: dict[str, str] = {}  # queue -> where its fairness groups' prune stopped
        self.maintain_every = opts.maintain_every
        self._maintained_at = self._swept_at = float("-inf")
        self.id = pump_id or "pump-" + uuid.uuid4().hex[:12]
        self.totals = TickStats()
        #: ticks that failed and were retried (their warnings are backed off: :class:`Outage`)
        self.failed_ticks = 0
        self._queues: list[str] = list(self.fixed or [])
        #: the given names are taken as logical ones: each sharded queue's shards replace it,
        #: read once, at the first tick (construction makes no round trip)
        self._expanded = self.fixed is None
        self._discovered_at = float("-inf")
        self._hint_for: str | None = None  # the queue whose outbox was busy last
        self._others: set[str] = set()  # queues whose outbox lease another drainer held
        self._woken = False  # the next tick follows a wake-up hint this Pump popped
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hints: HintWatch | None = None  # the sync idle wait's, made on first use
        #: its warnings while the server is down, backed off (and its return said)
        self._outage = Outage(log, f"pump {self.id}")

    def __repr__(self) -> str:
        return f"Pump({self.id}, queues={self.fixed or 'discovered'})"

    def queues(self, now: float) -> list[str]:
        if not self._expanded:
            self._queues = self._sync().perform(self._expand())
            self._expanded = True
        if self.fixed is None and now - self._discovered_at >= self.discover_every:
            self._queues = self._sync().queues()
            self._discovered_at = now
        return self._queues

    def _expand(self) -> Op[list[str]]:
        """The physical queues of the names given: a sharded queue's shards (one step)."""
        given = self.fixed or []
        shards = yield from sharding.resolve(self.client.keys, self.client.shard_cache, given)
        return list(dict.fromkeys(s for q in given for s in shards[q]))

    def _sync(self) -> EchoMQ:
        if hasattr(self.client, "perform"):
            return self.client  # type: ignore[return-value]
        raise InvalidArgument(
            "this Pump has an asyncio client: run it with `await pump.arun()` and give it queues"
        )

    def _aconnection(self) -> AsyncConnection:
        from ..wire.drivers import AsyncConnection  # loaded with the client (redis-py) already

        connection = self.client.connection
        if not isinstance(connection, AsyncConnection):
            raise InvalidArgument("Pump.arun needs an AsyncEchoMQ; run a sync one with run()")
        return connection

    def tick(self) -> TickStats:
        """One pass: deliver and trim; every ``maintain_every`` s also promote due retries and
        recover expired leases; every ``sweep_every`` s forget what is past its retention."""
        queues = self.queues(time.monotonic())
        if not queues:
            return TickStats()
        rearm, self._woken = self._woken, False
        stats = self._sync().perform(self._tick_op(queues, rearm))
        self._after(stats)
        return stats

    async def atick(self) -> TickStats:
        """:meth:`tick` on an asyncio client (the queues given)."""
        if not self._expanded:
            self._queues = await self._aconnection().perform(self._expand())
            self._expanded = True
        if not self._queues:
            return TickStats()
        rearm, self._woken = self._woken, False
        stats = await self._aconnection().perform(self._tick_op(self._queues, rearm))
        self._after(stats)
        return stats

    def _tick_op(self, queues: list[str], rearm: bool) -> Op[TickStats]:
        """One tick as one operation, driven by the sync or the asyncio connection. ``rearm``:
        it follows a wake-up hint this Pump popped (see the class doc)."""
        keys = self.client.keys
        stats = yield from drain(
            keys, queues, self.id, page=self.page, lease_ms=self.lease_ms, max_tries=self.max_tries
        )
        if rearm and any(stats.others.values()):
            yield [
                Call.cmd("ZADD", keys.outbox_wake(q), 0, "w")
                for q, waiting in stats.others.items()
                if waiting
            ]
        now = time.monotonic()
        if now - self._maintained_at >= self.maintain_every:
            # Maintenance is cheap but not free: at most every maintain_every seconds, so a
            # Pump busy draining spends its round trips on delivery.
            self._maintained_at = now
            batch = min(self.page, 1000)  # Lua's unpack() bounds one script's batch
            stats.promoted = yield from maintenance.promote(keys, queues, batch)
            stats.recovered, stats.dead = yield from maintenance.recover(
                keys, queues, batch, self.max_stalls, self.client.serializer
            )
            stats.buried = len(stats.dead)
            if self.sweep_every is not None and now - self._swept_at >= self.sweep_every:
                self._swept_at = now
                swept = yield from retention.sweep(
                    keys, queues, self.id, lease_ms=self.lease_ms, limit=200, cursors=self._fair
                )
                stats.swept = swept.swept
                stats.expired = swept.flows
        return stats

    def _after(self, stats: TickStats) -> None:
        """What a tick leaves behind: totals, the hint state, the log, the hooks."""
        if stats.drained:
            self._hint_for = stats.drained[-1]
        self._others = set(stats.others)
        for name in ("delivered", "poisoned", "promoted", "recovered", "buried"):
            setattr(self.totals, name, getattr(self.totals, name) + getattr(stats, name))
        if stats.poisoned:
            log.warning("pump %s poisoned %d signal(s): %s", self.id, stats.poisoned, stats.blocked)
        if self.hooks is not None:
            self._fire_hooks(self.hooks, stats, self.client.shard_cache)

    @staticmethod
    def _fire_hooks(
        hooks: LifecycleHooks, stats: TickStats, shards: Mapping[str, sharding.Shards]
    ) -> None:
        # After the scripts returned, never inside them (hooks.fire logs what a hook raises).
        # A sharded queue's shards are shown under its logical name, as workers show them.
        for job, error in stats.dead:
            job.queue = logical_of(shards, job.shard)
            fire(hooks, "job_dead", job=job, error=error)
        for queue, parent_id in stats.released:
            fire(hooks, "flow_released", queue=logical_of(shards, queue), parent_id=parent_id)
        for queue, parent_id in stats.failed:
            fire(hooks, "flow_failed", queue=logical_of(shards, queue), parent_id=parent_id)
        for queue, reason in stats.poisoned_entries:
            fire(hooks, "signal_poisoned", queue=logical_of(shards, queue), reason=reason)

    def run(self) -> None:
        """Tick until :meth:`stop`; errors are logged and retried with a bounded backoff."""
        failures = 0
        while not self._stop.is_set():
            try:
                busy = self.tick().busy
                failures = 0
                self._outage.up()
            except EchoMQError as exc:
                failures += 1
                self._stop.wait(self._failed(exc, failures))
                continue
            if not busy:
                self._woken = self._idle(self.interval * random.uniform(0.5, 1.5))

    async def arun(self, stop: asyncio.Event) -> None:
        """:meth:`run` as an asyncio task on an :class:`~echomq_core.AsyncEchoMQ`, until
        ``stop`` is set; gives up its leases when it ends."""
        failures = 0
        try:
            while not stop.is_set():
                try:
                    busy = (await self.atick()).busy
                    failures = 0
                    self._outage.up()
                except EchoMQError as exc:
                    failures += 1
                    await _sleep(stop, self._failed(exc, failures))
                    continue
                if not busy:
                    self._woken = await self._aidle(stop, self.interval * random.uniform(0.5, 1.5))
        finally:
            await self.arelease_leases()

    def _failed(self, exc: EchoMQError, failures: int) -> float:
        """Count a failed tick (the ``failures``-th in a row), warn (backed off), and return
        the pause before the next (:func:`_backoff`)."""
        self.failed_ticks += 1
        wait = _backoff(failures)
        self._outage.warning("tick failed (%s); retrying in %.1fs", exc, wait)
        return wait

    def _idle(self, seconds: float) -> bool:
        """Wait up to ``seconds``, woken early by a signal pushed to an outbox (see the module
        doc): one BZPOPMIN on the hints of this Pump's queues, in slices, one per slot when they
        span several (a sharded queue's outboxes: :class:`~echomq_core.queues.hints.HintWatch`).
        True if a hint was popped."""
        queues = [q for q in self._queues if q not in self._others]
        if not queues:
            self._stop.wait(seconds)
            return False
        if self._hints is None:  # one waiter per slot (HintWatch), for the Pump's life
            what = "waiting for signals"
            self._hints = HintWatch(self._sync().perform, self._stop, what, self._outage.warning)
        hints = [self.client.keys.outbox_wake(q) for q in queues]
        return self._hints.wait(hint_groups(hints, self.client.connection.is_cluster), seconds)

    async def _aidle(self, stop: asyncio.Event, seconds: float) -> bool:
        """:meth:`_idle` on the asyncio connection."""
        hints = self._hint_keys()
        if not hints:
            await _sleep(stop, seconds)
            return False
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            op = wait_for_hint(hints, min(left, BLOCK_SLICE))
            try:
                if await self._aconnection().perform(op):
                    return True
            except EchoMQError as exc:
                if not stop.is_set():
                    self._outage.warning("waiting for signals failed: %s", exc)
                    await _sleep(stop, left)
                return False
        return False

    def _hint_keys(self) -> list[str]:
        """The outbox wake-up hints this Pump blocks on: those of its queues whose outbox lease
        no other drainer holds, or on a Cluster whose queues span slots those of the slot of
        the queue busy last."""
        queues, keys = [q for q in self._queues if q not in self._others], self.client.keys
        if not queues:
            return []
        if wake_queues(keys, self.client.connection.is_cluster, queues) is None:
            lead = self._hint_for if self._hint_for in queues else queues[0]
            queues = [q for q in queues if wake_queues(keys, True, [lead, q]) is not None]
        return [keys.outbox_wake(q) for q in queues]

    def start(self) -> Pump:
        """Run in a daemon thread; :meth:`stop` ends it."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._sync()
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=self.id, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread and give up this Pump's outbox and sweep leases, so another Pump
        takes over at once rather than after ``lease`` seconds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.release_leases()

    def stop_after_last_tick(self) -> None:
        """Stop, then tick once more and give up the leases: a stopping worker's Pump delivers
        the signals of the results it just recorded now, not when another drainer comes by.
        A failed last tick is logged: the outbox keeps the signals for another drainer."""
        self.stop()
        try:
            self.tick()
        except EchoMQError as exc:
            log.warning("the last drain of %s failed: %s", self.id, exc)
        self.release_leases()

    async def astop_after_last_tick(self, stop: asyncio.Event, task: asyncio.Task[None]) -> None:
        """:meth:`stop_after_last_tick` for the :meth:`arun` ``task`` that ``stop`` ends."""
        stop.set()  # it ends its tick or wait, and gives up its leases
        await asyncio.gather(task, return_exceptions=True)
        try:
            await self.atick()
        except EchoMQError as exc:
            log.warning("the last drain of %s failed: %s", self.id, exc)
        await self.arelease_leases()

    def _unlease_calls(self) -> list[Call]:
        keys = self.client.keys
        return [
            Call.lua("outbox_unlease", [lease], [self.id])
            for q in self._queues
            for lease in (keys.outbox_lease(q), keys.sweep_lease(q))
        ]

    def release_leases(self) -> None:
        calls = self._unlease_calls()
        if calls:
            try:
                self._sync().connection.execute(Lenient(calls))
            except EchoMQError as exc:  # the leases lapse on their own
                log.warning("pump %s could not release its leases: %s", self.id, exc)

    async def arelease_leases(self) -> None:
        """:meth:`release_leases` on the asyncio connection."""
        calls = self._unlease_calls()
        if calls:
            try:
                await self._aconnection().execute(Lenient(calls))
            except EchoMQError as exc:
                log.warning("pump %s could not release its leases: %s", self.id, exc)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Pump:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: The Pump a worker runs over its own queues unless told otherwise: it waits on the outboxes'
#: wake-up hints, so signals are delivered as they are written; ``interval`` only bounds how
#: soon it takes over a lapsed lease, and maintenance (lease recovery; claims promote due
#: retries themselves) is due once a second - a fleet of idle workers costs the server a few
#: commands per second each.
WORKER_PUMP = PumpOptions(interval=0.5, maintain_every=1.0)


def worker_pump(
    client: EchoMQ | AsyncEchoMQ,
    queues: Sequence[str],
    pump: bool | PumpOptions,
    hooks: LifecycleHooks | None,
) -> Pump | None:
    """The Pump a worker runs for ``queues`` (``pump``: True for :data:`WORKER_PUMP`, a
    :class:`PumpOptions` for those, False for none), firing the worker's hooks."""
    if pump is False:
        return None
    if pump is True:
        options = WORKER_PUMP
    elif isinstance(pump, PumpOptions):
        options = pump
    else:
        raise InvalidArgument(f"pump must be True, False or a PumpOptions, got {pump!r:.100}")
    name = f"worker-pump-{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    return Pump(client, list(queues), options=options, pump_id=name, hooks=hooks)


def _backoff(failures: int) -> float:
    """The pause after ``failures`` failed ticks in a row: 0.2 s doubling, at most 5 s."""
    return float(min(5.0, 0.1 * 2 ** min(failures, 6)))


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds`` or until ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
