"""The asyncio entry point: :class:`AsyncEchoMQ`, the twin of :class:`~echomq_core.EchoMQ`.

Every method is its :class:`~echomq_core.EchoMQ` namesake - the same parameters and defaults,
the same operation (:mod:`echomq_core.client.base`), so the same checks and commands - awaited
on an asyncio connection: a value becomes an awaitable of it, an iterator an awaitable of an
async iterator (its first read is made by the call, as the sync one's). ``tests/client/
test_twins.py`` holds the two classes to that.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
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
from ..wire.connection import Op, connect_async
from .base import _Client, children_list
from .clients import DEFAULT_MAX_PAYLOAD, DEFAULT_URL

if TYPE_CHECKING:  # imported where used: a synchronous user does not load the asyncio queue
    from ..wire.drivers import AsyncConnection
    from .async_queue import AsyncQueue

T = TypeVar("T")


class AsyncEchoMQ(_Client):
    """The asyncio client: every method of :class:`EchoMQ`, awaited - plain jobs
    (:meth:`queue`), flow adds, reads and lifecycle (for triggers, async applications and the
    asyncio worker)."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        cluster: bool | None = None,
        prefix: str = "emq",
        serializer: models.Serializer | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        connection: AsyncConnection | None = None,
        **redis_options: Any,
    ) -> None:
        super().__init__(prefix=prefix, serializer=serializer, max_payload_bytes=max_payload_bytes)
        self.url = url
        self.connection: AsyncConnection = connection or connect_async(
            url, cluster=cluster, **redis_options
        )

    def __repr__(self) -> str:
        return f"AsyncEchoMQ({self.connection.where}, prefix={self.keys.prefix!r})"

    async def __aenter__(self) -> AsyncEchoMQ:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.connection.close()

    async def perform(self, op: Op[T]) -> T:
        """Drive one operation on this client's asyncio connection."""
        return await self.connection.perform(op)

    async def register_queue(self, name: str) -> None:
        """As :meth:`EchoMQ.register_queue`."""
        await self.perform(self._register_queue_op(name))

    async def group_rule(self, queue: str) -> str | None:
        """As :meth:`EchoMQ.group_rule`."""
        return await self.perform(groups.get_rule(self.keys, queue))

    async def group_load(self, queue: str, top: int = 5) -> groups.GroupLoad:
        """As :meth:`EchoMQ.group_load`."""
        return await self.perform(self._group_load_op(queue, top))

    async def group_weight(self, queue: str, group: str) -> int:
        """As :meth:`EchoMQ.group_weight`."""
        return await self.perform(self._group_weight_op(queue, group))

    async def set_group_weight(self, queue: str, group: str, weight: int | None) -> None:
        """As :meth:`EchoMQ.set_group_weight`."""
        await self.perform(self._set_group_weight_op(queue, group, weight))

    async def set_group_rule(self, queue: str, rule: str | None) -> None:
        """As :meth:`EchoMQ.set_group_rule`."""
        await self.perform(self._set_group_rule_op(queue, rule))

    async def queues(self) -> list[str]:
        """As :meth:`EchoMQ.queues`."""
        return await self.perform(self._queues_op())

    def queue(self, name: str, **options: Any) -> AsyncQueue:
        """An :class:`~echomq_core.AsyncQueue` handle; options as :class:`Queue`'s."""
        from .async_queue import AsyncQueue

        return AsyncQueue(self, name, **options)

    async def get_job(self, queue: str, job_id: str) -> models.JobInfo:
        """As :meth:`EchoMQ.get_job`."""
        return await self.perform(self._get_job_op(queue, job_id))

    async def home(self, queue: str, parent_id: str) -> str:
        """As :meth:`EchoMQ.home`."""
        return await self.perform(self._home_op(queue, parent_id))

    async def add_flow(
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
        """As :meth:`EchoMQ.add_flow`."""
        children = children_list(children)
        with adding.gc_paused(children):
            # the planning only: a pause across the await would hold for the loop's other tasks
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
        return await self.perform(op)

    async def flow_cap(self, queue: str, parent_id: str) -> models.FlowCap | None:
        """As :meth:`EchoMQ.flow_cap`."""
        return await self.perform(self._flow_cap_op(queue, parent_id))

    async def note_epoch(self, queue: str, parent_id: str, epoch: int = 0) -> int | None:
        """As :meth:`EchoMQ.note_epoch`."""
        return await self.perform(self._note_epoch_op(queue, parent_id, epoch))

    async def close_flow(self, queue: str, parent_id: str) -> str:
        """As :meth:`EchoMQ.close_flow`."""
        return await self.perform(self._close_flow_op(queue, parent_id))

    async def cancel_flow(
        self, queue: str, parent_id: str, *, reason: str = ""
    ) -> lifecycle.CancelResult:
        """As :meth:`EchoMQ.cancel_flow`."""
        return await self.perform(self._cancel_flow_op(queue, parent_id, reason))

    async def retry_flow(
        self, queue: str, parent_id: str, *, ignored: bool = False
    ) -> lifecycle.RepairResult:
        """As :meth:`EchoMQ.retry_flow`."""
        return await self.perform(self._retry_flow_op(queue, parent_id, ignored))

    async def list_flows(
        self, queue: str, state: str | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[models.FlowSummary]:
        """As :meth:`EchoMQ.list_flows`."""
        return await self.perform(self._list_flows_op(queue, state, limit, offset))

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
        return await self.perform(self._take_released_op(queue, watcher, cursor, limit, close))

    async def retention(self, queue: str) -> dict[str, float | int | None]:
        """As :meth:`EchoMQ.retention`."""
        return await self.perform(self._retention_op(queue))

    async def set_retention(self, queue: str, **settings: float | int | None) -> None:
        """As :meth:`EchoMQ.set_retention`."""
        await self.perform(self._set_retention_op(queue, settings))

    async def shards(self, queue: str) -> tuple[str, ...]:
        """As :meth:`EchoMQ.shards`."""
        return await self.perform(self._shards_op(queue))

    async def set_shards(self, queue: str, shards: int) -> tuple[str, ...]:
        """As :meth:`EchoMQ.set_shards`."""
        return await self.perform(self._set_shards_op(queue, shards))

    async def rate_limit(self, queue: str) -> RateLimit | None:
        """:meth:`EchoMQ.rate_limit`, awaited."""
        return await self.perform(self._rate_limit_op(queue))

    async def set_rate_limit(
        self, queue: str, rate: str | RateLimit | None, burst: int | None = None
    ) -> None:
        """:meth:`EchoMQ.set_rate_limit`, awaited."""
        await self.perform(self._set_rate_limit_op(queue, rate, burst))

    async def children_values(self, queue: str, parent_id: str) -> dict[str, Any]:
        """As :meth:`EchoMQ.children_values` (:class:`JobNotFound` for no such flow)."""
        return await self.perform(self._children_values_op(queue, parent_id))

    async def dependencies(self, queue: str, parent_id: str) -> int:
        """As :meth:`EchoMQ.dependencies`."""
        return await self.perform(self._dependencies_op(queue, parent_id))

    async def ignored_failures(self, queue: str, parent_id: str) -> dict[str, str]:
        """As :meth:`EchoMQ.ignored_failures`."""
        return await self.perform(self._ignored_failures_op(queue, parent_id))

    async def failed_children(self, queue: str, parent_id: str) -> dict[str, str]:
        """As :meth:`EchoMQ.failed_children`."""
        return await self.perform(self._failed_children_op(queue, parent_id))

    async def child_failures(
        self, queue: str, parent_id: str, *, limit: int = 10
    ) -> list[models.ChildFailure]:
        """As :meth:`EchoMQ.child_failures`."""
        return await self.perform(self._child_failures_op(queue, parent_id, limit))

    async def snapshot(self, queue: str, parent_id: str) -> models.FlowSnapshot:
        """As :meth:`EchoMQ.snapshot`."""
        return await self.perform(self._snapshot_op(queue, parent_id))

    async def snapshots(self, refs: Iterable[models.FlowRef]) -> list[models.FlowSnapshot]:
        """As :meth:`EchoMQ.snapshots`."""
        return await self.perform(self._snapshots_op(refs))

    async def child_queues(self, queue: str, parent_id: str) -> list[str]:
        """As :meth:`EchoMQ.child_queues`."""
        return await self.perform(self._child_queues_op(queue, parent_id))

    async def iter_children_values(
        self, queue: str, parent_id: str, *, page: int = 1000
    ) -> AsyncIterator[tuple[str, Any]]:
        """As :meth:`EchoMQ.iter_children_values`: ``async for child_id, value in await
        mq.iter_children_values(...)`` (the first page is read by the call)."""
        key, cursor, items = await self.perform(self._first_values_op(queue, parent_id, page))
        return self._values(key, cursor, items, page)

    async def _values(
        self, key: str, cursor: int, items: dict[str, bytes], page: int
    ) -> AsyncIterator[tuple[str, Any]]:
        while True:
            for child_id, raw in items.items():
                yield child_id, self.serializer.loads(raw)
            if cursor == 0:
                return
            cursor, items = await self.perform(reads.scan_page(key, cursor, page))

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
        op = self._follow_op(queue, parent_id, follow, cursor, block, page, timeout)
        return await streaming.AsyncResults(self.perform, await self.perform(op)).check()

    async def children_values_range(
        self, queue: str, parent_id: str, start: int, stop: int
    ) -> list[tuple[int, Any]]:
        """As :meth:`EchoMQ.children_values_range`."""
        return await self.perform(self._children_values_range_op(queue, parent_id, start, stop))

    async def save_ref(self, name: str, ref: models.FlowRef) -> None:
        """As :meth:`EchoMQ.save_ref`."""
        await self.perform(refs.save_ref(self.keys, name, ref))

    async def load_ref(self, name: str) -> models.FlowRef | None:
        """As :meth:`EchoMQ.load_ref`."""
        return await self.perform(refs.load_ref(self.keys, name))

    async def wait(
        self, queue: str, parent_id: str, *, timeout: float = 60.0, poll: float = 0.2
    ) -> models.FlowSnapshot:
        """As :meth:`EchoMQ.wait`, without blocking the event loop."""
        wait = self._wait_for(queue, parent_id, timeout, poll)
        while not (verdict := await self.perform(wait.read(self.keys))).done:
            await asyncio.sleep(verdict.pause)
        return await self.perform(self._waited_op(wait, verdict, timeout))

    # -- for the orchestrators' adapters --------------------------------------------------

    async def missing_flow_error(self, queue: str, parent_id: str) -> JobNotFound:
        """As :meth:`EchoMQ.missing_flow_error`."""
        return await self.perform(self._missing_flow_error_op(queue, parent_id))

    async def verdict(self, wait: FlowWait) -> Verdict:
        """As :meth:`EchoMQ.verdict`."""
        return await self.perform(wait.read(self.keys))

    async def repair_on_readd(
        self, queue: str, parent_id: str, *, repair: bool, epoch: int | None = None
    ) -> ReAdd:
        """As :meth:`EchoMQ.repair_on_readd`."""
        return await self.perform(self._repair_on_readd_op(queue, parent_id, repair, epoch))

    async def worker_run(self, refs: Sequence[models.FlowRef]) -> list[models.FlowRef]:
        """As :meth:`EchoMQ.worker_run`."""
        return await self.perform(self._worker_run_op(refs))

    async def read_released(
        self,
        snap: models.FlowSnapshot,
        *,
        values: bool = False,
        close: bool = False,
        page: int = VALUES_PAGE,
        failures: int = SHOWN_FAILURES,
    ) -> ReleasedRead:
        """As :meth:`EchoMQ.read_released`."""
        return await self.perform(self._read_released_op(snap, values, close, page, failures))

    async def first_failure(self, queue: str, parent_id: str) -> models.ChildFailure | None:
        """As :meth:`EchoMQ.first_failure`."""
        return await self.perform(self._first_failure_op(queue, parent_id))

    async def save_handle(
        self, name: str, data: Mapping[str, Any], *, expire: float | None
    ) -> None:
        """As :meth:`EchoMQ.save_handle`."""
        await self.perform(self._save_handle_op(name, data, expire))

    async def load_handle(self, name: str) -> Any:
        """As :meth:`EchoMQ.load_handle`."""
        return await self.perform(self._load_handle_op(name))
