"""The connector: URLs to clients, and the two drivers (sync, asyncio) of every operation.

Operations are written once, as generators that *yield* steps and *receive* replies (see
:mod:`echomq_core.ops`): an operation never touches a socket. A step is a list of
:class:`Call` sent as one pipeline - one round trip per server node - and the driver sends
the replies back into the generator. :class:`Connection` drives them with a synchronous
redis-py client, :class:`AsyncConnection` with ``redis.asyncio``; both share the reply
handling below, so keys, arguments and reply parsing exist exactly once.

Scripts are called by SHA. A ``NOSCRIPT`` reply (a restarted server, a new Cluster node) loads
the missing scripts and re-sends only the calls that were refused - once: a second NOSCRIPT
is an error, not a loop.

URLs: ``redis://[user:password@]host:port/db``, ``rediss://`` for TLS, ``unix:///path``;
Cluster with ``redis+cluster://`` / ``rediss+cluster://`` or ``?cluster=true`` (or the
``cluster=True`` argument). Passwords never appear in reprs or error messages.

No blind re-sends: redis-py retries a command whose connection broke by sending it again, but
a reply lost *after* the server ran the command then runs it twice (a claim would lease a
second batch and orphan the first until its lease expires). So unless the caller passes its own
``retry``, clients are made with ``Retry(NoBackoff(), 0)``: a broken call raises
:class:`~echomq_core.errors.ConnectionLost` (it took effect once, or not at all), and the
caller's retry by id, or the Worker's and Pump's loops, decide what happens next. A dead idle
connection is still replaced transparently when it is taken from the pool. (A Cluster pipeline
re-sends the calls of a node whose connection broke, whatever ``retry`` says; every EchoMQ
script is safe to run twice - lease tokens, set-if-absent records, a head check on trims.)
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from . import errors

if TYPE_CHECKING:  # imported when an async client is made: it costs every CLI start
    import redis.asyncio
    import redis.asyncio.cluster
from .scripts import Script, script

T = TypeVar("T")

_SCHEMES = {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"}
_TRANSPORT_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException)


@dataclass(frozen=True, slots=True)
class Call:
    """One command or one script call, with how to read its reply."""

    args: tuple[Any, ...]
    script: Script | None = None
    parse: Callable[[Any], Any] | None = None

    @staticmethod
    def cmd(*args: Any, parse: Callable[[Any], Any] | None = None) -> Call:
        return Call(tuple(args), None, parse)

    @staticmethod
    def lua(
        name: str,
        keys: Sequence[str],
        argv: Sequence[Any],
        parse: Callable[[Any], Any] | None = None,
    ) -> Call:
        s = script(name)
        return Call(("EVALSHA", s.sha, len(keys), *keys, *argv), s, parse)


class Lenient(list[Call]):
    """A step whose failed calls come back as :class:`EchoMQError` values instead of raising
    (the Pump uses it so one parent that is gone does not stop the others)."""


#: An operation: yields steps (lists of calls), receives their replies, returns its result.
Op = Generator[list[Call], list[Any], T]


def _is_noscript(reply: Any) -> bool:
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT")
    )


def _finish(calls: Sequence[Call], replies: list[Any], lenient: bool) -> list[Any]:
    """Map error replies onto the exception tree and parse the rest; raise the first error
    unless the step is lenient."""
    out: list[Any] = []
    first: errors.EchoMQError | None = None
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, ResponseError):
            err: errors.EchoMQError = errors.from_reply(str(reply))
            first = first or err
            out.append(err)
        elif isinstance(reply, _TRANSPORT_ERRORS):
            lost = errors.ConnectionLost(f"connection lost: {type(reply).__name__}: {reply}")
            first = first or lost
            out.append(lost)
        elif isinstance(reply, BaseException):
            wrapped = errors.ServerError(f"{type(reply).__name__}: {reply}")
            first = first or wrapped
            out.append(wrapped)
        else:
            out.append(call.parse(reply) if call.parse is not None else reply)
    if first is not None and not lenient:
        raise first
    return out


class Connection:
    """Drives operations with a synchronous redis-py client (standalone or Cluster)."""

    def __init__(self, client: redis.Redis | redis.cluster.RedisCluster, *, where: str) -> None:
        self.client = client
        self.where = where
        self.is_cluster = isinstance(client, redis.cluster.RedisCluster)

    def __repr__(self) -> str:
        return f"Connection({self.where})"

    def run(self, op: Op[T]) -> T:
        """Run an operation to its end; each step costs one round trip (per node)."""
        try:
            step = next(op)
            while True:
                step = op.send(self.execute(step))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def execute(self, calls: list[Call]) -> list[Any]:
        replies = self._send(calls)
        missing = [i for i, r in enumerate(replies) if _is_noscript(r)]
        if missing:
            for script_ in {calls[i].script for i in missing}:
                if script_ is not None:
                    self._load(script_)
            again = self._send([calls[i] for i in missing])
            for i, r in zip(missing, again, strict=True):
                replies[i] = r
        return _finish(calls, replies, isinstance(calls, Lenient))

    def _send(self, calls: Sequence[Call]) -> list[Any]:
        if len(calls) == 1:
            try:
                return [self.client.execute_command(*calls[0].args)]  # type: ignore[no-untyped-call]
            except ResponseError as exc:
                return [exc]
            except _TRANSPORT_ERRORS as exc:
                raise self._lost(exc) from None
            except RedisError as exc:  # a reply that is not RESP (not a Redis server?)
                raise errors.ServerError(f"{self.where}: {type(exc).__name__}: {exc}") from None
        pipe = self.client.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*call.args)
        try:
            return list(pipe.execute(raise_on_error=False))
        except _TRANSPORT_ERRORS as exc:
            raise self._lost(exc) from None
        except RedisError as exc:
            raise errors.ServerError(f"{self.where}: {type(exc).__name__}: {exc}") from None
        finally:
            pipe.reset()

    def _load(self, script_: Script) -> None:
        try:
            self.client.script_load(script_.source)
        except ResponseError as exc:
            raise errors.from_reply(str(exc)) from None
        except _TRANSPORT_ERRORS as exc:
            raise self._lost(exc) from None

    def _lost(self, exc: BaseException) -> errors.ConnectionLost:
        return errors.ConnectionLost(f"cannot reach {self.where}: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        self.client.close()


class AsyncConnection:
    """Drives the same operations with ``redis.asyncio`` (for triggers and async apps)."""

    def __init__(
        self,
        client: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster,
        *,
        where: str,
    ) -> None:
        self.client = client
        self.where = where

    def __repr__(self) -> str:
        return f"AsyncConnection({self.where})"

    async def run(self, op: Op[T]) -> T:
        try:
            step = next(op)
            while True:
                step = op.send(await self.execute(step))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def execute(self, calls: list[Call]) -> list[Any]:
        replies = await self._send(calls)
        missing = [i for i, r in enumerate(replies) if _is_noscript(r)]
        if missing:
            for s in {calls[i].script for i in missing if calls[i].script is not None}:
                assert s is not None
                try:
                    await self.client.script_load(s.source)
                except _TRANSPORT_ERRORS as exc:
                    raise self._lost(exc) from None
            again = await self._send([calls[i] for i in missing])
            for i, r in zip(missing, again, strict=True):
                replies[i] = r
        return _finish(calls, replies, isinstance(calls, Lenient))

    async def _send(self, calls: Sequence[Call]) -> list[Any]:
        if len(calls) == 1:
            try:
                return [await self.client.execute_command(*calls[0].args)]
            except ResponseError as exc:
                return [exc]
            except _TRANSPORT_ERRORS as exc:
                raise self._lost(exc) from None
            except RedisError as exc:  # a reply that is not RESP (not a Redis server?)
                raise errors.ServerError(f"{self.where}: {type(exc).__name__}: {exc}") from None
        pipe = self.client.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*call.args)
        try:
            return list(await pipe.execute(raise_on_error=False))
        except _TRANSPORT_ERRORS as exc:
            raise self._lost(exc) from None
        except RedisError as exc:
            raise errors.ServerError(f"{self.where}: {type(exc).__name__}: {exc}") from None

    def _lost(self, exc: BaseException) -> errors.ConnectionLost:
        return errors.ConnectionLost(f"cannot reach {self.where}: {type(exc).__name__}: {exc}")

    async def close(self) -> None:
        await self.client.aclose()


# -- URLs ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed connection URL: what to connect to, with the password kept out of reprs."""

    url: str  # the URL redis-py gets (cluster markers removed); holds the password
    cluster: bool
    where: str  # host:port/db for messages, never the password

    def __repr__(self) -> str:
        return f"Target({self.where}, cluster={self.cluster})"


