"""The vocabulary of operations: a :class:`Call`, a step (a list of calls), an :data:`Op`.

Operations are written once, as generators that *yield* steps and *receive* replies (see
:mod:`echomq_core.queues.adding`): an operation never touches a socket. A step is a list of
:class:`Call` sent as one pipeline - one round trip per server node - and a driver
(:mod:`echomq_core.wire.drivers`) sends the replies back into the generator. What kind of list a
step is decides what a failed call does: a plain list raises the first error, a :class:`Lenient` one
hands every error back as a value, a :class:`Durable` one also waits for the replicas.

:func:`~echomq_core.wire.replies.finish` is the one place where replies become values or typed
errors, for every driver and topology, so keys, arguments and reply parsing exist exactly once.
This module does not import redis-py (:mod:`echomq_core.wire.replies` does): every operation module
imports it, and a process that only defines flows (a DAG file, a Dagster code server) does not
load a client it never makes.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .scripts import Script, script

T = TypeVar("T")

#: The most items (jobs, children) one script call takes: batches are cut into chunks of at most
#: this many (Lua's unpack limit, and a bounded time inside the server), and all the chunks of a
#: step travel in one pipeline, so a bulk call costs one round trip, not one per item.
CHUNK = 500


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
    :data:`~echomq_core.wire.cluster.DURABLE_WAIT_MS` comes back as
    :class:`~echomq_core.errors.ConnectionLost` (it ran; the caller must be able to send it
    again). The same as :class:`Lenient` elsewhere."""


#: An operation: yields steps (lists of calls), receives their replies, returns its result.
Op = Generator[list[Call], list[Any], T]


def scored(flat: Any) -> list[tuple[Any, Any]]:
    """A ``WITHSCORES`` reply as (member, score) pairs, whichever the driver gave: RESP2's
    flat list (members and scores alternating) or redis-py's own pairs."""
    if flat and isinstance(flat[0], list | tuple):
        return [(m, sc) for m, sc in flat]
    return list(zip(flat[::2], flat[1::2], strict=True))


def chunks(items: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
