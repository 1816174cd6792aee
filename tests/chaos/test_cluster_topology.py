"""Topology changes on a real Cluster with replicas (3 masters + 3 replicas, AOF on,
``cluster-node-timeout`` 2 s, started by the suite): masters SIGKILLed mid-flow and a slot
resharded live, while real worker and Pump processes (``topology_proc.py``) run a cross-queue
flow whose parent queue and child queues live on different masters.

The kinds of fault (issue 12):

(a) the master holding the parent queue is SIGKILLed;
(b) the master holding a child queue is SIGKILLed;
(c) the master that is every client's *default node* is SIGKILLed - it holds none of the
    flow's queues, so nothing should notice; before the fix every Pump tick failed from then
    on, for ever, on healthy masters too;
(d) a child queue's slot, then the parent queue's slot, are moved to another master while the
    flow runs (``CLUSTER SETSLOT IMPORTING/MIGRATING``, ``GETKEYSINSLOT`` + ``MIGRATE ...
    KEYS`` in batches, ``SETSLOT NODE``), so calls meet ``ASK`` and ``TRYAGAIN``.

Preconditions are built, not hoped for: two children of each flow wait on a *gate* (a local
file the test creates only after the fault), so every fault lands mid-flow - the parent held,
children settled and unsettled on the masters involved; a kill waits (bounded) until a quarter
of the children have settled. For the reshard, every key of the slot is moved before the slot
is handed over, and in that window the test's own clients, by construction, meet ``ASK``
(single-key reads: the source has none of the keys) and ``TRYAGAIN`` (a flow add: its
multi-key scripts find the new rows on neither node); the handover waits until they have.

What must hold afterwards:

* every worker process, Pump process and client - sync ``EchoMQ`` and ``AsyncEchoMQ`` alike,
  each used before the fault - works again within ``cluster-node-timeout + 10 s`` of the kill,
  without a restart (workers: a successful claim from every queue of the lost master; Pumps: a
  successful tick, which reads every queue's outbox; clients: a flow add touching all three
  queues); no process exits;
* each flow converges with nothing lost and nothing counted twice: ``children_values`` holds
  exactly the N results (each child's value once), ``processed + ignored == N``, the raw
  ``:dependencies`` counter is exactly 0, the parent completed once with the sum of all N
  results, every run of its handler saw all N, and it ran at most once more than its lease
  was recovered; nothing dead, poisoned, leased, pending or in an outbox; the two probe flows
  the clients added during the recovery converge the same way;
* the killed master is restarted on its AOF and rejoins as a replica: the cluster is healthy
  again for the next test.

No assertion is about speed: recovery is asserted within a generous bound, and the measured
seconds are recorded (``record``) as rows of docs/RELIABILITY.md.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from redis.crc import key_slot

from echomq_core import AsyncEchoMQ, Child, EchoMQ, EchoMQError, Pump
from echomq_core.pump.drain import TickStats
from echomq_core.server import EmbeddedServer, _command
from echomq_core.wire.keyspace import Keyspace

from ..clusterkit import EmbeddedCluster
from ..serverkit import kill
from ..waiting import eventually
from .harness import Fleet, Member, record, row_fields

PROC_FILE = str(Path(__file__).with_name("topology_proc.py"))

pytestmark = [pytest.mark.slow]

N = 1600  # children per flow, half in each child queue, plus the two gated ones
PAUSE_MS = 8  # per child: the flow takes a few seconds, so faults land while it runs
CONFIG = {"concurrency": 4, "max_batch": 20, "lease": 2.0, "pump_lease": 1.0, "max_stalls": 20}


# -- the cluster, the clients, the fleet ---------------------------------------------------


@pytest.fixture
def cluster(replica_cluster: EmbeddedCluster) -> Iterator[EmbeddedCluster]:
    replica_cluster.wait_healthy(60)  # whatever the test before did
    yield replica_cluster
    for server in replica_cluster.servers:  # a failed test must not leave a node down
        if not server.is_running():
            server.start()
    replica_cluster.wait_healthy(90)


def bound(cluster: EmbeddedCluster) -> float:
    """How soon after a fault everything must work again: cluster-node-timeout + 10 s."""
    assert cluster.node_timeout_ms is not None
    return cluster.node_timeout_ms / 1000 + 10.0


def owner(cluster: EmbeddedCluster, queue: str) -> EmbeddedServer:
    return cluster.server_for_slot(key_slot(f"{{{queue}}}".encode()))


def queue_on(cluster: EmbeddedCluster, master: EmbeddedServer, stem: str) -> str:
    """A queue name (``stem`` + a number) whose slot lives on ``master``."""
    for i in range(10_000):
        if owner(cluster, f"{stem}{i}") is master:
            return f"{stem}{i}"
    raise AssertionError(f"no queue of stem {stem!r} on {master.url}")


class AsyncSide:
    """An ``AsyncEchoMQ`` living in its own event loop thread, so the test can poll it next to
    the sync client (as the Airflow trigger does, it keeps one client across the fault)."""

    def __init__(self, url: str, prefix: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.mq: AsyncEchoMQ = self.call(self._make(url, prefix))

    @staticmethod
    async def _make(url: str, prefix: str) -> AsyncEchoMQ:
        return AsyncEchoMQ(url, cluster=True, prefix=prefix)

    def submit(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        return self.submit(coro).result(timeout)

    def set_default_node(self, name: str) -> None:
        client: Any = self.mq.connection.client
        client.set_default_node(client.get_node(node_name=name))

    @property
    def stats(self) -> dict[str, int]:
        return dict(self.mq.connection.stats)

    def close(self) -> None:
        self.call(self.mq.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class TopologyFleet(Fleet):
    """The harness's fleet, running ``topology_proc.py``."""

    def spawn(self, role: str) -> Member:
        import subprocess
        import sys

        self.started += 1
        self.logdir.mkdir(parents=True, exist_ok=True)
        log = self.logdir / f"{role}-{self.started}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, PROC_FILE, role, json.dumps(self.config)],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        member = Member(role, proc, log)
        self.members.append(member)
        return member


