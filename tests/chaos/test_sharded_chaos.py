"""SIGKILL chaos over a sharded child queue (issue 30, item 5): the run of
``test_cluster_chaos.py`` with the children spread over the K = 3 shards of one logical queue,
on standalone and on the 3-master Cluster (where the three shards are on three masters).

Two layouts, each on both backends:

* ``plain parent``: the parent in a plain queue, every child in the sharded queue ``kids``:
  every child's settle crosses slots (its shard's outbox and a Pump);
* ``sharded parent``: the parent itself in the sharded queue ``both``, its children in the same
  logical queue: a third of them share the parent's shard (settled in the completion's own
  script), two thirds cross to it through their shards' outboxes.

Three worker processes (given the logical name: each serves every shard) and two Pump processes
(each drains every shard's outbox) run ``chaos_proc.py``; a driver SIGKILLs one at random every
0.2-0.5 s and starts a replacement at once, from the first claim until the parent completed.
About 1% of the children, and the parent, sleep 300-800 ms, so some are killed mid-run. The
children carry fairness groups (17 tenants, and some without): every promise below holds with
them.

Afterwards, the checks of the plain-queue run: every child's value exactly once in
``children_values``, ``processed + ignored == N``, the raw ``:dependencies`` counter exactly 0,
the parent completed once with the sum of all N (every run of its handler saw all N; at most
one run more than its recovered leases), and every shard idle: nothing leased, pending,
delayed, dead, poisoned or in an outbox.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from echomq_core import Child, EchoMQ

from ..conftest import Backend
from ..waiting import eventually
from .harness import Fleet, record, run_killed
from .test_cluster_chaos import chaos_figures, no_leftovers, parent_runs

pytestmark = [pytest.mark.slow]

N = 6000
K = 3
#: the plain-queue run's fleet; the workers' own Pumps take the Pump processes' settings
CONFIG = {
    "concurrency": 4,
    "max_batch": 50,
    "lease": 1.0,
    "pump_lease": 1.0,
    "max_stalls": 20,
    "pump_options": True,
}


def children(n: int, queue: str | None, rng: random.Random) -> list[Child]:
    out = []
    for i in range(n):
        payload: dict[str, Any] = {"n": i}
        if rng.random() < 0.01:
            payload["slow"] = rng.randint(300, 800)
        # fairness groups (one of 17 tenants, none for some): they order the claims only
        group = None if i % 18 == 17 else f"tenant/{i % 18}"
        out.append(Child(payload, queue=queue, max_attempts=2, group=group))
    return out


def run_fleet(
    backend: Backend,
    prefix: str,
    env: dict[str, str],
    queues: list[str],
    done: Any,
    logdir: Path,
    describe: Any,
    outboxes: Any,
) -> tuple[Fleet, float, int]:
    """The fleet under the killer until ``done()``; then, the killer stopped, until
    ``outboxes()`` (the signals left in every shard's outbox) is 0; then stopped gracefully
    (SIGTERM). ``describe()`` says how far the flow got if it never settles. Returns the
    fleet, the faulted seconds and the signals that were left when the flow settled: a Pump
    killed between a delivery and its trim leaves its page for the next one, which redelivers
    it (counted nothing twice: the counter check below would show it)."""
    config = {"url": backend.url, "cluster": backend.cluster, "prefix": prefix, "queues": queues}
    fleet = Fleet({**config, **CONFIG}, env, logdir).start()

    def drain() -> int:
        left = int(outboxes())
        eventually(lambda: outboxes() == 0, 30, lambda: f"the outboxes to drain: {describe()}")
        return left

    wall, left = run_killed(
        fleet, 17, done, 240, lambda: f"the sharded flow to settle: {describe()}", drain
    )
    return fleet, wall, left


def describe(mq: EchoMQ, parents: str, parent_id: str, physical: list[str]) -> str:
    """The parent's job and flow state and every physical queue's counts and leases."""
    job = mq.get_job(parents, parent_id)
    raw = mq.connection.client
    queues = {
        q: {
            **mq.queue(q).stats(),
            "leases": raw.hlen(mq.keys.leases(q)),
            "outbox_lease": raw.get(mq.keys.outbox_lease(q)),
            "outbox_head": raw.lrange(mq.keys.outbox(q), 0, 0),
        }
        for q in physical
    }
    return (
        f"parent {job.state} (attempts {job.attempts}, stalls {job.stalls}); "
        f"{mq.snapshot(parents, parent_id)}; {queues}"
    )


@pytest.mark.parametrize("layout", ["plain parent", "sharded parent"])
def test_sharded_children_under_chaos(
    backend: Backend, prefix: str, proc_env: dict[str, str], tmp_path: Path, layout: str
) -> None:
    mq = backend.client(prefix)
    if layout == "plain parent":
        parents = "chaos-top"
        shards = mq.set_shards("kids", K)
        logical, child_queue = ["chaos-top", "kids"], "kids"
    else:
        parents = "both"
        shards = mq.set_shards("both", K)
        logical, child_queue = ["both"], None  # the children default to the parent's queue
    if backend.cluster:  # the shards are on three masters, the plain parent on one of them
        assert len({backend.node_of_queue(q) for q in shards}) == K
    parent_id = "JOB-af/sharded_chaos/fan/3f2a9c"  # an Airflow-derived id: it holds '/'
    ref = mq.add_flow(
        parents,
        children(N, child_queue, random.Random(7)),
        payload={"parent": True, "slow": 300},
        parent_id=parent_id,
    )
    per_shard = Counter(q for q, _ in ref.children)
    assert set(per_shard) == set(shards), "the children are spread over every shard"
    if layout == "sharded parent":
        assert ref.queue in shards
    physical = sorted({ref.queue, *shards})
    fleet, wall, left = run_fleet(
        backend,
        prefix,
        proc_env,
        logical,
        lambda: mq.get_job(parents, parent_id).state == "completed",
        tmp_path,
        lambda: describe(mq, parents, parent_id, physical),
        lambda: sum(mq.connection.client.llen(mq.keys.outbox(q)) for q in physical),
    )

    expected = {f"{parent_id}.{i}": {"sq": i * i} for i in range(N)}
    values = mq.children_values(parents, parent_id)
    assert values == expected, "exactly the N results: none lost, none extra"
    snap = mq.snapshot(parents, parent_id)
    assert snap.processed + snap.ignored == N
    raw = mq.connection.client.get(mq.keys.dependencies(ref.queue, parent_id))
    assert raw == b"0", f"raw counter {raw!r}: below 0 would be a double count"
    parent = mq.get_job(parents, parent_id)
    total = sum(i * i for i in range(N))
    assert (parent.state, parent.result) == ("completed", {"count": N, "sum": total})
    runs = parent_runs(mq, prefix, parent_id)
    assert runs and all(run[2:] == [N, total] for run in runs), "no run before every child"
    assert len(runs) <= 1 + parent.stalls, "every re-run is a recovered lease: released once"
    leftovers = no_leftovers(mq, physical)
    assert leftovers == {"dead": 0, "poison": 0}
    ids = {q: [c for cq, c in ref.children if cq == q] for q in shards}
    figures = chaos_figures(mq, prefix, fleet, ids)
    assert figures["worker_kills"] > 0 and figures["pump_kills"] > 0
    assert figures["leases_recovered"] > 0, "workers were killed holding jobs"
    spread = ", ".join(map(str, sorted(per_shard.values())))
    placed = (
        "parent in a plain queue"
        if layout == "plain parent"
        else "parent in the same sharded queue (a third of the children on its shard)"
    )
    where = "3-master Cluster, one shard per master" if backend.cluster else "standalone"
    record(
        {
            "scenario": f"chaos: {N:,}-child flow into a {K}-shard queue, {layout}, {where}",
            "parameters": f"children spread over {K} shards ({spread} per shard); {placed}; "
            "3 worker processes x 4 threads given the logical name (batches <= 50, lease 1 s), "
            "2 Pump processes over every shard (outbox lease 1 s, max_stalls 20; the workers' "
            "own Pumps the same); ~1% of "
            "children and the parent sleep 300-800 ms",
            "faults": f"SIGKILL of a random worker or Pump every 0.2-0.5 s, replaced at once: "
            f"{figures['worker_kills']} workers + {figures['pump_kills']} Pumps killed; "
            f"{figures['leases_recovered']} leases recovered (at most "
            f"{figures['most_recoveries_of_one_job']} for one job); "
            f"{figures['slow_jobs_killed_mid_run']} of {figures['slow_jobs']} slow jobs "
            f"killed mid-run; parent ran {len(runs)}x (its lease recovered {parent.stalls}x); "
            f"{left} signals still in outboxes when the parent completed, redelivered "
            "(changing nothing) once the kills stopped",
            "lost": N - len(values),
            "double_counted": 0,
            "poisoned": leftovers["poison"],
            "dead": leftovers["dead"],
            "wall_s": round(wall, 1),
        }
    )
    mq.close()
