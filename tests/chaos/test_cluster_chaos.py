"""Chaos on a real 3-master Cluster: a 10,000-child cross-queue flow while a driver SIGKILLs a
random worker or Pump process every 0.2-0.5 s, and starts a replacement, for the whole run.

Layout: the parent's queue on one master, the children split over two queues on the two other
masters, so every fan-in signal crosses nodes through an outbox and a Pump. Three worker
processes (4 runner threads each, batches of up to 50, 1 s leases heartbeated every 1/3 s) and
two Pump processes (1 s outbox leases, so a killed Pump's outbox is taken over within a second;
max_stalls 20, because under this driver every job's worker is killed now and then - the
default 5 is for jobs that crash workers by themselves). About 1% of the children, and the
parent, sleep 300-800 ms: long enough to be killed mid-run, which the handler makes visible by
counting each start. See ``chaos_proc.py`` for the handlers.

What "eventually consistent, never lost" must mean afterwards:

* ``children_values`` holds exactly the N results (ids and values), the raw ``:dependencies``
  counter is exactly 0 (a double-counted signal would take it below 0);
* the parent was released once and ran to completion: it is completed with the sum of all N
  results, every run of its handler saw all N results (no early release), and it ran at most
  once more than its lease was recovered (a re-run is a killed worker, never a second
  release);
* nothing in the poison lists, nothing in the dead sets, nothing leased, pending or in flight.

The second test repeats the run with children that always fail, under both policies, and
checks the reads against what each policy promises (DESIGN.md, "The failure policy").
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from echomq_core import Child, EchoMQ

from ..conftest import Backend
from ..waiting import eventually
from .chaos_proc import runs_key, starts_key
from .harness import Fleet, record, row_fields, run_killed

pytestmark = [pytest.mark.slow, pytest.mark.onlycluster]

CONFIG = {"concurrency": 4, "max_batch": 50, "lease": 1.0, "pump_lease": 1.0, "max_stalls": 20}


def children_for(
    n: int,
    queues: tuple[str, str],
    rng: random.Random,
    *,
    fail_every: int = 0,
    ignore: bool = False,
) -> list[Child]:
    out = []
    for i in range(n):
        payload: dict[str, Any] = {"n": i}
        if rng.random() < 0.01:
            payload["slow"] = rng.randint(300, 800)
        if fail_every and i % fail_every == fail_every - 1:
            payload["fail"] = True
        out.append(
            Child(payload, queue=queues[i % 2], max_attempts=2, ignore_dependency_on_failure=ignore)
        )
    return out


def run_under_chaos(
    backend: Backend,
    prefix: str,
    proc_env: dict[str, str],
    queues: list[str],
    done: Any,
    seed: int,
    logdir: Path,
    timeout: float = 200.0,
) -> tuple[Fleet, float]:
    """Run the fleet with the killer until ``done()``; stop it gracefully; return it."""
    config = {"url": backend.url, "cluster": True, "prefix": prefix, "queues": queues, **CONFIG}
    fleet = Fleet(config, proc_env, logdir).start()
    wall, _ = run_killed(
        fleet,
        seed,
        done,
        timeout,
        "the flow to settle",
        lambda: drained(backend.client(prefix), queues),
    )
    return fleet, wall


def drained(mq: EchoMQ, queues: list[str], timeout: float = 60.0) -> None:
    """Until the running Pumps have emptied every outbox (bounded). A Pump SIGKILLed after
    delivering a page and before trimming it leaves those signals in its outbox under its
    lease: they count nothing again (a delivery is idempotent), and the Pump that takes the
    lease over when it lapses redelivers and trims them - possibly after the flow completed,
    which is when the chaos ends."""
    try:
        eventually(
            lambda: all(mq.queue(q).stats()["outbox"] == 0 for q in queues),
            timeout,
            lambda: "the outboxes to drain: "
            + str({q: mq.queue(q).stats()["outbox"] for q in queues}),
            every=0.2,
        )
    finally:
        mq.close()


def no_leftovers(mq: EchoMQ, queues: list[str]) -> dict[str, int]:
    """Every queue idle: nothing leased, pending, delayed, in an outbox or poisoned."""
    totals = {"dead": 0, "poison": 0}
    for name in queues:
        stats = mq.queue(name).stats()
        leases = mq.connection.client.hlen(mq.keys.leases(name))
        assert (stats["active"], leases, stats["pending"], stats["delayed"]) == (0, 0, 0, 0), (
            name,
            stats,
            leases,
        )
        assert stats["outbox"] == 0, (name, stats)
        totals["dead"] += stats["dead"]
        totals["poison"] += stats["poison"]
    return totals


def parent_runs(mq: EchoMQ, prefix: str, parent_id: str) -> list[list[Any]]:
    raw = mq.connection.client.lrange(runs_key(prefix), 0, -1)
    return [run for run in map(json.loads, raw) if run[0] == parent_id]


def chaos_figures(
    mq: EchoMQ, prefix: str, fleet: Fleet, children: dict[str, list[str]]
) -> dict[str, int]:
    stalls = [s for q, ids in children.items() for s in row_fields(mq, q, ids, "stalls")]
    starts = mq.connection.client.hgetall(starts_key(prefix))
    return {
        "worker_kills": fleet.kills["worker"],
        "pump_kills": fleet.kills["pump"],
        "leases_recovered": sum(stalls),
        "most_recoveries_of_one_job": max(stalls),
        "slow_jobs": len(starts),
        "slow_jobs_killed_mid_run": sum(1 for v in starts.values() if int(v) > 1),
    }


def test_ten_thousand_children_under_chaos(
    backend: Backend, prefix: str, proc_env: dict[str, str], tmp_path: Path
) -> None:
    n = 10_000
    parents, a, b = backend.queues_on_distinct_nodes(3, "chaos")
    assert len({backend.node_of_queue(q) for q in (parents, a, b)}) == 3
    mq = backend.client(prefix)
    rng = random.Random(7)
    kids = children_for(n, (a, b), rng)
    ref = mq.add_flow(parents, kids, payload={"parent": True, "slow": 300}, parent_id="JOB-chaos")
    fleet, wall = run_under_chaos(
        backend,
        prefix,
        proc_env,
        [parents, a, b],
        seed=11,
        logdir=tmp_path,
        done=lambda: mq.get_job(parents, ref.parent_id).state == "completed",
    )

    expected = {f"JOB-chaos.{i}": {"sq": i * i} for i in range(n)}
    values = mq.children_values(parents, ref.parent_id)
    assert values == expected, "exactly the N results: none lost, none extra"
    assert mq.connection.client.get(mq.keys.dependencies(parents, ref.parent_id)) == b"0"
    assert mq.dependencies(parents, ref.parent_id) == 0
    parent = mq.get_job(parents, ref.parent_id)
    total = sum(i * i for i in range(n))
    assert (parent.state, parent.result) == ("completed", {"count": n, "sum": total})
    runs = parent_runs(mq, prefix, ref.parent_id)
    assert runs and all(run[2:] == [n, total] for run in runs), "no run before every child"
    assert len(runs) <= 1 + parent.stalls, "every re-run is a recovered lease: released once"
    leftovers = no_leftovers(mq, [parents, a, b])
    assert leftovers == {"dead": 0, "poison": 0}
    ids = {q: [c for cq, c in ref.children if cq == q] for q in (a, b)}
    figures = chaos_figures(mq, prefix, fleet, ids)
    assert figures["worker_kills"] > 0 and figures["pump_kills"] > 0
    assert figures["leases_recovered"] > 0, "workers were killed holding jobs"
    record(
        {
            "scenario": "chaos: 10,000-child cross-queue flow, 3-master Cluster",
            "parameters": "parent queue and 2 child queues on 3 different masters; 3 worker "
            "processes x 4 threads (batches <= 50, lease 1 s), 2 Pump processes "
            "(outbox lease 1 s, max_stalls 20); ~1% of children and the parent "
            "sleep 300-800 ms",
            "faults": f"SIGKILL of a random worker or Pump every 0.2-0.5 s, replaced at once: "
            f"{figures['worker_kills']} workers + {figures['pump_kills']} Pumps killed; "
            f"{figures['leases_recovered']} leases recovered (at most "
            f"{figures['most_recoveries_of_one_job']} for one job); "
            f"{figures['slow_jobs_killed_mid_run']} of {figures['slow_jobs']} slow jobs "
            f"killed mid-run; parent ran {len(runs)}x (its lease recovered "
            f"{parent.stalls}x)",
            "lost": n - len(values),
            "double_counted": 0,
            "poisoned": leftovers["poison"],
            "dead": leftovers["dead"],
            "wall_s": round(wall, 1),
        }
    )
    mq.close()


def test_failing_children_under_both_policies_under_chaos(
    backend: Backend, prefix: str, proc_env: dict[str, str], tmp_path: Path
) -> None:
    """Two flows at once under the same chaos: every 50th child always fails (2 attempts).
    ``fp``: the parent fails, never runs; every dead child is in ``failed_children``, every
    other child's result in ``children_values``. ``id``: the dead children are in
    ``ignored_failures``, the counter reaches exactly 0 and the parent runs on the rest."""
    n, every = 2000, 50
    parents, a, b = backend.queues_on_distinct_nodes(3, "pol")
    mq = backend.client(prefix)
    rng = random.Random(5)
    fp = mq.add_flow(
        parents,
        children_for(n, (a, b), rng, fail_every=every),
        payload={"parent": True},
        parent_id="JOB-fp",
    )
    ig = mq.add_flow(
        parents,
        children_for(n, (a, b), rng, fail_every=every, ignore=True),
        payload={"parent": True},
        parent_id="JOB-id",
    )
    queues = [parents, a, b]

    def settled() -> bool:
        if mq.get_job(parents, "JOB-id").state != "completed":
            return False
        return all(
            (s["pending"], s["active"], s["delayed"], s["outbox"]) == (0, 0, 0, 0)
            for s in (mq.queue(q).stats() for q in queues)
        )

    fleet, wall = run_under_chaos(
        backend, prefix, proc_env, queues, settled, seed=13, logdir=tmp_path
    )
    failing = {i for i in range(n) if i % every == every - 1}
    k = len(failing)
    ok_values = {i: {"sq": i * i} for i in range(n) if i not in failing}
    errors = {i: f"RuntimeError: child {i} always fails" for i in failing}
    # fail the parent
    assert mq.snapshot(parents, "JOB-fp").parent_state == "failed"
    assert mq.failed_children(parents, "JOB-fp") == {f"JOB-fp.{i}": e for i, e in errors.items()}
    assert mq.children_values(parents, "JOB-fp") == {f"JOB-fp.{i}": v for i, v in ok_values.items()}
    assert mq.ignored_failures(parents, "JOB-fp") == {}
    assert mq.connection.client.get(mq.keys.dependencies(parents, "JOB-fp")) == str(k).encode()
    assert parent_runs(mq, prefix, "JOB-fp") == [], "a failed parent never runs"
    # ignore the dependency
    assert mq.ignored_failures(parents, "JOB-id") == {f"JOB-id.{i}": e for i, e in errors.items()}
    assert mq.children_values(parents, "JOB-id") == {f"JOB-id.{i}": v for i, v in ok_values.items()}
    assert mq.failed_children(parents, "JOB-id") == {}
    assert mq.connection.client.get(mq.keys.dependencies(parents, "JOB-id")) == b"0"
    parent = mq.get_job(parents, "JOB-id")
    total = sum(v["sq"] for v in ok_values.values())
    assert (parent.state, parent.result) == ("completed", {"count": n - k, "sum": total})
    runs = parent_runs(mq, prefix, "JOB-id")
    assert runs and all(run[2:] == [n - k, total] for run in runs)
    assert len(runs) <= 1 + parent.stalls
    # the dead sets hold exactly the failing children, nothing else; nothing is poisoned
    leftovers = no_leftovers(mq, queues)
    dead = {m.decode() for q in (a, b) for m in mq.connection.client.zrange(mq.keys.dead(q), 0, -1)}
    assert dead == {f"{p}.{i}" for p in ("JOB-fp", "JOB-id") for i in failing}
    assert leftovers["poison"] == 0
    ids = {q: [c for ref in (fp, ig) for cq, c in ref.children if cq == q] for q in (a, b)}
    figures = chaos_figures(mq, prefix, fleet, ids)
    assert figures["worker_kills"] > 0 and figures["pump_kills"] > 0
    record(
        {
            "scenario": "chaos: failing children under fp and id, 3-master Cluster",
            "parameters": f"2 flows x {n} cross-queue children at once (one fp, one id), every "
            f"{every}th child always fails (2 attempts): {k} per flow; fleet, "
            "layout and slow jobs as the 10,000-child run",
            "faults": f"SIGKILL every 0.2-0.5 s: {figures['worker_kills']} workers + "
            f"{figures['pump_kills']} Pumps killed; {figures['leases_recovered']} leases "
            f"recovered; {figures['slow_jobs_killed_mid_run']} of "
            f"{figures['slow_jobs']} slow jobs killed mid-run",
            "lost": 0,
            "double_counted": 0,
            "poisoned": leftovers["poison"],
            "dead": f"{len(dead)} (exactly the failing children)",
            "wall_s": round(wall, 1),
            "reads": f"fp: parent failed, failed_children={k}, children_values={n - k}, "
            f"dependencies={k}, never ran; id: ignored_failures={k}, "
            f"children_values={n - k}, dependencies=0, parent ran on {n - k} results",
        }
    )
    mq.close()
