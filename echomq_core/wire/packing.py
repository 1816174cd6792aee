"""Packing commands with hiredis where redis-py would pack them in Python.

redis-py packs a command argument by argument in Python unless its connection was given a
``command_packer`` - which neither Cluster client takes, nor any asyncio connection. A batch
completion has thousands of arguments and a 1,000,000-child add millions, so this module keeps
one hiredis packer per process and the three ways it is used: a standalone connection's
``command_packer`` (:func:`_packer`), an asyncio connection class that packs with it
(:func:`_fast_packing`), and a Cluster node's batches (:func:`pack_commands`). Without
hiredis everything goes the redis-py way.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any


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
