"""A flow's concurrency cap (``max_running``) and children's priorities (issue 28, items 1, 4).

The cap is counted on each child queue's slot by a gate (lua/includes/gate.lua): at most K of
a node's leaf children hold a token (pending, leased or retrying), so at most K are leased,
whatever the number of workers. On standalone and on the Cluster with the parent and the child
queues on different nodes; the server's own ZCARD of ``active`` is what is sampled.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import redis

from echomq_core import Child, EchoMQ, FlowConflict, InvalidArgument, Job, Pump, Worker
from echomq_core.flows import plan as flow_ops
from echomq_core.queues import claiming, settling
from echomq_core.server import EmbeddedServer

from ..cli.test_cli import run_many
from ..conftest import Backend
from ..flowkit import keys_of, normalised, work_off
from ..waiting import eventually
from .test_flow_lifecycle import ALL_ZERO, job_keys, sweep


def server_of(backend: Backend, queue: str) -> redis.Redis:
    server = backend.servers[backend.node_of_queue(queue)]
    return redis.Redis(host=server.host, port=server.port)


def gate_of(mq: EchoMQ, queue: str, parent_queue: str, parent_id: str) -> tuple[str, str]:
    waiting, counts = mq.keys.gate_keys(queue, parent_queue, parent_id)
    return waiting, counts


def counts(mq: EchoMQ, work: str, parents: str, pid: str) -> tuple[int, int, int]:
    """(pending, waiting in the gate, admitted) of one gate, read on the child queue's slot."""
    r = mq.connection.client
    waiting, cap = gate_of(mq, work, parents, pid)
    admitted = r.hget(cap, "admitted")
    return r.zcard(mq.keys.pending(work)), r.zcard(waiting), int(admitted or 0)


