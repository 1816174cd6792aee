"""What both clients are made of: :class:`_Client`, the state a client keeps (its keyspace,
serializer, registered queues and shard cache) and every operation of its methods, written once.

Each public method of :class:`~echomq_core.EchoMQ` and :class:`~echomq_core.AsyncEchoMQ` drives
one operation built here (:mod:`echomq_core.wire.calls`): the checks of its arguments, the
planning of an add, where a flow lives (its shard), the calls and how their replies are read.
The synchronous client runs it with ``perform``, the asyncio one with ``await perform``: so
both cost the same commands and round trips, and a method added for both clients is one
operation here and one line in each class. Nothing here touches a socket.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .. import models
from ..checks import MAX_ATTEMPTS, check_int, check_seconds, encode_checked, text
from ..control import groups, rates
from ..control.rates import RateLimit
from ..errors import InvalidArgument, JobNotFound, flow_error
from ..flows import children as child_reads
from ..flows import (
    failures,
    handles,
    lifecycle,
    release_watch,
    released,
    retention,
    sharding,
    streaming,
)
from ..flows import reads as flows
from ..flows.add import add_flow
from ..flows.plan import apply_rules, child_list, new_parent_id, plan, queues_of, unlink
from ..flows.waiting import MISSING, FlowWait, Verdict
from ..queues import adding
from ..wire import collector
from ..wire.calls import Call, Op
from ..wire.keyspace import FLOW_LISTS, QUEUE_NAME_RE, Keyspace, check_job_id, check_queue
from .queue import QueueOps

if TYPE_CHECKING:
    from ..wire.drivers import AsyncConnection, Connection

T = TypeVar("T")
log = logging.getLogger("echomq_core.client")

#: What :meth:`iter_children_values` starts from: the hash it pages through, the HSCAN
#: cursor after the first page, and that page.
Pages = tuple[str, int, dict[str, bytes]]


class _Client:
    """The state both clients keep and the operations of their methods (``_<method>_op``)."""

    connection: Connection | AsyncConnection

    def __init__(
        self, *, prefix: str, serializer: models.Serializer | None, max_payload_bytes: int
    ) -> None:
        self.keys = Keyspace(prefix)
        self.serializer: models.Serializer = (
            serializer if serializer is not None else models.JsonSerializer()
        )
        self.max_payload_bytes = check_int("max_payload_bytes", max_payload_bytes, 1)
        self._registered: set[str] = set()
        #: each logical queue's shards, as read from the server once per process
        #: (:mod:`echomq_core.flows.sharding`): never recomputed, changed only while empty
        self.shard_cache: dict[str, sharding.Shards] = {}
        #: each queue's group rule, read at most once per groups.RULE_TTL s
        self.group_rules = groups.Rules()

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

    # -- queues ----------------------------------------------------------------------------
    def _register_queue_op(self, name: str) -> Op[None]:
        check_queue(name)
        if name not in self._registered:
            yield adding.register(self.keys, [name])
            self._registered.add(name)

    def _group_load_op(self, queue: str, top: int) -> Op[groups.GroupLoad]:
        shards = yield from self._shards_op(queue)
        return (yield from groups.load(self.keys, shards, top))

    def _set_group_weight_op(self, queue: str, group: str, weight: int | None) -> Op[None]:
        shards = yield from self._shards_op(queue)
        yield from groups.set_weight(self.keys, shards, group, weight)
        yield from self._register_queue_op(queue)

    def _group_weight_op(self, queue: str, group: str) -> Op[int]:
        shards = yield from self._shards_op(queue)
        return (yield from groups.get_weight(self.keys, shards[0], group))

    def _set_group_rule_op(self, queue: str, rule: str | None) -> Op[None]:
        yield from groups.set_rule(self.keys, queue, rule)
        self.group_rules.forget(queue)
        yield from self._register_queue_op(queue)

    def _queues_op(self) -> Op[list[str]]:
        (members,) = yield [Call.cmd("SMEMBERS", self.keys.queues())]
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

    def _get_job_op(self, queue: str, job_id: str) -> Op[models.JobInfo]:
        return QueueOps(self, queue).get_job_op(job_id)

    def _shards_op(self, queue: str) -> Op[sharding.Shards]:
        check_queue(queue)
        if cached := self.shard_cache.get(queue):
            return cached
        # the group rule rides along: an add then needs no step of its own for it
        rules = self.group_rules
        places, _ = yield from sharding.resolve_for_add(self.keys, self.shard_cache, rules, [queue])
        return places[queue]

    def _set_shards_op(self, queue: str, shards: int) -> Op[sharding.Shards]:
        op = sharding.configure(self.keys, queue, shards, self.connection.is_cluster)
        names = yield from op
        self.shard_cache[queue] = names
        rules = self.group_rules  # known with the shards, as a first read knows it
        rules.take([queue], (yield rules.read_calls(self.keys, [queue])))
        yield from self._register_queue_op(queue)
        return names

    def _home_op(self, queue: str, parent_id: str) -> Op[str]:
        check_queue(queue)
        check_job_id(parent_id)
        return sharding.shard_of((yield from self._shards_op(queue)), parent_id)

    def _retention_op(self, queue: str) -> Op[dict[str, float | int | None]]:
        check_queue(queue)
        return retention.get_config(self.keys, queue)

    def _set_retention_op(self, queue: str, settings: dict[str, float | int | None]) -> Op[None]:
        check_queue(queue)
        shards = yield from self._shards_op(queue)  # a sharded queue: every shard the same
        yield from sharding.together([retention.set_config(self.keys, q, settings) for q in shards])
        yield from self._register_queue_op(queue)

    def _rate_limit_op(self, queue: str) -> Op[RateLimit | None]:
        shards = yield from self._shards_op(queue)
        return (yield from rates.get_rate(self.keys, queue, shards))

    def _set_rate_limit_op(
        self, queue: str, rate: str | RateLimit | None, burst: int | None = None
    ) -> Op[None]:
        shards = yield from self._shards_op(queue)
        yield from rates.set_rate(self.keys, queue, rate, shards, burst)
        self.mark_registered([queue])

    # -- adding a flow ---------------------------------------------------------------------
    def _plan_flow(
        self,
        queue: str,
        children: Sequence[models.Child],
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

    def _add_flow_op(
        self,
        queue: str,
        children: Sequence[models.Child],
        payload: Any,
        parent_id: str | None,
        max_attempts: int,
        barrier: Any,
        replace: Any,
        max_running: Any,
        min_success: Any,
        stream: Any,
    ) -> Op[models.FlowRef]:
        """The operation of :meth:`EchoMQ.add_flow <echomq_core.EchoMQ.add_flow>` (a replace
        when asked), planned here, before anything is sent (the caller pauses the collector
        around it: :func:`~echomq_core.queues.adding.gc_paused`); its queues are marked registered
        once it lands."""
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

        def add() -> Op[models.FlowRef]:
            # nodes in sharded queues go to their ids' shards before anything is written
            shards, rules = yield from sharding.resolve_for_add(
                self.keys, self.shard_cache, self.group_rules, logical
            )
            if rules:  # queues that name groups from payloads (control.groups): before shards
                apply_rules(root, children, rules)
            sharded = sharding.place(root, shards)
            queues = self.unregistered(queues_of(root) if sharded else logical)

            planned = [root]

            def plan(gen: str) -> Any:
                if not gen:
                    return root
                again = self._plan_flow(
                    queue, children, payload, root.id, max_attempts, gen, max_running, min_success
                )
                again.stream = stream
                if rules:
                    apply_rules(again, children, rules)
                sharding.place(again, shards)
                planned.append(again)
                return again

            try:
                if not replace:
                    op = add_flow(self.keys, root, queues, barrier=barrier, replan=plan)
                else:
                    op = lifecycle.add_or_replace(self.keys, plan, queues, barrier=barrier)
                # a rule read long ago is read again in the add's first step (control.groups)
                refresh = self.group_rules.refresh(self.keys, logical)
                ref, _ = yield from sharding.together([op, refresh])
                assert ref is not None
            finally:
                unlink(planned)
            self.mark_registered(queues)
            return ref

        return add()

    # -- a flow's lifecycle ----------------------------------------------------------------
    def _flow_cap_op(self, queue: str, parent_id: str) -> Op[models.FlowCap | None]:
        home = yield from self._home_op(queue, parent_id)
        return (yield from flows.flow_cap(self.keys, home, parent_id))

    def _note_epoch_op(self, queue: str, parent_id: str, epoch: int) -> Op[int | None]:
        home = yield from self._home_op(queue, parent_id)
        epoch = check_int("epoch", epoch, 0, 2**53)
        return (yield from lifecycle.note_epoch(self.keys, home, parent_id, epoch))

    def _close_flow_op(self, queue: str, parent_id: str) -> Op[str]:
        home = yield from self._home_op(queue, parent_id)
        return (yield from lifecycle.close_flow(self.keys, home, parent_id))

    def _cancel_flow_op(
        self, queue: str, parent_id: str, reason: str
    ) -> Op[lifecycle.CancelResult]:
        home = yield from self._home_op(queue, parent_id)
        return (yield from lifecycle.cancel_flow(self.keys, home, parent_id, _reason(reason)))

    def _retry_flow_op(
        self, queue: str, parent_id: str, ignored: bool
    ) -> Op[lifecycle.RepairResult]:
        home = yield from self._home_op(queue, parent_id)
        op = lifecycle.retry_flow(self.keys, home, parent_id, ignored=_flag("ignored", ignored))
        return (yield from op)

    def _list_flows_op(
        self, queue: str, state: str | None, limit: int, offset: int
    ) -> Op[list[models.FlowSummary]]:
        check_queue(queue)
        if state is not None and state not in FLOW_LISTS:
            raise InvalidArgument(f"state must be one of {', '.join(FLOW_LISTS)}, got {state!r}")
        states = list(FLOW_LISTS) if state is None else [state]
        limit, offset = check_int("limit", limit, 1, 10_000), check_int("offset", offset, 0)
        return flows.list_flows(self.keys, queue, states, offset=offset, limit=limit)

    def _take_released_op(
        self, queue: str, watcher: str, cursor: str | None, limit: int, close: bool
    ) -> Op[tuple[str, list[release_watch.Released]]]:
        ks = self.keys
        return release_watch.take_released(ks, queue, watcher, cursor, limit=limit, close=close)

    # -- a flow's reads --------------------------------------------------------------------
    def _read_op(self, queue: str, parent_id: str, read: Callable[..., Op[T]], *args: Any) -> Op[T]:
        """``read(keys, home, parent_id, *args)`` of the flow's home (its shard), with
        :class:`~echomq_core.errors.JobNotFound` naming the queue and id when there is no such
        flow: checked in the read's own round trip."""
        home = yield from self._home_op(queue, parent_id)
        op = read(self.keys, home, parent_id, *args)
        return (yield from flows.explained(self.keys, queue, parent_id, op))

    def _children_values_op(self, queue: str, parent_id: str) -> Op[dict[str, Any]]:
        return self._read_op(queue, parent_id, flows.children_values, self.serializer)

    def _dependencies_op(self, queue: str, parent_id: str) -> Op[int]:
        return self._read_op(queue, parent_id, flows.dependencies)

    def _ignored_failures_op(self, queue: str, parent_id: str) -> Op[dict[str, str]]:
        return self._read_op(queue, parent_id, flows.ignored_failures)

    def _failed_children_op(self, queue: str, parent_id: str) -> Op[dict[str, str]]:
        return self._read_op(queue, parent_id, flows.failed_children)

    def _child_failures_op(
        self, queue: str, parent_id: str, limit: int
    ) -> Op[list[models.ChildFailure]]:
        home = yield from self._home_op(queue, parent_id)
        limit = check_int("limit", limit, 1, 10_000)
        found = yield from failures.child_failures(self.keys, home, parent_id, limit)
        if not found:  # none, or no such flow: only then is the row looked at
            check = flows.check_exists(self.keys, home, parent_id)
            yield from flows.explained(self.keys, queue, parent_id, check)
        return found

    def _children_values_range_op(
        self, queue: str, parent_id: str, start: int, stop: int
    ) -> Op[list[tuple[int, Any]]]:
        ser = self.serializer
        return self._read_op(queue, parent_id, child_reads.values_in_range, ser, start, stop)

    def _first_values_op(self, queue: str, parent_id: str, page: int) -> Op[Pages]:
        """The first HSCAN page of :meth:`EchoMQ.iter_children_values
        <echomq_core.EchoMQ.iter_children_values>`, the flow's existence checked with it."""
        home = yield from self._home_op(queue, parent_id)
        check_int("page", page, 1, 100_000)
        first = flows.first_page(self.keys, home, parent_id, page)
        cursor, items = yield from flows.explained(self.keys, queue, parent_id, first)
        return self.keys.processed(home, parent_id), cursor, items

    def _snapshot_op(self, queue: str, parent_id: str) -> Op[models.FlowSnapshot]:
        home = yield from self._home_op(queue, parent_id)
        return (yield from flows.snapshot(self.keys, home, parent_id))

    def _snapshots_op(self, refs: Iterable[models.FlowRef]) -> Op[list[models.FlowSnapshot]]:
        homes = []
        for ref in refs:
            homes.append(((yield from self._home_op(ref.queue, ref.parent_id)), ref.parent_id))
        if not homes:
            return []
        return (yield from sharding.together([flows.snapshot(self.keys, q, p) for q, p in homes]))

    def _child_queues_op(self, queue: str, parent_id: str) -> Op[list[str]]:
        home = yield from self._home_op(queue, parent_id)
        return (yield from flows.child_queues(self.keys, home, parent_id))

    def _follow_op(
        self,
        queue: str,
        parent_id: str,
        follow: bool,
        cursor: str | None,
        block: float,
        page: int,
        timeout: float | None,
    ) -> Op[streaming.Follow]:
        """The follower of :meth:`EchoMQ.iter_results <echomq_core.EchoMQ.iter_results>`."""
        home = yield from self._home_op(queue, parent_id)
        return streaming.Follow.start(
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

    def _wait_for(self, queue: str, parent_id: str, timeout: float, poll: float) -> FlowWait:
        """The reads of :meth:`EchoMQ.wait <echomq_core.EchoMQ.wait>`, each a ``read`` op; the
        caller sleeps each verdict's ``pause`` between them, then drives :meth:`_waited_op`."""
        bound = check_seconds("timeout", timeout)  # bounded: None is not "no timeout" here
        return FlowWait(queue, parent_id, poll=poll, timeout=bound, missing_ok=False)

    def _waited_op(
        self, wait: FlowWait, verdict: Verdict, timeout: float
    ) -> Op[models.FlowSnapshot]:
        """A wait's end: the snapshot of a released (or closed) flow; else its error -
        :class:`JobNotFound`, :class:`ParentFailed` / :class:`FlowCancelled` naming the failed
        children, or :class:`FlowTimeout` with what holds the flow up where that shows."""
        queue, parent_id = wait.queue, wait.parent_id
        if verdict.kind == MISSING:
            raise (yield from flows.not_found(self.keys, queue, parent_id))
        if verdict.never_released:
            failed = yield from self._failed_children_op(queue, parent_id)
            raise flow_error(queue, parent_id, verdict.kind, failed, verdict.snap.error)
        if verdict.ready:
            return verdict.snap
        raise verdict.timeout_error(timeout)

    # -- for the orchestrators' adapters (EchoMQ's methods say what each is for) ----------

    def _missing_flow_error_op(self, queue: str, parent_id: str) -> Op[JobNotFound]:
        return flows.not_found(self.keys, queue, parent_id)

    def _repair_on_readd_op(
        self, queue: str, parent_id: str, repair: bool, epoch: int | None
    ) -> Op[lifecycle.ReAdd]:
        return lifecycle.repair_on_readd(self.keys, queue, parent_id, repair=repair, epoch=epoch)

    def _worker_run_op(self, refs: Sequence[models.FlowRef]) -> Op[list[models.FlowRef]]:
        return released.worker_run(self.keys, refs)

    def _read_released_op(
        self, snap: models.FlowSnapshot, values: bool, close: bool, page: int, failures: int
    ) -> Op[released.ReleasedRead]:
        return released.read_released(
            self.keys,
            self.serializer,
            snap,
            values=values,
            close=close,
            page=page,
            failures=failures,
        )

    def _first_failure_op(self, queue: str, parent_id: str) -> Op[models.ChildFailure | None]:
        found = yield from self._child_failures_op(queue, parent_id, 1)
        return next((f for f in found if not f.ignored), None)

    def _save_handle_op(self, name: str, data: Mapping[str, Any], expire: float | None) -> Op[None]:
        return handles.save_handle(self.keys, name, data, expire)

    def _load_handle_op(self, name: str) -> Op[Any]:
        return handles.load_handle(self.keys, name)


def children_list(children: Iterable[models.Child]) -> Sequence[models.Child]:
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


def _reason(reason: Any) -> str:
    if not isinstance(reason, str) or len(reason) > 1000:
        raise InvalidArgument(
            f"reason must be a string of at most 1000 characters, got {reason!r:.80}"
        )
    return reason
