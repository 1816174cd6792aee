"""What the threaded and the asyncio worker are made of alike: their construction (the
arguments read and checked before any round trip, the queues, batch sizes, Pump and registry
entry of the handlers they serve, a sharded queue served shard by shard), their start-up
(the shard read, what its waits say), their :class:`~echomq_core.work.loop.Loop`, the stop
signal's rule, and their options as read-only attributes. :class:`Driven` is the base of
both drivers (:mod:`echomq_core.work.threads` and :mod:`echomq_core.work.tasks`, under
:class:`~echomq_core.Worker` and :class:`~echomq_core.AsyncWorker`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar

from ..client.queue import QueueOps
from ..control.options import PumpOptions, WorkerOptions, build
from ..flows import sharding
from ..flows.sharding import Shards
from ..hooks import LifecycleHooks
from ..pump.pump import Pump, worker_pump
from ..queues.registry import Presence
from ..wire.calls import Op
from ..wire.patience import Outage
from . import batching
from .loop import Loop
from .running import InHand, Intake, logical_names, make_queues, serving

log = logging.getLogger("echomq_core.worker")
Q = TypeVar("Q", bound=QueueOps)
T = TypeVar("T")

#: What a worker's start-up says it waits for while the server cannot take its queues yet.
REGISTERING = "worker: registering its queues"


class _Option(Generic[T]):
    """A worker's option as a read-only attribute (``worker.lease``), read from its
    ``options``: one source of truth, nothing copied."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, worker: Any, owner: type | None = None) -> T:
        return getattr(worker.options, self.name)  # type: ignore[no-any-return]