def parse_url(url: str, *, cluster: bool | None = None) -> Target:
    """Check a URL and decide standalone or Cluster; raise :class:`ConfigurationError`."""
    if not isinstance(url, str) or not url:
        raise errors.ConfigurationError("connection URL must be a non-empty string")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise errors.ConfigurationError(f"malformed connection URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise errors.ConfigurationError(
            f"unsupported URL scheme {parts.scheme!r}: use redis://, rediss://, unix://, "
            "redis+cluster:// or rediss+cluster://"
        )
    query = dict(parse_qsl(parts.query))
    flag = (query.pop("cluster", None) or "").lower()
    if flag not in {"", "1", "true", "yes", "0", "false", "no"}:
        raise errors.ConfigurationError(f"cluster= in the URL must be true or false, got {flag!r}")
    is_cluster = scheme.endswith("+cluster") or flag in {"1", "true", "yes"}
    if cluster is not None:
        is_cluster = cluster
    if scheme != "unix" and not parts.hostname:
        raise errors.ConfigurationError("connection URL has no host")
    if scheme == "unix" and not parts.path:
        raise errors.ConfigurationError("unix:// URL has no socket path")
    db = parts.path.lstrip("/")
    if db and scheme != "unix" and not db.isdigit():
        raise errors.ConfigurationError(f"database in URL must be a number, got {db!r}")
    if is_cluster and db not in ("", "0"):
        raise errors.ConfigurationError("a Cluster has only database 0")
    if is_cluster and scheme == "unix":
        raise errors.ConfigurationError("Cluster mode needs host:port URLs, not unix://")
    base = scheme.split("+", 1)[0]
    if base == "unix":  # redis-py wants the "unix://" spelling, which urlunsplit drops
        clean = f"unix://{parts.netloc}{parts.path}" + (f"?{urlencode(query)}" if query else "")
    else:
        clean = urlunsplit((base, parts.netloc, parts.path, urlencode(query), ""))
    where = (
        f"unix:{parts.path}"
        if scheme == "unix"
        else f"{parts.hostname}:{port or 6379}/{db or '0'}{' (cluster)' if is_cluster else ''}"
    )
    return Target(clean, is_cluster, where)


