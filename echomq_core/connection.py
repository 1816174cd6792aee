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

redis-py loads with the first client, not with this module: the drivers, the router and
:mod:`echomq_core.replies` import it, and the names re-exported from them resolve on first
access. A process that only defines flows - Airflow's DAG processor, a Dagster code server,
``echomq --help`` - pays nothing for a client it never makes.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import collector, errors
from .calls import Call, Durable, Lenient, Op
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


def __getattr__(name: str) -> Any:
    """Import a lazy name's module once; the name is then a plain module global."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __package__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _Packer:
    """Packs a command with hiredis, as redis-py's own hiredis packer does, without the pass
    that packer makes over every argument to turn ``bytearray`` / ``memoryview`` into
    ``bytes``: EchoMQ never sends those, and a batch completion has thousands of arguments, so
    that pass is a large share of a no-op worker's CPU. Such an argument, or a command name
    with a space (``CLIENT SETINFO``), goes the redis-py way."""

    def __init__(self, pack_command: Any) -> None:
        from redis.connection import HiredisRespSerializer

        # typed Any: redis-py 8.2 left its __init__ unannotated (an untyped call to mypy)
        serializer: Any = HiredisRespSerializer
        self._fast = pack_command
        self._slow = serializer()

    def pack(self, *args: Any) -> list[bytes]:
        first = args[0]
        if (isinstance(first, str) and " " not in first) or (
            isinstance(first, bytes) and b" " not in first
        ):
            try:
                return [self._fast(args)]
            except TypeError:
                pass  # a bytearray or memoryview (or a bad value: redis-py raises DataError)
        return self._slow.pack(*args)  # type: ignore[no-any-return]


def pack_commands(conn: Any, commands: Sequence[Sequence[Any]]) -> list[bytes]:
    """``conn.pack_commands(commands)`` with the process's :class:`_Packer`: a Cluster node's
    connection packs in Python otherwise (neither RedisCluster takes a ``command_packer``, and
    the asyncio one's node connections are made by the cluster itself), argument by argument -
    about 0.7 s of a 1,000,000-child add's land calls in an Airflow task on a
    3-master Cluster. Small commands are joined into buffers of about 6,000 bytes, as redis-py
    does, so a step of many small calls is not one send per call."""
    packer = _packer()
    if packer is None:  # pragma: no cover - hiredis is optional
        return conn.pack_commands(commands)  # type: ignore[no-any-return]
    out: list[bytes] = []
    pieces: list[bytes] = []
    size = 0
    for args in commands:
        for chunk in packer.pack(*args):
            if len(chunk) > 6000:
                if pieces:
                    out.append(b"".join(pieces))
                    pieces, size = [], 0
                out.append(chunk)
                continue
            pieces.append(chunk)
            size += len(chunk)
            if size > 6000:
                out.append(b"".join(pieces))
                pieces, size = [], 0
    if pieces:
        out.append(b"".join(pieces))
    return out


#: The fast-packing subclass of each asyncio connection class (:func:`_fast_packing`).
_FAST_PACKING: dict[type[Any], type[Any]] = {}


def _fast_packing(connection_class: type[Any]) -> type[Any]:
    """``connection_class`` (an asyncio connection of redis-py) packing commands as
    :class:`_Packer` does: redis-py's asyncio connections take no ``command_packer`` and pack
    in Python, argument by argument, which is most of an asyncio worker's own CPU per batch
    completion. The pool's own class is subclassed (TCP, TLS or a Unix socket alike), once
    per class; without hiredis it is returned as it is."""
    made = _FAST_PACKING.get(connection_class)
    if made is not None:
        return made
    packer = _packer()
    if packer is None:  # pragma: no cover - hiredis is optional
        return connection_class
    fast = packer._fast

    class FastPacking(connection_class):  # type: ignore[misc]
        def pack_command(self, *args: Any) -> list[bytes]:
            first = args[0]
            if (isinstance(first, str) and " " not in first) or (
                isinstance(first, bytes) and b" " not in first
            ):
                try:
                    return [fast(args)]
                except TypeError:
                    pass  # a bytearray or memoryview: redis-py's own way
            return super().pack_command(*args)  # type: ignore[no-any-return]

    FastPacking.__name__ = FastPacking.__qualname__ = f"FastPacking{connection_class.__name__}"
    _FAST_PACKING[connection_class] = FastPacking
    return FastPacking


@functools.cache
def _packer() -> _Packer | None:
    """The one packer of the process, made with the first connection; None without hiredis
    (redis-py then packs in Python)."""
    try:
        from hiredis import pack_command
    except ImportError:  # pragma: no cover - hiredis is optional
        return None
    return _Packer(pack_command)


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