def events(member: Member) -> list[tuple[str, str, float]]:
    """(kind, what, time) of each down / up / ok line a process printed."""
    out = []
    for line in member.log.read_text(errors="replace").splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 3 and parts[0] in ("down", "up", "ok"):
            out.append((parts[0], parts[1], float(parts[2])))
    return out


#: A WHAT that did not succeed for longer than this was stalled (successes are printed every
#: 0.25 s while they happen; a busy runner claims from each of its queues several times a s).
STALL = 1.0


def back_after(seen: list[tuple[str, float]], since: float, after: float) -> float | None:
    """Seconds from ``since`` (the fault) until something worked again, from its ``seen``
    (kind, time) events - "down" a failure, anything else a success: the end of its last
    failure streak or of its longest stall (no success for ``STALL`` s) after ``since``,
    whichever is later; 0 if it never stopped. None until it has succeeded after ``after``
    (so a stall still going on is not missed) with no failure since."""
    wins = sorted(t for kind, t in seen if kind != "down" and t > since)
    downs = [t for kind, t in seen if kind == "down" and t >= since]
    if not wins or wins[-1] <= after or (downs and max(downs) >= wins[-1]):
        return None
    back = next(t for t in wins if t > max(downs)) if downs else since
    previous = since
    for t in wins:
        if t - previous > STALL:
            back = max(back, t)
        previous = t
    return back - since


def recovery(member: Member, whats: list[str], since: float, after: float) -> float | None:
    """:func:`back_after` for each of a process's ``whats``: the latest (None if one is not
    back yet)."""
    seen = events(member)
    worst = 0.0
    for what in whats:
        back = back_after([(k, t) for k, w, t in seen if w == what], since, after)
        if back is None:
            return None
        worst = max(worst, back)
    return worst


@dataclass
class Recovery:
    """Seconds from a fault until each part worked again."""

    sync: float
    async_: float
    workers: list[float]
    pumps: list[float]

    @property
    def slowest(self) -> float:
        return max(self.sync, self.async_, *self.workers, *self.pumps)

    def text(self) -> str:
        return (
            f"sync client {self.sync:.1f}, async client {self.async_:.1f}, workers "
            f"{', '.join(f'{w:.1f}' for w in self.workers)}, Pumps "
            f"{', '.join(f'{p:.1f}' for p in self.pumps)}"
        )