class Driven(Generic[Q]):
    """What the two workers are made of alike: their options (read-only attributes, read
    from ``options``), queues, handlers, batch sizes, Pump, registry entry and
    :class:`~echomq_core.work.loop.Loop`. A driver's constructor calls :meth:`_configure`,
    reads the shards (:meth:`_read_shards`, :meth:`_serve_shards`) when it can wait for the
    server, and makes its loop with its own lock and stop flag (:meth:`_make_loop`)."""

    options: WorkerOptions
    client: Any
    hooks: LifecycleHooks | None
    queues: dict[str, Q]
    handlers: dict[str, Any]
    batches: dict[str, int]
    pump: Pump | None
    presence: Presence
    abandoned: int
    _loop: Loop
    _hand: InHand  # the loop's
    _intake: Intake  # the loop's
    _spawner: Any  # what job.spawn() calls
    _outage: Outage
    _stop: Any  # a threading.Event or an asyncio.Event: stop claiming
    _halt: Any  # the same: a second signal, do not wait for handlers
    _per_queue: Mapping[str, Any] | None
    _given: tuple[Mapping[str, Any], Mapping[str, Any] | None, bool | PumpOptions]
    #: the kind of worker in the workers registry ("thread" or "asyncio")
    _KIND = ""
    #: its queues: :class:`~echomq_core.Queue` or :class:`~echomq_core.AsyncQueue`
    _QUEUE: Callable[..., Q]

    def _configure(
        self,
        client: Any,
        handlers: Mapping[str, Any],
        options: WorkerOptions | None,
        queue_options: Mapping[str, Any] | None,
        hooks: LifecycleHooks | None,
        pump: bool | PumpOptions,
        settings: dict[str, Any],
    ) -> None:
        """Read the constructor's arguments (``settings``: option fields by name, ``batch``
        maybe per queue) and refuse bad ones before any round trip."""
        settings = dict(settings)
        self._per_queue = batching.split_setting(settings)  # batch={queue: size}
        self.options = build(WorkerOptions, options, settings)
        self.client = client
        self.hooks = hooks
        self._given = (handlers, queue_options, pump)  # checked by _serve, then copied
        #: the signal that stopped ``run`` (SIGINT or SIGTERM), None until one came
        self.signalled: int | None = None
        self.abandoned = 0  # handler calls left running (or cancelled) past their time limit
        self._serve(handlers)  # refuses bad input before any round trip
        self._given = (dict(handlers), queue_options, pump)

    def _serve(self, handlers: Mapping[str, Any], logical: Mapping[str, str] | None = None) -> None:
        """Take ``handlers`` (by physical queue; ``logical``: the name each one's jobs show,
        :func:`~echomq_core.work.running.logical_names`): their queues, batch sizes, Pump,
        registry entry and the outage warnings of the fetcher."""
        opts, (_, queue_options, pump) = self.options, self._given
        self.queues = make_queues(self.client, handlers, opts, queue_options, self._QUEUE, logical)
        self.handlers = dict(handlers)
        #: {queue: jobs per call} of the queues whose handler takes lists (size above 1)
        self.batches = batching.sizes(
            opts.batch,
            self._per_queue,
            {name: queue.logical for name, queue in self.queues.items()},
            opts.max_batch,
        )
        self.pump = worker_pump(self.client, list(self.handlers), pump, self.hooks)
        #: this process's entry in the workers registry (:mod:`echomq_core.queues.registry`)
        self.presence = Presence(
            self.client.keys, list(handlers), opts.concurrency, self._KIND, opts.lease
        )
        for queue in self.queues.values():  # its lease tokens name this worker
            queue.holder = self.presence.entry.id
        #: the fetcher's and hint waits' warnings while the server is down, backed off
        self._outage = Outage(log, f"worker {self.presence.entry.id}")

    def _read_shards(self) -> Op[dict[str, Shards]]:
        """Read the shard configuration of the given queues (one read, cached by the client;
        the start-up waits for it, saying :meth:`_reading_shards`)."""
        return sharding.resolve(self.client.keys, self.client.shard_cache, self._given[0])

    def _reading_shards(self) -> str:
        return f"worker: reading the shard configuration of {', '.join(map(repr, self._given[0]))}"

    def _serve_shards(self, shards: Mapping[str, Shards]) -> None:
        """A sharded queue is served by serving every shard (``shards``: as read by
        :meth:`_read_shards`), claimed in turn with the other queues, its jobs shown under its
        logical name."""
        given = self._given[0]
        served = serving(given, shards)
        if served.keys() != self.handlers.keys():
            self._serve(served, logical_names(given, shards))

    def _make_loop(self, lock: AbstractContextManager[Any], stop: Any) -> Loop:
        """The worker's :class:`Loop` (``lock`` and ``stop``: the driver's), claiming for
        whole calls of its largest batch handler; the driver wires its wakes in."""
        per_call = max(self.batches.values(), default=1)
        loop = self._loop = Loop(self.options, per_call, self.hooks, lock, stop)
        self._intake, self._hand = loop.intake, loop.hand
        return loop

    def _signal(self, signum: int) -> bool:
        """SIGTERM / SIGINT: stop claiming and drain (``run`` says what it waits for); a
        second one (True) gives back the running jobs at once."""
        second: bool = self._stop.is_set()
        if second:
            log.warning("second signal: giving back the running jobs now")
            self._halt.set()
        else:
            self.signalled = signum
        self._stop.set()
        return second

    def __repr__(self) -> str:
        name, queues = type(self).__name__, sorted(self.handlers)
        return f"{name}(queues={queues}, concurrency={self.concurrency})"

    @property
    def completed(self) -> int:
        """Completions the server recorded."""
        return self._loop.completed

    @property
    def failed(self) -> int:
        """Failed attempts the server recorded."""
        return self._loop.failed

    @property
    def dropped(self) -> int:
        """Claimed jobs not started because their lease was gone (a cancelled flow)."""
        return self._loop.hand.dropped

    @property
    def recheck(self) -> float:
        """Buffered jobs claimed longer ago than this (s) have their leases re-checked."""
        return self._loop.recheck

    @recheck.setter
    def recheck(self, seconds: float) -> None:
        self._loop.recheck = seconds

    concurrency = _Option[int]()
    max_batch = _Option[int]()
    #: Jobs per handler call of the queues ``batch={queue: n}`` does not name.
    batch = _Option[int]()
    lease = _Option[float]()
    poll = _Option[float]()
    max_poll = _Option[float]()
    grace = _Option[float]()
    fast_job = _Option[float]()
    flush_after = _Option[float]()
