"""The Cluster router: the routing and re-send rules of one step on a Redis Cluster.

A step (:mod:`echomq_core.wire.calls`) is routed here, not by redis-py's cluster pipeline: the hash
slot of each call comes from its first key, computed locally (scripts carry their keys in
``KEYS``), and the calls of each master go in one write, every master written before any is
read. The replies decide what happens next - patch the slot map after ``MOVED``, follow
``ASK`` with ``ASKING``, wait out ``CLUSTERDOWN`` / ``LOADING`` for
:data:`CLUSTER_RETRY_WINDOW` and a slot being moved for ``migration_wait``, refresh the
topology when a node cannot be reached - and a call is sent again only when the server
guarantees it did not run. :class:`Step` holds those rules for both drivers
(:mod:`echomq_core.wire.drivers`), which only do the I/O of each round.

Why each rule is what it is - the re-send rule, redis-py's cluster pipeline, a slot migration,
:class:`~echomq_core.wire.calls.Durable` steps and the counters of ``Connection.stats`` - is in
``docs/CLUSTER.md``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    MovedError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)

from .. import errors
from .calls import Call
from .replies import is_noscript
from .scripts import Script
from .slots import key_slot
from .targets import MIGRATION_WAIT

log = logging.getLogger("echomq_core.cluster")

#: How long (s) one step keeps being sent again while a Cluster answers CLUSTERDOWN, MASTERDOWN
#: or LOADING, or a slot has no known owner; then it comes back as ConnectionLost.
CLUSTER_RETRY_WINDOW = 5.0
#: The least time (s) between two topology refreshes (CLUSTER SLOTS) of one connection.
REFRESH_EVERY = 0.2
#: How long (ms) a :class:`~echomq_core.wire.calls.Durable` step waits for the replicas of each
# master.
DURABLE_WAIT_MS = 1000
#: The most MOVED replies one call follows at once; past them it waits between moves.
_MAX_MOVES = 5
#: The most rounds in a row a step may make without waiting (a safety net: every redirect
#: that can repeat - MOVED, TRYAGAIN, ASK to an unknown node - waits).
_MAX_FAST_ROUNDS = 32
#: The suffix, after a queue's hash tag, of the key the router probes to learn where a slot
#: is being moved (nobody writes it; a read of a missing key makes the source answer ASK).
_PROBE = ":migration-probe"
#: Commands without a key: sent to the client's default node.
_KEYLESS = frozenset({"PING", "ECHO", "TIME", "INFO", "SCRIPT", "CLUSTER", "COMMAND", "DBSIZE"})


def _key_slot(key: Any) -> int:
    return key_slot(key.encode() if isinstance(key, str) else bytes(key))


def _first_key(args: Sequence[Any]) -> Any:
    """The key a command is routed by: a script's first key (``EVALSHA sha numkeys key ...``),
    every other command's first argument; None for a command without a key."""
    name = str(args[0]).upper()
    if name in ("EVALSHA", "EVAL"):
        return args[3] if int(args[2]) > 0 else None
    if name in _KEYLESS or len(args) < 2:
        return None
    if name == "XREAD":  # XREAD [COUNT n] [BLOCK ms] STREAMS key id: the key follows STREAMS
        words = [str(a).upper() for a in args]
        return args[words.index("STREAMS") + 1]
    return args[1]


def slot_of(args: Sequence[Any]) -> int | None:
    """The hash slot a command goes to, computed locally; None for a command without a key."""
    key = _first_key(args)
    return None if key is None else _key_slot(key)


def _hash_tag(key: Any) -> tuple[str, str] | None:
    """A key's hash tag (the queue name, for EchoMQ's keys) and the key up to the end of the
    tag (``<prefix>:{q}``: a key starting so is in the same slot and under the same prefix);
    None for a key without one."""
    text = key.decode(errors="replace") if isinstance(key, bytes | bytearray) else str(key)
    start = text.find("{")
    end = text.find("}", start + 1) if start >= 0 else -1
    if end <= start + 1:
        return None
    return text[start + 1 : end], text[: end + 1]


@dataclass(slots=True)
class Batch:
    """What one step sends to one node in one write, and what each reply answers: a call
    (its index), the ``ASKING`` before it, a script load, or the closing ``WAIT``."""

    node: Any  # redis.cluster.ClusterNode or redis.asyncio.cluster.ClusterNode
    wire: list[tuple[Any, ...]] = field(default_factory=list)
    answers: list[tuple[str, Any]] = field(default_factory=list)

    def add(self, kind: str, ref: Any, args: tuple[Any, ...]) -> None:
        self.wire.append(args)
        self.answers.append((kind, ref))

    @property
    def names(self) -> list[str]:
        """The command name of each reply (redis-py parses replies by command name)."""
        return [
            " ".join(map(str, args[:2])) if args[0] == "SCRIPT" else args[0] for args in self.wire
        ]