@dataclass
class Flow:
    """One flow under one fault, and everything that runs it."""

    cluster: EmbeddedCluster
    prefix: str
    parents: str
    kids: tuple[str, str]
    tmp: Path
    proc_env: dict[str, str]
    default_node: str | None = None
    parent_id: str = "JOB-topo"
    mq: EchoMQ = field(init=False)
    side: AsyncSide = field(init=False)
    fleet: TopologyFleet = field(init=False)
    probes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.gate = self.tmp / "gate"
        self.runs = self.tmp / "parent-runs.jsonl"
        self.mq = EchoMQ(self.cluster.url, cluster=True, prefix=self.prefix)
        self.side = AsyncSide(self.cluster.url, self.prefix)
        self.queues = [self.parents, *self.kids]

    def children(self) -> list[Child]:
        kids = [
            Child({"n": i, "pause": PAUSE_MS}, queue=self.kids[i % 2], max_attempts=20)
            for i in range(N)
        ]
        # the gate: one child per child queue waits for the test to open it
        return kids + [
            Child({"n": N + k, "gate": True}, queue=self.kids[k], max_attempts=20) for k in (0, 1)
        ]

    @property
    def total(self) -> int:
        return N + 2

    def start(self) -> None:
        self.mq.add_flow(
            self.parents,
            self.children(),
            payload={"parent": True},
            parent_id=self.parent_id,
            max_attempts=20,
        )
        self.side.call(self.side.mq.dependencies(self.parents, self.parent_id))  # learn topology
        if self.default_node is not None:
            client: Any = self.mq.connection.client
            client.set_default_node(client.get_node(node_name=self.default_node))
            self.side.set_default_node(self.default_node)
        config = {
            "url": self.cluster.url,
            "prefix": self.prefix,
            "queues": self.queues,
            "gate": str(self.gate),
            "runs": str(self.runs),
            "default_node": self.default_node,
            **CONFIG,
        }
        self.fleet = TopologyFleet(config, self.proc_env, self.tmp / "logs", workers=3, pumps=2)
        self.fleet.start()
        self.fleet.wait_ready()

    def settled(self) -> int:
        snap = self.mq.snapshot(self.parents, self.parent_id)
        return snap.processed + snap.ignored

    def wait_settled(self, at_least: int, timeout: float = 60.0) -> int:
        done = 0

        def enough() -> bool:
            nonlocal done
            if (done := self.settled()) >= at_least:
                return True
            assert not self.fleet.crashed(), self.fleet.crashed()
            return False

        eventually(
            enough, timeout, lambda: f"{at_least} settled: only {done} of {self.total}", every=0.05
        )
        return done

    def probe_children(self) -> list[Child]:
        return [Child({"n": i}, queue=self.kids[i % 2]) for i in range(10)]

    def sync_probe(self, parent_id: str) -> None:
        """A flow add touching all three queues (hold on the parent's master, land on both
        children's); retried by id until it returns."""
        self.mq.add_flow(
            self.parents, self.probe_children(), payload={"parent": True}, parent_id=parent_id
        )
        if parent_id not in self.probes:
            self.probes.append(parent_id)

    async def async_probe(self, parent_id: str) -> None:
        await self.side.mq.add_flow(
            self.parents, self.probe_children(), payload={"parent": True}, parent_id=parent_id
        )
        if parent_id not in self.probes:
            self.probes.append(parent_id)

    def measure_recovery(
        self, since: float, lost: list[str], ready: Callable[[], float | None], limit: float
    ) -> Recovery:
        """Seconds from ``since`` (the fault) until each part worked again. The test's clients
        keep adding their probe flow (retried by id: a flow add touching all three queues)
        from the fault on; the processes report their claims and ticks. ``lost``: the queues
        whose master is gone (workers must claim from each of them again); ``ready()``: when
        the fault is over (the replica took over, the reshard ended), None before."""
        halt = threading.Event()
        seen: dict[str, list[tuple[str, float]]] = {"sync": [], "async": []}

        def poll(name: str, probe: Callable[[], Any]) -> None:
            while not halt.is_set():
                try:
                    probe()
                    seen[name].append(("ok", time.time()))
                except EchoMQError:
                    seen[name].append(("down", time.time()))
                halt.wait(0.1)

        pollers = [
            threading.Thread(target=poll, args=("sync", lambda: self.sync_probe("JOB-sprobe"))),
            threading.Thread(
                target=poll,
                args=("async", lambda: self.side.call(self.async_probe("JOB-aprobe"))),
            ),
        ]
        for thread in pollers:
            thread.start()
        workers: list[float | None] = []
        pumps: list[float | None] = []
        after: float | None = None

        def recovered() -> Recovery | None:
            nonlocal workers, pumps, after
            assert not self.fleet.crashed(), self.fleet.crashed()
            after = ready()
            if after is None:
                return None
            sync_s = back_after(seen["sync"], since, after)
            async_s = back_after(seen["async"], since, after)
            workers = [
                recovery(m, [f"claim:{q}" for q in lost], since, after)
                for m in self.fleet.members
                if m.role == "worker"
            ]
            pumps = [
                recovery(m, ["tick"], since, after) for m in self.fleet.members if m.role == "pump"
            ]
            every = [sync_s, async_s, *workers, *pumps]
            if sync_s is None or async_s is None or None in every:
                return None
            return Recovery(
                round(sync_s, 2),
                round(async_s, 2),
                [round(w, 2) for w in workers if w is not None],
                [round(p, 2) for p in pumps if p is not None],
            )

        def told() -> str:
            return (
                f"everything to work again: not yet {time.time() - since:.1f}s after the fault "
                f"(over: {after is not None}): back after (s): workers {workers}, Pumps "
                f"{pumps}; last probes: sync {seen['sync'][-2:]}, async {seen['async'][-2:]}; "
                f"logs in {self.fleet.logdir}"
            )

        try:
            return eventually(recovered, limit, told, every=0.1)
        finally:
            halt.set()
            for thread in pollers:
                thread.join(30)

    def finish(self, timeout: float = 120.0) -> None:
        """Open the gate and wait until the flow and the probes completed."""
        self.gate.touch()
        deadline = time.monotonic() + timeout  # one bound for all of them
        for parent_id in [self.parent_id, *self.probes]:

            def completed(parent_id: str = parent_id) -> bool:
                if self.mq.get_job(self.parents, parent_id).state == "completed":
                    return True
                assert not self.fleet.crashed(), self.fleet.crashed()
                return False

            eventually(
                completed,
                max(0.0, deadline - time.monotonic()),
                lambda p=parent_id: f"{p} to complete: {self.mq.snapshot(self.parents, p)}",
                every=0.1,
            )

    def stop(self) -> None:
        assert not self.fleet.crashed(), "no process exited:\n" + "\n".join(self.fleet.crashed())
        self.fleet.stop()  # SIGTERM: workers drain, nothing stays leased

    def routers(self) -> dict[str, int]:
        """What the processes' Cluster routers met, summed (printed when they stopped)."""
        total: Counter[str] = Counter()
        for member in self.fleet.members:
            for line in member.log.read_text(errors="replace").splitlines():
                if line.startswith("router "):
                    total.update(json.loads(line[len("router ") :]))
        return dict(sorted(total.items()))

    def close(self) -> None:
        if hasattr(self, "fleet"):
            self.fleet.close()
        self.side.close()
        self.mq.close()

    def check(self) -> dict[str, int]:
        """Nothing lost, nothing counted twice, released once; returns figures."""
        mq, parents = self.mq, self.parents
        values = mq.children_values(parents, self.parent_id)
        expected = {f"{self.parent_id}.{i}": i * i for i in range(self.total)}
        assert {k: v["sq"] for k, v in values.items()} == expected, "each child's value once"
        assert len(values) + len(mq.ignored_failures(parents, self.parent_id)) == self.total
        raw = mq.connection.client.get(mq.keys.dependencies(parents, self.parent_id))
        assert raw == b"0", f"raw counter {raw!r}: below 0 would be a double count"
        parent = mq.get_job(parents, self.parent_id)
        total = sum(i * i for i in range(self.total))
        assert (parent.state, parent.result) == ("completed", {"count": self.total, "sum": total})
        runs = [json.loads(line) for line in self.runs.read_text().splitlines()]
        mine = [r for r in runs if r[0] == self.parent_id]
        assert mine and all(r[2:] == [self.total, total] for r in mine), "no early release"
        assert len(mine) <= 1 + parent.stalls, "every re-run is a recovered lease"
        for probe in self.probes:
            got = mq.children_values(parents, probe)
            assert {k: v["sq"] for k, v in got.items()} == {
                f"{probe}.{i}": i * i for i in range(10)
            }
            assert mq.connection.client.get(mq.keys.dependencies(parents, probe)) == b"0"
            assert mq.get_job(parents, probe).result == {"count": 10, "sum": 285}
        leftovers = {"dead": 0, "poison": 0}
        for name in self.queues:
            stats = mq.queue(name).stats()
            leases = mq.connection.client.hlen(mq.keys.leases(name))
            idle = (stats["active"], leases, stats["pending"], stats["delayed"], stats["outbox"])
            assert idle == (0, 0, 0, 0, 0), (name, stats, leases)
            leftovers["dead"] += stats["dead"]
            leftovers["poison"] += stats["poison"]
        assert leftovers == {"dead": 0, "poison": 0}
        stalls = 0
        for k, queue in enumerate(self.kids):
            ids = [f"{self.parent_id}.{i}" for i in range(k, N, 2)] + [f"{self.parent_id}.{N + k}"]
            stalls += sum(row_fields(mq, queue, ids, "stalls"))
        return {"runs": len(mine), "parent_stalls": parent.stalls, "leases_recovered": stalls}


