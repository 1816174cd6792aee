"""The two drivers of every operation: :class:`Connection` (a synchronous redis-py client) and
:class:`AsyncConnection` (``redis.asyncio``), each standalone or Cluster.

What one step does is written once, as a generator (:meth:`_Driver._plan`) in the house style
of the operations themselves: it yields each piece of I/O it needs - send a command or a
pipeline, load a script, one Cluster round, patch the slot map, refresh the topology, wait -
and receives its outcome, or has the exception the I/O raised thrown back in where it asked.
So the error mapping of a send, the script-load fallback and the Cluster loop exist once; a
driver only performs the requests, with its own client.

Scripts are called by SHA. A ``NOSCRIPT`` reply (a restarted server, a new Cluster node, a
replica that took over) loads the missing script - on a Cluster, on the node that refused it
(:mod:`echomq_core.wire.cluster`) - and re-sends only the calls that were refused, once: a second
NOSCRIPT is an error, not a loop.

No blind re-sends: a call is sent again only when the server guarantees it did not run (the
replies above, or a connection that could not be opened before anything was written to it).
A call whose connection broke after it was written comes back as
:class:`~echomq_core.errors.ConnectionLost` - it took effect once, or not at all - and the
caller's retry by id, or the Worker's and Pump's loops, decide what happens next.
``docs/CLUSTER.md`` says why, call by call, and what the router does on a Cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.cluster
from redis.exceptions import (
    AskError,
    MovedError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from .. import errors
from .calls import Call, Durable, Lenient, Op
from .cluster import REFRESH_EVERY, Batch, Step
from .packing import pack_commands
from .replies import REPLY_ERRORS, TRANSPORT_ERRORS, finish, is_noscript
from .scripts import Script
from .targets import MIGRATION_WAIT

if TYPE_CHECKING:  # imported when an async client is made: it costs every CLI start
    import redis.asyncio
    import redis.asyncio.cluster

T = TypeVar("T")


# -- what a step asks its driver to do ----------------------------------------------------


@dataclass(slots=True)
class _Command:
    """Send one command; the reply (an error reply raises)."""

    args: tuple[Any, ...]


@dataclass(slots=True)
class _Pipeline:
    """Send the calls as one pipeline; their replies, error replies in place."""

    calls: Sequence[Call]


@dataclass(slots=True)
class _Load:
    """``SCRIPT LOAD`` the script (standalone: a Cluster round loads on the node that asked)."""

    script: Script


@dataclass(slots=True)
class _Round:
    """Write every node's batch, then read every node's replies into ``step``."""

    step: Step
    batches: dict[str, Batch]


@dataclass(slots=True)
class _Move:
    """Patch the client's slot map with a ``MOVED`` reply."""

    redirect: MovedError


@dataclass(slots=True)
class _Refresh:
    """Learn the topology again and replace a default node that failed."""

    failed: set[str]


@dataclass(slots=True)
class _Sleep:
    seconds: float


_Request = _Command | _Pipeline | _Load | _Round | _Move | _Refresh | _Sleep
#: One step's plan: yields requests, receives their outcomes, returns the step's replies.
_Plan = Generator[_Request, Any, list[Any]]