_UNSET: Any = object()


class Step:
    """The routing and re-send rules of one step on a Cluster, shared by both drivers: the
    driver asks for the batches of a round, sends them, and hands each node's replies back;
    this decides which calls are settled, which may be sent again, and what the driver must
    do before the next round (patch the slot map, refresh the topology, wait)."""

    def __init__(
        self,
        calls: Sequence[Call],
        durable: bool,
        where: str,
        stats: Counter[str],
        migration_wait: float = MIGRATION_WAIT,
    ):
        self.calls = calls
        self.durable = durable
        self.where = where
        self.stats = stats
        self.migration_wait = migration_wait
        self.slots = [slot_of(c.args) for c in calls]
        self.out: list[Any] = [_UNSET] * len(calls)
        self.asking: dict[int, str] = {}  # call -> the node an ASK named
        self.noscript: set[tuple[int, str]] = set()
        self.to_load: dict[str, set[Script]] = defaultdict(set)
        self.load_errors: dict[tuple[str, str], BaseException] = {}
        self.unsent: Counter[int] = Counter()
        self.why: dict[int, str] = {}  # why a call could not be sent
        self.moves: Counter[int] = Counter()
        self.moved: list[MovedError] = []  # for the driver: patch the slot map
        self.dead: set[str] = set()  # nodes whose connection could not be opened
        self.unreachable: set[str] = set()  # the same, for the whole step
        self.broken: set[str] = set()  # nodes whose connection broke after the write
        self.wait = 0.0  # how long the driver waits before the next round
        self.holds = 0
        self.since: dict[str, float] = {}  # kind of hold ("cluster", "migration") -> first
        self.held: dict[str, tuple[int, str]] = {}  # this round's holds: kind -> (call, why)
        self.reason = ""
        self.fast = 0  # rounds in a row without a wait
        self.moving: dict[int, tuple[str, str | None]] = {}  # slot -> (source, target)
        self.probes: dict[int, tuple[str, str]] = {}  # slot -> (source, key): to send
        self.probed: set[int] = set()

    def pending(self) -> list[int]:
        return [i for i, reply in enumerate(self.out) if reply is _UNSET]

    def _hold(self, reason: str, wait: float, *, call: int = -1, kind: str = "cluster") -> None:
        """A call must be sent again after a wait (the server did not run it); ``kind`` says
        which bound applies (``migration``: ``migration_wait``, else
        :data:`CLUSTER_RETRY_WINDOW`), counted from the step's first hold of that kind."""
        self.reason = reason
        self.held[kind] = (call, reason)
        self.since.setdefault(kind, time.monotonic())
        self.wait = max(self.wait, min(0.5, wait * 2 ** min(self.holds, 5)))

    def _lost(self, message: str) -> errors.ConnectionLost:
        return errors.ConnectionLost(f"cannot reach {self.where}: {message}")

    def route(self, nodes: Any, default_node: Callable[[], Any]) -> dict[str, Batch]:
        """The batches of this round, per node name, from the client's current slot map."""
        batches: dict[str, Batch] = {}
        for i in self.pending():
            asked = self.asking.get(i)
            slot = self.slots[i]
            if asked is not None:
                node = nodes.get_node(node_name=asked)
                if node is None:  # a node the map does not know yet: learn the topology first
                    self.asking.pop(i)
                    self.broken.add(asked)
                    self._hold(f"ASK to unknown node {asked}", 0.02, call=i, kind="migration")
                    continue
            elif slot is None:
                node = default_node()
                if node is None:
                    self.broken.add("")
                    self._hold("no default node", 0.05)
                    continue
            else:
                try:
                    node = nodes.get_node_from_slot(slot)
                except SlotNotCoveredError:
                    self.broken.add("")
                    self._hold(f"slot {slot} has no known owner", 0.05)
                    continue
            if self.unsent[i]:  # its node could not be reached: only another owner may help
                if node.name in self.unreachable:
                    self.out[i] = self._lost(self.why.get(i, self.reason))
                    continue
                self.stats["resent_unsent"] += 1
            batch = self._batch(batches, node)
            if asked is not None:
                batch.add("asking", i, ("ASKING",))
            batch.add("call", i, self.calls[i].args)
        for slot, (source, key) in self.probes.items():
            node = nodes.get_node(node_name=source)
            if node is not None:
                self._batch(batches, node).add("probe", slot, ("EXISTS", key))
        self.probes.clear()
        if self.durable:
            for batch in batches.values():
                replicas = self._replicas(nodes, batch)
                if replicas:
                    batch.add("wait", replicas, ("WAIT", replicas, DURABLE_WAIT_MS))
        return batches

    def _batch(self, batches: dict[str, Batch], node: Any) -> Batch:
        """The node's batch of this round, opened with the scripts it must load first."""
        batch = batches.get(node.name)
        if batch is None:
            batch = batches[node.name] = Batch(node)
            for s in self.to_load.get(node.name, ()):
                batch.add("load", s, ("SCRIPT", "LOAD", s.source))
        return batch

    def _replicas(self, nodes: Any, batch: Batch) -> int:
        """How many replicas the slot map lists for the batch's node (failed replicas are
        left out of CLUSTER SLOTS)."""
        for kind, ref in batch.answers:
            if kind == "call" and self.slots[ref] is not None:
                owners = nodes.slots_cache.get(self.slots[ref]) or []
                if owners and owners[0].name == batch.node.name:
                    return len(owners) - 1
        return 0

    def absorb(
        self, batch: Batch, replies: list[Any], error: BaseException | None, written: bool
    ) -> None:
        """Settle what one node answered. ``replies`` are the replies read, in order;
        ``error`` what broke the connection (the replies after it were not read);
        ``written``: whether anything was written (False: the connection never opened)."""
        name = batch.node.name
        if error is not None:
            (self.broken if written else self.dead).add(name)
            if not written:
                self.unreachable.add(name)
        done: list[int] = []
        confirmed = True
        for n, (kind, ref) in enumerate(batch.answers):
            reply = replies[n] if n < len(replies) else _UNSET
            if kind == "load":
                if reply is not _UNSET and isinstance(reply, BaseException):
                    self.load_errors[(name, ref.sha)] = reply
                elif reply is not _UNSET:
                    self.to_load[name].discard(ref)
            elif kind == "wait":
                if isinstance(reply, ResponseError):  # refused (an ACL without +wait)
                    self._wait_refused(name, reply)
                elif reply is _UNSET or isinstance(reply, BaseException) or int(reply) < ref:
                    confirmed = False
            elif kind == "probe":  # the source names the target; any other reply: unknown
                if isinstance(reply, AskError) and ref in self.moving:
                    self.moving[ref] = (self.moving[ref][0], f"{reply.host}:{reply.port}")
            elif kind == "call":
                if reply is _UNSET:
                    self._unread(ref, name, error, written)
                elif self._settle(ref, name, reply):
                    done.append(ref)
        if not confirmed:
            for i in done:
                if not isinstance(self.out[i], BaseException):
                    self.stats["unconfirmed"] += 1
                    self.out[i] = self._lost(
                        f"{name} ran the call, but its replicas did not confirm it within "
                        f"{DURABLE_WAIT_MS} ms"
                    )
            if batch.answers and batch.answers[-1][0] == "wait":
                self.broken.add(name)  # a replica may be gone: learn the topology again

    def _wait_refused(self, name: str, reply: BaseException) -> None:
        """WAIT refused: the writes stand unconfirmed rather than blocking every delivery."""
        self.stats["wait_refused"] += 1
        if self.stats["wait_refused"] == 1:
            log.warning(
                "%s refused WAIT (%s): deliveries are not confirmed by replicas; allow +wait "
                "(see docs/RELIABILITY.md)", name, reply,
            )  # fmt: skip

    def _unread(self, i: int, name: str, error: BaseException | None, written: bool) -> None:
        text = f"{type(error).__name__}: {error}" if error is not None else "no reply"
        if not written and self.unsent[i] == 0:
            self.unsent[i] += 1  # nothing was written: send it again if the map changes
            self.asking.pop(i, None)
            self.why[i] = f"{name}: {text}"
        elif not written:
            self.out[i] = self._lost(f"{name}: {text}")
        else:
            self.stats["lost_in_flight"] += 1
            self.out[i] = self._lost(f"{name}: {text} (the call may or may not have run)")

    def _settle(self, i: int, name: str, reply: Any) -> bool:
        """Record a reply; False when the call is to be sent again."""
        asked = self.asking.pop(i, None)
        if isinstance(reply, MovedError):
            self.stats["moved"] += 1
            self.moves[i] += 1
            self.moved.append(reply)
            if self.moves[i] > _MAX_MOVES:  # the owners disagree: a handover under way
                self._hold(f"MOVED {self.moves[i]} times", 0.02, call=i, kind="migration")
            return False
        elif isinstance(reply, AskError):
            self.stats["ask"] += 1
            self.asking[i] = f"{reply.host}:{reply.port}"
            slot = self.slots[i]
            if slot is not None:
                self.moving[slot] = (name, self.asking[i])
            return False
        elif isinstance(reply, TryAgainError):
            self.stats["tryagain"] += 1
            if asked is None:  # from the source: the target is known from an ASK, or probed
                self._source(i, name)
            self._hold("TRYAGAIN", 0.02, call=i, kind="migration")
            return False
        elif isinstance(reply, ClusterDownError):  # CLUSTERDOWN, MASTERDOWN
            self.stats["clusterdown"] += 1
            self.broken.add(name)
            self._hold(f"{name}: {reply}", 0.05)
            return False
        elif isinstance(reply, BusyLoadingError):
            self._hold(f"{name} is loading its data", 0.05)
            return False
        elif is_noscript(reply) and self.calls[i].script is not None:
            script_ = self.calls[i].script
            assert script_ is not None
            failed = self.load_errors.get((name, script_.sha))
            if (i, name) not in self.noscript and failed is None:
                self.stats["noscript"] += 1
                self.noscript.add((i, name))
                self.to_load[name].add(script_)
                return False
            self.out[i] = failed if failed is not None else reply
        else:
            self.out[i] = reply
        return True

    def _source(self, i: int, name: str) -> None:
        """``name`` answered TRYAGAIN for call ``i`` without an ASK: it is the slot's source.
        Unless an ASK named the target already, probe for it once in this step."""
        slot = self.slots[i]
        if slot is None:
            return
        known = self.moving.get(slot)
        if known is not None and known[0] == name:
            return
        self.moving[slot] = (name, None)
        tag = _hash_tag(_first_key(self.calls[i].args))
        if tag is not None and slot not in self.probed:
            self.probed.add(slot)
            self.probes[slot] = (name, tag[1] + _PROBE)

    def next_round(self) -> bool:
        """After a round: True when calls are left to send; settles them as lost when they
        have waited too long, or went round too often without a wait."""
        left = self.pending()
        if not left:
            return False
        self.fast = 0 if self.wait else self.fast + 1
        now = time.monotonic()
        for kind, (i, why) in self.held.items():
            window = self.migration_wait if kind == "migration" else CLUSTER_RETRY_WINDOW
            waited = now - self.since[kind]
            if waited < window:  # the last try is made when the bound is reached, not before
                self.wait = min(self.wait, window - waited)
            else:
                if kind == "migration":
                    message = f"{self.where}: {self._migration(i, why, window)}; it did not run"
                else:
                    message = (
                        f"cannot reach {self.where}: the Cluster did not serve the call within "
                        f"{window:g} s ({why}); it did not run"
                    )
                for j in left:
                    self.out[j] = errors.ConnectionLost(message)
                return False
        if self.fast > _MAX_FAST_ROUNDS:
            for j in left:
                self.out[j] = self._lost(
                    f"routed {self.fast} times without being served ({self.reason})"
                )
            return False
        return True

    def _migration(self, i: int, why: str, window: float) -> str:
        """What a call held by a slot migration waited for: the slot, its queue (the hash tag
        of EchoMQ's keys), the nodes it moves between, and the bound."""
        slot = self.slots[i] if i >= 0 else None
        tag = _hash_tag(_first_key(self.calls[i].args)) if i >= 0 else None
        what = "a slot" if slot is None else f"slot {slot}"
        what += f" of queue {tag[0]!r}" if tag is not None else ""
        source, target = self.moving.get(slot, (None, None)) if slot is not None else (None, None)
        if source is None:
            where = "is changing owner"
        elif target is None:
            where = f"is migrating away from {source}"
        else:
            where = f"is migrating from {source} to {target}"
        return f"{what} {where}: {why} for {window:g} s (migration_wait)"

    def after_round(self) -> tuple[list[MovedError], set[str], float]:
        """What the driver must do before the next round: the MOVED replies to patch the map
        with, the nodes that failed (learn the topology again), and how long to wait. Resets
        them."""
        moved, self.moved = self.moved, []
        failed = self.dead | self.broken
        self.dead, self.broken = set(), set()
        wait, self.wait = self.wait, 0.0
        self.held = {}
        if wait:
            self.holds += 1
        return moved, failed, wait
