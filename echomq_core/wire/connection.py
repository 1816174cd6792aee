"""The connector: URLs to clients; the public entry of the transport.

:func:`connect` and :func:`connect_async` check a URL (:mod:`echomq_core.wire.targets`) and make a
redis-py client for it, with ``Retry(NoBackoff(), 0)`` unless the caller passes its own
``retry``, so redis-py never re-sends a call on its own: a call that may have run is not sent
twice (``docs/CLUSTER.md``); a dead idle connection is still replaced transparently when it is
taken from the pool. The client is wrapped in a driver (:mod:`echomq_core.wire.drivers`).

Where the rest lives: the call/step vocabulary in :mod:`echomq_core.wire.calls`, the Cluster
router's rules in :mod:`echomq_core.wire.cluster` (their reasons in ``docs/CLUSTER.md``), the two
drivers in :mod:`echomq_core.wire.drivers`, URL parsing in :mod:`echomq_core.wire.targets`. Each
name is re-exported here, so ``from echomq_core.wire.connection import ...`` keeps working for all
of them.

redis-py loads with the first client, not with this module: the drivers, the router and
:mod:`echomq_core.wire.replies` import it, and the names re-exported from them resolve on first
access. A process that only defines flows - Airflow's DAG processor, a Dagster code server,
``echomq --help`` - pays nothing for a client it never makes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import errors
from . import collector
from .calls import Call, Durable, Lenient, Op
from .lazy import lazy_names
from .packing import _fast_packing, _packer
from .targets import MAX_MIGRATION_WAIT, MIGRATION_WAIT, Target, migration_wait, parse_url, wait_for

if TYPE_CHECKING:
    import redis
    import redis.asyncio
    import redis.asyncio.cluster
    import redis.cluster

    from .cluster import CLUSTER_RETRY_WINDOW as CLUSTER_RETRY_WINDOW
    from .cluster import DURABLE_WAIT_MS as DURABLE_WAIT_MS
    from .cluster import REFRESH_EVERY as REFRESH_EVERY
    from .cluster import slot_of as slot_of
    from .drivers import AsyncConnection as AsyncConnection
    from .drivers import Connection as Connection

#: The re-exported names whose modules import redis-py, and those modules: imported on first
#: access, so that importing this module (every operation's client does) loads no client.
_LAZY = {
    "AsyncConnection": ".drivers",
    "CLUSTER_RETRY_WINDOW": ".cluster",
    "Connection": ".drivers",
    "DURABLE_WAIT_MS": ".cluster",
    "REFRESH_EVERY": ".cluster",
    "slot_of": ".cluster",
}

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


__getattr__, __dir__ = lazy_names(__name__, _LAZY)


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
    # redis-py and the driver load with the first client, not with this module (see _LAZY),
    # with the collector paused (a full collection in the middle of the import: .collector)
    with collector.paused():
        import redis
        import redis.cluster
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from .drivers import Connection
        from .replies import TRANSPORT_ERRORS

    options.setdefault("retry", Retry(NoBackoff(), 0))  # no blind re-sends (docs/CLUSTER.md)
    packer = _packer()
    if packer is not None and not target.cluster:
        options.setdefault("command_packer", packer)
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
    with collector.paused():  # as in connect()
        import redis
        import redis.asyncio
        import redis.asyncio.cluster
        from redis.asyncio.retry import Retry as AsyncRetry
        from redis.backoff import NoBackoff

        from .drivers import AsyncConnection

    options.setdefault("retry", AsyncRetry(NoBackoff(), 0))  # no blind re-sends (docs/CLUSTER.md)
    client: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster
    try:
        if target.cluster:
            client = redis.asyncio.cluster.RedisCluster.from_url(target.url, **options)
        else:
            client = redis.asyncio.Redis.from_url(target.url, **options)
            pool = client.connection_pool
            pool.connection_class = _fast_packing(pool.connection_class)
            _check_options(pool)
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