class _Driver:
    """What both drivers share: the plan of a step and the state the Cluster router keeps."""

    def __init__(self, *, where: str, migration_wait: float, is_cluster: bool) -> None:
        self.where = where
        #: How long (s) a step waits for a slot being moved (see docs/CLUSTER.md).
        self.migration_wait = migration_wait
        self.is_cluster = is_cluster
        #: What the Cluster router met (see docs/CLUSTER.md); empty on standalone.
        self.stats: Counter[str] = Counter()
        self._refreshed = float("-inf")
        self._refresh_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where})"

    def _plan(self, calls: list[Call], client: Any) -> _Plan:
        """One step, for either driver: its calls sent, a missing script loaded and only the
        calls it refused sent again, the replies mapped onto the exception tree."""
        if self.is_cluster:
            replies = yield from self._routed(calls, client)
        else:
            replies = yield from self._send(calls)
            refused = [r for r in replies if isinstance(r, ResponseError)]  # empty: most steps
            for reply in refused:
                if isinstance(reply, AskError):  # MOVED or ASK: a Cluster node, not a server
                    raise self._not_standalone(reply)
            missing = [i for i, r in enumerate(replies) if is_noscript(r)] if refused else []
            if missing:
                for script_ in {calls[i].script for i in missing}:
                    if script_ is not None:
                        yield from self._load(script_)
                again = yield from self._send([calls[i] for i in missing])
                for i, r in zip(missing, again, strict=True):
                    replies[i] = r
        return finish(calls, replies, isinstance(calls, Lenient))

    def _send(self, calls: Sequence[Call]) -> _Plan:
        try:
            if len(calls) == 1:
                try:
                    return [(yield _Command(calls[0].args))]
                except ResponseError as exc:
                    return [exc]
            return list((yield _Pipeline(calls)))
        except TRANSPORT_ERRORS as exc:
            raise self._lost(exc) from None
        except RedisError as exc:  # a reply that is not RESP (not a Redis server?)
            raise errors.ServerError(f"{self.where}: {type(exc).__name__}: {exc}") from None

    def _load(self, script_: Script) -> Generator[_Request, Any, None]:
        try:
            yield _Load(script_)
        except ResponseError as exc:
            raise errors.from_reply(str(exc)) from None
        except TRANSPORT_ERRORS as exc:
            raise self._lost(exc) from None

    def _routed(self, calls: Sequence[Call], client: Any) -> _Plan:
        """A step on a Cluster, round by round, as :class:`~echomq_core.wire.cluster.Step` rules."""
        step = Step(calls, isinstance(calls, Durable), self.where, self.stats, self.migration_wait)
        while True:
            yield _Round(step, step.route(client.nodes_manager, client.get_default_node))
            if not step.next_round():
                return step.out
            moved, failed, wait = step.after_round()
            for redirect in moved:
                yield _Move(redirect)
            if failed and self._refresh_due():
                yield _Refresh(failed)
            if wait:
                yield _Sleep(wait)

    def _refresh_due(self) -> bool:
        """At most one topology refresh per :data:`~echomq_core.wire.cluster.REFRESH_EVERY`
        seconds, however many threads or tasks share the connection."""
        with self._refresh_lock:
            now = time.monotonic()
            if now - self._refreshed < REFRESH_EVERY:
                return False
            self._refreshed = now
        self.stats["refresh"] += 1
        return True

    def _not_standalone(self, reply: AskError) -> errors.ConfigurationError:
        """A standalone client's server answered ``MOVED`` / ``ASK``: its URL names a node of a
        Redis Cluster, which serves only its own slots. Following the redirect would need the
        whole Cluster's slot map - the Cluster client's job - so the URL is what is wrong (the
        refused calls did not run; those of the node's own slots in the same step did)."""
        kind = "MOVED" if isinstance(reply, MovedError) else "ASK"
        return errors.ConfigurationError(
            f"{self.where} is a Redis Cluster node: it answered {kind} {reply.slot_id} "
            f"{reply.host}:{reply.port} (that slot is served by another node), and a "
            "standalone client does not follow it; connect with a redis+cluster:// (or "
            "rediss+cluster://) URL, ?cluster=true or cluster=True"
        )

    def _lost(self, exc: BaseException) -> errors.ConnectionLost:
        return errors.ConnectionLost(f"cannot reach {self.where}: {type(exc).__name__}: {exc}")


def _last_failed(failed: set[str]) -> str | None:
    """The failed node a topology refresh should not ask first ("" is no node in particular)."""
    return next(iter(sorted(failed - {""})), None)


