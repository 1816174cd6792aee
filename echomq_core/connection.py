"""The connector: URLs to clients, and the two drivers (sync, asyncio) of every operation.

Operations are written once, as generators that *yield* steps and *receive* replies (see
:mod:`echomq_core.ops`): an operation never touches a socket. A step is a list of
:class:`Call` sent as one pipeline - one round trip per server node - and the driver sends
the replies back into the generator. :class:`Connection` drives them with a synchronous
redis-py client, :class:`AsyncConnection` with ``redis.asyncio``; both share the reply
handling below, so keys, arguments and reply parsing exist exactly once.

Scripts are called by SHA. A ``NOSCRIPT`` reply (a restarted server, a new Cluster node, a
replica that took over) loads the missing script - on a Cluster, on the node that refused it -
and re-sends only the calls that were refused, once: a second NOSCRIPT is an error, not a loop.

URLs: ``redis://[user:password@]host:port/db``, ``rediss://`` for TLS, ``unix:///path``;
Cluster with ``redis+cluster://`` / ``rediss+cluster://`` or ``?cluster=true`` (or the
``cluster=True`` argument); ``?migration_wait=S`` (or the ``migration_wait=S`` argument, which
wins) bounds how long a call waits for a Cluster slot being moved (below). Passwords never
appear in reprs or error messages.

**No blind re-sends.** A call whose reply is lost after it was written may have run: re-sending
it runs it twice. Most EchoMQ writes are idempotent by id (holding a parent, landing a child
or adding a job whose id the caller chose, completions and heartbeats under a lease token,
deliveries recorded set-if-absent, outbox trims that re-check the head), but not all: a claim
leases a second batch (the first stays leased until its lease expires), and ``add`` / ``land``
with ids the host has just generated skip the existence check (``check`` '0': the first attempt
of ``add(job_id=None)``, ``add_bulk`` of bare payloads, the leaves of a freshly held flow)
and would write their rows and queue them a second time. So a call is sent again only when the
server guarantees it did not run: a ``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``,
``MASTERDOWN``, ``LOADING`` or ``NOSCRIPT`` reply, or a connection that could not be opened
before anything was written to it. Anything else that breaks a call - a connection dropped
after the call was written, a timeout - comes back as :class:`~echomq_core.errors.ConnectionLost`
(it took effect once, or not at all), and the caller's retry by id, or the Worker's and Pump's
loops, decide what happens next. Clients are made with ``Retry(NoBackoff(), 0)`` unless the
caller passes its own ``retry``, so redis-py does not re-send either; a dead idle connection is
still replaced transparently when it is taken from the pool.

**Cluster.** redis-py's cluster pipeline is not used: it re-sends the calls of a node whose
connection broke whatever ``retry`` says, and, to pick a routing policy for each ``EVALSHA``,
it asks the client's *default node* for the call's keys (``COMMAND GETKEYS``, one round trip
per call); once that node died, every pipeline failed before anything was sent - on healthy
masters too - and that failure path neither refreshes the topology nor replaces the default
node, so with retries off it never recovered (issue 12). Here the driver routes a step
itself: the hash slot of each call comes from its first key, computed locally (scripts carry
their keys in ``KEYS``: ``EVALSHA sha numkeys key ...``; every other command EchoMQ sends names
its key first), and the calls of each master go in one write on one pooled connection, every
master written before any is read. The replies decide what happens next:

* ``MOVED``: the slot map is patched and the call goes to the new owner (a failover, a
  finished reshard);
* ``ASK``: the call goes to the named node, preceded by ``ASKING`` on the same connection in
  the same write (a slot half-moved, and the source does not hold the call's keys);
* ``CLUSTERDOWN`` / ``MASTERDOWN`` (a master failed and no replica has taken over yet),
  ``LOADING``, or a slot missing from the map: the call is sent again after a short, growing
  wait (20 ms up to 500 ms), for at most :data:`CLUSTER_RETRY_WINDOW` seconds, then it comes
  back as ``ConnectionLost`` (it did not run);
* a slot being moved (a reshard): ``TRYAGAIN``, an ``ASK`` naming a node the map does not
  know, or a ``MOVED`` followed more than :data:`_MAX_MOVES` times (the owners disagree while
  the slot is handed over): the same growing wait, for at most ``migration_wait`` seconds
  (:data:`MIGRATION_WAIT` unless the URL or ``connect`` sets it), then ``ConnectionLost``
  naming the slot, its queue, and the two nodes;
* a connection that cannot be opened (the master is dead): the topology is refreshed (at most
  every :data:`REFRESH_EVERY` seconds per connection), a dead default node is replaced, and
  the call is sent again once if its slot now has another owner (the replica took over);
  otherwise ``ConnectionLost`` at once;
* a connection that breaks after the write, or times out: ``ConnectionLost`` for every call of
  that node whose reply was not read; the topology is refreshed for the next call.

**A slot migration.** A reshard moves a slot's keys in batches (``MIGRATE ... KEYS``) and
hands the slot over once every key is on the target. Meanwhile the source runs a call only if
it holds every key the call names, and the target (after ``ASKING``) only if it holds them all
or the call names one key; otherwise the source answers ``ASK`` (it holds none of them) and
either node ``TRYAGAIN``. EchoMQ's scripts name keys that do not exist yet (a result hash, an
index still empty), so most calls of a busy queue meet ``TRYAGAIN`` from the first batch to
the handover: the queue pauses for as long as the migration runs, and its calls wait rather
than fail. The bound counts from a step's first such reply (a step: one driver call, one round
trip per master); what is still held then comes back as ``ConnectionLost``. When a source
answers ``TRYAGAIN`` to a call that met no ``ASK``, the router learns where the slot goes with
one ``EXISTS`` of a key nobody writes (``<prefix>:{q}:migration-probe``: the source answers
``ASK target``), once per step, so that error can name both nodes.

Sending again after ``MOVED``, ``ASK`` or ``TRYAGAIN`` is safe for every call, idempotent or
not: a node checks the keys a command or script names against its slots before it runs
anything (a script is refused whole, and cannot meet a ``MIGRATE`` half-way: both are atomic),
and ``ASKING`` only lets the next command of its connection through that check. So a claim
(run twice, it would lease a second batch) and an ``add`` of fresh ids (``check`` '0': it would
queue its jobs twice) are sent again as safely as a completion or heartbeat under a lease
token, a flow add of caller-chosen ids, or a delivery recorded set-if-absent, which would even
be harmless run twice. What the rule still refuses is the re-send of a call written on a
connection that broke before its reply was read: that one may have run.

A :class:`Durable` step (the Pump's deliveries) also waits, on each master that the topology
lists replicas for, until those replicas have the step's writes (``WAIT``, up to
:data:`DURABLE_WAIT_MS`); a call the replicas did not confirm comes back as ``ConnectionLost``
although it ran, so the Pump keeps the signal and redelivers it (harmless) rather than trim an
outbox on one master for a delivery that a failover of another master could still lose. (A
server that refuses ``WAIT`` - an ACL without ``+wait`` - is logged once and counted as
``wait_refused``; the step then goes on as a plain :class:`Lenient` one.)
:attr:`Connection.stats` counts what the router met (``moved``, ``ask``, ``tryagain``,
``clusterdown``, ``noscript``, ``refresh``, ``resent_unsent``, ``lost_in_flight``,
``unconfirmed``, ``wait_refused``; not exact when threads share the connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from . import errors
from .checks import check_seconds

if TYPE_CHECKING:  # imported when an async client is made: it costs every CLI start
    import redis.asyncio
    import redis.asyncio.cluster
from .scripts import Script, script

T = TypeVar("T")
log = logging.getLogger(__name__)

_SCHEMES = {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"}
_TRANSPORT_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException)
#: Error replies that redis-py raises as connection errors although the connection is fine and
#: the reply was read in full (the call did not run).
_REPLY_ERRORS = (BusyLoadingError, AuthenticationError, AuthorizationError)

#: How long (s) one step keeps being sent again while a Cluster answers CLUSTERDOWN, MASTERDOWN
#: or LOADING, or a slot has no known owner; then it comes back as ConnectionLost.
CLUSTER_RETRY_WINDOW = 5.0
#: How long (s) one step keeps being sent again while its slot is being moved (TRYAGAIN), unless
#: the connection's ``migration_wait`` says otherwise: a reshard of a busy slot, moving its keys
#: in small batches, can take tens of seconds, and the queue's calls wait for the handover.
MIGRATION_WAIT = 60.0
#: The most seconds ``migration_wait`` may be.
MAX_MIGRATION_WAIT = 86400.0
#: The least time (s) between two topology refreshes (CLUSTER SLOTS) of one connection.
REFRESH_EVERY = 0.2
#: How long (ms) a :class:`Durable` step waits for the replicas of each master.
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
    :data:`DURABLE_WAIT_MS` comes back as :class:`~echomq_core.errors.ConnectionLost` (it ran;
    the caller must be able to send it again). The same as :class:`Lenient` elsewhere."""


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
        if isinstance(reply, errors.EchoMQError):  # the Cluster router's own verdicts
            first = first or reply
            out.append(reply)
        elif isinstance(reply, ResponseError):
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