def test_at_most_k_children_run_at_once_across_four_workers(backend: Backend, prefix: str) -> None:
    """Four workers of concurrency 10 (40 slots) on a flow capped at 5: while every handler is
    held by a gate the test controls, exactly 5 are leased (sampled on the child queue's server)
    and the rest wait in the gate; once the gate opens, every sample of the server's active set
    and of the handlers running at once stays <= 5 until the flow is released with all 120."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "cap")
    k, n = 5, 120
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(n)], max_running=k)
    go = threading.Event()
    lock = threading.Lock()
    running, peak = [0], [0]

    def handle(job: Job) -> Any:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        go.wait(30)
        with lock:
            running[0] -= 1
        return job.payload

    workers = [
        Worker(backend.client(prefix), {work: handle}, concurrency=10, poll=0.05) for _ in range(4)
    ]
    pump = Pump(mq, [parents, work])
    server = server_of(backend, work)
    active = mq.keys.active(work)
    try:
        for w in workers:
            w.start()
        eventually(lambda: server.zcard(active) == k, 30, "5 children leased")
        assert running[0] <= k
        samples = [server.zcard(active) for _ in range(200)]
        assert max(samples) == k, samples
        assert counts(mq, work, parents, ref.parent_id) == (0, n - k, k)
        go.set()
        seen = []
        while mq.snapshot(parents, ref.parent_id).parent_state == "held":
            seen.append(server.zcard(active))
            pump.tick()
        assert max(seen) <= k, max(seen)
        assert peak[0] <= k, peak[0]
    finally:
        go.set()
        for w in workers:
            w.stop()
        pump.release_leases()
        server.close()
    snap = mq.snapshot(parents, ref.parent_id)
    assert (snap.parent_state, snap.processed) == ("pending", n)
    cap = mq.flow_cap(parents, ref.parent_id)
    assert cap is not None and (cap.cap, cap.admitted, cap.waiting) == (k, 0, 0)


def test_a_retry_and_a_lease_expiry_keep_the_token_a_death_passes_it_on(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "tok")
    ref = mq.add_flow(
        parents,
        [Child(i, queue=work, max_attempts=2, ignore_dependency_on_failure=True) for i in range(6)],
        max_running=2,
    )
    pid, q = ref.parent_id, mq.queue(work)
    first, second = q.claim(10)
    assert [first.id, second.id] == [f"{pid}.0", f"{pid}.1"]  # the gate keeps the order
    assert first.parent is not None and first.parent.gated
    assert not q.fail(first, "boom")  # a retry: still the flow's to run, keeps its token
    assert counts(mq, work, parents, pid) == (0, 4, 2)
    assert q.claim(10) == []  # the retry waits for its due time; nothing else was admitted
    # a lease that expires: back to pending with its token (the Pump recovers it)
    mq.connection.client.zadd(mq.keys.active(work), {second.id: 0})
    pump = Pump(mq, [parents, work], sweep_every=None)
    pump.tick()
    assert counts(mq, work, parents, pid) == (1, 4, 2)
    (again,) = q.claim(10)
    assert again.id == second.id
    # a death (the attempt cap) returns the token: the gate's head starts in the same step
    mq.connection.client.zadd(mq.keys.delayed(work), {first.id: 0})
    (retried,) = q.claim(10)
    assert q.fail(retried, "boom again")
    assert counts(mq, work, parents, pid) == (1, 3, 2)
    (third,) = q.claim(10)
    assert third.id == f"{pid}.2"
    # a lease that expires past max_stalls buries the child (recover.lua): its token goes on
    mq.connection.client.zadd(mq.keys.active(work), {again.id: 0})
    stalls = Pump(mq, [parents, work], sweep_every=None, max_stalls=0)
    stalls.tick()
    stalls.release_leases()
    assert mq.queue(work).get_job(again.id).state == "dead"
    assert counts(mq, work, parents, pid) == (1, 2, 2)
    q.complete(third, "ok")
    work_off(mq, [parents, work], pump=pump)
    pump.release_leases()
    snap = mq.snapshot(parents, pid)
    assert (snap.parent_state, snap.processed, snap.ignored) == ("completed", 4, 2)


def test_a_retried_add_admits_nobody_twice_and_another_cap_is_a_conflict(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "re")
    kids = [Child(i, queue=work) for i in range(1200)]  # three land calls per add
    ref = mq.add_flow(parents, kids, parent_id="JOB-af/dag/task/1", max_running=3)
    before = normalised(backend, prefix)
    again = mq.add_flow(parents, kids, parent_id="JOB-af/dag/task/1", max_running=3)
    assert again == ref
    assert normalised(backend, prefix) == before
    assert counts(mq, work, parents, ref.parent_id) == (3, 1197, 3)
    for other in (4, None):
        with pytest.raises(FlowConflict, match="max_running"):
            mq.add_flow(parents, kids, parent_id="JOB-af/dag/task/1", max_running=other)
    plain = mq.add_flow(parents, kids[:3], parent_id="JOB-plain")
    with pytest.raises(FlowConflict, match="max_running"):
        mq.add_flow(parents, kids[:3], parent_id="JOB-plain", max_running=2)
    assert mq.dependencies(parents, plain.parent_id) == 3


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_a_bad_cap_is_refused_naming_it_before_anything_is_written(
    backend: Backend, prefix: str, bad: Any
) -> None:
    mq = backend.client(prefix)
    with pytest.raises(InvalidArgument, match=f"max_running.*{bad!r}"):
        mq.add_flow("bc", [Child(1, queue="bc-w")], max_running=bad)
    with pytest.raises(InvalidArgument, match=f"max_running.*{bad!r}"):
        mq.add_flow("bc", [Child(children=[Child(1)], max_running=bad)])
    assert keys_of(backend, prefix) == {}


def test_bad_priorities_and_misplaced_options_are_refused() -> None:
    mq = EchoMQ("redis://127.0.0.1:1/0")  # never reached: refused while planning
    for bad in (-1, 801, 1.5, True):
        with pytest.raises(InvalidArgument, match=f"priority.*{bad!r}"):
            mq.add_flow("p", [Child(1, priority=bad)])
    with pytest.raises(InvalidArgument, match="priority applies to a leaf"):
        mq.add_flow("p", [Child(children=[Child(1)], priority=3)])
    with pytest.raises(InvalidArgument, match="max_running applies to a child with children"):
        mq.add_flow("p", [Child(1, max_running=3)])
    with pytest.raises(InvalidArgument, match="below the number of queues"):
        mq.add_flow("p", [Child(1, queue="a"), Child(2, queue="b")], max_running=1)


def test_the_cap_splits_over_child_queues_by_their_children() -> None:
    def shares(k: int, spread: dict[str, int]) -> dict[str, int]:
        kids = [Child(i, queue=q) for q, n in spread.items() for i in range(n)]
        root = flow_ops.plan(
            "p", "JOB-p", b"", kids, default_attempts=1, dumps=lambda v: b"1",
            max_payload=100, max_running=k,
        )  # fmt: skip
        return root.shares or {}

    assert shares(10, {"a": 6, "b": 4}) == {"a": 6, "b": 4}
    assert shares(5, {"a": 6, "b": 4}) == {"a": 3, "b": 2}
    assert shares(50, {"a": 1, "b": 1000}) == {"a": 1, "b": 49}
    assert shares(3, {"a": 1, "b": 1, "c": 1}) == {"a": 1, "b": 1, "c": 1}
    for k in (3, 7, 50, 101):
        assert sum(shares(k, {"a": 5, "b": 17, "c": 900}).values()) == k


def test_several_child_queues_each_hold_their_share(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, a, b = backend.queues_on_distinct_nodes(3, "sq")
    kids = [Child(i, queue=a) for i in range(30)] + [Child(i, queue=b) for i in range(20)]
    ref = mq.add_flow(parents, kids, max_running=5)
    assert len(mq.queue(a).claim(100)) == 3 and len(mq.queue(b).claim(100)) == 2
    cap = mq.flow_cap(parents, ref.parent_id)
    assert cap is not None
    assert (cap.cap, cap.admitted, cap.waiting) == (5, 5, 45)
    assert cap.shares == {a: (3, 3), b: (2, 2)}


def test_a_sub_flow_has_its_own_cap_and_inner_nodes_hold_no_token(
    backend: Backend, prefix: str
) -> None:
    """The root's cap counts its own leaf children; the sub-flow (an inner node) takes none of
    it, and caps its own leaves with its own cap."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "nest")
    sub = Child(
        "sub", queue=parents, max_running=2, children=[Child(i, queue=work) for i in range(6)]
    )
    ref = mq.add_flow(parents, [sub, *(Child(i, queue=work) for i in range(4))], max_running=3)
    claimed = mq.queue(work).claim(100)
    by_parent: dict[str, int] = {}
    for job in claimed:
        assert job.parent is not None
        by_parent[job.parent.id] = by_parent.get(job.parent.id, 0) + 1
    sub_id = f"{ref.parent_id}.0"
    assert by_parent == {ref.parent_id: 3, sub_id: 2}
    assert mq.queue(work).claim(100) == []
    cap = mq.flow_cap(parents, sub_id)
    assert cap is not None and (cap.cap, cap.admitted, cap.waiting) == (2, 2, 4)
    assert all(mq.queue(work).complete_many([(j, j.payload) for j in claimed]))
    work_off(mq, [parents, work])
    assert mq.snapshot(parents, ref.parent_id).parent_state == "completed"


