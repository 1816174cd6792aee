"""The synchronous entry point: :class:`EchoMQ`.

It is thin: each method drives, on its connection, an operation built once
(:mod:`echomq_core.client.base`) - the same one :class:`AsyncEchoMQ <echomq_core.AsyncEchoMQ>`
awaits (:mod:`echomq_core.client.async_client`). Nothing here checks an argument, builds a key
or parses a reply.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .. import models
from ..control import groups
from ..control.rates import RateLimit
from ..errors import JobNotFound
from ..flows import lifecycle, reads, refs, release_watch, streaming
from ..flows.lifecycle import ReAdd
from ..flows.released import SHOWN_FAILURES, VALUES_PAGE, ReleasedRead
from ..flows.waiting import FlowWait, Verdict
from ..queues import adding
from ..wire.connection import Op, connect
from .base import _Client, children_list
from .sync_queue import Queue

if TYPE_CHECKING:
    from ..wire.drivers import Connection  # with the first client (redis-py)

T = TypeVar("T")

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_MAX_PAYLOAD = 512 * 1024


class EchoMQ(_Client):
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
        serializer: models.Serializer | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        connection: Connection | None = None,
        **redis_options: Any,
    ) -> None:
        super().__init__(prefix=prefix, serializer=serializer, max_payload_bytes=max_payload_bytes)
        self.url = url
        self.connection: Connection = connection or connect(url, cluster=cluster, **redis_options)

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
        self.perform(self._register_queue_op(name))

    def group_rule(self, queue: str) -> str | None:
        """The payload key ``queue`` takes a job's fairness group from (None: no rule; see
        :mod:`echomq_core.control.groups`)."""
        return self.perform(groups.get_rule(self.keys, queue))

    def group_load(self, queue: str, top: int = 5) -> groups.GroupLoad:
        """``queue``'s fairness groups now: how many have work queued and the ``top`` busiest,
        each with its jobs queued (one read per shard; see
        :class:`~echomq_core.control.groups.GroupLoad`)."""
        return self.perform(self._group_load_op(queue, top))

    def group_weight(self, queue: str, group: str) -> int:
        """How many of ``group``'s jobs one turn of ``queue`` holds (1 unless set)."""
        return self.perform(self._group_weight_op(queue, group))

    def set_group_weight(self, queue: str, group: str, weight: int | None) -> None:
        """Give ``group`` ``weight`` jobs per turn of ``queue`` (1 to 1,000; None or 1: one, as
        every group has): a tenant that pays for three times the share gets it. Checked before
        anything is written (:class:`InvalidArgument`); it applies to the jobs added after it."""
        self.perform(self._set_group_weight_op(queue, group, weight))

    def set_group_rule(self, queue: str, rule: str | None) -> None:
        """Take the fairness group of each job or child added to ``queue`` without one from its
        payload's key ``rule`` (``{"customer": "acme", ...}`` -> group ``"acme"``), or stop
        (None or ``"none"``). Checked before anything is written (:class:`InvalidArgument`).
        A producer follows a change from its second add once what it knows is
        :data:`~echomq_core.control.groups.RULE_TTL` s old (no round trip of its own)."""
        self.perform(self._set_group_rule_op(queue, rule))

    def queues(self) -> list[str]:
        """Every queue name this keyspace has used (the registry). A member that is not a
        valid queue name (written by something other than EchoMQ) is skipped with a warning, so
        it cannot stall every Pump that discovers queues."""
        return self.perform(self._queues_op())

    def queue(self, name: str, **options: Any) -> Queue:
        """A :class:`Queue` handle; options as documented there."""
        return Queue(self, name, **options)

    def get_job(self, queue: str, job_id: str) -> models.JobInfo:
        return self.perform(self._get_job_op(queue, job_id))

    def home(self, queue: str, parent_id: str) -> str:
        """The physical queue of flow node ``parent_id`` of ``queue``: its id's shard when
        ``queue`` is sharded (so every flow read and lifecycle call takes the logical name),
        else ``queue``; a shard's own name is its own single shard."""
        return self.perform(self._home_op(queue, parent_id))

    # -- flows ----------------------------------------------------------------------------
    def add_flow(
        self,
        queue: str,
        children: Iterable[models.Child],
        *,
        payload: Any = None,
        parent_id: str | None = None,
        max_attempts: int = 3,
        barrier: bool = False,
        replace: bool = False,
        max_running: int | None = None,
        min_success: float | int | None = None,
        stream: bool = False,
    ) -> models.FlowRef:
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
        children = children_list(children)
        with adding.gc_paused(children):  # the planning and the add (its calls are built then)
            op = self._add_flow_op(
                queue,
                children,
                payload,
                parent_id,
                max_attempts,
                barrier,
                replace,
                max_running,
                min_success,
                stream,
            )
            return self.perform(op)

    def flow_cap(self, queue: str, parent_id: str) -> models.FlowCap | None:
        """A flow node's ``max_running`` cap and its use (admitted / cap, per child queue);
        None for a node without a cap. See :func:`echomq_core.flows.reads.flow_cap`."""
        return self.perform(self._flow_cap_op(queue, parent_id))

    def note_epoch(self, queue: str, parent_id: str, epoch: int = 0) -> int | None:
        """An orchestrator's attempt counter on a flow: record ``epoch`` if it is above the one
        there (it never goes down) and return the flow's epoch after the call; ``0`` only reads
        it; None when there is no such flow. The Airflow provider records the DAG run's clear
        number from the adding and waiting tasks, and a failure callback of an older attempt,
        delivered late, leaves a flow whose epoch is newer than its own. The field goes with
        the flow."""
        return self.perform(self._note_epoch_op(queue, parent_id, epoch))

    def close_flow(self, queue: str, parent_id: str) -> str:
        """The reader is done with a released barrier flow: its ``closed`` retention starts.
        Idempotent; closing a flow that already ended otherwise (failed, completed) changes
        nothing. Returns the state after the call. :class:`JobNotFound` when there is no
        such flow (or it expired); :class:`FlowConflict` while it is still held."""
        return self.perform(self._close_flow_op(queue, parent_id))

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
        return self.perform(self._cancel_flow_op(queue, parent_id, reason))

    def retry_flow(
        self, queue: str, parent_id: str, *, ignored: bool = False
    ) -> lifecycle.RepairResult:
        """Repair a failed (or cancelled) flow: its dead children (``ignored=True``: its
        ignored failures too) go back to pending with fresh attempts, a cancelled flow's
        cancelled children too; the parent is held again with the right counter; children that
        completed keep their values and never run again. Sub-flows are repaired bottom-up.
        Idempotent: a repair cut short is completed by calling it again."""
        return self.perform(self._retry_flow_op(queue, parent_id, ignored))

    def list_flows(
        self, queue: str, state: str | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[models.FlowSummary]:
        """Root flows of ``queue`` (held, released, closed, failed, cancelled, completed: a
        worker-run flow whose parent job completed, kept as long as the queue's ``completed``
        retention keeps it; or one ``state``), oldest first in each state: a page of ``limit``
        per state from ``offset``."""
        return self.perform(self._list_flows_op(queue, state, limit, offset))

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
        return self.perform(self._take_released_op(queue, watcher, cursor, limit, close))

    def retention(self, queue: str) -> dict[str, float | int | None]:
        """The queue's retention settings (seconds and counts; None: unlimited), as stored on
        the server or the defaults (see :mod:`echomq_core.flows.retention`)."""
        return self.perform(self._retention_op(queue))

    def set_retention(self, queue: str, **settings: float | int | None) -> None:
        """Change retention settings of ``queue`` on the server (every Pump applies them):
        ``completed_age=3600, failed_count=1000, unclosed_age=None`` ..."""
        self.perform(self._set_retention_op(queue, settings))

    def shards(self, queue: str) -> tuple[str, ...]:
        """The physical queues of ``queue`` (itself alone unless sharded), as stored on the
        server; cached by this client (see :mod:`echomq_core.flows.sharding`)."""
        return self.perform(self._shards_op(queue))

    def set_shards(self, queue: str, shards: int) -> tuple[str, ...]:
        """Serve ``queue`` from ``shards`` physical queues (1..64), each on its own slot, on
        distinct masters of a Cluster of at least that many; returns their names. Refused with
        :class:`~echomq_core.errors.QueueInUse` while it holds jobs (see
        :mod:`echomq_core.flows.sharding`)."""
        return self.perform(self._set_shards_op(queue, shards))

    def rate_limit(self, queue: str) -> RateLimit | None:
        """The queue's rate limit and where its starts stand (booked ahead, when the next may
        start), as the server times them; None when it has none (see
        :mod:`echomq_core.control.rates`)."""
        return self.perform(self._rate_limit_op(queue))

    def set_rate_limit(
        self, queue: str, rate: str | RateLimit | None, burst: int | None = None
    ) -> None:
        """Limit ``queue`` to ``rate`` job starts across every worker (``"100/s"``,
        ``"6000/min"``, ``"5/500ms"``), spread evenly: every span of the window holds at most
        the limit; or remove the limit (None or ``"none"``). ``burst``: up to this many may
        start at once after a pause (then a window can hold ``limit + burst - 1``; None: 1).
        Checked before anything is written (:class:`InvalidArgument` naming the value). A
        sharded queue's limit holds over all its shards: each takes a share
        (:mod:`echomq_core.control.rates`), so it must be at least the shard count per window."""
        self.perform(self._set_rate_limit_op(queue, rate, burst))

    def children_values(self, queue: str, parent_id: str) -> dict[str, Any]:
        """{child id: result} of every child that completed so far. This read and the ones
        below raise :class:`JobNotFound` at once when there is no such flow (naming the queue
        and id, with the closest registered queues when ``queue`` is not one); the check rides
        in the read's own round trip."""
        return self.perform(self._children_values_op(queue, parent_id))

    def dependencies(self, queue: str, parent_id: str) -> int:
        """The flow's outstanding children (0 for a plain job)."""
        return self.perform(self._dependencies_op(queue, parent_id))

    def ignored_failures(self, queue: str, parent_id: str) -> dict[str, str]:
        """{child id: error} of the children that died under ignore-dependency."""
        return self.perform(self._ignored_failures_op(queue, parent_id))

    def failed_children(self, queue: str, parent_id: str) -> dict[str, str]:
        """{child id: error} of the children that died and failed the parent."""
        return self.perform(self._failed_children_op(queue, parent_id))

    def child_failures(
        self, queue: str, parent_id: str, *, limit: int = 10
    ) -> list[models.ChildFailure]:
        """The flow's dead children with their errors and last tracebacks, fail-parent ones
        first, then ignored ones, at most ``limit`` (a failed sub-flow stands for its own
        failures); see :mod:`echomq_core.flows.failures`."""
        return self.perform(self._child_failures_op(queue, parent_id, limit))

    def snapshot(self, queue: str, parent_id: str) -> models.FlowSnapshot:
        return self.perform(self._snapshot_op(queue, parent_id))

    def snapshots(self, refs: Iterable[models.FlowRef]) -> list[models.FlowSnapshot]:
        """:meth:`snapshot` of each flow, in order, in one round trip per node (pipelined):
        what a sensor watching many flows reads per evaluation."""
        return self.perform(self._snapshots_op(refs))

    def child_queues(self, queue: str, parent_id: str) -> list[str]:
        """The queues of the flow's direct children ([] if there is no such flow): what a
        Pump must serve for their results to reach the parent."""
        return self.perform(self._child_queues_op(queue, parent_id))

    def iter_children_values(
        self, queue: str, parent_id: str, *, page: int = 1000
    ) -> Iterator[tuple[str, Any]]:
        """Every (child id, result), read in HSCAN pages: memory stays flat for any N. The
        first page is read by this call, so a flow that is not there raises
        :class:`JobNotFound` here (checked in that page's round trip), not at the first
        ``next()``."""
        key, cursor, items = self.perform(self._first_values_op(queue, parent_id, page))
        return self._values(key, cursor, items, page)

    def _values(
        self, key: str, cursor: int, items: dict[str, bytes], page: int
    ) -> Iterator[tuple[str, Any]]:
        while True:
            for child_id, raw in items.items():
                yield child_id, self.serializer.loads(raw)
            if cursor == 0:
                return
            cursor, items = self.perform(reads.scan_page(key, cursor, page))

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
        op = self._follow_op(queue, parent_id, follow, cursor, block, page, timeout)
        return streaming.Results(self.perform, self.perform(op)).check()

    def children_values_range(
        self, queue: str, parent_id: str, start: int, stop: int
    ) -> list[tuple[int, Any]]:
        """``(position, value)`` of the completed children at positions ``start`` to
        ``stop - 1``, in order: one slice of a flow's results (each of many readers reads its
        own; two round trips). :class:`InvalidArgument` for a flow whose children have ids of
        their own (explicit or keyed)."""
        return self.perform(self._children_values_range_op(queue, parent_id, start, stop))

    def save_ref(self, name: str, ref: models.FlowRef) -> None:
        """Store a flow reference under ``name`` for another process to find (adapters)."""
        self.perform(refs.save_ref(self.keys, name, ref))

    def load_ref(self, name: str) -> models.FlowRef | None:
        """The flow reference stored under ``name``, or None."""
        return self.perform(refs.load_ref(self.keys, name))

    def wait(
        self, queue: str, parent_id: str, *, timeout: float = 60.0, poll: float = 0.2
    ) -> models.FlowSnapshot:
        """Block until the parent is released (every child settled); raise
        :class:`ParentFailed` at once if it failed (:class:`FlowCancelled` if it was
        cancelled), :class:`FlowTimeout` after ``timeout`` (naming what holds the flow up,
        where that shows). Reads come at most ``poll`` seconds apart, the first ones sooner
        (see :mod:`echomq_core.flows.waiting`). :class:`JobNotFound` at the first read when there
        is no such flow (a wrong id, queue or prefix, or expired): an add is parent-first, so a
        flow being added is there from its first step on; a wait for a flow another process
        has yet to add starts after that add, or polls :meth:`snapshot` (outcome
        ``missing``)."""
        wait = self._wait_for(queue, parent_id, timeout, poll)
        while not (verdict := self.perform(wait.read(self.keys))).done:
            time.sleep(verdict.pause)
        return self.perform(self._waited_op(wait, verdict, timeout))

    # -- for the orchestrators' adapters --------------------------------------------------
    # What the Airflow provider and the Dagster integration need beyond the methods above,
    # so neither sends a command of its own: each decision is the core's, driven here.

    def missing_flow_error(self, queue: str, parent_id: str) -> JobNotFound:
        """The :class:`JobNotFound` of a read of flow ``parent_id`` in ``queue`` that is not
        there, as every flow read raises it: naming the queue and id, and the closest
        registered queues when ``queue`` is not one (one round trip: the registry). Returned,
        for the caller to raise or report (a trigger's event)."""
        return self.perform(self._missing_flow_error_op(queue, parent_id))

    def verdict(self, wait: FlowWait) -> Verdict:
        """One read of the flow ``wait`` waits on, judged by it: the :class:`Verdict` says what
        the read means and how long to pause before the next (see :class:`FlowWait`)."""
        return self.perform(wait.read(self.keys))

    def repair_on_readd(
        self, queue: str, parent_id: str, *, repair: bool, epoch: int | None = None
    ) -> ReAdd:
        """The rule after an add under a stable parent id (an orchestrator's retry, clear or
        re-execution) converged to the flow already there: a failed or cancelled one is
        repaired when ``repair`` (:meth:`retry_flow`), a released or held one is left as it
        is; ``epoch`` (:meth:`note_epoch`) is recorded first. Returns what it found and the
        repair it did. See :func:`echomq_core.flows.lifecycle.repair_on_readd`."""
        return self.perform(self._repair_on_readd_op(queue, parent_id, repair, epoch))

    def worker_run(self, refs: Sequence[models.FlowRef]) -> list[models.FlowRef]:
        """The flows of ``refs`` whose parent exists and is run by a worker, not a barrier (a
        reader from outside refuses them: it could never close them); one round trip per
        node whatever their number. A missing flow is not listed."""
        return self.perform(self._worker_run_op(refs))

    def read_released(
        self,
        snap: models.FlowSnapshot,
        *,
        values: bool = False,
        close: bool = False,
        page: int = VALUES_PAGE,
        failures: int = SHOWN_FAILURES,
    ) -> ReleasedRead:
        """What a reader takes of its flow once released (``snap``, the read that found it
        so): every result with ``values`` (``page`` per round trip), the ignored failures,
        at most ``failures`` tolerated failed children, and a barrier flow closed with
        ``close``. See :class:`~echomq_core.flows.released.ReleasedRead`."""
        return self.perform(self._read_released_op(snap, values, close, page, failures))

    def first_failure(self, queue: str, parent_id: str) -> models.ChildFailure | None:
        """The first fail-parent child of the flow that died, with its error and last
        traceback (:meth:`child_failures`, one bounded read); None when none did (a flow
        cancelled with no dead child, or only ignored failures)."""
        return self.perform(self._first_failure_op(queue, parent_id))

    def save_handle(self, name: str, data: Mapping[str, Any], *, expire: float | None) -> None:
        """Store ``data`` as JSON under reference name ``name`` for ``expire`` seconds (None:
        no expiry): a handle with no flow behind it to expire with (:meth:`save_ref` ties one
        to its flow). See :mod:`echomq_core.flows.handles`."""
        self.perform(self._save_handle_op(name, data, expire))

    def load_handle(self, name: str) -> Any:
        """The JSON stored under reference name ``name`` (by :meth:`save_handle` or
        :meth:`save_ref`) as written, or None; :class:`InvalidInput` when it is not JSON."""
        return self.perform(self._load_handle_op(name))
