"""One Pump thread per process for each (server, prefix, queues, Pump options).

Two waits of one process on flows with the same child queues (two inputs of a step, two
partitions of a range, the resource's run-long Pump and a wait on the same queues) would
otherwise start two Pumps on the same outboxes. :class:`PumpShare` counts the users of each
key, starts one thread for the first and stops (and joins) it with the last.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from echomq_core import EchoMQ, Pump


@dataclass
class _Shared:
    pump: Pump
    client: EchoMQ
    users: int


class PumpShare:
    """One Pump thread per process for each (server, prefix, Pump options) key."""

    _lock = threading.Lock()
    _live: dict[tuple[Any, ...], _Shared] = {}

    @classmethod
    def acquire(cls, key: tuple[Any, ...], make: Callable[[], tuple[EchoMQ, Pump]]) -> Pump:
        """Join the Pump for ``key``, starting it with ``make() -> (client, Pump)`` if none."""
        with cls._lock:
            shared = cls._live.get(key)
            if shared is None:
                client, pump = make()
                try:
                    pump.start()
                except BaseException:
                    client.close()
                    raise
                shared = cls._live[key] = _Shared(pump, client, 0)
            shared.users += 1
            return shared.pump

    @classmethod
    def release(cls, key: tuple[Any, ...], timeout: float) -> bool:
        """Leave the Pump for ``key``; the last user stops and joins it. Returns whether the
        thread is gone (False only if it outlived ``timeout``)."""
        with cls._lock:
            shared = cls._live.get(key)
            if shared is None:
                return True
            shared.users -= 1
            if shared.users > 0:
                return True
            del cls._live[key]
        thread = _thread_named(shared.pump.id)
        shared.pump.stop(timeout)
        shared.client.close()
        return thread is None or not thread.is_alive()

    @classmethod
    def live_pumps(cls) -> list[str]:
        """The ids of the Pumps this process runs now (for tests and diagnostics)."""
        with cls._lock:
            return [shared.pump.id for shared in cls._live.values()]


def _thread_named(name: str) -> threading.Thread | None:
    return next((t for t in threading.enumerate() if t.name == name), None)
