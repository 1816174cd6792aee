"""redis-py's replies and exceptions as EchoMQ values and typed errors.

The one module of the call layer that imports redis-py's exception classes; the drivers
(:mod:`echomq_core.wire.drivers`) and the Cluster router (:mod:`echomq_core.wire.cluster`) import
it, and they load only when a client is made (:func:`echomq_core.wire.connection.connect`). The
operations and :mod:`echomq_core.wire.calls` stay free of redis-py, so defining flows costs no
client import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    NoScriptError,
    RedisClusterException,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import errors
from .calls import Call

#: What a broken connection raises: the call comes back as ConnectionLost.
TRANSPORT_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException)
#: Error replies that redis-py raises as connection errors although the connection is fine and
#: the reply was read in full (the call did not run).
REPLY_ERRORS = (BusyLoadingError, AuthenticationError, AuthorizationError)


def is_noscript(reply: Any) -> bool:
    """Whether a reply says the server does not hold the script the call named."""
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT")
    )


def finish(calls: Sequence[Call], replies: list[Any], lenient: bool) -> list[Any]:
    """Map error replies onto the exception tree and parse the rest; raise the first error
    unless the step is lenient."""
    out: list[Any] = []
    first: errors.EchoMQError | None = None
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, errors.EchoMQError):  # the Cluster router's own verdicts
            first = first or reply
            out.append(reply)
        elif isinstance(reply, ResponseError):
            err: errors.EchoMQError = errors.from_reply(str(reply))
            first = first or err
            out.append(err)
        elif isinstance(reply, TRANSPORT_ERRORS):
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