# -- the Cluster router -------------------------------------------------------------------


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
class _Batch:
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


class _Step:
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

    def route(self, nodes: Any, default_node: Callable[[], Any]) -> dict[str, _Batch]:
        """The batches of this round, per node name, from the client's current slot map."""
        batches: dict[str, _Batch] = {}
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

    def _batch(self, batches: dict[str, _Batch], node: Any) -> _Batch:
        """The node's batch of this round, opened with the scripts it must load first."""
        batch = batches.get(node.name)
        if batch is None:
            batch = batches[node.name] = _Batch(node)
            for s in self.to_load.get(node.name, ()):
                batch.add("load", s, ("SCRIPT", "LOAD", s.source))
        return batch

    def _replicas(self, nodes: Any, batch: _Batch) -> int:
        """How many replicas the slot map lists for the batch's node (failed replicas are
        left out of CLUSTER SLOTS)."""
        for kind, ref in batch.answers:
            if kind == "call" and self.slots[ref] is not None:
                owners = nodes.slots_cache.get(self.slots[ref]) or []
                if owners and owners[0].name == batch.node.name:
                    return len(owners) - 1
        return 0

    def absorb(
        self, batch: _Batch, replies: list[Any], error: BaseException | None, written: bool
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
        elif _is_noscript(reply) and self.calls[i].script is not None:
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


class Connection:
    """Drives operations with a synchronous redis-py client (standalone or Cluster)."""

    def __init__(
        self,
        client: redis.Redis | redis.cluster.RedisCluster,
        *,
        where: str,
        migration_wait: float = MIGRATION_WAIT,
    ) -> None:
        self.client = client
        self.where = where
        #: How long (s) a step waits for a slot being moved (see the module docstring).
        self.migration_wait = migration_wait
        self.is_cluster = isinstance(client, redis.cluster.RedisCluster)
        #: What the Cluster router met (see the module docstring); empty on standalone.
        self.stats: Counter[str] = Counter()
        self._refreshed = float("-inf")
        self._refresh_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Connection({self.where})"

    def perform(self, op: Op[T]) -> T:
        """Run an operation to its end; each step costs one round trip (per node)."""
        try:
            step = next(op)
            while True:
                step = op.send(self.execute(step))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def execute(self, calls: list[Call]) -> list[Any]:
        if self.is_cluster:
            replies = self._execute_cluster(calls)
            return _finish(calls, replies, isinstance(calls, Lenient))
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

    # -- Cluster ---------------------------------------------------------------------------

    def _execute_cluster(self, calls: Sequence[Call]) -> list[Any]:
        client = self.client
        assert isinstance(client, redis.cluster.RedisCluster)
        step = _Step(calls, isinstance(calls, Durable), self.where, self.stats, self.migration_wait)
        while True:
            self._round(step, step.route(client.nodes_manager, client.get_default_node))
            if not step.next_round():
                return step.out
            moved, failed, wait = step.after_round()
            for redirect in moved:
                client.nodes_manager.move_slot(redirect)
            if failed:
                self._refresh(failed)
            if wait:
                time.sleep(wait)

    def _round(self, step: _Step, batches: dict[str, _Batch]) -> None:
        """Write every node's batch, then read every node's replies (one round trip in all)."""
        client = self.client
        assert isinstance(client, redis.cluster.RedisCluster)
        opened: list[tuple[_Batch, Any, Any]] = []
        try:
            for batch in batches.values():
                try:
                    node_client = client.get_redis_connection(batch.node)
                    conn = node_client.connection_pool.get_connection()
                except _TRANSPORT_ERRORS as exc:  # nothing was written
                    step.absorb(batch, [], exc, written=False)
                    continue
                opened.append((batch, node_client, conn))
                try:
                    conn.send_packed_command(conn.pack_commands(batch.wire))  # type: ignore[no-untyped-call]
                except _TRANSPORT_ERRORS as exc:  # part of it may have gone out
                    opened.pop()
                    conn.disconnect()  # type: ignore[no-untyped-call]
                    node_client.connection_pool.release(conn)
                    step.absorb(batch, [], exc, written=True)
            while opened:
                batch, node_client, conn = opened[0]
                replies: list[Any] = []
                error: BaseException | None = None
                try:
                    for name in batch.names:
                        try:
                            replies.append(node_client.parse_response(conn, name))
                        except (ResponseError, *_REPLY_ERRORS) as exc:
                            replies.append(exc)
                except _TRANSPORT_ERRORS as exc:
                    error = exc
                    conn.disconnect()
                opened.pop(0)
                node_client.connection_pool.release(conn)
                step.absorb(batch, replies, error, written=True)
        finally:  # interrupted: no connection goes back to its pool with replies still due
            for _batch, node_client, conn in opened:
                conn.disconnect()
                node_client.connection_pool.release(conn)

    def _refresh(self, failed: set[str]) -> None:
        """Learn the topology again (after a node failed) and replace a dead default node."""
        client = self.client
        assert isinstance(client, redis.cluster.RedisCluster)
        with self._refresh_lock:
            now = time.monotonic()
            if now - self._refreshed < REFRESH_EVERY:
                return
            self._refreshed = now
        self.stats["refresh"] += 1
        last = next(iter(sorted(failed - {""})), None)
        # When no node answers, the next call fails with ConnectionLost, and tries again.
        with contextlib.suppress(RedisClusterException, RedisError, OSError):
            client.nodes_manager.initialize(last_failed_node_name=last)
        default = client.get_default_node()  # type: ignore[no-untyped-call]
        if default is None or default.name in failed:
            client.replace_default_node()

    def close(self) -> None:
        self.client.close()


class AsyncConnection:
    """Drives the same operations with ``redis.asyncio`` (for triggers and async apps)."""

    def __init__(
        self,
        client: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster,
        *,
        where: str,
        migration_wait: float = MIGRATION_WAIT,
    ) -> None:
        import redis.asyncio.cluster

        self.client = client
        self.where = where
        #: How long (s) a step waits for a slot being moved (see the module docstring).
        self.migration_wait = migration_wait
        self.is_cluster = isinstance(client, redis.asyncio.cluster.RedisCluster)
        #: What the Cluster router met (see the module docstring); empty on standalone.
        self.stats: Counter[str] = Counter()
        self._refreshed = float("-inf")

    def __repr__(self) -> str:
        return f"AsyncConnection({self.where})"

    async def perform(self, op: Op[T]) -> T:
        try:
            step = next(op)
            while True:
                step = op.send(await self.execute(step))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def execute(self, calls: list[Call]) -> list[Any]:
        if self.is_cluster:
            replies = await self._execute_cluster(calls)
            return _finish(calls, replies, isinstance(calls, Lenient))
        replies = await self._send(calls)
        missing = [i for i, r in enumerate(replies) if _is_noscript(r)]
        if missing:
            for s in {calls[i].script for i in missing if calls[i].script is not None}:
                assert s is not None
                try:
                    await self.client.script_load(s.source)
                except ResponseError as exc:  # as the sync driver's _load: a typed error
                    raise errors.from_reply(str(exc)) from None
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
        finally:
            await pipe.reset()  # type: ignore[no-untyped-call]

    def _lost(self, exc: BaseException) -> errors.ConnectionLost:
        return errors.ConnectionLost(f"cannot reach {self.where}: {type(exc).__name__}: {exc}")

    # -- Cluster ---------------------------------------------------------------------------

    async def _execute_cluster(self, calls: Sequence[Call]) -> list[Any]:
        import redis.asyncio.cluster

        client = self.client
        assert isinstance(client, redis.asyncio.cluster.RedisCluster)
        try:
            await client.initialize()  # once: learns the topology on the first call
        except (*_TRANSPORT_ERRORS, RedisError) as exc:
            raise self._lost(exc) from None
        step = _Step(calls, isinstance(calls, Durable), self.where, self.stats, self.migration_wait)
        while True:
            batches = step.route(client.nodes_manager, client.get_default_node)
            await asyncio.gather(*(self._send_batch(step, batch) for batch in batches.values()))
            if not step.next_round():
                return step.out
            moved, failed, wait = step.after_round()
            for redirect in moved:
                await client.nodes_manager.move_slot(redirect)
            if failed:
                await self._refresh(failed)
            if wait:
                await asyncio.sleep(wait)

    @staticmethod
    async def _send_batch(step: _Step, batch: _Batch) -> None:
        node = batch.node
        try:
            conn = node.acquire_connection()
        except _TRANSPORT_ERRORS as exc:  # MaxConnectionsError
            step.absorb(batch, [], exc, written=False)
            return
        replies: list[Any] = []
        error: BaseException | None = None
        written = clean = False
        try:
            await node.disconnect_if_needed(conn)
            if not conn.is_connected:
                await conn.connect()
            written = True
            await conn.send_packed_command(conn.pack_commands(batch.wire))
            for name in batch.names:
                try:
                    replies.append(await node.parse_response(conn, name))
                except (ResponseError, *_REPLY_ERRORS) as exc:
                    replies.append(exc)
            clean = True
        except _TRANSPORT_ERRORS as exc:
            error = exc
        finally:
            if not clean:  # a reply may still be on its way: this connection is done
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
            node.release(conn)
        step.absorb(batch, replies, error, written)

    async def _refresh(self, failed: set[str]) -> None:
        import redis.asyncio.cluster

        client = self.client
        assert isinstance(client, redis.asyncio.cluster.RedisCluster)
        now = time.monotonic()
        if now - self._refreshed < REFRESH_EVERY:
            return
        self._refreshed = now
        self.stats["refresh"] += 1
        last = next(iter(sorted(failed - {""})), None)
        # When no node answers, the next call fails with ConnectionLost, and tries again.
        with contextlib.suppress(RedisClusterException, RedisError, OSError):
            await client.nodes_manager.initialize(last_failed_node_name=last)
        default = client.get_default_node()
        if default is None or default.name in failed:
            client.replace_default_node()

    async def close(self) -> None:
        await self.client.aclose()


# -- URLs ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed connection URL: what to connect to, with the password kept out of reprs."""

    url: str  # the URL redis-py gets (EchoMQ's own parameters removed); holds the password
    cluster: bool
    where: str  # host:port/db for messages, never the password
    migration_wait: float | None = None  # ?migration_wait= (seconds), if the URL sets it

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
    wait = query.pop("migration_wait", None)
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
    return Target(clean, is_cluster, where, None if wait is None else migration_wait(wait))


def migration_wait(value: Any) -> float:
    """A ``migration_wait`` (seconds, from a URL parameter or a keyword argument), checked:
    :class:`ConfigurationError` unless it is a finite number in 0..:data:`MAX_MIGRATION_WAIT`
    (0: a call of a slot being moved fails at its first ``TRYAGAIN``)."""
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    try:
        return check_seconds("migration_wait", number, 0.0, MAX_MIGRATION_WAIT)
    except errors.InvalidArgument:
        raise errors.ConfigurationError(
            f"migration_wait must be a number of seconds between 0 and {MAX_MIGRATION_WAIT:g}, "
            f"got {value!r:.40}"
        ) from None


class _Packer:
    """Packs a command with hiredis, as redis-py's own hiredis packer does, without the pass
    that packer makes over every argument to turn ``bytearray`` / ``memoryview`` into
    ``bytes`` (EchoMQ never sends those, and a completion of 500 jobs has ~2,500 arguments):
    a quarter of a no-op worker's CPU went there. Such an argument, or a command name with a
    space (``CLIENT SETINFO``), goes the redis-py way."""

    def __init__(self) -> None:
        from redis.connection import HiredisRespSerializer

        self._slow = HiredisRespSerializer()

    def pack(self, *args: Any) -> list[bytes]:
        first = args[0]
        if (isinstance(first, str) and " " not in first) or (
            isinstance(first, bytes) and b" " not in first
        ):
            try:
                return [_pack_command(args)]
            except TypeError:
                pass  # a bytearray or memoryview (or a bad value: redis-py raises DataError)
        return self._slow.pack(*args)  # type: ignore[no-any-return]


try:
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - hiredis is optional: redis-py packs in Python
    _PACKER = None
else:
    _PACKER = _Packer()


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
    wait = _wait_for(target, migration_wait)
    options.setdefault("retry", Retry(NoBackoff(), 0))  # no blind re-sends: see the module doc
    if _PACKER is not None and not target.cluster:
        options.setdefault("command_packer", _PACKER)
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
    wait = _wait_for(target, migration_wait)
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
    return AsyncConnection(client, where=target.where, migration_wait=wait)


def _wait_for(target: Target, given: float | None) -> float:
    """The keyword argument wins over the URL parameter, as ``cluster=`` does."""
    if given is not None:
        return migration_wait(given)
    return MIGRATION_WAIT if target.migration_wait is None else target.migration_wait


def _check_options(pool: Any) -> None:
    """Build (without connecting) one connection from the pool's settings, so an unknown
    option or a bad TLS flag in the URL is a :class:`ConfigurationError` now, not a
    ``TypeError`` on the first call."""
    pool.connection_class(**pool.connection_kwargs)


def _async_no_retry() -> Any:
    from redis.asyncio.retry import Retry as AsyncRetry

    return AsyncRetry(NoBackoff(), 0)