def connect(url: str, *, cluster: bool | None = None, **options: Any) -> Connection:
    """A synchronous :class:`Connection` for ``url`` (no I/O until the first call)."""
    target = parse_url(url, cluster=cluster)
    options.setdefault("retry", Retry(NoBackoff(), 0))  # no blind re-sends: see the module doc
    client: redis.Redis | redis.cluster.RedisCluster
    try:
        if target.cluster:
            client = redis.cluster.RedisCluster.from_url(target.url, **options)
        else:
            client = redis.Redis.from_url(target.url, **options)
            _check_options(client.connection_pool)
    except _TRANSPORT_ERRORS as exc:
        raise errors.ConnectionLost(f"cannot reach {target.where}: {exc}") from None
    except (ValueError, TypeError, redis.RedisError) as exc:
        raise errors.ConfigurationError(
            f"bad connection options for {target.where}: {exc}"
        ) from None
    return Connection(client, where=target.where)


def connect_async(url: str, *, cluster: bool | None = None, **options: Any) -> AsyncConnection:
    """An :class:`AsyncConnection` for ``url`` (no I/O until the first call)."""
    target = parse_url(url, cluster=cluster)
    options.setdefault("retry", _async_no_retry())  # no blind re-sends: see the module doc
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
    return AsyncConnection(client, where=target.where)


def _check_options(pool: Any) -> None:
    """Build (without connecting) one connection from the pool's settings, so an unknown
    option or a bad TLS flag in the URL is a :class:`ConfigurationError` now, not a
    ``TypeError`` on the first call."""
    pool.connection_class(**pool.connection_kwargs)


def _async_no_retry() -> Any:
    from redis.asyncio.retry import Retry as AsyncRetry

    return AsyncRetry(NoBackoff(), 0)
