"""The connector: URLs to clients; the public entry of the transport.

:func:`connect` and :func:`connect_async` check a URL (:mod:`echomq_core.targets`) and make a
redis-py client for it, with ``Retry(NoBackoff(), 0)`` unless the caller passes its own
``retry``, so redis-py never re-sends a call on its own: a call that may have run is not sent
twice (``docs/CLUSTER.md``); a dead idle connection is still replaced transparently when it is
taken from the pool. The client is wrapped in a driver (:mod:`echomq_core.drivers`).

Where the rest lives: the call/step vocabulary in :mod:`echomq_core.calls`, the Cluster
router's rules in :mod:`echomq_core.cluster` (their reasons in ``docs/CLUSTER.md``), the two
drivers in :mod:`echomq_core.drivers`, URL parsing in :mod:`echomq_core.targets`. Each name is
re-exported here, so ``from echomq_core.connection import ...`` keeps working for all of them.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import errors
from .calls import TRANSPORT_ERRORS, Call, Durable, Lenient, Op
from .cluster import (
    CLUSTER_RETRY_WINDOW,
    DURABLE_WAIT_MS,
    MAX_MIGRATION_WAIT,
    MIGRATION_WAIT,
    REFRESH_EVERY,
    slot_of,
)
from .drivers import AsyncConnection, Connection
from .targets import Target, migration_wait, parse_url, wait_for

__all__ = [
    "CLUSTER_RETRY_WINDOW",
    "DURABLE_WAIT_MS",
    "MAX_MIGRATION_WAIT",
    "MIGRATION_WAIT",
    "REFRESH_EVERY",
    "AsyncConnection",
    "Call",
    "Connection",
    "Durable",
    "Lenient",
    "Op",
    "Target",
    "connect",
    "connect_async",
    "migration_wait",
    "parse_url",
    "slot_of",
]


class _Packer:
    """Packs a command with hiredis, as redis-py's own hiredis packer does, without the pass
    that packer makes over every argument to turn ``bytearray`` / ``memoryview`` into
    ``bytes``: EchoMQ never sends those, and a batch completion has thousands of arguments, so
    that pass is a large share of a no-op worker's CPU. Such an argument, or a command name
    with a space (``CLIENT SETINFO``), goes the redis-py way."""

    def __init__(self) -> None:
        from redis.connection import HiredisRespSerializer

        self._slow = HiredisRespSerializer()

    def pack(self, *args: Any) -> list[bytes]:
        first = args[0]
        if (isinstance(first, str) and " " not in first) or (
            isinstance(first, bytes) and b" " not in first
        ):
            try:
                return [_pack_command(args)]
            except TypeError:
                pass  # a bytearray or memoryview (or a bad value: redis-py raises DataError)
        return self._slow.pack(*args)  # type: ignore[no-any-return]


try:
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - hiredis is optional: redis-py packs in Python
    _PACKER = None
else:
    _PACKER = _Packer()


def connect(
    url: str,
    *,
    cluster: bool | None = None,
    migration_wait: float | None = None,
    **options: Any,
) -> Connection:
    """A synchronous :class:`Connection` for ``url`` (no I/O until the first call).
    ``migration_wait`` (seconds; else the URL's ``?migration_wait=``, else
    :data:`MIGRATION_WAIT`): how long a call of a Cluster slot being moved waits for it."""
    target = parse_url(url, cluster=cluster)
    wait = wait_for(target, migration_wait)
    options.setdefault("retry", Retry(NoBackoff(), 0))  # no blind re-sends (docs/CLUSTER.md)
    if _PACKER is not None and not target.cluster:
        options.setdefault("command_packer", _PACKER)
    client: redis.Redis | redis.cluster.RedisCluster
    try:
        if target.cluster:
            client = redis.cluster.RedisCluster.from_url(target.url, **options)
        else:
            client = redis.Redis.from_url(target.url, **options)
            _check_options(client.connection_pool)
    except TRANSPORT_ERRORS as exc:
        raise errors.ConnectionLost(f"cannot reach {target.where}: {exc}") from None
    except (ValueError, TypeError, redis.RedisError) as exc:
        raise errors.ConfigurationError(
            f"bad connection options for {target.where}: {exc}"
        ) from None
    return Connection(client, where=target.where, migration_wait=wait)


def connect_async(
    url: str,
    *,
    cluster: bool | None = None,
    migration_wait: float | None = None,
    **options: Any,
) -> AsyncConnection:
    """An :class:`AsyncConnection` for ``url`` (no I/O until the first call); options as for
    :func:`connect`."""
    target = parse_url(url, cluster=cluster)
    wait = wait_for(target, migration_wait)
    options.setdefault("retry", _async_no_retry())  # no blind re-sends (docs/CLUSTER.md)
    import redis.asyncio
    import redis.asyncio.cluster

    client: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster
    try:
        if target.cluster:
            client = redis.asyncio.cluster.RedisCluster.from_url(target.url, **options)
        else:
            client = redis.asyncio.Redis.from_url(target.url, **options)
            _check_options(client.connection_pool)
    except (ValueError, TypeError, redis.RedisError) as exc:
        raise errors.ConfigurationError(
            f"bad connection options for {target.where}: {exc}"
        ) from None
    return AsyncConnection(client, where=target.where, migration_wait=wait)


def _check_options(pool: Any) -> None:
    """Build (without connecting) one connection from the pool's settings, so an unknown
    option or a bad TLS flag in the URL is a :class:`ConfigurationError` now, not a
    ``TypeError`` on the first call."""
    pool.connection_class(**pool.connection_kwargs)


def _async_no_retry() -> Any:
    from redis.asyncio.retry import Retry as AsyncRetry

    return AsyncRetry(NoBackoff(), 0)
