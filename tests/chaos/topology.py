"""The topology runs' harness (``test_cluster_topology.py``, ``test_sharded_topology.py``): a
flow run by real worker and Pump processes (``topology_proc.py``) on the Cluster with replicas,
the test's own sync and async clients probing it, and the readers of what the processes met -
how soon after a fault each part worked again, and whether the flow converged.

Faults are the tests': :func:`kill_and_recover` SIGKILLs a master and measures the recovery
while its replica takes over; :func:`reshard` moves a queue's slot live.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.crc import key_slot

from echomq_core import AsyncEchoMQ, Child, EchoMQ, EchoMQError
from echomq_core.server import EmbeddedServer, _command

from ..clusterkit import EmbeddedCluster
from ..serverkit import kill
from ..waiting import eventually
from .harness import Fleet, Member, row_fields

N = 1600  # children per flow, half in each child queue, plus the two gated ones
PAUSE_MS = 8  # per child: the flow takes a few seconds, so faults land while it runs
CONFIG = {"concurrency": 4, "max_batch": 20, "lease": 2.0, "pump_lease": 1.0, "max_stalls": 20}


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


def three_masters(cluster: EmbeddedCluster) -> list[EmbeddedServer]:
    masters = cluster.current_masters()
    assert len(masters) == 3, masters
    return masters


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

    proc = str(Path(__file__).with_name("topology_proc.py"))


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
        self.queues = [self.parents, *self.kids]  # what the processes are given
        self.physical = self.queues  # the queues the flow's rows live in

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

    def child_id(self, i: int) -> str:
        return f"{self.parent_id}.{i}"

    def child_ids_by_queue(self) -> dict[str, list[str]]:
        """Each child queue's children: child ``i`` (a gated one too) is in ``kids[i % 2]``."""
        out: dict[str, list[str]] = {}
        for i in range(self.total):
            out.setdefault(self.kids[i % 2], []).append(self.child_id(i))
        return out

    def start(self, tuning: dict[str, Any] | None = None) -> float:
        """Add the flow (returns the add's seconds) and start the fleet (``tuning`` over
        :data:`CONFIG`)."""
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
            **(tuning or {}),
        }
        self.fleet = TopologyFleet(config, self.proc_env, self.tmp / "logs", workers=3, pumps=2)
        self.fleet.start()
        self.fleet.wait_ready()
        return added

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

    #: children per probe flow
    probe_size = 10

    def probe_children(self) -> list[Child]:
        return [Child({"n": i}, queue=self.kids[i % 2]) for i in range(self.probe_size)]

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

    def counted(self, values: dict[str, Any]) -> None:
        """Every child settled once: its value, or an ignored failure."""
        ignored = self.mq.ignored_failures(self.parents, self.parent_id)
        assert len(values) + len(ignored) == self.total

    def check(self) -> dict[str, int]:
        """Nothing lost, nothing counted twice, released once; returns figures."""
        mq, parents = self.mq, self.parents
        values = mq.children_values(parents, self.parent_id)
        expected = {self.child_id(i): i * i for i in range(self.total)}
        assert {k: v["sq"] for k, v in values.items()} == expected, "each child's value once"
        self.counted(values)
        raw = mq.connection.client.get(mq.keys.dependencies(parents, self.parent_id))
        assert raw == b"0", f"raw counter {raw!r}: below 0 would be a double count"
        parent = mq.get_job(parents, self.parent_id)
        total = sum(i * i for i in range(self.total))
        assert (parent.state, parent.result) == ("completed", {"count": self.total, "sum": total})
        runs = [json.loads(line) for line in self.runs.read_text().splitlines()]
        mine = [r for r in runs if r[0] == self.parent_id]
        assert mine and all(r[2:] == [self.total, total] for r in mine), "no early release"
        assert len(mine) <= 1 + parent.stalls, "every re-run is a recovered lease"
        size = self.probe_size
        probe_sum = sum(i * i for i in range(size))
        for probe in self.probes:
            got = mq.children_values(parents, probe)
            assert {k: v["sq"] for k, v in got.items()} == {
                f"{probe}.{i}": i * i for i in range(size)
            }
            assert mq.connection.client.get(mq.keys.dependencies(parents, probe)) == b"0"
            assert mq.get_job(parents, probe).result == {"count": size, "sum": probe_sum}
        for name in self.physical:
            stats = mq.queue(name).stats()
            leases = mq.connection.client.hlen(mq.keys.leases(name))
            idle = (stats["active"], leases, stats["pending"], stats["delayed"], stats["outbox"])
            assert idle == (0, 0, 0, 0, 0), (name, stats, leases)
            assert (stats["dead"], stats["poison"]) == (0, 0), (name, stats)
        stalls = sum(
            sum(row_fields(mq, queue, ids, "stalls"))
            for queue, ids in self.child_ids_by_queue().items()
        )
        return {"runs": len(mine), "parent_stalls": parent.stalls, "leases_recovered": stalls}


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
    handover wait until they have. The move carried keys, and the nodes answered ASK and
    TRYAGAIN."""
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
    assert migration.keys > 0
    assert met["ASK"] > 0 and met["TRYAGAIN"] > 0, met
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


@dataclass
class Failover:
    """A master SIGKILLed at ``since`` (wall clock), its replica in charge ``seconds`` later,
    every part of the flow working again as ``recovered`` says."""

    since: float
    seconds: float
    recovered: Recovery


def kill_and_recover(flow: Flow, victim: EmbeddedServer, lost: list[str]) -> Failover:
    """SIGKILL ``victim`` and, while its replica takes over (waited for in a thread), measure
    how soon every part of ``flow`` works again (``lost``: the queues whose master it was)."""
    cluster = flow.cluster
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
    return Failover(since, failover["s"], recovered)
