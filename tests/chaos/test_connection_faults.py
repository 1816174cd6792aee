"""Connection faults: client connections killed from the server side (``CLIENT KILL``) during
add, claim, complete and Pump delivery, on standalone and on a real Cluster.

The promise under test: every operation either takes effect once or raises
:class:`~echomq_core.ConnectionLost` (it may then have taken effect, once); a retry converges;
workers and Pumps reconnect with bounded backoff and carry on. A ``ConnectionKiller`` thread
lists the clients of every node and kills the ones named after the victim, every few
milliseconds, for the length of each phase.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from echomq_core import Child, ConnectionLost, EchoMQ, Pump

from ..conftest import Backend
from ..flowkit import normalised, work_off
from ..waiting import eventually
from .harness import ConnectionKiller, Fleet, record, row_fields

VICTIM = "emq-victim"
ADD_FLOWS = 10


def victim(backend: Backend, prefix: str) -> EchoMQ:
    return backend.client(prefix, client_name=VICTIM)


def retried(call: Any, attempts: int = 2000) -> tuple[Any, int]:
    """Call until it returns; (result, how many calls raised ConnectionLost first). A call cut
    every few ms still progresses (each attempt keeps what its scripts wrote), but on a loaded
    machine one attempt can outlast the kill interval many times over: hence the bound."""
    last: ConnectionLost | None = None
    started = time.monotonic()
    for failures in range(attempts):
        try:
            return call(), failures
        except ConnectionLost as exc:
            last = exc
    raise AssertionError(
        f"still failing after {attempts} attempts in {time.monotonic() - started:.1f}s; "
        f"last: {last}"
    )


def evidence(scenario: str, parameters: str, faults: str, wall: float) -> None:
    """Record a row of docs/RELIABILITY.md for a run whose assertions found nothing lost,
    double counted or poisoned."""
    record(
        {
            "scenario": scenario,
            "parameters": parameters,
            "faults": faults,
            "lost": 0,
            "double_counted": 0,
            "poisoned": 0,
            "wall_s": round(wall, 1),
        }
    )


def flows_to_add(parents: str, work: str, rounds: int) -> list[tuple[str, list[Child]]]:
    return [
        (f"JOB-add{r}", [Child(i, queue=work) for i in range(600)] + [Child(i) for i in range(10)])
        for r in range(rounds)
    ]


def test_add_takes_effect_once_or_raises_and_the_retry_converges(
    backend: Backend, prefix: str
) -> None:
    parents, work = backend.queues_on_distinct_nodes(2, "ca")
    # at least ADD_FLOWS flows, and more (bounded) until a fault has cut an add: on a loaded
    # machine the killer's timing may miss a few adds, so the precondition is reached by
    # adding, never by luck
    candidates = flows_to_add(parents, work, ADD_FLOWS * 10)
    todo: list[tuple[str, list[Child]]] = []
    mq = victim(backend, prefix)
    started = time.monotonic()
    raised = first_try = 0
    with ConnectionKiller(backend.servers, VICTIM, 0.0, 0.006) as killer:
        for parent_id, children in candidates:
            if len(todo) >= ADD_FLOWS and raised > 0 and killer.kills > 0:
                break
            todo.append((parent_id, children))
            ref, failures = retried(
                lambda p=parent_id, c=children: mq.add_flow(parents, c, parent_id=p, payload="p")
            )
            assert ref.parent_id == parent_id
            raised += failures
            first_try += failures == 0
    kills = killer.kills
    clean = backend.client(prefix + "c")
    for parent_id, children in todo:
        clean.add_flow(parents, children, parent_id=parent_id, payload="p")
    # the adds that were cut and retried wrote exactly what uncut adds write
    assert normalised(backend, prefix) == normalised(backend, prefix + "c")
    assert raised > 0 and kills > 0, "the faults hit the adds"
    work_off(mq, [parents, work], lambda job: job.payload)
    for parent_id, _ in todo:
        assert len(mq.children_values(parents, parent_id)) == 610
        assert mq.connection.client.get(mq.keys.dependencies(parents, parent_id)) == b"0"
    evidence(
        f"connection faults: add ({backend.name})",
        f"{len(todo)} flows x 610 children, parent and children on "
        "different nodes; adds retried by id until they return",
        f"{kills} CLIENT KILLs every 0-6 ms; {raised} adds raised ConnectionLost, "
        f"{len(todo) - first_try} flows needed a retry",
        time.monotonic() - started,
    )
    mq.close()
    clean.close()


def test_claim_takes_effect_once_or_raises(backend: Backend, prefix: str) -> None:
    (work,) = backend.queues_on_distinct_nodes(1, "cc")
    owner = backend.client(prefix)
    q_owner = owner.queue(work, lease=0.3)
    ids = set(q_owner.add_bulk(range(3000)))
    mq = victim(backend, prefix)
    q = mq.queue(work, lease=0.3)
    held: dict[str, Any] = {}
    raised = 0
    started = time.monotonic()
    with ConnectionKiller(backend.servers, VICTIM, 0.0, 0.003) as killer:
        while owner.queue(work).stats()["pending"] > 0:
            # more jobs (bounded) until a fault has cut a claim: the precondition is reached
            # by claiming more, not by luck of timing
            if raised == 0 and owner.queue(work).stats()["pending"] <= 10 and len(ids) < 8000:
                ids |= set(q_owner.add_bulk(range(1000)))
            try:
                jobs = q.claim(10, lease=60)
            except ConnectionLost:
                raised += 1
                continue
            for job in jobs:
                assert job.id not in held, "a job was handed out twice"
                held[job.id] = job
    stats = q_owner.stats()
    orphaned = stats["active"] - len(held)
    # a claim that returned leased exactly what it returned; one that raised may have leased
    # its batch (its reply was lost) - those, and only those, wait for their lease to expire
    assert 0 <= orphaned <= 10 * raised, (orphaned, raised)
    assert raised > 0 and killer.kills > 0
    assert all(q_owner.complete_many([(job, 1) for job in held.values()]))
    owner.connection.client.zadd(owner.keys.active(work), {i: 0 for i in ids - set(held)}, xx=True)
    pump = Pump(owner, [work], maintain_every=0)  # the orphans' leases "expire" now
    assert pump.tick().recovered == orphaned
    rest = q_owner.claim(10_000)
    assert len(rest) == orphaned and all(j.stalls == 1 for j in rest)
    q_owner.complete_many([(job, 1) for job in rest])
    final = q_owner.stats()
    assert (final["completed"], final["active"], final["pending"]) == (len(ids), 0, 0)
    evidence(
        f"connection faults: claim ({backend.name})",
        f"{len(ids):,} jobs claimed 10 at a time by a client whose connections are killed",
        f"{killer.kills} CLIENT KILLs every 0-3 ms; {raised} claims raised; "
        f"{orphaned} jobs leased by raised claims came back after their lease",
        time.monotonic() - started,
    )
    mq.close()
    owner.close()


def test_complete_takes_effect_once_or_raises(backend: Backend, prefix: str) -> None:
    """Attempt k of a batch's completion records results that name it (attempt 0: 2 * payload,
    attempt k > 0: -k); a batch whose call raised is retried until a call returns. The results
    recorded in the end then say which attempt took effect: exactly one per batch (a script
    call is atomic), the one that returned True, or - when it returned False (lease spent) -
    an earlier one that raised after it had taken effect."""
    parents, work = backend.queues_on_distinct_nodes(2, "cm")
    owner = backend.client(prefix)
    mq = victim(backend, prefix)
    started = time.monotonic()
    refs = []
    batches: list[tuple[Any, Any]] = []
    outcome: list[tuple[int, bool]] = []  # per batch: the attempt that returned, its status
    raised = 0
    with ConnectionKiller(backend.servers, VICTIM, 0.0, 0.003) as killer:
        # a round of 2 flows, and more rounds (bounded) until a fault has cut a completion:
        # on a loaded machine the killer may miss every call of a round (CI once saw 0 of
        # 100), so the precondition is reached by completing more, never by luck of timing
        for r in range(10):
            if raised > 0 and killer.kills > 0:
                break
            round_refs = [
                owner.add_flow(parents, [Child(i) for i in range(1000)], parent_id=f"JOB-same{r}"),
                owner.add_flow(
                    parents, [Child(i, queue=work) for i in range(1000)], parent_id=f"JOB-x{r}"
                ),
            ]
            refs += round_refs
            round_batches = []
            for name in (parents, work):
                q = owner.queue(name)  # claimed by the owner: the faults are for the completions
                while jobs := q.claim(20, lease=120):
                    # a parent an earlier round released is claimable here: it runs now
                    ran = [j for j in jobs if j.payload is None]
                    assert all(q.complete_many([(j, None) for j in ran]))
                    if kids := [j for j in jobs if j.payload is not None]:
                        round_batches.append((mq.queue(name), kids))
            batches += round_batches
            for q, jobs in round_batches:
                time.sleep(0.002)  # let the killer in between batches too
                for attempt in range(500):
                    results = [(j, j.payload * 2 if attempt == 0 else -attempt) for j in jobs]
                    try:
                        statuses = q.complete_many(results)
                    except ConnectionLost:
                        continue
                    assert len(set(statuses)) == 1, "one script call: all of the batch or none"
                    assert statuses[0] or attempt > 0, "a first call that returned took effect"
                    outcome.append((attempt, statuses[0]))
                    raised += attempt
                    break
    assert raised > 0 and killer.kills > 0, (raised, killer.kills, len(refs))
    work_off(owner, [parents, work], lambda job: job.payload)
    values: dict[str, Any] = {}
    for ref in refs:
        values |= owner.children_values(parents, ref.parent_id)
        assert owner.connection.client.get(owner.keys.dependencies(parents, ref.parent_id)) == b"0"
        assert owner.get_job(parents, ref.parent_id).state == "completed"  # released, ran
    took_effect_then_raised = 0
    for (_, jobs), (returned, status) in zip(batches, outcome, strict=True):
        recorded = {0 if values[j.id] == j.payload * 2 else -values[j.id] for j in jobs}
        assert len(recorded) == 1, f"one attempt took effect for the whole batch: {recorded}"
        (effective,) = recorded
        if status:
            assert effective == returned, (effective, returned)
        else:
            assert effective < returned, (effective, returned)
            took_effect_then_raised += 1
    evidence(
        f"connection faults: complete ({backend.name})",
        f"{len(refs)} flows x 1,000 children (same-queue and cross-queue), completed in "
        "batches of 20; a raised batch is retried until a call returns",
        f"{killer.kills} CLIENT KILLs every 0-3 ms; {raised} completion calls "
        f"raised ({took_effect_then_raised} batches had taken effect before raising)",
        time.monotonic() - started,
    )
    mq.close()
    owner.close()


def test_pump_delivery_under_connection_kills(backend: Backend, prefix: str) -> None:
    parents, work = backend.queues_on_distinct_nodes(2, "cp")
    owner = backend.client(prefix)
    ref = owner.add_flow(parents, [Child(i, queue=work) for i in range(3000)], parent_id="JOB-p")
    q = owner.queue(work)
    while jobs := q.claim(500):
        q.complete_many([(job, job.payload) for job in jobs])
    assert q.stats()["outbox"] == 3000
    mq = victim(backend, prefix)
    pump = Pump(mq, [parents, work], page=20, lease=0.5)
    started = time.monotonic()
    try:
        with ConnectionKiller(backend.servers, VICTIM, 0.005, 0.02) as killer:
            pump.start()
            deadline = time.monotonic() + 90  # one bound for both waits

            def settled() -> bool:
                if owner.snapshot(parents, ref.parent_id).parent_state != "held":
                    return True
                assert pump.running
                return False

            eventually(
                settled, 90, lambda: f"the release: {owner.snapshot(parents, ref.parent_id)}"
            )
        eventually(
            lambda: not q.stats()["outbox"],
            max(0.0, deadline - time.monotonic()),
            lambda: f"an empty outbox: {q.stats()}",
        )
    finally:
        pump.stop()
    assert killer.kills > 0, "the faults hit the Pump's connections"
    assert owner.children_values(parents, ref.parent_id) == {f"JOB-p.{i}": i for i in range(3000)}
    assert owner.connection.client.get(owner.keys.dependencies(parents, ref.parent_id)) == b"0"
    (parent,) = owner.queue(parents).claim(10)  # released exactly once
    assert parent.id == "JOB-p" and owner.queue(parents).claim(10) == []
    assert owner.queue(work).stats()["poison"] == 0
    evidence(
        f"connection faults: Pump delivery ({backend.name})",
        "3,000 cross-queue signals delivered by one Pump thread (page 20)",
        f"{killer.kills} CLIENT KILLs every 5-20 ms; {pump.failed_ticks} ticks failed "
        "and were retried with backoff",
        time.monotonic() - started,
    )
    mq.close()
    owner.close()


def test_worker_and_pump_processes_reconnect_and_carry_on(
    backend: Backend, prefix: str, proc_env: dict[str, str], tmp_path: Path
) -> None:
    """Real worker and Pump processes whose every connection is killed every 20-80 ms for
    the whole run: they log the failure, back off (bounded) and carry on; the flow completes
    exactly."""
    parents, a, b = backend.queues_on_distinct_nodes(3, "cw")
    n = 2000
    mq = backend.client(prefix)
    children = [Child({"n": i, "pause": 5}, queue=a if i % 2 else b) for i in range(n)]
    # attempts: a handler whose own reads are cut by a kill fails that attempt (the parent's
    # handler reads every result); give them room, this test is about the processes
    mq.add_flow(parents, children, payload={"parent": True}, parent_id="JOB-cw", max_attempts=25)
    config = {
        "url": backend.url,
        "cluster": backend.cluster,
        "prefix": prefix,
        "queues": [parents, a, b],
        "client_name": VICTIM,
        "lease": 1.0,
    }
    fleet = Fleet(config, proc_env, tmp_path, workers=2, pumps=1).start()
    started = time.monotonic()
    try:
        fleet.wait_ready()
        with ConnectionKiller(backend.servers, VICTIM, 0.02, 0.08) as killer:

            def completed() -> bool:
                if mq.get_job(parents, "JOB-cw").state == "completed":
                    return True
                assert not fleet.crashed(), fleet.crashed()
                return False

            eventually(
                completed,
                120,
                lambda: (
                    mq.snapshot(parents, "JOB-cw"),
                    [mq.queue(q).stats() for q in (parents, a, b)],
                    fleet.logdir,
                ),
                every=0.1,
            )
        wall = time.monotonic() - started
        assert not fleet.crashed(), "no process gave up"
        fleet.stop()
        logs = [m.log.read_text() for m in fleet.members]
    finally:
        fleet.close()
    complaints = sum(log.count("WARNING") for log in logs)
    values = mq.children_values(parents, "JOB-cw")
    assert len(values) == n and sum(v["sq"] for v in values.values()) == sum(
        i * i for i in range(n)
    )
    assert mq.connection.client.get(mq.keys.dependencies(parents, "JOB-cw")) == b"0"
    result = mq.get_job(parents, "JOB-cw").result
    assert result == {"count": n, "sum": sum(i * i for i in range(n))}
    for name in (parents, a, b):
        stats = mq.queue(name).stats()
        assert (stats["dead"], stats["poison"], stats["active"], stats["pending"]) == (
            0,
            0,
            0,
            0,
        ), (name, stats, fleet.logdir)
    stalls = sum(row_fields(mq, a, [f"JOB-cw.{i}" for i in range(1, n, 2)], "stalls")) + sum(
        row_fields(mq, b, [f"JOB-cw.{i}" for i in range(0, n, 2)], "stalls")
    )
    assert killer.kills > 0 and complaints + stalls > 0, "the faults reached the processes"
    evidence(
        f"connection faults: worker + Pump processes ({backend.name})",
        f"{n}-child cross-queue flow (5 ms handlers), 2 worker processes (4 threads) + 1 Pump "
        "process, lease 1 s",
        f"{killer.kills} CLIENT KILLs of all their connections every 20-80 ms; "
        f"{complaints} logged failures; {stalls} leases recovered",
        wall,
    )
    mq.close()
