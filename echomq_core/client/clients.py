"""The entry points: :class:`EchoMQ` (synchronous) and :class:`AsyncEchoMQ` (asyncio).

Both are thin: every method validates its arguments and hands an operation from
:mod:`echomq_core.queues` / :mod:`echomq_core.flows` to its connection's driver. Nothing
here builds a key or parses a reply.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..checks import MAX_ATTEMPTS, check_int, check_seconds, encode_checked, text
from ..control import rates
from ..control.rates import RateLimit
from ..errors import InvalidArgument, JobNotFound, flow_error
from ..flows import children as child_reads
from ..flows import (
    failures,
    handles,
    lifecycle,
    refs,
    release_watch,
    released,
    retention,
    sharding,
    streaming,
)
from ..flows import reads as flows
from ..flows.add import add_flow
from ..flows.plan import child_list, new_parent_id, plan, queues_of, unlink
from ..flows.waiting import MISSING, FlowWait, Verdict
from ..models import (
    Child,
    ChildFailure,
    FlowCap,
    FlowRef,
    FlowSnapshot,
    FlowSummary,
    JobInfo,
    JsonSerializer,
    Serializer,
)
from ..queues import adding
from ..wire import collector
from ..wire.connection import Call, Op, connect, connect_async
from ..wire.keyspace import FLOW_LISTS, QUEUE_NAME_RE, Keyspace, check_job_id, check_queue
from .queue import Queue

if TYPE_CHECKING:  # imported where used: a synchronous user does not load the asyncio queue
    from ..wire.drivers import AsyncConnection, Connection  # with the first client (redis-py)
    from .async_queue import AsyncQueue

T = TypeVar("T")
log = logging.getLogger("echomq_core.client")

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_MAX_PAYLOAD = 512 * 1024


class _Base:
    def __init__(
        self, *, prefix: str, serializer: Serializer | None, max_payload_bytes: int
    ) -> None:
        self.keys = Keyspace(prefix)
        self.serializer: Serializer = serializer if serializer is not None else JsonSerializer()
        self.max_payload_bytes = check_int("max_payload_bytes", max_payload_bytes, 1)
        self._registered: set[str] = set()
        #: each logical queue's shards, as read from the server once per process
        #: (:mod:`echomq_core.flows.sharding`): never recomputed, changed only while empty
        self.shard_cache: dict[str, sharding.Shards] = {}

    def mark_registered(self, names: Iterable[str]) -> None:
        """Note ``names`` as registered by this process (a write that carried them landed)."""
        self._registered.update(names)

    def unregistered(self, names: Iterable[str]) -> list[str]:
        """The names this process has not registered yet (they ride along with the next
        write; marked registered once it succeeds)."""
        return sorted(set(names) - self._registered)

    def encode(self, value: Any) -> bytes:
        """Serialise a payload or result, enforcing ``max_payload_bytes``."""
        return encode_checked(self.serializer, value, self.max_payload_bytes)

    def _plan_flow(
        self,
        queue: str,
        children: Sequence[Child],
        payload: Any,
        parent_id: str | None,
        max_attempts: int,
        gen: str = "",
        max_running: Any = None,
        min_success: Any = None,
    ) -> Any:
        return plan(
            queue,
            new_parent_id() if parent_id is None else parent_id,
            self.encode(payload),
            children,
            default_attempts=check_int("max_attempts", max_attempts, 1, MAX_ATTEMPTS),
            dumps=self.serializer.dumps,  # plan() checks what it returns, as encode() does
            max_payload=self.max_payload_bytes,
            gen=gen,
            max_running=max_running,
            min_success=min_success,
        )

    def _add_op(
        self,
        queue: str,
        children: Sequence[Child],
        payload: Any,
        parent_id: str | None,
        max_attempts: int,
        barrier: Any,
        replace: Any,
        new_queues: Any,
        max_running: Any = None,
        min_success: Any = None,
        stream: Any = False,
    ) -> tuple[Any, Op[FlowRef]]:
        """The planned root and the operation of an add (a replace when asked)."""
        barrier, replace = _flag("barrier", barrier), _flag("replace", replace)
        stream = _flag("stream", stream)
        root = self._plan_flow(
            queue,
            children,
            payload,
            parent_id,
            max_attempts,
            max_running=max_running,
            min_success=min_success,
        )
        root.stream = stream
        if replace and parent_id is None:
            raise InvalidArgument("replace=True needs the parent_id of the flow to replace")
        logical = queues_of(root)
        registered: list[str] = []  # filled by the operation: the caller marks them after it

        def add() -> Op[FlowRef]:
            # nodes in sharded queues go to their ids' shards before anything is written
            shards = yield from sharding.resolve(self.keys, self.shard_cache, logical)
            sharded = sharding.place(root, shards)
            queues = new_queues(queues_of(root) if sharded else logical)
            registered.extend(queues)

            planned = [root]

            def plan(gen: str) -> Any:
                if not gen:
                    return root
                again = self._plan_flow(
                    queue, children, payload, root.id, max_attempts, gen, max_running, min_success
                )
                again.stream = stream
                sharding.place(again, shards)
                planned.append(again)
                return again

            try:
                if not replace:
                    return (
                        yield from add_flow(
                            self.keys, root, queues, barrier=barrier, replan=plan
                        )
                    )
                return (
                    yield from lifecycle.add_or_replace(self.keys, plan, queues, barrier=barrier)
                )
            finally:
                unlink(planned)

        return registered, add()

    @staticmethod
    def _check_flow(queue: str, parent_id: str) -> None:
        check_queue(queue)
        check_job_id(parent_id)

    @staticmethod
    def _reason(reason: Any) -> str:
        if not isinstance(reason, str) or len(reason) > 1000:
            raise InvalidArgument(
                f"reason must be a string of at most 1000 characters, got {reason!r:.80}"
            )
        return reason

    @staticmethod
    def _list_args(
        queue: str, state: str | None, limit: int, offset: int
    ) -> tuple[list[str], int, int]:
        check_queue(queue)
        if state is not None and state not in FLOW_LISTS:
            raise InvalidArgument(f"state must be one of {', '.join(FLOW_LISTS)}, got {state!r}")
        states = list(FLOW_LISTS) if state is None else [state]
        return states, check_int("limit", limit, 1, 10_000), check_int("offset", offset, 0)


class EchoMQ(_Base):
    """A synchronous client.

    >>> mq = EchoMQ("redis://localhost:6379/0")
    >>> ref = mq.add_flow("reports", [Child({"n": i}, queue="work") for i in range(1000)])
    >>> mq.dependencies(ref.queue, ref.parent_id)
    1000

    ``url``: ``redis://``, ``rediss://`` (TLS), ``unix://``; Cluster with ``redis+cluster://``
    or ``cluster=True``. ``prefix`` namespaces every key; ``serializer`` replaces JSON;
    ``max_payload_bytes`` bounds every payload and result. Extra keyword arguments go to the
    redis-py client (timeouts, TLS files).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        cluster: bool | None = None,
        prefix: str = "emq",
        serializer: Serializer | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        connection: Connection | None = None,
        **redis_options: Any,
    ) -> None:
        super().__init__(prefix=prefix, serializer=serializer, max_payload_bytes=max_payload_bytes)
        self.url = url
        self.connection = connection or connect(url, cluster=cluster, **redis_options)

    def __repr__(self) -> str:
        return f"EchoMQ({self.connection.where}, prefix={self.keys.prefix!r})"

    def __enter__(self) -> EchoMQ:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.connection.close()

    def perform(self, op: Op[T]) -> T:
        """Drive one operation on this client's connection."""
        return self.connection.perform(op)

    def register_queue(self, name: str) -> None:
        """Record ``name`` in the queue registry (once per process) so Pumps find it."""
        check_queue(name)
        if name not in self._registered:
            self.connection.execute(adding.register(self.keys, [name]))
            self._registered.add(name)

    def queues(self) -> list[str]:
        """Every queue name this keyspace has used (the registry). A member that is not a
        valid queue name (written by something other than EchoMQ) is skipped with a warning, so
        it cannot stall every Pump that discovers queues."""
        (members,) = self.connection.execute([Call.cmd("SMEMBERS", self.keys.queues())])
        names = []
        for member in members:
            name = text(member)
            if QUEUE_NAME_RE.fullmatch(name):
                names.append(name)
            else:
                log.warning(
                    "queue registry %s holds an invalid name %r; skipped",
                    self.keys.queues(),
                    name[:80],
                )
        return sorted(names)

    def queue(self, name: str, **options: Any) -> Queue:
        """A :class:`Queue` handle; options as documented there."""
        return Queue(self, name, **options)

    def get_job(self, queue: str, job_id: str) -> JobInfo:
        return Queue(self, queue).get_job(job_id)

    def home(self, queue: str, parent_id: str) -> str:
        """The physical queue of flow node ``parent_id`` of ``queue``: its id's shard when
        ``queue`` is sharded (so every flow read and lifecycle call takes the logical name),
        else ``queue``; a shard's own name is its own single shard."""
        self._check_flow(queue, parent_id)
        shards = self.shard_cache.get(queue) or self.shards(queue)
        return sharding.shard_of(shards, parent_id)

    # -- flows ----------------------------------------------------------------------------
    def add_flow(
        self,
        queue: str,
        children: Iterable[Child],
        *,
        payload: Any = None,
        parent_id: str | None = None,
        max_attempts: int = 3,
        barrier: bool = False,
        replace: bool = False,
        max_running: int | None = None,
        min_success: float | int | None = None,
        stream: bool = False,
    ) -> FlowRef:
        """Add a parent in ``queue`` held until ``children`` settle; see :mod:`.flows`.

        Safe to retry with the same ``parent_id`` (and child ids): a retry converges to
        exactly the requested flow. Two round trips per tree level, whatever the size.

        ``barrier=True``: the flow is read from outside (an Airflow sensor, a Dagster IO
        manager, a script), not run by a worker: its parent is never claimed; released means
        readable (state ``released``), and the reader :meth:`close_flow` s it when done, which
        starts its retention (``closed``); one nobody closes expires after ``unclosed``.

        ``replace=True`` (with ``parent_id``): if that id holds a different flow (other
        children, or any node's payload or options changed, compared by a digest of the whole
        tree that a replacing add keeps), it is cancelled and taken away, and this flow is
        added in its place as a new generation whose child ids cannot collide with the old ones
        (``<id>.g<n>.<i>``); without it such an add raises :class:`FlowConflict`. A re-add
        of the same flow converges either way. See :mod:`echomq_core.flows.lifecycle`.

        ``max_running=K``: at most K of the root's leaf children are leased at once, whatever
        the number of workers; the rest wait in order (priority, then arrival) and each one
        that settles for good (completes, dies, is cancelled) lets the next start. Counted on
        the child queues' slots; over several child queues K is split in proportion to their
        children (:func:`echomq_core.flows.plan.split_cap`). ``Child(max_running=)`` caps a
        sub-flow's own leaf children. A re-add with another cap is :class:`FlowConflict`.
        ``min_success``: a success threshold - a fraction in (0, 1] of the children, or an int
        count of them, that must succeed. A fail-parent child that dies is then recorded in
        :meth:`failed_children` without failing the parent while the threshold can still be
        met (the flow is released with its failures listed); the death that makes it
        unreachable fails the parent at once, naming the failures, and its children that have
        not started are cancelled (see :mod:`echomq_core.flows.lifecycle`). A re-add with another
        threshold is :class:`FlowConflict`; sub-flows take ``Child(min_success=)``.
        ``stream=True``: the root keeps a settle log, so :meth:`iter_results` can follow its
        results as they settle (see :mod:`echomq_core.flows.streaming`); a re-add with the other
        setting is :class:`FlowConflict`.

        ``children``: a list, or any iterable of :class:`Child` - a generator is read once
        (with the cyclic collector paused), as is a ``Child``'s ``children`` generator.
        """
        children = _children(children)
        with adding.gc_paused(children):
            new, op = self._add_op(
                queue,
                children,
                payload,
                parent_id,
                max_attempts,
                barrier,
                replace,
                self.unregistered,
                max_running,
                min_success,
                stream,
            )
            ref = self.perform(op)
        self._registered.update(new)
        return ref

    def flow_cap(self, queue: str, parent_id: str) -> FlowCap | None:
        """A flow node's ``max_running`` cap and its use (admitted / cap, per child queue);
        None for a node without a cap. See :func:`echomq_core.flows.reads.flow_cap`."""
        queue = self.home(queue, parent_id)
        return self.perform(flows.flow_cap(self.keys, queue, parent_id))

    def note_epoch(self, queue: str, parent_id: str, epoch: int = 0) -> int | None:
        """An orchestrator's attempt counter on a flow: record ``epoch`` if it is above the one
        there (it never goes down) and return the flow's epoch after the call; ``0`` only reads
        it; None when there is no such flow. The Airflow provider records the DAG run's clear
        number from the adding and waiting tasks, and a failure callback of an older attempt,
        delivered late, leaves a flow whose epoch is newer than its own. The field goes with
        the flow."""
        queue = self.home(queue, parent_id)
        epoch = check_int("epoch", epoch, 0, 2**53)
        return self.perform(lifecycle.note_epoch(self.keys, queue, parent_id, epoch))

    def close_flow(self, queue: str, parent_id: str) -> str:
        """The reader is done with a released barrier flow: its ``closed`` retention starts.
        Idempotent; closing a flow that already ended otherwise (failed, completed) changes
        nothing. Returns the state after the call. :class:`JobNotFound` when there is no
        such flow (or it expired); :class:`FlowConflict` while it is still held."""
        queue = self.home(queue, parent_id)
        return self.perform(lifecycle.close_flow(self.keys, queue, parent_id))

    def cancel_flow(
        self, queue: str, parent_id: str, *, reason: str = ""
    ) -> lifecycle.CancelResult:
        """Cancel a flow: once this returns, no child of it (any depth, any queue) that a
        handler had not started will start - pending and retrying children are removed, leased
        ones lose their lease (their worker drops them before they start) - and what running
        children report changes nothing. The parent's state is ``cancelled`` with ``reason``;
        the reads still work; the ``cancelled`` retention applies. Idempotent: a cancel cut
        short is completed by calling it again. A closed flow is refused
        (:class:`~echomq_core.FlowConflict`); a worker-run parent that completed is left as it
        is. See :mod:`echomq_core.flows.lifecycle`."""
        queue = self.home(queue, parent_id)
        op = lifecycle.cancel_flow(self.keys, queue, parent_id, self._reason(reason))
        return self.perform(op)

    def retry_flow(
        self, queue: str, parent_id: str, *, ignored: bool = False
    ) -> lifecycle.RepairResult:
        """Repair a failed (or cancelled) flow: its dead children (``ignored=True``: its
        ignored failures too) go back to pending with fresh attempts, a cancelled flow's
        cancelled children too; the parent is held again with the right counter; children that
        completed keep their values and never run again. Sub-flows are repaired bottom-up.
        Idempotent: a repair cut short is completed by calling it again."""
        queue = self.home(queue, parent_id)
        op = lifecycle.retry_flow(self.keys, queue, parent_id, ignored=_flag("ignored", ignored))
        return self.perform(op)

    def list_flows(
        self, queue: str, state: str | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[FlowSummary]:
        """Root flows of ``queue`` (held, released, closed, failed, cancelled, completed: a
        worker-run flow whose parent job completed, kept as long as the queue's ``completed``
        retention keeps it; or one ``state``), oldest first in each state: a page of ``limit``
        per state from ``offset``."""
        states, limit, offset = self._list_args(queue, state, limit, offset)
        return self.perform(flows.list_flows(self.keys, queue, states, offset=offset, limit=limit))

    def take_released(
        self,
        queue: str,
        watcher: str,
        cursor: str | None = None,
        *,
        limit: int = 100,
        close: bool = False,
    ) -> tuple[str, list[release_watch.Released]]:
        """One poll of release watcher ``watcher`` of ``queue``: the barrier flows released
        after ``cursor`` (None: the watcher's stored one; a new watcher starts now), taken at
        most once across every reader of that watcher. Returns the cursor for the next poll
        and what this one took; ``close=True`` closes them. See
        :mod:`echomq_core.flows.release_watch`."""
        ks = self.keys
        op = release_watch.take_released(ks, queue, watcher, cursor, limit=limit, close=close)
        return self.perform(op)

    def retention(self, queue: str) -> dict[str, float | int | None]:
        """The queue's retention settings (seconds and counts; None: unlimited), as stored on
        the server or the defaults (see :mod:`echomq_core.flows.retention`)."""
        check_queue(queue)
        return self.perform(retention.get_config(self.keys, queue))

    def set_retention(self, queue: str, **settings: float | int | None) -> None:
        """Change retention settings of ``queue`` on the server (every Pump applies them):
        ``completed_age=3600, failed_count=1000, unclosed_age=None`` ..."""
        check_queue(queue)
        shards = self.shards(queue)  # a sharded queue: every shard keeps the same settings
        writes = [retention.set_config(self.keys, q, settings) for q in shards]
        self.perform(sharding.together(writes))
        self.register_queue(queue)

    def shards(self, queue: str) -> tuple[str, ...]:
        """The physical queues of ``queue`` (itself alone unless sharded), as stored on the
        server; cached by this client (see :mod:`echomq_core.flows.sharding`)."""
        check_queue(queue)
        return self.perform(sharding.resolve(self.keys, self.shard_cache, [queue]))[queue]

    def set_shards(self, queue: str, shards: int) -> tuple[str, ...]:
        """Serve ``queue`` from ``shards`` physical queues (1..64), each on its own slot, on
        distinct masters of a Cluster of at least that many; returns their names. Refused with
        :class:`~echomq_core.errors.QueueInUse` while it holds jobs (see
        :mod:`echomq_core.flows.sharding`)."""
        op = sharding.configure(self.keys, queue, shards, self.connection.is_cluster)
        names = self.perform(op)
        self.shard_cache[queue] = names
        self.register_queue(queue)
        return names

    def rate_limit(self, queue: str) -> RateLimit | None:
        """The queue's rate limit and its current window (starts used, when it resets), as
        the server counts them; None when it has none (see :mod:`echomq_core.control.rates`)."""
        check_queue(queue)
        return self.perform(rates.get_rate(self.keys, queue, self.shards(queue)))

    def set_rate_limit(self, queue: str, rate: str | RateLimit | None) -> None:
        """Limit ``queue`` to ``rate`` job starts across every worker (``"100/s"``,
        ``"6000/min"``, ``"5/500ms"``), or remove the limit (None or ``"none"``). Checked
        before anything is written (:class:`InvalidArgument` naming the value). A sharded
        queue's limit holds over all its shards: each counts a share
        (:mod:`echomq_core.control.rates`), so it must be at least the shard count per window."""
        self.perform(rates.set_rate(self.keys, queue, rate, self.shards(queue)))
        self.mark_registered([queue])

    def children_values(self, queue: str, parent_id: str) -> dict[str, Any]:
        """{child id: result} of every child that completed so far. This read and the ones
        below raise :class:`JobNotFound` at once when there is no such flow (naming the queue
        and id, with the closest registered queues when ``queue`` is not one); the check rides
        in the read's own round trip."""
        home = self.home(queue, parent_id)
        op = flows.children_values(self.keys, home, parent_id, self.serializer)
        return self.perform(flows.explained(self.keys, queue, parent_id, op))

    def dependencies(self, queue: str, parent_id: str) -> int:
        """The flow's outstanding children (0 for a plain job)."""
        home = self.home(queue, parent_id)
        op = flows.dependencies(self.keys, home, parent_id)
        return self.perform(flows.explained(self.keys, queue, parent_id, op))

    def ignored_failures(self, queue: str, parent_id: str) -> dict[str, str]:
        """{child id: error} of the children that died under ignore-dependency."""
        home = self.home(queue, parent_id)
        op = flows.ignored_failures(self.keys, home, parent_id)
        return self.perform(flows.explained(self.keys, queue, parent_id, op))

    def failed_children(self, queue: str, parent_id: str) -> dict[str, str]:
        """{child id: error} of the children that died and failed the parent."""
        home = self.home(queue, parent_id)
        op = flows.failed_children(self.keys, home, parent_id)
        return self.perform(flows.explained(self.keys, queue, parent_id, op))

    def child_failures(self, queue: str, parent_id: str, *, limit: int = 10) -> list[ChildFailure]:
        """The flow's dead children with their errors and last tracebacks, fail-parent ones
        first, then ignored ones, at most ``limit`` (a failed sub-flow stands for its own
        failures); see :mod:`echomq_core.flows.failures`."""
        home = self.home(queue, parent_id)
        limit = check_int("limit", limit, 1, 10_000)
        found = self.perform(failures.child_failures(self.keys, home, parent_id, limit))
        if not found:  # none, or no such flow: only then is the row looked at
            check = flows.check_exists(self.keys, home, parent_id)
            self.perform(flows.explained(self.keys, queue, parent_id, check))
        return found

    def snapshot(self, queue: str, parent_id: str) -> FlowSnapshot:
        queue = self.home(queue, parent_id)
        return self.perform(flows.snapshot(self.keys, queue, parent_id))

    def snapshots(self, refs: Iterable[FlowRef]) -> list[FlowSnapshot]:
        """:meth:`snapshot` of each flow, in order, in one round trip per node (pipelined):
        what a sensor watching many flows reads per evaluation."""
        homes = [(self.home(r.queue, r.parent_id), r.parent_id) for r in refs]
        if not homes:
            return []
        return self.perform(sharding.together([flows.snapshot(self.keys, q, p) for q, p in homes]))

    def child_queues(self, queue: str, parent_id: str) -> list[str]:
        """The queues of the flow's direct children ([] if there is no such flow): what a
        Pump must serve for their results to reach the parent."""
        queue = self.home(queue, parent_id)
        return self.perform(flows.child_queues(self.keys, queue, parent_id))

    def iter_children_values(
        self, queue: str, parent_id: str, *, page: int = 1000
    ) -> Iterator[tuple[str, Any]]:
        """Every (child id, result), read in HSCAN pages: memory stays flat for any N. The
        first page is read by this call, so a flow that is not there raises
        :class:`JobNotFound` here (checked in that page's round trip), not at the first
        ``next()``."""
        home = self.home(queue, parent_id)
        check_int("page", page, 1, 100_000)
        first = flows.first_page(self.keys, home, parent_id, page)
        cursor, items = self.perform(flows.explained(self.keys, queue, parent_id, first))
        return self._values(self.keys.processed(home, parent_id), cursor, items, page)

    def _values(
        self, key: str, cursor: int, items: dict[str, bytes], page: int
    ) -> Iterator[tuple[str, Any]]:
        while True:
            for child_id, raw in items.items():
                yield child_id, self.serializer.loads(raw)
            if cursor == 0:
                return
            cursor, items = self.perform(flows.scan_page(key, cursor, page))

    def iter_results(
        self,
        queue: str,
        parent_id: str,
        *,
        follow: bool = True,
        cursor: str | None = None,
        block: float = 1.0,
        page: int = 500,
        timeout: float | None = None,
    ) -> streaming.Results:
        """``(child id, value)`` of each completed child in settle order, for a flow added with
        ``stream=True`` (see :mod:`echomq_core.flows.streaming`). ``follow=True``: while the flow is
        held, wait for the next result (one blocking read of at most ``block`` seconds at a
        time) and end when it is released; ``follow=False``: end at the last result settled
        so far. The iterator's ``cursor`` names the last item handed out: passed back as
        ``cursor=``, a new iterator resumes after it. ``timeout``: the most seconds the follow
        waits for the release in all, then :class:`FlowTimeout` (None: no bound; every result
        settled by then is handed out first). Raises :class:`ParentFailed` /
        :class:`FlowCancelled` when the flow fails or is cancelled, :class:`JobNotFound` when
        there is no such flow, :class:`InvalidArgument` for a flow without a settle log, a
        malformed cursor or another flow's - at this call: it makes the first read (which
        the first ``next()`` would make)."""
        home = self.home(queue, parent_id)
        f = streaming.Follow.start(
            self.keys,
            home,
            parent_id,
            self.serializer,
            follow=follow,
            cursor=cursor,
            block=block,
            page=page,
            timeout=timeout,
            name=queue,
        )
        return streaming.Results(self.perform, f).check()

    def children_values_range(
        self, queue: str, parent_id: str, start: int, stop: int
    ) -> list[tuple[int, Any]]:
        """``(position, value)`` of the completed children at positions ``start`` to
        ``stop - 1``, in order: one slice of a flow's results (each of many readers reads its
        own; two round trips). :class:`InvalidArgument` for a flow whose children have ids of
        their own (explicit or keyed)."""
        home = self.home(queue, parent_id)
        op = child_reads.values_in_range(self.keys, home, parent_id, self.serializer, start, stop)
        return self.perform(flows.explained(self.keys, queue, parent_id, op))

    def save_ref(self, name: str, ref: FlowRef) -> None:
        """Store a flow reference under ``name`` for another process to find (adapters)."""
        self.perform(refs.save_ref(self.keys, name, ref))

    def load_ref(self, name: str) -> FlowRef | None:
        """The flow reference stored under ``name``, or None."""
        return self.perform(refs.load_ref(self.keys, name))

    def wait(
        self, queue: str, parent_id: str, *, timeout: float = 60.0, poll: float = 0.2
    ) -> FlowSnapshot:
        """Block until the parent is released (every child settled); raise
        :class:`ParentFailed` at once if it failed (:class:`FlowCancelled` if it was
        cancelled), :class:`FlowTimeout` after ``timeout`` (naming what holds the flow up,
        where that shows). Reads come at most ``poll`` seconds apart, the first ones sooner
        (see :mod:`echomq_core.flows.waiting`). :class:`JobNotFound` at the first read when there
        is no such flow (a wrong id, queue or prefix, or expired): an add is parent-first, so a
        flow being added is there from its first step on; a wait for a flow another process
        has yet to add starts after that add, or polls :meth:`snapshot` (outcome
        ``missing``)."""
        bound = check_seconds("timeout", timeout)  # bounded: None is not "no timeout" here
        wait = FlowWait(queue, parent_id, poll=poll, timeout=bound, missing_ok=False)
        while not (verdict := self.perform(wait.read(self.keys))).done:
            time.sleep(verdict.pause)
        if verdict.kind == MISSING:
            raise self.perform(flows.not_found(self.keys, queue, parent_id))
        if verdict.never_released:
            failed = self.failed_children(queue, parent_id)
            raise flow_error(queue, parent_id, verdict.kind, failed, verdict.snap.error)
        return _released(verdict, timeout)

    # -- for the orchestrators' adapters --------------------------------------------------
    # What the Airflow provider and the Dagster integration need beyond the methods above,
    # so neither sends a command of its own: each decision is the core's, driven here.

    def missing_flow_error(self, queue: str, parent_id: str) -> JobNotFound:
        """The :class:`JobNotFound` of a read of flow ``parent_id`` in ``queue`` that is not
        there, as every flow read raises it: naming the queue and id, and the closest
        registered queues when ``queue`` is not one (one round trip: the registry). Returned,
        for the caller to raise or report (a trigger's event)."""
        return self.perform(flows.not_found(self.keys, queue, parent_id))

    def verdict(self, wait: FlowWait) -> Verdict:
        """One read of the flow ``wait`` waits on, judged by it: the :class:`Verdict` says what
        the read means and how long to pause before the next (see :class:`FlowWait`)."""
        return self.perform(wait.read(self.keys))

    def repair_on_readd(
        self, queue: str, parent_id: str, *, repair: bool, epoch: int | None = None
    ) -> lifecycle.ReAdd:
        """The rule after an add under a stable parent id (an orchestrator's retry, clear or
        re-execution) converged to the flow already there: a failed or cancelled one is
        repaired when ``repair`` (:meth:`retry_flow`), a released or held one is left as it
        is; ``epoch`` (:meth:`note_epoch`) is recorded first. Returns what it found and the
        repair it did. See :func:`echomq_core.flows.lifecycle.repair_on_readd`."""
        return self.perform(
            lifecycle.repair_on_readd(self.keys, queue, parent_id, repair=repair, epoch=epoch)
        )

    def worker_run(self, refs: Sequence[FlowRef]) -> list[FlowRef]:
        """The flows of ``refs`` whose parent exists and is run by a worker, not a barrier (a
        reader from outside refuses them: it could never close them); one round trip per
        node whatever their number. A missing flow is not listed."""
        return self.perform(released.worker_run(self.keys, refs))

    def read_released(
        self,
        snap: FlowSnapshot,
        *,
        values: bool = False,
        close: bool = False,
        page: int = released.VALUES_PAGE,
        failures: int = released.SHOWN_FAILURES,
    ) -> released.ReleasedRead:
        """What a reader takes of its flow once released (``snap``, the read that found it
        so): every result with ``values`` (``page`` per round trip), the ignored failures,
        at most ``failures`` tolerated failed children, and a barrier flow closed with
        ``close``. See :class:`~echomq_core.flows.released.ReleasedRead`."""
        op = released.read_released(
            self.keys,
            self.serializer,
            snap,
            values=values,
            close=close,
            page=page,
            failures=failures,
        )
        return self.perform(op)

    def first_failure(self, queue: str, parent_id: str) -> ChildFailure | None:
        """The first fail-parent child of the flow that died, with its error and last
        traceback (:meth:`child_failures`, one bounded read); None when none did (a flow
        cancelled with no dead child, or only ignored failures)."""
        return next(
            (f for f in self.child_failures(queue, parent_id, limit=1) if not f.ignored), None
        )

    def save_handle(self, name: str, data: Mapping[str, Any], *, expire: float | None) -> None:
        """Store ``data`` as JSON under reference name ``name`` for ``expire`` seconds (None:
        no expiry): a handle with no flow behind it to expire with (:meth:`save_ref` ties one
        to its flow). See :mod:`echomq_core.flows.handles`."""
        self.perform(handles.save_handle(self.keys, name, data, expire))

    def load_handle(self, name: str) -> Any:
        """The JSON stored under reference name ``name`` (by :meth:`save_handle` or
        :meth:`save_ref`) as written, or None; :class:`InvalidInput` when it is not JSON."""
        return self.perform(handles.load_handle(self.keys, name))


class AsyncEchoMQ(_Base):
    """The asyncio client: plain jobs (:meth:`queue`), flow adds and reads (for triggers,
    async applications and the asyncio worker)."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        cluster: bool | None = None,
        prefix: str = "emq",
        serializer: Serializer | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        **redis_options: Any,
    ) -> None:
        super().__init__(prefix=prefix, serializer=serializer, max_payload_bytes=max_payload_bytes)
        self.connection: AsyncConnection = connect_async(url, cluster=cluster, **redis_options)

    def __repr__(self) -> str:
        return f"AsyncEchoMQ({self.connection.where}, prefix={self.keys.prefix!r})"

    async def close(self) -> None:
        await self.connection.close()

    async def perform(self, op: Op[T]) -> T:
        """Drive one operation on this client's asyncio connection."""
        return await self.connection.perform(op)

    def queue(self, name: str, **options: Any) -> AsyncQueue:
        """An :class:`~echomq_core.AsyncQueue` handle; options as :class:`Queue`'s."""
        from .async_queue import AsyncQueue

        return AsyncQueue(self, name, **options)

    async def get_job(self, queue: str, job_id: str) -> JobInfo:
        """As :meth:`EchoMQ.get_job`."""
        return await self.queue(queue).get_job(job_id)

    async def shards(self, queue: str) -> tuple[str, ...]:
        """As :meth:`EchoMQ.shards`."""
        check_queue(queue)
        op = sharding.resolve(self.keys, self.shard_cache, [queue])
        return (await self.perform(op))[queue]

    async def home(self, queue: str, parent_id: str) -> str:
        """As :meth:`EchoMQ.home`."""
        self._check_flow(queue, parent_id)
        shards = self.shard_cache.get(queue) or await self.shards(queue)
        return sharding.shard_of(shards, parent_id)

    async def add_flow(
        self,
        queue: str,
        children: Iterable[Child],
        *,
        payload: Any = None,
        parent_id: str | None = None,
        max_attempts: int = 3,
        barrier: bool = False,
        replace: bool = False,
        max_running: int | None = None,
        min_success: float | int | None = None,
        stream: bool = False,
    ) -> FlowRef:
        """As :meth:`EchoMQ.add_flow`."""
        children = _children(children)
        with adding.gc_paused(children):
            # the planning only: a pause across the await would hold for the loop's other tasks
            _, op = self._add_op(
                queue,
                children,
                payload,
                parent_id,
                max_attempts,
                barrier,
                replace,
                sorted,
                max_running,
                min_success,
                stream,
            )
        return await self.connection.perform(op)

    async def flow_cap(self, queue: str, parent_id: str) -> FlowCap | None:
        """As :meth:`EchoMQ.flow_cap`."""
        queue = await self.home(queue, parent_id)
        return await self.connection.perform(flows.flow_cap(self.keys, queue, parent_id))

    async def take_released(
        self,
        queue: str,
        watcher: str,
        cursor: str | None = None,
        *,
        limit: int = 100,
        close: bool = False,
    ) -> tuple[str, list[release_watch.Released]]:
        """As :meth:`EchoMQ.take_released`."""
        ks = self.keys
        op = release_watch.take_released(ks, queue, watcher, cursor, limit=limit, close=close)
        return await self.connection.perform(op)

    async def note_epoch(self, queue: str, parent_id: str, epoch: int = 0) -> int | None:
        """As :meth:`EchoMQ.note_epoch`."""
        queue = await self.home(queue, parent_id)
        epoch = check_int("epoch", epoch, 0, 2**53)
        return await self.connection.perform(
            lifecycle.note_epoch(self.keys, queue, parent_id, epoch)
        )

    async def close_flow(self, queue: str, parent_id: str) -> str:
        """As :meth:`EchoMQ.close_flow`."""
        queue = await self.home(queue, parent_id)
        return await self.connection.perform(lifecycle.close_flow(self.keys, queue, parent_id))

    async def cancel_flow(
        self, queue: str, parent_id: str, *, reason: str = ""
    ) -> lifecycle.CancelResult:
        """As :meth:`EchoMQ.cancel_flow`."""
        queue = await self.home(queue, parent_id)
        op = lifecycle.cancel_flow(self.keys, queue, parent_id, self._reason(reason))
        return await self.connection.perform(op)

    async def retry_flow(
        self, queue: str, parent_id: str, *, ignored: bool = False
    ) -> lifecycle.RepairResult:
        """As :meth:`EchoMQ.retry_flow`."""
        queue = await self.home(queue, parent_id)
        op = lifecycle.retry_flow(self.keys, queue, parent_id, ignored=_flag("ignored", ignored))
        return await self.connection.perform(op)

    async def list_flows(
        self, queue: str, state: str | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[FlowSummary]:
        """As :meth:`EchoMQ.list_flows`."""
        states, limit, offset = self._list_args(queue, state, limit, offset)
        return await self.connection.perform(
            flows.list_flows(self.keys, queue, states, offset=offset, limit=limit)
        )

    async def rate_limit(self, queue: str) -> RateLimit | None:
        """:meth:`EchoMQ.rate_limit`, awaited."""
        check_queue(queue)
        return await self.perform(rates.get_rate(self.keys, queue, await self.shards(queue)))

    async def set_rate_limit(self, queue: str, rate: str | RateLimit | None) -> None:
        """:meth:`EchoMQ.set_rate_limit`, awaited."""
        await self.perform(rates.set_rate(self.keys, queue, rate, await self.shards(queue)))
        self.mark_registered([queue])

    async def children_values(self, queue: str, parent_id: str) -> dict[str, Any]:
        """As :meth:`EchoMQ.children_values` (:class:`JobNotFound` for no such flow)."""
        home = await self.home(queue, parent_id)
        op = flows.children_values(self.keys, home, parent_id, self.serializer)
        return await self.perform(flows.explained(self.keys, queue, parent_id, op))

    async def dependencies(self, queue: str, parent_id: str) -> int:
        """As :meth:`EchoMQ.dependencies`."""
        home = await self.home(queue, parent_id)
        op = flows.dependencies(self.keys, home, parent_id)
        return await self.perform(flows.explained(self.keys, queue, parent_id, op))

    async def ignored_failures(self, queue: str, parent_id: str) -> dict[str, str]:
        """As :meth:`EchoMQ.ignored_failures`."""
        home = await self.home(queue, parent_id)
        op = flows.ignored_failures(self.keys, home, parent_id)
        return await self.perform(flows.explained(self.keys, queue, parent_id, op))

    async def failed_children(self, queue: str, parent_id: str) -> dict[str, str]:
        """As :meth:`EchoMQ.failed_children`."""
        home = await self.home(queue, parent_id)
        op = flows.failed_children(self.keys, home, parent_id)
        return await self.perform(flows.explained(self.keys, queue, parent_id, op))

    async def child_failures(
        self, queue: str, parent_id: str, *, limit: int = 10
    ) -> list[ChildFailure]:
        """As :meth:`EchoMQ.child_failures`."""
        home = await self.home(queue, parent_id)
        limit = check_int("limit", limit, 1, 10_000)
        found = await self.perform(failures.child_failures(self.keys, home, parent_id, limit))
        if not found:  # none, or no such flow: only then is the row looked at
            check = flows.check_exists(self.keys, home, parent_id)
            await self.perform(flows.explained(self.keys, queue, parent_id, check))
        return found

    async def snapshot(self, queue: str, parent_id: str) -> FlowSnapshot:
        queue = await self.home(queue, parent_id)
        return await self.connection.perform(flows.snapshot(self.keys, queue, parent_id))

    async def snapshots(self, refs: Iterable[FlowRef]) -> list[FlowSnapshot]:
        """As :meth:`EchoMQ.snapshots`."""
        homes = [(await self.home(r.queue, r.parent_id), r.parent_id) for r in refs]
        if not homes:
            return []
        ops_ = [flows.snapshot(self.keys, q, p) for q, p in homes]
        return await self.connection.perform(sharding.together(ops_))

    async def iter_results(
        self,
        queue: str,
        parent_id: str,
        *,
        follow: bool = True,
        cursor: str | None = None,
        block: float = 1.0,
        page: int = 500,
        timeout: float | None = None,
    ) -> streaming.AsyncResults:
        """As :meth:`EchoMQ.iter_results`: ``async for child_id, value in await
        mq.iter_results(...)``; the blocking read holds one connection of the pool, never the
        event loop."""
        home = await self.home(queue, parent_id)
        f = streaming.Follow.start(
            self.keys,
            home,
            parent_id,
            self.serializer,
            follow=follow,
            cursor=cursor,
            block=block,
            page=page,
            timeout=timeout,
            name=queue,
        )
        return await streaming.AsyncResults(self.connection.perform, f).check()

    async def wait(
        self, queue: str, parent_id: str, *, timeout: float = 60.0, poll: float = 0.2
    ) -> FlowSnapshot:
        """As :meth:`EchoMQ.wait`, without blocking the event loop."""
        bound = check_seconds("timeout", timeout)
        wait = FlowWait(queue, parent_id, poll=poll, timeout=bound, missing_ok=False)
        while not (verdict := await self.connection.perform(wait.read(self.keys))).done:
            await asyncio.sleep(verdict.pause)
        if verdict.kind == MISSING:
            raise await self.perform(flows.not_found(self.keys, queue, parent_id))
        if verdict.never_released:
            failed = await self.failed_children(queue, parent_id)
            raise flow_error(queue, parent_id, verdict.kind, failed, verdict.snap.error)
        return _released(verdict, timeout)

    # -- for the orchestrators' adapters --------------------------------------------------
    # What the Airflow provider's trigger needs beyond the methods above (see EchoMQ's).

    async def missing_flow_error(self, queue: str, parent_id: str) -> JobNotFound:
        """As :meth:`EchoMQ.missing_flow_error`."""
        return await self.perform(flows.not_found(self.keys, queue, parent_id))

    async def verdict(self, wait: FlowWait) -> Verdict:
        """As :meth:`EchoMQ.verdict`."""
        return await self.perform(wait.read(self.keys))

    async def read_released(
        self,
        snap: FlowSnapshot,
        *,
        values: bool = False,
        close: bool = False,
        page: int = released.VALUES_PAGE,
        failures: int = released.SHOWN_FAILURES,
    ) -> released.ReleasedRead:
        """As :meth:`EchoMQ.read_released`."""
        op = released.read_released(
            self.keys,
            self.serializer,
            snap,
            values=values,
            close=close,
            page=page,
            failures=failures,
        )
        return await self.perform(op)


def _released(verdict: Verdict, timeout: float) -> FlowSnapshot:
    """The snapshot of a wait that ended released (or closed); else its :class:`FlowTimeout`,
    with what holds the flow up where that shows."""
    if verdict.ready:
        return verdict.snap
    raise verdict.timeout_error(timeout)


def _children(children: Iterable[Child]) -> Sequence[Child]:
    """An add's children as a sequence, read once: a list or tuple as it is; a generator (any
    other iterable) into a list, with the cyclic collector paused while it builds its
    ``Child`` objects (an add re-plans from it when it meets a replaced generation)."""
    if isinstance(children, list | tuple):
        return children
    with collector.paused():
        return child_list(children, "add_flow")


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be True or False, got {value!r}")
    return value