def test_cancel_empties_the_gate_and_repair_goes_through_it_again(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "cx")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(8)], max_running=2)
    pid, q = ref.parent_id, mq.queue(work)
    leased = q.claim(10)
    assert len(leased) == 2
    assert q.complete(leased[0], "done") is None  # its token admits the next one
    mq.cancel_flow(parents, pid, reason="stop")
    waiting, _ = gate_of(mq, work, parents, pid)
    assert counts(mq, work, parents, pid) == (0, 0, 0)
    assert mq.connection.client.exists(waiting) == 0
    assert not any(q.complete_many([(leased[1], "late")]))  # its lease went with the cancel
    assert counts(mq, work, parents, pid) == (0, 0, 0)
    assert q.claim(10) == []
    # the repair re-runs the 7 cancelled children through the gate: 2 at a time
    mq.retry_flow(parents, pid)
    assert counts(mq, work, parents, pid) == (2, 5, 2)
    seen = 0
    pump = Pump(mq, [parents, work], sweep_every=None)
    while jobs := q.claim(10):
        assert len(jobs) <= 2
        seen += len(jobs)
        assert all(q.complete_many([(j, j.payload) for j in jobs]))
        pump.tick()
    pump.tick()
    pump.release_leases()
    assert seen == 7
    snap = mq.snapshot(parents, pid)
    assert (snap.parent_state, snap.processed) == ("pending", 8)


