"""The vocabulary of operations: a :class:`Call`, a step (a list of calls), an :data:`Op`.

Operations are written once, as generators that *yield* steps and *receive* replies (see
:mod:`echomq_core.ops`): an operation never touches a socket. A step is a list of
:class:`Call` sent as one pipeline - one round trip per server node - and a driver
(:mod:`echomq_core.drivers`) sends the replies back into the generator. What kind of list a step
is decides what a failed call does: a plain list raises the first error, a :class:`Lenient` one
hands every error back as a value, a :class:`Durable` one also waits for the replicas.

:func:`finish` is the one place where replies become values or typed errors, for every driver
and topology, so keys, arguments and reply parsing exist exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

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

from . import errors
from .scripts import Script, script

T = TypeVar("T")

#: What a broken connection raises: the call comes back as ConnectionLost.
TRANSPORT_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException)
#: Error replies that redis-py raises as connection errors although the connection is fine and
#: the reply was read in full (the call did not run).
REPLY_ERRORS = (BusyLoadingError, AuthenticationError, AuthorizationError)


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


class Durable(Lenient):
    """A lenient step whose writes count only once the replicas of their master have them: on
    a Cluster whose masters have replicas, a call that no replica confirmed within
    :data:`~echomq_core.cluster.DURABLE_WAIT_MS` comes back as
    :class:`~echomq_core.errors.ConnectionLost` (it ran; the caller must be able to send it
    again). The same as :class:`Lenient` elsewhere."""


#: An operation: yields steps (lists of calls), receives their replies, returns its result.
Op = Generator[list[Call], list[Any], T]


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