class Connection(_Driver):
    """Drives operations with a synchronous redis-py client (standalone or Cluster)."""

    def __init__(
        self,
        client: redis.Redis | redis.cluster.RedisCluster,
        *,
        where: str,
        migration_wait: float = MIGRATION_WAIT,
    ) -> None:
        super().__init__(
            where=where,
            migration_wait=migration_wait,
            is_cluster=isinstance(client, redis.cluster.RedisCluster),
        )
        self.client = client

    def perform(self, op: Op[T]) -> T:
        """Run an operation to its end; each step costs one round trip (per node)."""
        try:
            step = next(op)
            while True:
                step = op.send(self.execute(step))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def execute(self, calls: list[Call]) -> list[Any]:
        plan = self._plan(calls, self.client)
        outcome: Any = None
        failure: Exception | None = None
        try:
            while True:
                request = plan.send(outcome) if failure is None else plan.throw(failure)
                failure = None
                try:
                    outcome = self._do(request)
                except Exception as exc:  # thrown back into the plan, which maps it
                    failure = exc
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def _do(self, request: _Request) -> Any:
        client = self.client
        match request:
            case _Command(args):
                return client.execute_command(*args)  # type: ignore[no-untyped-call]
            case _Pipeline(calls):
                pipe = client.pipeline(transaction=False)
                for call in calls:
                    pipe.execute_command(*call.args)
                try:
                    return pipe.execute(raise_on_error=False)
                finally:
                    pipe.reset()
            case _Load(script_):
                return client.script_load(script_.source)
            case _Round(step, batches):
                self._round(step, batches)
            case _Move(redirect):
                assert isinstance(client, redis.cluster.RedisCluster)
                client.nodes_manager.move_slot(redirect)
            case _Refresh(failed):
                self._refresh(failed)
            case _Sleep(seconds):
                time.sleep(seconds)
        return None

    def _round(self, step: Step, batches: dict[str, Batch]) -> None:
        """Write every node's batch, then read every node's replies (one round trip in all)."""
        client = self.client
        assert isinstance(client, redis.cluster.RedisCluster)
        opened: list[tuple[Batch, Any, Any]] = []
        try:
            for batch in batches.values():
                try:
                    node_client = client.get_redis_connection(batch.node)
                    conn = node_client.connection_pool.get_connection()
                except TRANSPORT_ERRORS as exc:  # nothing was written
                    step.absorb(batch, [], exc, written=False)
                    continue
                opened.append((batch, node_client, conn))
                try:
                    conn.send_packed_command(pack_commands(conn, batch.wire))  # type: ignore[no-untyped-call]
                except TRANSPORT_ERRORS as exc:  # part of it may have gone out
                    opened.pop()
                    conn.disconnect()  # type: ignore[no-untyped-call]
                    node_client.connection_pool.release(conn)
                    step.absorb(batch, [], exc, written=True)
            while opened:
                batch, node_client, conn = opened[0]
                replies: list[Any] = []
                error: BaseException | None = None
                try:
                    for name in batch.names:
                        try:
                            replies.append(node_client.parse_response(conn, name))
                        except (ResponseError, *REPLY_ERRORS) as exc:
                            replies.append(exc)
                except TRANSPORT_ERRORS as exc:
                    error = exc
                    conn.disconnect()
                opened.pop(0)
                node_client.connection_pool.release(conn)
                step.absorb(batch, replies, error, written=True)
        finally:  # interrupted: no connection goes back to its pool with replies still due
            for _batch, node_client, conn in opened:
                conn.disconnect()
                node_client.connection_pool.release(conn)

    def _refresh(self, failed: set[str]) -> None:
        """Learn the topology again (after a node failed) and replace a dead default node."""
        client = self.client
        assert isinstance(client, redis.cluster.RedisCluster)
        # When no node answers, the next call fails with ConnectionLost, and tries again.
        with contextlib.suppress(RedisClusterException, RedisError, OSError):
            client.nodes_manager.initialize(last_failed_node_name=_last_failed(failed))
        default = client.get_default_node()  # type: ignore[no-untyped-call]
        if default is None or default.name in failed:
            client.replace_default_node()

    def close(self) -> None:
        self.client.close()


