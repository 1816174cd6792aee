"""A Redis Cluster on one host, for the tests: formed from EmbeddedServer nodes, with
replicas, failovers, node restarts and slot migrations under running clients.

Test harness, not runtime: nothing installed needs it (the wheel does not ship it, and
tests/test_packaging.py checks that). The nodes are :class:`echomq_core.server.EmbeddedServer`
processes started with ``cluster=True``; this module forms them into a cluster and asks the live
nodes about the topology (CLUSTER SLOTS / NODES / INFO), never a cached plan.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import redis
from redis.crc import key_slot

from echomq_core.errors import ServerStartError
from echomq_core.server import EmbeddedServer, _command, _family, find_server_binary

log = logging.getLogger(__name__)

CLUSTER_SLOTS = 16384
_POLL = 0.02

# Every cluster started and not stopped, so that interpreter exit -- a test run that fails
# half-way included -- never leaves its nodes or its temporary directory behind.
_live: set[EmbeddedCluster] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all_at_exit() -> None:
    with _live_lock:
        pending = list(_live)
    for cluster in pending:
        try:
            cluster.stop()
        except Exception:  # pragma: no cover - best effort at interpreter exit
            log.exception("failed to stop %r at exit", cluster)


def _slot_map(server: EmbeddedServer) -> set[tuple[int, int, str, int, str]]:
    """``(first, last, ip, port, node_id)`` for each slot range in the node's CLUSTER SLOTS."""
    reply = _command(server.host, server.port, "CLUSTER", "SLOTS")
    return {(int(e[0]), int(e[1]), str(e[2][0]), int(e[2][1]), str(e[2][2])) for e in reply}


#: One slot range as a node sees it: (first, last, master port, replica ports).
Layout = frozenset[tuple[int, int, int, frozenset[int]]]


def _layout(server: EmbeddedServer) -> Layout:
    """The node's CLUSTER SLOTS as ranges with their master's and replicas' ports (a node
    leaves replicas it considers failed out of CLUSTER SLOTS)."""
    reply = _command(server.host, server.port, "CLUSTER", "SLOTS")
    return frozenset(
        (int(e[0]), int(e[1]), int(e[2][1]), frozenset(int(r[1]) for r in e[3:])) for e in reply
    )


def _cluster_info(server: EmbeddedServer) -> dict[str, str]:
    reply = _command(server.host, server.port, "CLUSTER", "INFO")
    return dict(line.split(":", 1) for line in str(reply).splitlines() if ":" in line)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One line of a node's CLUSTER NODES."""

    id: str
    port: int
    flags: frozenset[str]
    master_id: str | None  # None for a master
    slots: tuple[tuple[int, int], ...]
    connected: bool

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})