@pytest.fixture
def flows(tmp_path: Path, proc_env: dict[str, str]) -> Iterator[list[Flow]]:
    made: list[Flow] = []
    yield made
    for flow in made:
        flow.close()


# -- (a), (b), (c): a master SIGKILLed mid-flow ---------------------------------------------


def kill_mid_flow(
    kind: str,
    cluster: EmbeddedCluster,
    flow: Flow,
    victim: EmbeddedServer,
    lost: list[str],
    layout: str = "parent queue and 2 child queues on 3 different masters",
) -> None:
    flow.start()
    settled = flow.wait_settled(N // 4)
    snap = flow.mq.snapshot(flow.parents, flow.parent_id)
    assert not snap.released, "mid-flow by construction: the gated children hold the parent"
    since = time.time()
    kill(victim)
    failover: dict[str, Any] = {}

    def wait_for_failover() -> None:
        try:
            failover["s"] = cluster.wait_for_failover(victim, timeout=60)
            failover["at"] = time.time()
        except BaseException as exc:  # surfaced by ready()
            failover["error"] = exc

    def ready() -> float | None:
        if "error" in failover:
            raise failover["error"]
        return failover.get("at")

    waiter = threading.Thread(target=wait_for_failover, daemon=True)
    waiter.start()
    recovered = flow.measure_recovery(since, lost, ready, limit=90)
    waiter.join()
    failover_s = failover["s"]
    limit = bound(cluster)
    assert recovered.slowest <= limit, (
        f"{kind}: something worked again only {recovered.slowest:.1f}s after the kill (bound "
        f"{limit:.0f}s; the replica took over after {failover_s:.1f}s): {recovered}"
    )
    flow.finish()
    began = time.monotonic()
    cluster.restart_node(victim)  # rejoins on its AOF as a replica of its replacement
    rejoin_s = time.monotonic() - began
    flow.stop()
    figures = flow.check()
    record(
        {
            "scenario": f"topology: {kind}, 3 masters + 3 replicas",
            "parameters": f"{flow.total}-child cross-queue flow ({PAUSE_MS} ms handlers; "
            f"{layout}), 3 worker processes x 4 threads (lease 2 s) + 2 Pump processes, a sync "
            "and an async client in the test; cluster-node-timeout 2 s, AOF everysec",
            "faults": f"SIGKILL of the master at {settled} of {flow.total} settled (2 children "
            f"gated: mid-flow by construction); replica took over after {failover_s:.1f} s; "
            f"working again after the kill (s): {recovered.text()} (bound {limit:.0f} s); "
            f"{figures['leases_recovered']} leases "
            f"recovered; parent ran {figures['runs']}x; killed node back as a replica in "
            f"{rejoin_s:.1f} s; the processes' routers met {flow.routers()}",
            "lost": 0,
            "double_counted": 0,
            "poisoned": 0,
            "failover_s": round(failover_s, 1),
            "recovery_s": round(recovered.slowest, 1),
            "wall_s": round(time.time() - since, 1),
        }
    )


def three_masters(cluster: EmbeddedCluster) -> list[EmbeddedServer]:
    masters = cluster.current_masters()
    assert len(masters) == 3, masters
    return masters


def test_a_parent_queue_master_killed_mid_flow(
    cluster: EmbeddedCluster,
    prefix: str,
    proc_env: dict[str, str],
    tmp_path: Path,
    flows: list[Flow],
) -> None:
    m0, m1, m2 = three_masters(cluster)
    parents, a, b = (
        queue_on(cluster, m0, "pa"),
        queue_on(cluster, m1, "ka"),
        queue_on(cluster, m2, "kb"),
    )
    flow = Flow(cluster, prefix, parents, (a, b), tmp_path, proc_env)
    flows.append(flow)
    kill_mid_flow("(a) the parent queue's master killed", cluster, flow, m0, [parents])


def test_b_child_queue_master_killed_mid_flow(
    cluster: EmbeddedCluster,
    prefix: str,
    proc_env: dict[str, str],
    tmp_path: Path,
    flows: list[Flow],
) -> None:
    m0, m1, m2 = three_masters(cluster)
    parents, a, b = (
        queue_on(cluster, m0, "pb"),
        queue_on(cluster, m1, "kc"),
        queue_on(cluster, m2, "kd"),
    )
    flow = Flow(cluster, prefix, parents, (a, b), tmp_path, proc_env)
    flows.append(flow)
    kill_mid_flow("(b) a child queue's master killed", cluster, flow, m1, [a])


def test_c_default_node_master_killed_mid_flow(
    cluster: EmbeddedCluster,
    prefix: str,
    proc_env: dict[str, str],
    tmp_path: Path,
    flows: list[Flow],
) -> None:
    """Every client's default node is a master that holds none of the keys the flow and the
    clients use (its queues, and the queue registry the async client writes to on each add)."""
    m0, m1, m2 = three_masters(cluster)
    prefix = next(
        f"{prefix}{i}"
        for i in range(1000)
        if cluster.server_for_key(Keyspace(f"{prefix}{i}").queues()) is not m0
    )
    parents, a, b = (
        queue_on(cluster, m1, "pc"),
        queue_on(cluster, m2, "ke"),
        queue_on(cluster, m1, "kf"),
    )
    default = f"{m0.host}:{m0.port}"
    flow = Flow(cluster, prefix, parents, (a, b), tmp_path, proc_env, default_node=default)
    flows.append(flow)
    kill_mid_flow(
        "(c) the clients' default node killed",
        cluster,
        flow,
        m0,
        [parents, a, b],
        layout="parent queue and a child queue on one master, the other child queue on a second; "
        "the third master, every client's default node, holds none of the flow's keys",
    )


def test_pump_and_async_client_outlive_their_default_node(
    cluster: EmbeddedCluster, prefix: str
) -> None:
    """Issue 12's repro, in one process: a Pump whose client's default node is not its seed
    node ticks; that master is SIGKILLed; once its replica took over, the Pump ticks again and
    delivers (before the fix: ``cannot reach ...: Connection refused`` on every tick, for
    ever). The same for an AsyncEchoMQ (the Airflow trigger's client)."""
    masters = three_masters(cluster)
    seed = cluster.servers[0]
    victim = next(m for m in masters if m is not seed)
    others = [m for m in masters if m is not victim]
    parents, work = queue_on(cluster, others[0], "rp"), queue_on(cluster, others[1], "rw")
    mq = EchoMQ(cluster.url, cluster=True, prefix=prefix)
    side = AsyncSide(cluster.url, prefix)
    try:
        client: Any = mq.connection.client
        name = f"{victim.host}:{victim.port}"
        client.set_default_node(client.get_node(node_name=name))
        assert client.get_default_node().port != seed.port
        side.call(side.mq.snapshot(parents, "JOB-none"))  # a read that reaches the server
        side.set_default_node(name)
        ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(50)], parent_id="JOB-r")
        pump = Pump(mq, [parents, work])
        pump.tick()
        q = mq.queue(work)
        jobs = q.claim(50)
        assert len(jobs) == 50 and all(q.complete_many([(j, j.payload) for j in jobs]))
        since = time.monotonic()
        kill(victim)
        cluster.wait_for_failover(victim, timeout=60)
        errors: list[EchoMQError] = []

        def ticked() -> TickStats | None:
            try:
                return pump.tick()
            except EchoMQError as exc:
                errors.append(exc)
                return None

        # bounded: tick until it works (it works at once: no call needs the node)
        stats = eventually(
            ticked,
            max(0.0, since + bound(cluster) - time.monotonic()),
            lambda: f"the Pump to recover (last error: {errors[-1] if errors else None})",
            every=0.2,
        )
        assert stats.delivered == 50 and stats.released == [(parents, ref.parent_id)]
        assert mq.snapshot(parents, ref.parent_id).released
        aref = side.call(
            side.mq.add_flow(parents, [Child(i, queue=work) for i in range(5)], parent_id="JOB-a")
        )
        assert side.call(side.mq.dependencies(parents, aref.parent_id)) == 5
    finally:
        side.close()
        mq.close()
    cluster.restart_node(victim)