def test_a_dead_child_of_a_failed_flow_is_repaired_through_the_gate(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rp")
    ref = mq.add_flow(
        parents, [Child(i, queue=work, max_attempts=1) for i in range(5)], max_running=2
    )
    pid, q = ref.parent_id, mq.queue(work)
    a, b = q.claim(10)
    q.fail(a, "boom")
    q.fail(b, "boom")
    pump = Pump(mq, [parents, work], sweep_every=None)
    work_off(mq, [parents, work], pump=pump)  # the other three run in the failed flow
    assert mq.snapshot(parents, pid).parent_state == "failed"
    assert counts(mq, work, parents, pid) == (0, 0, 0)
    mq.retry_flow(parents, pid)
    assert counts(mq, work, parents, pid) == (2, 0, 2)
    work_off(mq, [parents, work], pump=pump)
    pump.release_leases()
    assert mq.snapshot(parents, pid).parent_state == "completed"


def test_retention_deletes_the_gate_with_the_flow(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "ret")
    sub = Child("sub", queue=work, max_running=1, children=[Child(i) for i in range(3)])
    ref = mq.add_flow(parents, [sub, *(Child(i, queue=work) for i in range(4))], max_running=2)
    work_off(mq, [parents, work])
    work_off(mq, [parents, work])  # the released parent runs too
    gates = [k for k in keys_of(backend, prefix) if ":gate:" in k]
    assert len(gates) == 2, gates  # the cap hashes of the root and the sub-flow (the waiting
    # zsets are empty: no key)
    assert mq.snapshot(parents, ref.parent_id).parent_state == "completed"
    assert any(":gate:" in k for k in keys_of(backend, prefix))
    for queue in (parents, work):
        mq.set_retention(queue, **ALL_ZERO)
    sweep(mq, [parents, work])
    assert job_keys(backend, prefix) == []
    assert [k for k in keys_of(backend, prefix) if ":gate:" in k] == []


def test_a_late_urgent_flow_overtakes_a_backlog(backend: Backend, prefix: str) -> None:
    """A queue holding 1,000 children of priority 100 (some flows capped, some not): a flow
    added later with priority 0 is claimed first, capped or not."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "pri")
    mq.add_flow(parents, [Child(i, queue=work, priority=100) for i in range(600)])
    mq.add_flow(parents, [Child(i, queue=work, priority=100) for i in range(400)], max_running=400)
    urgent = mq.add_flow(parents, [Child(i, queue=work) for i in range(3)])
    gated = mq.add_flow(parents, [Child(i, queue=work) for i in range(4)], max_running=2)
    first = mq.queue(work).claim(5)
    assert {j.id for j in first} == {
        *(f"{urgent.parent_id}.{i}" for i in range(3)),
        *(f"{gated.parent_id}.{i}" for i in range(2)),
    }
    assert [j.id for j in first[:3]] == [f"{urgent.parent_id}.{i}" for i in range(3)]
    later = mq.queue(work).claim(1)[0]
    assert later.parent is not None and later.parent.id != gated.parent_id  # gate holds two


def test_flow_show_prints_running_over_cap(
    standalone_server: EmbeddedServer, prefix: str, proc_env: dict[str, str]
) -> None:
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    ref = mq.add_flow("show-p", [Child(i, queue="show-w") for i in range(10)], max_running=4)
    plain = mq.add_flow("show-p", [Child(1)])
    mq.queue("show-w").claim(3)
    conn = ["--url", standalone_server.url, "--prefix", prefix]
    text, as_json, uncapped = run_many(
        [
            ["flow", "show", "show-p", ref.parent_id, *conn],
            ["flow", "show", "show-p", ref.parent_id, "--json", *conn],
            ["flow", "show", "show-p", plain.parent_id, "--json", *conn],
        ],
        {k: v for k, v in proc_env.items() if not k.startswith("ECHOMQ_")},
    )
    assert text.returncode == 0, text.stderr
    assert "running 4 / cap 4 (admitted: leased, pending or retrying), 6 waiting" in text.stdout
    assert "per queue: show-w 4/4" in text.stdout
    cap = json.loads(as_json.stdout)["cap"]
    assert (cap["cap"], cap["admitted"], cap["waiting"]) == (4, 4, 6)
    assert json.loads(uncapped.stdout)["cap"] is None
    mq.close()


def test_a_threshold_that_fails_the_flow_empties_its_gate(backend: Backend, prefix: str) -> None:
    """min_success and max_running together: the death that makes the threshold unreachable
    cancels the unstarted children - those waiting in the gate too - and nothing starts."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "thr")
    kids = [Child(i, queue=work, max_attempts=1) for i in range(8)]
    ref = mq.add_flow(parents, kids, max_running=2, min_success=7)  # one death allowed
    pid, q = ref.parent_id, mq.queue(work)
    pump = Pump(mq, [parents, work], sweep_every=None)
    a, b = q.claim(10)
    q.fail(a, "boom")
    pump.tick()
    assert mq.snapshot(parents, pid).parent_state == "held"
    q.fail(b, "boom")  # the second death: 7 can no longer succeed
    for _ in range(5):
        pump.tick()
    pump.release_leases()
    assert mq.snapshot(parents, pid).parent_state == "failed"
    assert q.claim(10) == []
    assert counts(mq, work, parents, pid) == (0, 0, 0)


def test_a_completion_hands_the_admitted_child_to_the_completing_worker(
    backend: Backend, prefix: str
) -> None:
    """A completion that offers a hand-off (what a worker's flusher sends) leases the child its
    gate admits to the caller at once - in active with the offered token, not in pending, still
    counted as admitted - and that lease is a normal one: heartbeats extend it, it completes,
    and when its holder dies (its lease expires) the Pump returns it to pending with its token.
    A plain ``Queue.complete`` (no buffer to take it) and a rate-limited queue (starts are
    counted by claims) put the admitted child in pending instead."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "hand")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(6)], max_running=2)
    pid, q, r = ref.parent_id, mq.queue(work), mq.connection.client
    first, second = q.claim(10)
    offer = flow_ops_hand("tok-a", 2)
    done = mq.perform(q.settle_completed_op(q.encode_results([(first, "ok")]), offer))
    assert done.statuses == [1] and done.handed == [f"{pid}.2"]
    assert counts(mq, work, parents, pid) == (0, 3, 2)  # leased, not pending; within the cap
    assert r.hget(mq.keys.leases(work), f"{pid}.2") == b"tok-a"
    (handed,) = mq.perform(claiming.leased(mq.keys, work, done.handed, "tok-a", mq.serializer))
    assert handed.parent is not None and handed.parent.gated and handed.payload == 2
    assert q.heartbeat([handed]) == [True]
    # its holder dies: the lease expires and the Pump recovers it, token kept
    r.zadd(mq.keys.active(work), {handed.id: 0})
    pump = Pump(mq, [parents, work], sweep_every=None)
    pump.tick()
    assert counts(mq, work, parents, pid) == (1, 3, 2)
    assert not q.complete_many([(handed, "late")])[0]  # the dead holder's lease is gone
    # a plain completion: the admitted child goes to pending
    q.complete(second, "ok")
    assert counts(mq, work, parents, pid) == (2, 2, 2)
    # a rate-limited queue: no hand-off, the child goes to pending, claimed within the limit
    mq.set_rate_limit(work, "1000/s", burst=10)  # both claimed at once
    third, fourth = q.claim(10)
    done = mq.perform(q.settle_completed_op(q.encode_results([(third, "ok")]), offer))
    assert done.handed == [] and counts(mq, work, parents, pid) == (1, 1, 2)
    mq.set_rate_limit(work, None)
    # a death hands off too
    failed = mq.perform(q.settle_failed_op([(fourth, "boom", False)], offer))
    assert failed.statuses == [2] and failed.handed == [f"{pid}.5"]
    assert counts(mq, work, parents, pid) == (1, 0, 2)
    (last,) = mq.perform(claiming.leased(mq.keys, work, failed.handed, "tok-a", mq.serializer))
    q.complete(last, "ok")
    work_off(mq, [parents, work], pump=pump)
    pump.release_leases()
    assert mq.snapshot(parents, pid).parent_state == "failed"  # the death failed the flow


def flow_ops_hand(token: str, room: int) -> settling.Hand:
    return settling.Hand(token, 30_000, room)


def test_a_worker_runs_handed_off_children_within_the_cap(backend: Backend, prefix: str) -> None:
    """One worker of concurrency 4 on a flow of 8 capped at 2: after the first claim, the
    children its completions admit come to it as hand-offs (its claims return only the first
    two), every one runs and completes, and no more than 2 ever run at once."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "handw")
    n = 8
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(n)], max_running=2)
    lock = threading.Lock()
    running, peak, ran = [0], [0], []

    def handle(job: Job) -> Any:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            ran.append(job.id)
        with lock:
            running[0] -= 1
        return job.payload

    worker = Worker(mq, {work: handle}, concurrency=4, pump=False)
    claimed: list[str] = []
    claim_op = worker.queues[work].claim_op  # the fetcher's claims (routines.claim_turn)

    def counting_claim(count: int, **kw: Any) -> Any:
        jobs = yield from claim_op(count, **kw)
        claimed.extend(j.id for j in jobs)
        return jobs

    worker.queues[work].claim_op = counting_claim  # type: ignore[method-assign,assignment]
    pump = Pump(mq, [parents, work], sweep_every=None)
    worker.start()
    try:
        eventually(lambda: [pump.tick()] and mq.dependencies(parents, ref.parent_id) == 0)
    finally:
        worker.stop()
        pump.release_leases()
    assert sorted(ran) == sorted(f"{ref.parent_id}.{i}" for i in range(n))
    assert len(claimed) < n  # the rest were handed off with completions
    assert peak[0] <= 2
