"""Topology changes under a sharded flow (issue 30, item 5), on the Cluster with replicas of
``test_cluster_topology.py`` (3 masters + 3 replicas, AOF on, cluster-node-timeout 2 s): the
children go to the logical queue ``kids`` of K = 3 shards, one shard per master, the parent to
a plain queue; worker processes are given the logical name (each serves every shard), Pump
processes drain every shard's outbox.

* **Every master failed over in turn**: the master of shard 0 (also the parent queue's), then
  of shard 1, then of shard 2 is SIGKILLed; each time its replica takes over, every process and
  client works again within the bound, and the killed node rejoins as a replica before the
  next kill.
* **A live reshard of one shard's slot during a 100,000-child flow**: the slot of the shard on
  the second master moves to the third (IMPORTING/MIGRATING, MIGRATE in batches, SETSLOT NODE)
  once a quarter of the children settled, while the two other shards keep running.

Preconditions are built, not hoped for: one child of each shard waits on a gate file the test
creates only after the last fault, so every fault meets a held parent and an unsettled child on
the shard it hits; each fault waits (bounded) until a share of the children settled. Afterwards
the checks of the plain-queue topology runs (``Flow.check``): each child's value once,
``processed + ignored == N``, the raw ``:dependencies`` counter 0, the parent released once,
the probe flows the clients added during the fault converged, and every shard idle.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from echomq_core import Child
from echomq_core.flows.sharding import Shards, shard_of

from ..clusterkit import EmbeddedCluster
from ..serverkit import kill
from .harness import record, row_fields
from .test_cluster_topology import (
    CONFIG,
    PAUSE_MS,
    Flow,
    TopologyFleet,
    bound,
    owner,
    queue_on,
    reshard,
    three_masters,
)

pytestmark = [pytest.mark.slow]

K = 3
PROBE = 30  # children per probe flow: enough that every shard gets some
#: per child in the failover run: the flow outlasts three failovers and rejoins (each some 6 s),
#: so each kill meets children still running on every shard, not only the gated ones
FAILOVER_PAUSE_MS = 60
#: a gated child whose lease lapsed during a failover runs again elsewhere while its first run
#: still waits on the gate: with 4 threads one worker once had all of them in gated runs, so it
#: claimed nothing more until the gate opened (and the recovery check waited for it in vain)
FAILOVER_CONFIG = {"concurrency": 8}
PARENT_ID = "JOB-af/shard_topology/fan/7e41c0"  # an Airflow-derived id: it holds '/'


@pytest.fixture
def cluster(replica_cluster: EmbeddedCluster) -> Iterator[EmbeddedCluster]:
    replica_cluster.wait_healthy(60)
    yield replica_cluster
    for server in replica_cluster.servers:  # a failed test must not leave a node down
        if not server.is_running():
            server.start()
    replica_cluster.wait_healthy(90)


@dataclass
class ShardedFlow(Flow):
    """A :class:`Flow` whose ``n`` children go to the sharded logical queue ``kids[0]``; the
    first child of each shard waits on the gate. ``tag`` names the probe flows of one fault."""

    n: int = 1600
    pause_ms: int = PAUSE_MS
    tag: str = "0"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.logical = self.kids[0]
        self.shards: Shards = self.mq.set_shards(self.logical, K)
        firsts: dict[str, int] = {}
        for i in range(self.n):
            firsts.setdefault(shard_of(self.shards, self.child_id(i)), i)
        assert len(firsts) == K
        self.gated = set(firsts.values())
        self.queues = [self.parents, self.logical]  # what the processes are given
        self.physical = [self.parents, *self.shards]

    def start(self, tuning: dict[str, Any] | None = None) -> float:  # type: ignore[override]
        """Add the flow (returns the add's seconds) and start the fleet (``tuning`` over the
        plain-queue runs' worker settings)."""
        began = time.monotonic()
        self.mq.add_flow(
            self.parents,
            self.children(),
            payload={"parent": True},
            parent_id=self.parent_id,
            max_attempts=20,
        )
        added = time.monotonic() - began
        self.side.call(self.side.mq.dependencies(self.parents, self.parent_id))  # learn topology
        config = {
            "url": self.cluster.url,
            "prefix": self.prefix,
            "queues": self.queues,
            "gate": str(self.gate),
            "runs": str(self.runs),
            **CONFIG,
            **(tuning or {}),
        }
        self.fleet = TopologyFleet(config, self.proc_env, self.tmp / "logs", workers=3, pumps=2)
        self.fleet.start()
        self.fleet.wait_ready()
        return added

    def child_id(self, i: int) -> str:
        return f"{self.parent_id}.{i}"

    @property
    def total(self) -> int:
        return self.n

    def children(self) -> list[Child]:
        out = []
        for i in range(self.n):
            payload: dict[str, Any] = {"n": i}
            if i in self.gated:
                payload["gate"] = True
            elif self.pause_ms:
                payload["pause"] = self.pause_ms
            out.append(Child(payload, queue=self.logical, max_attempts=20))
        return out

    def probe_children(self) -> list[Child]:
        return [Child({"n": i}, queue=self.logical) for i in range(PROBE)]

    def sync_probe(self, parent_id: str) -> None:
        super().sync_probe(f"{parent_id}-{self.tag}")

    async def async_probe(self, parent_id: str) -> None:
        await super().async_probe(f"{parent_id}-{self.tag}")

    def close(self) -> None:
        """Before the fleet is killed, each live process writes its threads' stacks to its log
        (SIGUSR1, see topology_proc.py), so a process that hung says where."""
        for member in getattr(getattr(self, "fleet", None), "members", []):
            if member.proc.poll() is None:
                member.proc.send_signal(signal.SIGUSR1)
                deadline = time.monotonic() + 5  # bounded: a teardown must not hang on it
                while b"most recent call first" not in member.log.read_bytes():
                    if time.monotonic() > deadline or member.proc.poll() is not None:
                        break
                    time.sleep(0.05)
        super().close()

    def check(self) -> dict[str, int]:
        """:meth:`Flow.check` over the shards."""
        mq, parents = self.mq, self.parents
        values = mq.children_values(parents, self.parent_id)
        expected = {self.child_id(i): i * i for i in range(self.n)}
        assert {k: v["sq"] for k, v in values.items()} == expected, "each child's value once"
        snap = mq.snapshot(parents, self.parent_id)
        assert snap.processed + snap.ignored == self.n
        raw = mq.connection.client.get(mq.keys.dependencies(parents, self.parent_id))
        assert raw == b"0", f"raw counter {raw!r}: below 0 would be a double count"
        parent = mq.get_job(parents, self.parent_id)
        total = sum(i * i for i in range(self.n))
        assert (parent.state, parent.result) == ("completed", {"count": self.n, "sum": total})
        runs = [json.loads(line) for line in self.runs.read_text().splitlines()]
        mine = [r for r in runs if r[0] == self.parent_id]
        assert mine and all(r[2:] == [self.n, total] for r in mine), "no early release"
        assert len(mine) <= 1 + parent.stalls, "every re-run is a recovered lease"
        probe_sum = sum(i * i for i in range(PROBE))
        for probe in self.probes:
            got = mq.children_values(parents, probe)
            assert {k: v["sq"] for k, v in got.items()} == {
                f"{probe}.{i}": i * i for i in range(PROBE)
            }
            assert mq.connection.client.get(mq.keys.dependencies(parents, probe)) == b"0"
            assert mq.get_job(parents, probe).result == {"count": PROBE, "sum": probe_sum}
        for name in self.physical:
            stats = mq.queue(name).stats()
            leases = mq.connection.client.hlen(mq.keys.leases(name))
            idle = (stats["active"], leases, stats["pending"], stats["delayed"], stats["outbox"])
            assert idle == (0, 0, 0, 0, 0), (name, stats, leases)
            assert (stats["dead"], stats["poison"]) == (0, 0), (name, stats)
        stalls = 0
        by_shard: dict[str, list[str]] = {}
        for i in range(self.n):
            by_shard.setdefault(shard_of(self.shards, self.child_id(i)), []).append(
                self.child_id(i)
            )
        for shard, ids in by_shard.items():
            stalls += sum(row_fields(mq, shard, ids, "stalls"))
        return {"runs": len(mine), "parent_stalls": parent.stalls, "leases_recovered": stalls}


@pytest.fixture
def flows() -> Iterator[list[ShardedFlow]]:
    made: list[ShardedFlow] = []
    yield made
    for flow in made:
        flow.close()


def test_every_master_failed_over_in_turn_during_a_sharded_flow(
    cluster: EmbeddedCluster,
    prefix: str,
    proc_env: dict[str, str],
    tmp_path: Path,
    flows: list[ShardedFlow],
) -> None:
    m0 = three_masters(cluster)[0]
    parents = queue_on(cluster, m0, "sf")
    flow = ShardedFlow(
        cluster,
        prefix,
        parents,
        ("kids", "kids"),
        tmp_path,
        proc_env,
        parent_id=PARENT_ID,
        n=3000,
        pause_ms=FAILOVER_PAUSE_MS,
    )
    flows.append(flow)
    # shard 0 first: its master is the parent queue's (so that master too is failed over)
    shards = sorted(flow.shards, key=lambda s: owner(cluster, s) is not m0)
    assert len({owner(cluster, s).port for s in shards}) == K, "one shard per master"
    flow.start(FAILOVER_CONFIG)
    began = time.time()
    rounds = []
    for k, shard in enumerate(shards):
        flow.tag = str(k)
        settled = flow.wait_settled((k + 1) * flow.n // 4)
        assert not flow.mq.snapshot(parents, flow.parent_id).released, "held by the gates"
        victim = owner(cluster, shard)
        lost = [q for q in flow.physical if owner(cluster, q) is victim]
        since = time.time()
        kill(victim)
        failover: dict[str, Any] = {}

        def wait_for_failover(victim: Any = victim, failover: dict[str, Any] = failover) -> None:
            try:
                failover["s"] = cluster.wait_for_failover(victim, timeout=60)
                failover["at"] = time.time()
            except BaseException as exc:  # surfaced by ready()
                failover["error"] = exc

        def ready(failover: dict[str, Any] = failover) -> float | None:
            if "error" in failover:
                raise failover["error"]
            return failover.get("at")

        waiter = threading.Thread(target=wait_for_failover, daemon=True)
        waiter.start()
        recovered = flow.measure_recovery(since, lost, ready, limit=90)
        waiter.join()
        assert recovered.slowest <= bound(cluster), (k, recovered)
        assert owner(cluster, shard) is not victim, "the replica took the shard over"
        rejoin = time.monotonic()
        cluster.restart_node(victim)  # back on its AOF, as a replica of its replacement
        rounds.append(
            f"master of {' + '.join(lost)} at {settled} settled: replica took over after "
            f"{failover['s']:.1f} s, working again after {recovered.slowest:.1f} s, rejoined in "
            f"{time.monotonic() - rejoin:.1f} s"
        )
    flow.finish()
    flow.stop()
    figures = flow.check()
    record(
        {
            "scenario": "topology: every master failed over in turn during a 3-shard flow, "
            "3 masters + 3 replicas",
            "parameters": f"{flow.n}-child flow into a {K}-shard queue (one shard per master; "
            f"{FAILOVER_PAUSE_MS} ms handlers; one gated child per shard), parent in a plain "
            "queue on the first killed master; 3 worker processes x 8 threads (lease 2 s) "
            "given the logical name + 2 Pump processes over every shard; a sync and an async "
            "client probing",
            "faults": "SIGKILL of each master in turn, each after a further quarter settled: "
            + "; ".join(rounds)
            + f"; {figures['leases_recovered']} leases recovered; parent ran "
            f"{figures['runs']}x; the processes' routers met {flow.routers()}",
            "lost": 0,
            "double_counted": 0,
            "poisoned": 0,
            "wall_s": round(time.time() - began, 1),
        }
    )


BIG = 100_000
BIG_CONFIG = {"concurrency": 16, "max_batch": 200, "lease": 5.0}


@pytest.mark.timeout(600)
def test_live_reshard_of_one_shard_during_a_100000_child_flow(
    cluster: EmbeddedCluster,
    prefix: str,
    proc_env: dict[str, str],
    tmp_path: Path,
    flows: list[ShardedFlow],
) -> None:
    m0, m1, m2 = three_masters(cluster)
    parents = queue_on(cluster, m0, "sr")
    flow = ShardedFlow(
        cluster,
        prefix,
        parents,
        ("big", "big"),
        tmp_path,
        proc_env,
        parent_id=PARENT_ID,
        n=BIG,
        pause_ms=0,
    )
    flows.append(flow)
    moving = next(s for s in flow.shards if owner(cluster, s) is m1)
    assert len({owner(cluster, s).port for s in flow.shards}) == K, "one shard per master"
    began = time.monotonic()
    added = flow.start(BIG_CONFIG)
    settled = flow.wait_settled(BIG // 4, timeout=240)
    since = time.time()
    flow.tag = "r"
    move = reshard(flow, moving, m2, "r", batch=1000, pause=0.0)
    assert owner(cluster, moving) is m2
    assert move["keys"] > 0
    assert move["servers_sent"]["ASK"] > 0 and move["servers_sent"]["TRYAGAIN"] > 0
    ended = time.time()
    recovered = flow.measure_recovery(since, [moving], lambda: ended, limit=60)
    assert recovered.slowest <= bound(cluster), recovered
    flow.finish(timeout=240)
    wall = time.monotonic() - began
    flow.stop()
    figures = flow.check()
    cluster.wait_healthy(60)
    record(
        {
            "scenario": f"topology: live reshard of one shard's slot during a {BIG:,}-child "
            "3-shard flow, 3 masters + 3 replicas",
            "parameters": f"{BIG:,} trivial children into a {K}-shard queue (one shard per "
            "master; one gated child per shard), parent in a plain queue; 3 worker processes "
            "x 16 threads (batches <= 200, lease 5 s) given the logical name + 2 Pump "
            "processes; slot moved by SETSLOT IMPORTING/MIGRATING, GETKEYSINSLOT + MIGRATE "
            "... KEYS (1000 keys a batch), SETSLOT NODE on every master",
            "faults": f"from {settled:,} of {BIG:,} settled: the second master's shard moved to "
            f"the third ({move['keys']} keys, {move['batches']} batches, {move['seconds']} s; "
            f"the nodes answered {move['servers_sent']}); test clients met sync "
            f"{move['sync_client']}, async {move['async_client']}; working again after the "
            f"reshard (s): {recovered.text()}; {figures['leases_recovered']} leases "
            f"recovered; parent ran {figures['runs']}x; add_flow took {added:.1f} s; the "
            f"processes' routers met {flow.routers()}",
            "lost": 0,
            "double_counted": 0,
            "poisoned": 0,
            "wall_s": round(wall, 1),
        }
    )