# -- (d): a live reshard ---------------------------------------------------------------------


def errorstats(cluster: EmbeddedCluster) -> dict[str, int]:
    """ASK / TRYAGAIN / MOVED replies every node has sent so far (INFO errorstats)."""
    total = {"ASK": 0, "TRYAGAIN": 0, "MOVED": 0}
    for server in cluster.servers:
        info = _command(server.host, server.port, "INFO", "errorstats")
        for kind in total:
            total[kind] += int(info.get(f"errorstat_{kind}", {}).get("count", 0))
    return total


def reshard(
    flow: Flow, queue: str, target: EmbeddedServer, tag: str, batch: int = 50, pause: float = 0.03
) -> dict[str, Any]:
    """Move ``queue``'s slot to ``target`` while the flow runs (``batch`` keys a MIGRATE,
    ``pause`` s apart); in the window where every key is on the target but the slot is not
    handed over, make the test's clients meet ASK and TRYAGAIN (by construction) and let the
    handover wait until they have."""
    cluster, mq, side = flow.cluster, flow.mq, flow.side
    slot = key_slot(f"{{{queue}}}".encode())
    before = errorstats(cluster)
    sync0, async0 = dict(mq.connection.stats), side.stats
    pending: dict[str, Any] = {}

    def handover() -> None:
        asks = mq.connection.stats["ask"]
        mq.queue(queue).stats()  # single-key reads: the source has none of the keys -> ASK
        assert mq.connection.stats["ask"] > asks, "a read of the half-moved slot met ASK"
        # flow adds land new rows in the slot: on neither node, so TRYAGAIN until the handover
        done = threading.Event()

        def add() -> None:
            try:
                flow.sync_probe(f"JOB-sprobe-{tag}")
            except BaseException as exc:  # surfaced below
                pending["sync_error"] = exc
            done.set()

        pending["sync"] = threading.Thread(target=add, daemon=True)
        pending["sync"].start()
        pending["async"] = side.submit(flow.async_probe(f"JOB-aprobe-{tag}"))
        eventually(
            lambda: (
                mq.connection.stats["tryagain"] > sync0.get("tryagain", 0)
                and side.stats.get("tryagain", 0) > async0.get("tryagain", 0)
            ),
            3.0,  # well inside the router's wait for a moving slot
            lambda: f"the clients to meet TRYAGAIN: {mq.connection.stats} {side.stats}",
            every=0.01,
        )

    migration = cluster.migrate_slot(
        slot, target, batch=batch, pause=pause, before_handover=handover
    )
    pending["sync"].join(30)
    assert "sync_error" not in pending, pending.get("sync_error")
    pending["async"].result(30)
    after = errorstats(cluster)
    met = {k: after[k] - before[k] for k in after}
    return {
        "keys": migration.keys,
        "batches": migration.batches,
        "seconds": round(migration.seconds, 2),
        "servers_sent": met,
        "sync_client": {
            k: mq.connection.stats[k] - sync0.get(k, 0) for k in ("ask", "tryagain", "moved")
        },
        "async_client": {
            k: side.stats.get(k, 0) - async0.get(k, 0) for k in ("ask", "tryagain", "moved")
        },
    }