def _cancels() -> int:
    """How many cancels of the current task are pending (0 outside a task)."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def _deliver_cancel(before: int) -> None:
    """Raise the CancelledError of a cancel made since ``before`` (:func:`_cancels`) that an
    awaited call swallowed (see :meth:`AsyncConnection._cancellable`)."""
    if _cancels() > before:
        raise asyncio.CancelledError


class AsyncConnection(_Driver):
    """Drives the same operations with ``redis.asyncio`` (for triggers and async apps)."""

    def __init__(
        self,
        client: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster,
        *,
        where: str,
        migration_wait: float = MIGRATION_WAIT,
    ) -> None:
        import redis.asyncio.cluster

        super().__init__(
            where=where,
            migration_wait=migration_wait,
            is_cluster=isinstance(client, redis.asyncio.cluster.RedisCluster),
        )
        self.client = client

    async def perform(self, op: Op[T]) -> T:
        try:
            step = next(op)
            while True:
                step = op.send(await self.execute(step))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def execute(self, calls: list[Call]) -> list[Any]:
        if self.is_cluster:
            before = _cancels()
            await self._open()
            _deliver_cancel(before)  # see _cancellable
        plan = self._plan(calls, self.client)
        outcome: Any = None
        failure: Exception | None = None
        try:
            while True:
                request = plan.send(outcome) if failure is None else plan.throw(failure)
                failure = None
                try:
                    outcome = await self._cancellable(request)
                except Exception as exc:  # thrown back into the plan, which maps it
                    failure = exc
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def _cancellable(self, request: _Request) -> Any:
        """:meth:`_do`, and a cancel of the calling task made while it ran delivered here if
        redis.asyncio swallowed it: a command cancelled while it waits for its reply can still
        return the reply (in about 40 % of such cancels, redis-py 8.1 and 8.2), and the task
        would run on as if never cancelled - a trigger the triggerer stopped polling for ever,
        a stopping worker claiming again. A cancel requested before the call (a task that
        cleans up after a cancel) is not raised again."""
        before = _cancels()
        outcome = await self._do(request)
        _deliver_cancel(before)
        return outcome

    async def _open(self) -> None:
        """Learn the topology once, on the first call (the asyncio client does not at once)."""
        import redis.asyncio.cluster

        client = self.client
        assert isinstance(client, redis.asyncio.cluster.RedisCluster)
        try:
            await client.initialize()
        except (*TRANSPORT_ERRORS, RedisError) as exc:
            raise self._lost(exc) from None

    async def _do(self, request: _Request) -> Any:
        client: Any = self.client
        match request:
            case _Command(args):
                return await client.execute_command(*args)
            case _Pipeline(calls):
                pipe = client.pipeline(transaction=False)
                for call in calls:
                    pipe.execute_command(*call.args)
                try:
                    return await pipe.execute(raise_on_error=False)
                finally:
                    await pipe.reset()
            case _Load(script_):
                return await client.script_load(script_.source)
            case _Round(step, batches):
                await asyncio.gather(*(self._send_batch(step, b) for b in batches.values()))
            case _Move(redirect):
                await client.nodes_manager.move_slot(redirect)
            case _Refresh(failed):
                await self._refresh(failed)
            case _Sleep(seconds):
                await asyncio.sleep(seconds)
        return None

    @staticmethod
    async def _send_batch(step: Step, batch: Batch) -> None:
        node = batch.node
        try:
            conn = node.acquire_connection()
        except TRANSPORT_ERRORS as exc:  # MaxConnectionsError
            step.absorb(batch, [], exc, written=False)
            return
        replies: list[Any] = []
        error: BaseException | None = None
        written = clean = False
        try:
            await node.disconnect_if_needed(conn)
            if not conn.is_connected:
                await conn.connect()
            written = True
            await conn.send_packed_command(pack_commands(conn, batch.wire))
            for name in batch.names:
                try:
                    replies.append(await node.parse_response(conn, name))
                except (ResponseError, *REPLY_ERRORS) as exc:
                    replies.append(exc)
            clean = True
        except TRANSPORT_ERRORS as exc:
            error = exc
        finally:
            if not clean:  # a reply may still be on its way: this connection is done
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
            node.release(conn)
        step.absorb(batch, replies, error, written)

    async def _refresh(self, failed: set[str]) -> None:
        import redis.asyncio.cluster

        client = self.client
        assert isinstance(client, redis.asyncio.cluster.RedisCluster)
        # When no node answers, the next call fails with ConnectionLost, and tries again.
        with contextlib.suppress(RedisClusterException, RedisError, OSError):
            await client.nodes_manager.initialize(last_failed_node_name=_last_failed(failed))
        default = client.get_default_node()
        if default is None or default.name in failed:
            client.replace_default_node()

    async def close(self) -> None:
        await self.client.aclose()
