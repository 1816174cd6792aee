"""A queue's wake-up hint: an idle worker's fetcher and an idle Pump block on it (BZPOPMIN) instead
of polling, in groups of one Cluster slot, in slices well inside the socket timeout."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import EchoMQError
from ..wire.calls import Call, Op
from ..wire.slots import key_slot

log = logging.getLogger("echomq_core.worker")


#: The longest single BZPOPMIN of an idle fetcher or Pump (s): well inside redis-py's default socket
#: timeout (5 s), so a long ``max_poll`` is waited in slices, never as a read that times out,
#: and a stopping worker's fetcher sees the stop within one slice.
BLOCK_SLICE = 1.0


def wait_on_hints(
    perform: Callable[[Any], Any],
    keys: list[str],
    seconds: float,
    stop: threading.Event,
    what: str,
    warn: Callable[..., None] | None = None,
) -> bool:
    """Wait up to ``seconds`` for one of the wake-up hint ``keys`` (``wake``, or
    ``flow:outbox:wake``; one Cluster slot), or for ``stop``: BZPOPMIN in slices of
    :data:`BLOCK_SLICE`, so a blocked read ends well inside the socket timeout and a stop is
    seen within a slice. A failed wait is logged (``what`` failed) and the rest slept out.
    True when a hint was popped."""
    deadline = time.monotonic() + seconds
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            if perform(wait_for_hint(keys, min(left, BLOCK_SLICE))):
                return True
        except EchoMQError as exc:
            if not stop.is_set():  # a stopping client may be closing
                (warn or log.warning)("%s failed: %s", what, exc)
                stop.wait(max(0.0, deadline - time.monotonic()))
            return False
    return False


def hint_groups(hints: list[str], is_cluster: bool) -> list[list[str]]:
    """Wake-up hint keys (``wake`` or ``flow:outbox:wake``) grouped so that each group is one
    BZPOPMIN: one group on standalone, one per slot on a Cluster (a sharded queue's shards,
    or queues of different slots)."""
    if not is_cluster:
        return [hints] if hints else []
    groups: dict[int, list[str]] = {}
    for hint in hints:
        groups.setdefault(key_slot(hint.encode()), []).append(hint)
    return list(groups.values())


class HintWatch:
    """How an idle fetcher whose queues lie on several slots (a sharded queue's shards on a
    Cluster) blocks on all their hints: one waiter thread per slot group, for the worker's
    life, each blocking (BZPOPMIN, its own pooled connection) only while the fetcher is idle.
    A hint a waiter pops is kept (``popped``) until the fetcher's next wait takes it, also
    when the fetcher stopped waiting meanwhile: no hint this worker took is lost to it. A
    waiter may still pop within one slice after the fetcher found work (a hint another idle
    worker could have had; hints are never needed for correctness). One group: a plain
    :func:`wait_on_hints` on the fetcher's own thread, no waiter."""

    def __init__(
        self,
        perform: Callable[[Any], Any],
        stop: threading.Event,
        what: str,
        warn: Callable[..., None] | None = None,
    ) -> None:
        self.perform, self.stop, self.what, self.warn = perform, stop, what, warn
        self.idle = threading.Event()
        self.popped = threading.Event()
        self.wanted: set[tuple[str, ...]] = set()
        self.waiters: dict[tuple[str, ...], threading.Thread] = {}

    def wait(self, groups: list[list[str]], seconds: float) -> bool:
        """Wait up to ``seconds`` for a hint of any group (or ``stop``); True when one was
        popped (now or by a waiter since the last wait)."""
        if len(groups) == 1 and not self.waiters:
            return wait_on_hints(self.perform, groups[0], seconds, self.stop, self.what, self.warn)
        if self.popped.is_set():
            self.popped.clear()
            return True
        self.wanted = {tuple(g) for g in groups}
        for group in self.wanted:
            thread = self.waiters.get(group)
            if thread is None or not thread.is_alive():
                thread = threading.Thread(
                    target=self._waiter, args=(group,), daemon=True, name="echomq-wake"
                )
                self.waiters[group] = thread
                thread.start()
        self.idle.set()
        try:
            deadline = time.monotonic() + seconds
            while not self.stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if self.popped.wait(min(left, BLOCK_SLICE)):
                    self.popped.clear()
                    return True
            return False
        finally:
            self.idle.clear()

    def _waiter(self, group: tuple[str, ...]) -> None:
        while not self.stop.is_set():
            if not self.idle.wait(BLOCK_SLICE) or group not in self.wanted:
                continue
            if wait_on_hints(
                self.perform, list(group), BLOCK_SLICE, self.stop, self.what, self.warn
            ):
                self.popped.set()


def wake_queues(keys: Any, is_cluster: bool, names: list[str]) -> list[str] | None:
    """The queues an idle fetcher can block on in one BZPOPMIN (None: poll instead): all of
    them, unless a Cluster puts them on different slots."""
    if not is_cluster:
        return names
    slots = {key_slot(keys.wake(n).encode()) for n in names}
    return names if len(slots) == 1 else None


def wait_for_hint(keys: Sequence[str], timeout: float) -> Op[bool]:
    """One BZPOPMIN on wake-up hint keys (``wake`` or ``flow:outbox:wake``; they must share a
    Cluster slot) for at most ``timeout`` seconds. True when a hint was popped."""
    seconds = max(0.001, round(timeout, 3))  # 0 would block for ever
    (reply,) = yield [Call.cmd("BZPOPMIN", *keys, seconds)]
    return reply is not None