def test_d_live_reshard_of_child_and_parent_queues(
    cluster: EmbeddedCluster,
    prefix: str,
    proc_env: dict[str, str],
    tmp_path: Path,
    flows: list[Flow],
) -> None:
    m0, m1, m2 = three_masters(cluster)
    parents, a, b = (
        queue_on(cluster, m0, "pd"),
        queue_on(cluster, m1, "kg"),
        queue_on(cluster, m2, "kh"),
    )
    flow = Flow(cluster, prefix, parents, (a, b), tmp_path, proc_env)
    flows.append(flow)
    flow.start()
    settled = flow.wait_settled(N // 4)
    since = time.time()
    child_move = reshard(flow, a, m2, "a")  # the child queue a joins b's master
    settled_between = flow.settled()
    parent_move = reshard(flow, parents, m1, "p")  # the parent queue moves to a's old master
    assert owner(cluster, a) is m2 and owner(cluster, parents) is m1
    moves = {"child": child_move, "parent": parent_move}
    for move in moves.values():
        assert move["keys"] > 0
        assert move["servers_sent"]["ASK"] > 0 and move["servers_sent"]["TRYAGAIN"] > 0
    # everyone carries on: every process works again (most never stopped) within the bound
    ended = time.time()
    recovered = flow.measure_recovery(since, [parents, a], lambda: ended, limit=60)
    assert recovered.slowest <= bound(cluster), recovered
    outages = [
        (m.log.name, w, t) for m in flow.fleet.members for k, w, t in events(m) if k == "down"
    ]
    flow.finish()
    flow.stop()
    figures = flow.check()
    cluster.wait_healthy(60)
    record(
        {
            "scenario": "topology: (d) live reshard of a child queue's and the parent queue's "
            "slots, 3 masters + 3 replicas",
            "parameters": f"{flow.total}-child cross-queue flow ({PAUSE_MS} ms handlers), 3 "
            "worker processes x 4 threads + 2 Pump processes, a sync and an async client; each "
            "slot moved by SETSLOT IMPORTING/MIGRATING, GETKEYSINSLOT + MIGRATE ... KEYS (50 "
            "keys a batch, 30 ms apart), SETSLOT NODE on every master",
            "faults": f"from {settled} of {flow.total} settled: child queue's slot moved "
            f"({child_move['keys']} keys, {child_move['batches']} batches, "
            f"{child_move['seconds']} s; the nodes answered {child_move['servers_sent']}), then "
            f"(from {settled_between} settled) the parent queue's slot ({parent_move['keys']} "
            f"keys, {parent_move['batches']} batches, {parent_move['seconds']} s; "
            f"{parent_move['servers_sent']}); test clients met sync {child_move['sync_client']} "
            f"/ {parent_move['sync_client']}, async {child_move['async_client']} / "
            f"{parent_move['async_client']}; calls that failed in the processes: "
            f"{len(outages)}; working again after the reshards (s): {recovered.text()}; "
            f"{figures['leases_recovered']} leases recovered; parent ran "
            f"{figures['runs']}x; the processes' routers met {flow.routers()}",
            "lost": 0,
            "double_counted": 0,
            "poisoned": 0,
            "recovery_s": round(recovered.slowest, 1),
            "wall_s": round(time.time() - since, 1),
        }
    )
