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

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from echomq_core import Child, EchoMQ, EchoMQError, Pump
from echomq_core.pump.drain import TickStats
from echomq_core.server import EmbeddedServer
from echomq_core.wire.keyspace import Keyspace

from ..clusterkit import EmbeddedCluster
from ..serverkit import kill
from ..waiting import eventually
from .harness import record
from .topology import (
    PAUSE_MS,
    AsyncSide,
    Flow,
    N,
    bound,
    events,
    kill_and_recover,
    owner,
    queue_on,
    reshard,
    three_masters,
)

pytestmark = [pytest.mark.slow]


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
    fault = kill_and_recover(flow, victim, lost)
    since, failover_s, recovered = fault.since, fault.seconds, fault.recovered
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


@dataclass(frozen=True)
class Kill:
    """One master killed mid-flow: the stems of the parent queue and the two child queues,
    the master (by index among the three) each lives on, the master killed, the queues it
    held (by index among the three), and whether it is every client's default node."""

    kind: str
    stems: tuple[str, str, str]
    homes: tuple[int, int, int]
    victim: int
    lost: tuple[int, ...]
    default_node: bool = False
    layout: str = "parent queue and 2 child queues on 3 different masters"


KILLS = [
    pytest.param(
        Kill("(a) the parent queue's master killed", ("pa", "ka", "kb"), (0, 1, 2), 0, (0,)),
        id="a-parent-queue-master",
    ),
    pytest.param(
        Kill("(b) a child queue's master killed", ("pb", "kc", "kd"), (0, 1, 2), 1, (1,)),
        id="b-child-queue-master",
    ),
    # Every client's default node is a master that holds none of the keys the flow and the
    # clients use (its queues, and the queue registry the async client writes to on each add).
    pytest.param(
        Kill(
            "(c) the clients' default node killed",
            ("pc", "ke", "kf"),
            (1, 2, 1),
            0,
            (0, 1, 2),
            default_node=True,
            layout="parent queue and a child queue on one master, the other child queue on a "
            "second; the third master, every client's default node, holds none of the flow's "
            "keys",
        ),
        id="c-default-node-master",
    ),
]


@pytest.mark.parametrize("case", KILLS)
def test_master_killed_mid_flow(
    cluster: EmbeddedCluster,
    prefix: str,
    proc_env: dict[str, str],
    tmp_path: Path,
    flows: list[Flow],
    case: Kill,
) -> None:
    masters = three_masters(cluster)
    victim = masters[case.victim]
    default = None
    if case.default_node:
        prefix = next(
            f"{prefix}{i}"
            for i in range(1000)
            if cluster.server_for_key(Keyspace(f"{prefix}{i}").queues()) is not victim
        )
        default = f"{victim.host}:{victim.port}"
    parents, a, b = (
        queue_on(cluster, masters[home], stem)
        for home, stem in zip(case.homes, case.stems, strict=True)
    )
    queues = (parents, a, b)
    flow = Flow(cluster, prefix, parents, (a, b), tmp_path, proc_env, default_node=default)
    flows.append(flow)
    lost = [queues[i] for i in case.lost]
    kill_mid_flow(case.kind, cluster, flow, victim, lost, layout=case.layout)


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
    # each move carried keys and met ASK and TRYAGAIN (asserted by reshard)
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