def _nodes_view(server: EmbeddedServer) -> list[NodeView]:
    reply = _command(server.host, server.port, "CLUSTER", "NODES")
    out = []
    for line in str(reply).splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        address = fields[1].split(",", 1)[0].split("@", 1)[0]
        slots = []
        for spec in fields[8:]:
            if spec.startswith("["):  # a slot being imported or migrated: [slot->-id]
                continue
            first, _, last = spec.partition("-")
            slots.append((int(first), int(last or first)))
        out.append(
            NodeView(
                id=fields[0],
                port=int(address.rsplit(":", 1)[1]),
                flags=frozenset(fields[2].split(",")),
                master_id=None if fields[3] == "-" else fields[3],
                slots=tuple(slots),
                connected=fields[7] == "connected",
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class Migration:
    """What :meth:`EmbeddedCluster.migrate_slot` did."""

    slot: int
    source: int  # ports
    target: int
    keys: int
    batches: int
    seconds: float


class EmbeddedCluster:
    """A Redis Cluster of ``masters`` EmbeddedServer masters, each with ``replicas`` replicas,
    on one host.

    start() returns only once every node agrees on the full slot map (and every replica is
    attached and in sync), so a RedisCluster client created right afterwards sees a stable
    topology instead of transient MOVED or CLUSTERDOWN.

    ``servers`` lists the masters first (in slot order), then the replicas (``replicas`` per
    master, in the masters' order). Roles change when a master fails over; the topology
    helpers (:meth:`server_for_slot`, :meth:`current_masters`, :meth:`wait_for_failover`,
    :meth:`wait_healthy`, :meth:`migrate_slot`) always ask the live nodes.

    ``node_timeout_ms`` sets ``cluster-node-timeout`` (the server default is 15 s; failover
    tests want 1-2 s). With replicas, nodes also get ``repl-diskless-sync-delay 0`` (a replica
    attaching does not wait 5 s for company) and ``cluster-replica-validity-factor 0`` (a
    replica always takes over, however long its link was down).
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        replicas: int = 0,
        node_timeout_ms: int | None = None,
        host: str = "127.0.0.1",
        data_dir: str | os.PathLike[str] | None = None,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        binary: str | os.PathLike[str] | None = None,
    ) -> None:
        if not 1 <= masters <= CLUSTER_SLOTS:
            raise ValueError(f"masters must be in 1..{CLUSTER_SLOTS}, not {masters}")
        if not 0 <= replicas <= 8:
            raise ValueError(f"replicas must be in 0..8, not {replicas}")
        if node_timeout_ms is not None and node_timeout_ms < 100:
            raise ValueError(f"node_timeout_ms must be >= 100, not {node_timeout_ms}")
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.host = host
        self.appendonly = appendonly
        self.extra_args = tuple(extra_args)
        self.binary = Path(binary) if binary is not None else find_server_binary()
        self._owns_dir = data_dir is None
        tmp_dir = Path(tempfile.gettempdir()) / f"echomq-cluster-{uuid.uuid4().hex[:12]}"
        self.data_dir = tmp_dir if data_dir is None else Path(data_dir).resolve()
        self.servers: list[EmbeddedServer] = []
        self._ids: dict[int, str] = {}  # port -> node id (stable: kept in nodes.conf)
        # CLUSTER MEET and cluster-announce-ip need an address, not a host name.
        self._ip = str(socket.getaddrinfo(host, None, _family(host))[0][4][0])
        bounds = [CLUSTER_SLOTS * i // masters for i in range(masters + 1)]
        self._ranges = [(bounds[i], bounds[i + 1] - 1) for i in range(masters)]

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    @property
    def url(self) -> str:
        """URL of the first node; ``RedisCluster.from_url`` discovers the others from it."""
        if not self.servers:
            raise RuntimeError("the cluster has not been started")
        return self.servers[0].url

    def _node_args(self) -> list[str]:
        # Announcing the IP matters: a node that never receives a MEET (node 0, or the only
        # node) would otherwise list itself with an empty IP in CLUSTER SLOTS.
        args = ["--cluster-announce-ip", self._ip]
        if self.node_timeout_ms is not None:
            args += ["--cluster-node-timeout", str(self.node_timeout_ms)]
        if self.replicas:
            args += ["--repl-diskless-sync-delay", "0", "--cluster-replica-validity-factor", "0"]
        return args + list(self.extra_args)

    def start(self, timeout: float = 30.0) -> Self:
        """Start the nodes, assign slots, join the nodes, attach the replicas and wait until
        the topology is stable.

        Expect about 2 s: a master only reports cluster_state:ok once 2 s have passed since it
        started (the server's rejoin delay), whatever the gossip speed.
        """
        if self.servers and all(server.is_running() for server in self.servers):
            return self
        if self.servers:
            raise ServerStartError("a stopped EmbeddedCluster cannot be started again")
        began = time.monotonic()
        deadline = began + timeout
        with _live_lock:
            _live.add(self)
        try:
            for index in range(self.masters * (1 + self.replicas)):
                node_dir = self.data_dir / f"node-{index}"
                if (node_dir / "nodes.conf").exists():
                    raise ServerStartError(
                        f"{node_dir} holds a nodes.conf from an earlier cluster; EmbeddedCluster "
                        "always forms a new cluster and needs a fresh data_dir"
                    )
                server = EmbeddedServer(
                    host=self.host, data_dir=node_dir, appendonly=self.appendonly, cluster=True,
                    binary=self.binary, extra_args=self._node_args(),
                )  # fmt: skip
                self.servers.append(server)
                server.start(timeout=max(deadline - time.monotonic(), 1.0))
            self._form(deadline)
        except BaseException:
            self.stop()
            raise
        log.info(
            "%d-master cluster (%d replica(s) each) formed in %.2fs",
            self.masters, self.replicas, time.monotonic() - began,
        )  # fmt: skip
        return self

    def _form(self, deadline: float) -> None:
        ip = self._ip
        masters = self.servers[: self.masters]
        expected: set[tuple[int, int, int, frozenset[int]]] = set()
        for index, (server, (first, last)) in enumerate(zip(masters, self._ranges, strict=True)):
            # Distinct config epochs up front (as `redis-cli --cluster create` does) avoid a
            # round of epoch-collision resolution once the nodes meet.
            _command(server.host, server.port, "CLUSTER", "SET-CONFIG-EPOCH", index + 1)
            _command(server.host, server.port, "CLUSTER", "ADDSLOTSRANGE", first, last)
            followers = self.servers[self.masters + index * self.replicas :][: self.replicas]
            expected.add((first, last, server.port, frozenset(s.port for s in followers)))
        for server in self.servers:
            self._ids[server.port] = str(_command(server.host, server.port, "CLUSTER", "MYID"))
        # Meet every pair directly: learning about peers through gossip alone took up to 9 s
        # on Redis 7.0. The bus port must be given, as --cluster-port is set explicitly.
        for index, node in enumerate(self.servers):
            for peer in self.servers[index + 1 :]:
                _command(node.host, node.port, "CLUSTER", "MEET", ip, peer.port, peer.cluster_port)
        if self.replicas:
            self._attach_replicas(deadline)
        self._wait(deadline, lambda s: self._why_not_ready(s, frozenset(expected)))

    def _attach_replicas(self, deadline: float) -> None:
        """CLUSTER REPLICATE each replica to its master, once the replica has learned of the
        master through the MEETs (until then it answers "Unknown node")."""
        for index in range(self.masters):
            master_id = self._ids[self.servers[index].port]
            for replica in self.servers[self.masters + index * self.replicas :][: self.replicas]:
                while True:
                    try:
                        _command(replica.host, replica.port, "CLUSTER", "REPLICATE", master_id)
                        break
                    except redis.ResponseError as exc:
                        if time.monotonic() >= deadline:
                            raise ServerStartError(
                                f"{replica.url} cannot replicate {master_id}: {exc}"
                            ) from None
                        time.sleep(_POLL)

    def _wait(self, deadline: float, why_not: Any) -> None:
        while True:
            pending = [f"{s.url}: {why}" for s in self.servers if (why := why_not(s))]
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise ServerStartError("cluster did not converge in time:\n" + "\n".join(pending))
            time.sleep(_POLL)

    def _why_not_ready(self, server: EmbeddedServer, expected: Layout) -> str:
        """Why ``server`` does not yet see the final topology ('' once it does)."""
        if not server.is_running():
            raise ServerStartError(f"cluster node {server.url} died:\n{server._log_tail()}")
        try:
            info = _cluster_info(server)
            want = {"cluster_state": "ok", "cluster_known_nodes": str(len(self.servers)),
                    "cluster_slots_assigned": str(CLUSTER_SLOTS)}  # fmt: skip
            summary = ", ".join(f"{key}={info.get(key)}" for key in want)
            if any(info.get(key) != value for key, value in want.items()):
                return summary
            if _layout(server) != expected:
                return summary + ", CLUSTER SLOTS incomplete"
            return self._replica_lag(server)
        except (redis.RedisError, OSError, IndexError, TypeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"

    @staticmethod
    def _replica_lag(server: EmbeddedServer) -> str:
        """'' unless ``server`` is a replica whose link to its master is not up yet."""
        info = _command(server.host, server.port, "INFO", "replication")
        if info.get("role") == "slave" and info.get("master_link_status") != "up":
            return f"replica link {info.get('master_link_status')}"
        return ""

    # -- topology, as the live nodes see it ---------------------------------------------

    def node_id(self, server: EmbeddedServer) -> str:
        """The node's cluster id (stable across restarts: it is kept in nodes.conf)."""
        if server.port not in self._ids:
            self._ids[server.port] = str(_command(server.host, server.port, "CLUSTER", "MYID"))
        return self._ids[server.port]

    def _by_port(self, port: int) -> EmbeddedServer:
        return next(server for server in self.servers if server.port == port)

    def nodes_view(self) -> list[NodeView]:
        """CLUSTER NODES of the first live node that answers."""
        for server in filter(EmbeddedServer.is_running, self.servers):
            try:
                return _nodes_view(server)
            except (redis.RedisError, OSError, IndexError, ValueError):
                continue
        raise ServerStartError("no cluster node answers CLUSTER NODES")

    def current_masters(self) -> list[EmbeddedServer]:
        """Live masters that own slots, per a live node's CLUSTER NODES."""
        return [
            self._by_port(view.port) for view in self.nodes_view()
            if view.is_master and view.slots and not view.failing
            and self._by_port(view.port).is_running()
        ]  # fmt: skip

    def replicas_of(self, master: EmbeddedServer) -> list[EmbeddedServer]:
        master_id = self.node_id(master)
        return [self._by_port(v.port) for v in self.nodes_view() if v.master_id == master_id]

    def wait_for_failover(self, dead: EmbeddedServer, timeout: float = 30.0) -> float:
        """Wait until every live node routes no slot to ``dead`` (a replica took over) and
        reports cluster_state ok; return the seconds waited."""
        began = time.monotonic()

        def why_not(server: EmbeddedServer) -> str:
            if server is dead or not server.is_running():
                return ""
            try:
                info = _cluster_info(server)
                if info.get("cluster_state") != "ok":
                    return f"cluster_state={info.get('cluster_state')}"
                if any(port == dead.port for _f, _l, port, _r in _layout(server)):
                    return f"still routes slots to {dead.url}"
            except (redis.RedisError, OSError, IndexError, TypeError, ValueError) as exc:
                return f"{type(exc).__name__}: {exc}"
            return ""

        self._wait(began + timeout, why_not)
        return time.monotonic() - began

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Wait until every node runs, agrees on one slot map covering every slot, reports
        cluster_state ok and no failing node, and every master has its ``replicas`` replicas
        attached and in sync. Roles may differ from the start (after failovers)."""
        deadline = time.monotonic() + timeout
        for server in self.servers:
            if not server.is_running():
                raise ServerStartError(f"cluster node {server.url} is not running")
        while True:
            layouts: set[Layout] = set()
            pending = [
                f"{s.url}: {why}" for s in self.servers if (why := self._why_unhealthy(s, layouts))
            ]
            if not pending and len(layouts) > 1:
                pending = ["nodes disagree on the slot map"]
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise ServerStartError("cluster is not healthy:\n" + "\n".join(pending))
            time.sleep(_POLL)

    def _why_unhealthy(self, server: EmbeddedServer, layouts: set[Layout]) -> str:
        try:
            info = _cluster_info(server)
            if info.get("cluster_state") != "ok":
                return f"cluster_state={info.get('cluster_state')}"
            if info.get("cluster_known_nodes") != str(len(self.servers)):
                return f"cluster_known_nodes={info.get('cluster_known_nodes')}"
            failing = [v.port for v in _nodes_view(server) if v.failing]
            if failing:
                return f"sees failing nodes {failing}"
            layout = _layout(server)
            layouts.add(layout)
            covered = sum(last - first + 1 for first, last, _m, _r in layout)
            if covered != CLUSTER_SLOTS:
                return f"{covered} slots covered"
            short = sorted({m for _f, _l, m, r in layout if len(r) != self.replicas})
            if short:
                return f"masters {short} without {self.replicas} replica(s)"
            return self._replica_lag(server)
        except (redis.RedisError, OSError, IndexError, TypeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def restart_node(self, server: EmbeddedServer, timeout: float = 60.0) -> None:
        """Start a killed node again on its port and data (its AOF and nodes.conf): a master
        that was failed over rejoins as a replica of the node that replaced it. Waits until
        the cluster is healthy again."""
        server.start(timeout=min(timeout, 30.0))
        self.wait_healthy(timeout)

    def migrate_slot(
        self,
        slot: int,
        target: EmbeddedServer,
        *,
        batch: int = 100,
        pause: float = 0.0,
        on_batch: Any = None,
        before_handover: Any = None,
        timeout_ms: int = 10_000,
    ) -> Migration:
        """Move ``slot`` (and its keys) to ``target`` while clients keep running, as
        ``valkey-cli --cluster reshard`` does: SETSLOT IMPORTING on the target and MIGRATING
        on the source, then GETKEYSINSLOT + MIGRATE ... KEYS in batches of ``batch`` keys
        (``pause`` seconds between batches; ``on_batch(batches, keys)`` after each), then
        ``before_handover()`` (every key is on the target, the slot still half-moved), then
        SETSLOT NODE on the target, the source and every other master. While the slot is
        half-moved, clients meet ``ASK`` (a key that is not on the source) and ``TRYAGAIN`` (a
        multi-key call whose keys are not all on one node)."""
        source = self.server_for_slot(slot)
        if source is target:
            raise ValueError(f"slot {slot} is already on {target.url}")
        began = time.monotonic()
        source_id, target_id = self.node_id(source), self.node_id(target)
        _command(target.host, target.port, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        _command(source.host, source.port, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        keys = batches = 0
        while True:
            names = _command(
                source.host, source.port, "CLUSTER", "GETKEYSINSLOT", slot, batch, decode=False
            )
            if not names:
                break
            reply = _command(
                source.host, source.port, "MIGRATE", target.host, target.port, "", 0,
                timeout_ms, "KEYS", *names, timeout=timeout_ms / 1000 + 2.0,
            )  # fmt: skip
            if reply not in ("OK", "NOKEY"):
                raise ServerStartError(f"MIGRATE of slot {slot} answered {reply!r}")
            keys += len(names)
            batches += 1
            if on_batch is not None:
                on_batch(batches, keys)
            if pause:
                time.sleep(pause)
        if before_handover is not None:
            before_handover()
        others = [m for m in self.current_masters() if m is not source and m is not target]
        for server in (target, source, *others):
            _command(server.host, server.port, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        return Migration(slot, source.port, target.port, keys, batches, time.monotonic() - began)

    def server_for_slot(self, slot: int) -> EmbeddedServer:
        """The node owning ``slot`` per a live node's CLUSTER SLOTS (the initial plan if none
        answers), so tests that migrate slots or fail masters over still get the right node."""
        if not 0 <= slot < CLUSTER_SLOTS:
            raise ValueError(f"slot must be in 0..{CLUSTER_SLOTS - 1}, not {slot}")
        if not self.servers:
            raise RuntimeError("the cluster has not been started")
        by_port = {server.port: server for server in self.servers}
        for server in filter(EmbeddedServer.is_running, self.servers):
            try:
                ranges = _slot_map(server)
            except (redis.RedisError, OSError, IndexError, TypeError, ValueError):
                continue
            for first, last, _ip, port, _id in ranges:
                if first <= slot <= last and port in by_port:
                    return by_port[port]
        index = next(i for i, (first, last) in enumerate(self._ranges) if first <= slot <= last)
        return self.servers[index]

    def server_for_key(self, key: str | bytes) -> EmbeddedServer:
        """The node owning ``key``'s hash slot (hash tags such as ``{job:1}`` are honoured)."""
        return self.server_for_slot(key_slot(key.encode() if isinstance(key, str) else key))

    def stop(self) -> None:
        """Stop every node and remove a temporary data_dir. Idempotent."""
        for server in self.servers:
            server.stop()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        with _live_lock:
            _live.discard(self)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
