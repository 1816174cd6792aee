"""Flows on standalone and on a real 3-master Cluster (parent and children on different nodes)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from typing import Any

import pytest

from echomq_core import (
    AsyncEchoMQ,
    Child,
    EchoMQ,
    FlowConflict,
    InvalidFlow,
    InvalidJobId,
    InvalidPayload,
    InvalidQueueName,
    Job,
    Pump,
    Worker,
)
from echomq_core.flows import add, plan, sharding
from echomq_core.queues.adding import GC_PAUSE_AT, gc_paused
from echomq_core.wire.calls import CHUNK

from ..conftest import Backend
from ..flowkit import keys_of, run_steps, work_off
from ..waiting import eventually


def result_of(job: Job) -> Any:
    return {"child": job.id, "x": job.payload * 3} if isinstance(job.payload, int) else job.id


def check_invariant(mq: EchoMQ, queue: str, parent_id: str) -> int:
    """|processed| + |unsuccessful| + dependencies == N (one atomic read); disjointness."""
    snap = mq.snapshot(queue, parent_id)
    if snap.parent_state != "failed":
        assert snap.processed + snap.ignored + snap.dependencies == snap.total, snap
    return snap.dependencies


def test_cross_queue_thousand_children(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "fan")
    if backend.cluster:
        assert backend.node_of_queue(parents) != backend.node_of_queue(work)
    n = 1000
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(n)], payload="parent")
    assert mq.dependencies(parents, ref.parent_id) == n
    assert mq.snapshot(parents, ref.parent_id).parent_state == "held"

    released: list[tuple[str, str]] = []
    stop = threading.Event()

    def pump_loop() -> None:
        pump = Pump(mq, [parents, work], page=200)
        while not stop.is_set():
            released.extend(pump.tick().released)
            time.sleep(0.005)

    pumper = threading.Thread(target=pump_loop)
    pumper.start()
    # the worker's own Pump left out: this test counts the releases of the one above
    worker = Worker(mq, {work: result_of}, concurrency=2, max_batch=50, pump=False).start()
    readings = 0
    try:

        def settled() -> bool:
            nonlocal readings
            if check_invariant(mq, parents, ref.parent_id) > 0:
                readings += 1
                return False
            return True

        eventually(settled, 60, "every child settled", every=0.002)
        eventually(lambda: released, 60, "the release", every=0.01)
    finally:
        worker.stop()
        stop.set()
        pumper.join()
    assert readings > 5, "the invariant was read during the run, not only at the end"
    assert released == [(parents, ref.parent_id)], "released exactly once"
    values = mq.children_values(parents, ref.parent_id)
    assert values == {
        f"{ref.parent_id}.{i}": {"child": f"{ref.parent_id}.{i}", "x": i * 3} for i in range(n)
    }
    assert mq.ignored_failures(parents, ref.parent_id) == {}
    assert dict(mq.iter_children_values(parents, ref.parent_id, page=128)) == values
    (parent_job,) = mq.queue(parents).claim(10)  # released into its queue exactly once
    assert parent_job.id == ref.parent_id and mq.queue(parents).claim(10) == []
    mq.close()


def test_same_queue_fan_in_is_atomic(mq: EchoMQ) -> None:
    ref = mq.add_flow("same", [Child(i) for i in range(300)])
    q = mq.queue("same")
    jobs = q.claim(1000)
    assert {j.id for j in jobs} == {f"{ref.parent_id}.{i}" for i in range(300)}
    for k in range(0, 300, 100):
        q.complete_many([(j, j.payload) for j in jobs[k : k + 100]])
        check_invariant(mq, "same", ref.parent_id)
    snap = mq.snapshot("same", ref.parent_id)
    assert (snap.parent_state, snap.dependencies, snap.processed) == ("pending", 0, 300)
    assert mq.queue("same").stats()["outbox"] == 0  # no Pump needed on the same slot
    (parent,) = q.claim(10)
    assert parent.id == ref.parent_id and parent.payload is None
    q.complete(parent, sum(mq.children_values("same", ref.parent_id).values()))
    assert q.get_job(ref.parent_id).result == sum(range(300))


def test_redelivery_changes_nothing(backend: Backend, prefix: str) -> None:
    from ..flowkit import deliver_without_trim

    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rd")
    ref = mq.add_flow(
        parents,
        [Child(i, queue=work) for i in range(40)]
        + [Child(99, queue=work, ignore_dependency_on_failure=True, max_attempts=1)],
    )
    q = mq.queue(work, max_attempts=1)
    jobs = q.claim(100)
    q.complete_many([(j, j.payload) for j in jobs if j.payload != 99])
    q.fail_many([(j, "boom", True) for j in jobs if j.payload == 99])
    assert q.stats()["outbox"] == 41
    deliver_without_trim(mq, [work], "pump-a")
    first = (
        mq.snapshot(parents, ref.parent_id),
        mq.children_values(parents, ref.parent_id),
        mq.ignored_failures(parents, ref.parent_id),
    )
    assert first[0].parent_state == "pending" and first[0].processed == 40
    for _ in range(2):  # the same signals, delivered twice more
        deliver_without_trim(mq, [work], "pump-a")
    again = (
        mq.snapshot(parents, ref.parent_id),
        mq.children_values(parents, ref.parent_id),
        mq.ignored_failures(parents, ref.parent_id),
    )
    assert again == first
    assert q.stats()["outbox"] == 41  # nothing trimmed by the crashed Pumps
    # a restarted Pump (another id) takes over once the dead Pump's lease lapses
    pump = Pump(mq, [work], lease=0.2)
    assert pump.tick().delivered == 0  # lease still held by the dead pump-a
    mq.connection.client.pexpire(mq.keys.outbox_lease(work), 1)
    time.sleep(0.01)
    stats = pump.tick()
    assert stats.delivered == 41 and stats.released == []  # released once, by the first
    assert q.stats()["outbox"] == 0
    assert mq.snapshot(parents, ref.parent_id) == first[0]
    assert mq.queue(parents).stats()["pending"] == 1
    mq.close()


def test_trim_is_conditional(backend: Backend, prefix: str) -> None:
    """A Pump that loses its lease between deliver and trim removes nothing."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "tc")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(20)])
    q = mq.queue(work)
    first = q.claim(10)
    q.complete_many([(j, j.payload) for j in first])
    op = flow_ops_drain(mq, work, "slow-pump")
    step = next(op)
    step = op.send(mq.connection.execute(step))  # read the page
    step = op.send(mq.connection.execute(step))  # delivered; now it stalls
    mq.connection.client.delete(mq.keys.outbox_lease(work))  # its lease lapses
    fast = Pump(mq, [work], pump_id="fast-pump")
    assert fast.tick().delivered == 10  # the other Pump takes over and trims
    rest = q.claim(10)
    q.complete_many([(j, j.payload) for j in rest])  # 10 new signals in the outbox
    with pytest.raises(StopIteration) as done:
        op.send(mq.connection.execute(step))  # the stalled Pump's trim
    assert done.value.value.delivered == 0
    assert q.stats()["outbox"] == 10  # none of the new signals were removed
    fast.tick()
    snap = mq.snapshot(parents, ref.parent_id)
    assert (snap.processed, snap.dependencies, snap.parent_state) == (20, 0, "pending")
    mq.close()


def flow_ops_drain(mq: EchoMQ, queue: str, pump_id: str):  # type: ignore[no-untyped-def]
    from echomq_core.pump.drain import drain

    return drain(mq.keys, [queue], pump_id, page=1000, lease_ms=10_000, max_tries=5)


def test_two_pumps_one_outbox(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "tp")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(600)])
    released: list[Any] = []
    stop = threading.Event()

    def loop(pump: Pump) -> None:
        while not stop.is_set():
            released.extend(pump.tick().released)

    pumps = [Pump(mq, [work], page=50, lease=0.3) for _ in range(2)]
    threads = [threading.Thread(target=loop, args=(p,)) for p in pumps]
    for t in threads:
        t.start()
    try:
        work_q = mq.queue(work)
        while True:
            jobs = work_q.claim(37)
            if not jobs:
                break
            work_q.complete_many([(j, j.payload) for j in jobs])
            if len(jobs) % 2:  # let the lease move between Pumps now and then
                mq.connection.client.delete(mq.keys.outbox_lease(work))
        eventually(
            lambda: mq.dependencies(parents, ref.parent_id) == 0, 30, "the release", every=0.01
        )
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert released == [(parents, ref.parent_id)]
    values = mq.children_values(parents, ref.parent_id)
    assert values == {f"{ref.parent_id}.{i}": i for i in range(600)}
    assert sum(p.totals.delivered for p in pumps) >= 600
    mq.close()


def _tree(parents: str, a: str, b: str) -> list[Child]:
    """10 cross-queue leaves, 5 same-queue leaves, and a sub-parent with 4 leaves."""
    return (
        [Child(i, queue=a) for i in range(10)]
        + [Child(100 + i) for i in range(5)]
        + [Child("sub", queue=b, children=[Child(200 + i, queue=a) for i in range(4)])]
    )


@pytest.mark.parametrize("step", [0, 1, 2])
@pytest.mark.parametrize("partial", [False, True])
def test_failed_add_then_retry_converges(
    backend: Backend, prefix: str, step: int, partial: bool
) -> None:
    mq = backend.client(prefix)
    parents, a, b = backend.queues_on_distinct_nodes(3, "fx")
    pid = "JOB-flow-under-test"
    root = plan.plan(
        parents,
        pid,
        mq.encode("p"),
        _tree(parents, a, b),
        default_attempts=3,
        dumps=mq.encode,
        max_payload=1 << 20,
    )
    run_steps(
        mq, add.add_flow(mq.keys, root, [parents, a, b]), step, partial=1 if partial else None
    )
    # progress in between: whatever landed may already run and complete
    for name in (a, parents):
        q = mq.queue(name)
        jobs = q.claim(3)
        q.complete_many([(j, j.payload) for j in jobs])
    if step == 0 and not partial:
        assert mq.snapshot(parents, pid).parent_state is None  # nothing was written
    ref = mq.add_flow(parents, _tree(parents, a, b), parent_id=pid, payload="p")  # the retry
    snap = mq.snapshot(parents, pid)
    assert (snap.total, snap.parent_state) == (16, "held")
    check_invariant(mq, parents, pid)
    again = mq.add_flow(parents, _tree(parents, a, b), parent_id=pid, payload="p")
    assert again == ref and mq.snapshot(parents, pid) == snap  # a second retry: no change
    work_off(mq, [parents, a, b], lambda j: j.payload if j.id != pid else "root")
    values = mq.children_values(parents, pid)
    expect = {f"{pid}.{i}": i for i in range(10)} | {f"{pid}.{10 + i}": 100 + i for i in range(5)}
    expect[f"{pid}.15"] = "sub"
    assert values == expect
    assert mq.children_values(b, f"{pid}.15") == {f"{pid}.15.{i}": 200 + i for i in range(4)}
    assert mq.get_job(parents, pid).result == "root"  # ran once, after every child
    mq.close()


def test_a_leaf_child_given_twice_is_two_children(mq: EchoMQ) -> None:
    """``[Child(x)] * 3`` is three children with x's payload (a leaf has nothing to plan
    twice); the same sub-flow given twice is refused (test_add_refusals_write_nothing)."""
    leaf = Child({"n": 1})
    ref = mq.add_flow("p", [leaf] * 3 + [Child(2, children=[leaf, leaf])])
    assert [c[1] for c in ref.children] == [f"{ref.parent_id}.{i}" for i in range(4)]
    assert mq.dependencies("p", ref.parent_id) == 4
    assert mq.dependencies("p", f"{ref.parent_id}.3") == 2
    got = [job.payload for job in mq.queue("p").claim(10)]
    assert got == [{"n": 1}] * 5, got


def test_add_refusals_write_nothing(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    before = keys_of(backend, prefix)
    twice = Child(1, children=[Child(9)])  # a sub-flow: given twice, refused
    cases: list[tuple[type[Exception], list[Child], dict[str, Any]]] = [
        (InvalidFlow, [], {}),
        (InvalidFlow, [Child(1, id="JOB-a"), Child(2, id="JOB-a")], {}),
        (InvalidFlow, [Child(1, id="JOB-root")], {"parent_id": "JOB-root"}),
        (InvalidFlow, [twice, Child(2, children=[twice])], {}),
        (InvalidFlow, [Child(1, fail_parent_on_failure=False)], {}),
        (InvalidFlow, ["not a child"], {}),  # type: ignore[list-item]
        (InvalidJobId, [Child(1, id="bad id")], {}),
        (InvalidJobId, [Child(1)], {"parent_id": "JOB-{x}"}),
        (InvalidQueueName, [Child(1, queue="a:b")], {}),
    ]
    for error, children, kwargs in cases:
        with pytest.raises(error):
            mq.add_flow("parents", children, **kwargs)
    assert keys_of(backend, prefix) == before
    mq.close()


def test_conflicting_parent_refused(mq: EchoMQ) -> None:
    mq.add_flow("p", [Child(1), Child(2)], parent_id="JOB-same")
    with pytest.raises(FlowConflict):
        mq.add_flow("p", [Child(1)], parent_id="JOB-same")
    mq.queue("p").add("plain", job_id="JOB-plain")
    with pytest.raises(FlowConflict):
        mq.add_flow("p", [Child(1)], parent_id="JOB-plain")
    assert mq.snapshot("p", "JOB-same").total == 2


def test_add_costs_two_round_trips(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    calls = []
    execute = mq.connection.execute

    def counting(step):  # type: ignore[no-untyped-def]
        calls.append(len(step))
        return execute(step)

    mq.shards("p"), mq.shards("c")  # the shard counts: read once per process, then cached
    mq.connection.execute = counting  # type: ignore[method-assign]
    mq.add_flow("p", [Child(i, queue="c" if i % 2 else "p") for i in range(1000)])
    assert len(calls) == 2, calls  # hold, then every landing (+ registry) in one pipeline
    assert calls == [1, 3]  # the registry, then 500 children per script call, per queue
    mq.close()


def test_a_big_depth_lands_the_first_call_of_each_queue_first(
    backend: Backend, prefix: str
) -> None:
    """A depth with more land calls than one per queue plus EARLY_AFTER lands in two steps:
    the first land call of each queue (with the holds and the registry), then the rest in
    order, so the first children are claimable before the rest is formed and sent. Claims
    still follow the given order in every queue, and a depth just at the bound stays one
    step."""
    mq = backend.client(prefix)
    steps: list[list[tuple[str, int]]] = []
    execute = mq.connection.execute

    def recording(step):  # type: ignore[no-untyped-def]
        steps.append([(c.script.name if c.script else c.args[0], len(c.args)) for c in step])
        return execute(step)

    mq.shards("p"), mq.shards("c"), mq.shards("d")
    mq.connection.execute = recording  # type: ignore[method-assign]
    per = CHUNK * (add.EARLY_AFTER + 2) + 7  # 6 calls in "c": 1 first, 5 after
    kids = [Child(i, queue="c") for i in range(per)] + [Child(-i, queue="d") for i in range(3)]
    ref = mq.add_flow("p", kids, parent_id="JOB-af/dag/run/early")
    names = [[name for name, _ in step] for step in steps]
    assert names == [["hold"], ["SADD", "land", "land"], ["land"] * 5], names
    small = [Child(i, queue="c") for i in range(CHUNK * (add.EARLY_AFTER + 1))]
    steps.clear()
    mq.add_flow("p", small, parent_id="JOB-af/dag/run/small")
    assert [[name for name, _ in step] for step in steps] == [["hold"], ["land"] * 4]
    mq.connection.execute = execute  # type: ignore[method-assign]
    got = []
    while jobs := mq.queue("c").claim(CHUNK):
        got += [j.payload for j in jobs if j.parent and j.parent.id == ref.parent_id]
    assert got == list(range(per))
    assert [j.payload for j in mq.queue("d").claim(10)] == [0, -1, -2]
    assert mq.dependencies("p", ref.parent_id) == per + 3
    mq.close()


def test_big_adds_build_without_garbage_collections(
    mq: EchoMQ, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bulk call of GC_PAUSE_AT items or more pauses the cyclic collector while it builds
    (echomq_core.queues.adding.gc_paused): at most the one collection due when the pause ends."""
    from echomq_core.queues import adding

    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    def collections_during(call: Any) -> int:
        gc.collect()
        started.clear()
        gc.callbacks.append(count)
        try:
            call()
        finally:
            gc.callbacks.remove(count)
        return len(started)

    children = [[Child(i, queue="c") for i in range(20_000)] for _ in range(2)]
    jobs = [list(range(20_000)) for _ in range(2)]
    paused = collections_during(lambda: mq.add_flow("p", children[0], parent_id="JOB-a"))
    paused_bulk = collections_during(lambda: mq.queue("c").add_bulk(jobs[0]))
    monkeypatch.setattr(adding, "GC_PAUSE_AT", 10**9)  # the same calls, never paused
    unpaused = collections_during(lambda: mq.add_flow("p", children[1], parent_id="JOB-b"))
    unpaused_bulk = collections_during(lambda: mq.queue("c").add_bulk(jobs[1]))
    assert paused <= 1 and paused_bulk <= 1 and unpaused > 5 and unpaused_bulk > 5, (
        paused,
        paused_bulk,
        unpaused,
        unpaused_bulk,
    )
    assert gc.isenabled()
    assert mq.snapshot("p", "JOB-a").total == 20_000
    # a collector the caller turned off stays off
    gc.disable()
    try:
        with gc_paused(range(GC_PAUSE_AT)):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def _land_steps(root: Any, fresh: bool) -> list[list[Any]]:
    """The calls of every step of add_flow(root), as (args, script name), the server's replies
    made up: no explicit id taken, each hold answered ``1`` (held fresh) or ``0``."""
    from echomq_core.wire.keyspace import Keyspace

    def replies(step: list[Any]) -> list[Any]:
        # the explicit ids' rows read (none taken), else each call's "held fresh" or not
        if step[0].script is not None and step[0].script.name == "rows":
            return [[[None] * 4 for _ in range(int(c.args[2]))] for c in step]
        return [1 if fresh else 0] * len(step)

    op = add.add_flow(Keyspace("t"), root, ["p"])
    step = next(op)
    steps: list[list[Any]] = []
    try:
        while True:
            steps.append([(c.args, c.script and c.script.name) for c in step])
            step = op.send(replies(step))
    except StopIteration:
        return steps


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("fresh", [True, False])
def test_uniform_children_land_as_the_per_child_grouping_would(fresh: bool, sharded: bool) -> None:
    """A parent whose children are derived leaves of one queue with the same options is marked
    uniform by plan(), and add_flow() forms its run of land calls without looking at each
    child: the calls are the same as the per-child grouping's, in every mix of options. With
    the children's queue sharded, sharding.place() spreads a uniform parent's children over
    the shards in one pass, and add_flow() forms one run per shard from that."""
    shards = {"c": ("c", "c+s1.7", "c+s2.9"), "d": ("d", "d+s1.3")} if sharded else {}

    def tree() -> list[Child]:
        return [
            *[Child(i, queue="c") for i in range(1_200)],  # uniform
            Child("s", queue="c", children=[Child(j, queue="d") for j in range(700)]),
            Child("m", children=[Child(1, queue="c"), Child(2, queue="d"), Child(3)]),
            Child("o", children=[Child(1, priority=3), Child(2, priority=3)]),
            Child("t", children=[Child(1, timeout=5), Child(2, id="JOB-named")]),
            Child("a", children=[Child(1, max_attempts=2), Child(2, max_attempts=2)]),
            Child("i", children=[Child(1, ignore_dependency_on_failure=True), Child(2)]),
            Child("r", children=[Child(1, priority=3), Child(2)]),
        ]

    def planned() -> Any:
        return plan.plan(
            "p", "JOB-u/1", b"{}", tree(), default_attempts=3, dumps=lambda v: b"%r" % v,
            max_payload=1000,
        )  # fmt: skip

    root = planned()
    sharding.place(root, shards)
    assert not root.uniform  # a sub-flow among its children
    marked = {n.id: n.uniform for n in add._explicit(root) + root.children if n.children}
    assert marked == {
        "JOB-u/1.1200": True,
        "JOB-u/1.1201": False,  # two queues
        "JOB-u/1.1202": True,  # one priority, in one queue
        "JOB-u/1.1203": False,  # a named child
        "JOB-u/1.1204": True,
        "JOB-u/1.1205": False,  # two policies
        "JOB-u/1.1206": False,  # two priorities
    }
    spread = {n.id: sorted(n.spread) for n in root.children if n.spread}
    assert spread == ({"JOB-u/1.1200": ["d", "d+s1.3"]} if sharded else {})
    fast = _land_steps(root, fresh)
    slow_root = planned()
    todo = [slow_root]
    while todo:  # the same tree, every node looked at child by child
        node = todo.pop()
        node.uniform = False
        todo.extend(node.children)
    sharding.place(slow_root, shards)  # each child placed on its own
    assert fast == _land_steps(slow_root, fresh)
    assert sum(len(s) for s in fast) > 10
    if sharded:  # the sub-flow's uniform children land in a run per shard of "d"
        lands = [args for step in fast for args, name in step if name == "land"]
        firsts = {args[3] for args in lands if "JOB-u/1.1200" in args}
        assert len(firsts) == 2, firsts


@pytest.mark.parametrize(
    ("children", "gen", "taken"),
    [
        ([Child(1, id="JOB-r.1"), Child(2)], "", "JOB-r.1"),  # a later derived id
        ([Child(1, children=[Child(2)]), Child(3, id="JOB-r.0.0")], "", "JOB-r.0.0"),
        # a replaced flow's children derive <root>.g<n>.<i>: a node named <root>.g<n> derives
        # the same ids below it
        ([Child(1), Child(2, id="JOB-r.g1", children=[Child(3)])], "1", "JOB-r.g1.0"),
        ([Child(1, id="JOB-r.g1.1"), Child(2)], "1", "JOB-r.g1.1"),
    ],
)
def test_a_derived_id_that_a_named_node_takes_is_refused(
    children: list[Child], gen: str, taken: str
) -> None:
    """plan() checks derived ids (unique among themselves: paths of indexes) against the ids
    given, wherever they are in the tree, and names the id."""
    with pytest.raises(InvalidFlow, match=f"duplicate job id '{taken}' in flow 'JOB-r'"):
        plan.plan(
            "p", "JOB-r", b"1", children, default_attempts=1, dumps=repr, max_payload=99, gen=gen
        )


def test_a_payload_the_serializer_cannot_write_is_refused_naming_the_child(
    backend: Backend, mq: EchoMQ, prefix: str
) -> None:
    """plan() calls the serializer itself and checks what it gives, as encode() does."""
    with pytest.raises(InvalidPayload, match="not JSON-serialisable"):
        mq.add_flow("p", [Child(1), Child(object())], parent_id="JOB-bad/1")
    with pytest.raises(InvalidPayload, match=r"payload of JOB-bad/2\.1 is 600002 bytes"):
        mq.add_flow("p", [Child(1), Child("x" * 600_000)], parent_id="JOB-bad/2")
    bytes_out = EchoMQ(
        backend.url, cluster=backend.cluster, prefix=prefix, serializer=_Raw(), max_payload_bytes=99
    )
    try:
        bytes_out.add_flow("p", [Child("ab"), Child(b"cd")], payload=b"", parent_id="JOB-ok/3")
        with pytest.raises(InvalidPayload, match="serializer returned int, not bytes"):
            bytes_out.add_flow("p", [Child("ab"), Child(5)], payload=b"", parent_id="JOB-bad/4")
    finally:
        bytes_out.close()
    assert mq.snapshot("p", "JOB-ok/3").total == 2
    for n in (1, 2, 4):
        assert mq.snapshot("p", f"JOB-bad/{n}").parent_state is None  # nothing written


class _Raw:
    """A serializer that passes str and bytes through (and anything else too)."""

    def dumps(self, value: Any) -> Any:
        return value

    def loads(self, data: bytes) -> Any:
        return data


def _cyclic_nodes(call: Any) -> list[Any]:
    """The planned nodes (flows._Node) that only the cyclic collector would free after
    ``call``, run with the collector off."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        call()
        gc.collect()
        return [o for o in gc.garbage if type(o).__name__ == "_Node"]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_a_planned_flow_is_freed_without_the_cyclic_collector(
    backend: Backend, mq: EchoMQ, prefix: str
) -> None:
    """The planned tree (a node per child, linked up and down) is freed by reference counting
    when the add is over - added, replaced, or through the asyncio client: left to the
    cyclic collector, an add of 1,000,000 children made it walk 2,000,000 objects (about 1 s)
    in the caller's code."""
    tree = [Child(i, queue="c", children=[Child(j) for j in range(3)]) for i in range(50)]
    leaves = [Child(i, queue="c") for i in range(2_000)]
    assert _cyclic_nodes(lambda: mq.add_flow("p", leaves, parent_id="JOB-f/1")) == []
    assert _cyclic_nodes(lambda: mq.add_flow("p", tree, parent_id="JOB-f/2")) == []
    again = [Child(i, queue="c") for i in range(1_000)]  # another flow under JOB-f/1
    with pytest.raises(FlowConflict):  # (a refusal's traceback holds its tree until collected)
        mq.add_flow("p", again, parent_id="JOB-f/1")
    replace = lambda: mq.add_flow("p", again, parent_id="JOB-f/1", replace=True)  # noqa: E731
    assert _cyclic_nodes(replace) == []
    assert mq.snapshot("p", "JOB-f/1").total == 1_000

    async def add_async() -> None:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        try:
            await amq.add_flow("p", leaves, parent_id="JOB-f/3")
        finally:
            await amq.close()

    assert _cyclic_nodes(lambda: asyncio.run(add_async())) == []
    assert mq.snapshot("p", "JOB-f/3").total == 2_000


#: Run in a fresh interpreter: the collections that start while the first client of the
#: process is made (connect() imports redis-py and the driver then; it does no I/O).
FIRST_CLIENT = """
import gc, json, sys
import echomq_core
from echomq_core.wire.connection import connect, connect_async
started = []
gc.callbacks.append(lambda phase, info: phase == "start" and started.append(info["generation"]))
assert "redis" not in sys.modules
make = connect_async if sys.argv[1] == "async" else connect
if sys.argv[2] == "unpaused":
    import contextlib
    from echomq_core.wire import collector
    collector.paused = contextlib.nullcontext
gc.collect()
started.clear()
make("redis://127.0.0.1:1")
print(json.dumps({"collections": len(started), "enabled": gc.isenabled()}))
"""


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_first_client_imports_redis_py_without_garbage_collections(kind: str) -> None:
    """In a task or step process (Airflow's, Dagster's: a few hundred thousand objects) a
    collection set off by importing redis-py walks them all, in the middle of the step; the
    import runs with the collector paused (echomq_core.wire.collector). Without the pause the same
    import sets off collections."""
    import json
    import subprocess
    import sys

    def run(mode: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", FIRST_CLIENT, kind, mode],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    paused, unpaused = run("paused"), run("unpaused")
    assert paused["enabled"] and unpaused["enabled"]
    # paused: at most the collections due when the pause ends (the first allocations after)
    assert paused["collections"] <= 2 and unpaused["collections"] > 10, (paused, unpaused)


def test_named_refs_and_pump_gives_up_leases_on_stop(mq: EchoMQ) -> None:
    from echomq_core import InvalidArgument

    ref = mq.add_flow("p", [Child(1, queue="c")])
    mq.save_ref("dagster:assets/daily/2026-11-30", ref)
    loaded = mq.load_ref("dagster:assets/daily/2026-11-30")
    assert loaded is not None and loaded.parent_id == ref.parent_id
    assert mq.load_ref("nothing-here") is None
    for bad in ["", "a b", "x{y}", "x" * 513]:
        with pytest.raises(InvalidArgument):
            mq.save_ref(bad, ref)
    idle = Pump(mq, ["c"])
    idle.tick()  # an empty outbox: an idle Pump takes no lease (it writes nothing at all)
    assert mq.connection.client.get(mq.keys.outbox_lease("c")) is None
    (job,) = mq.queue("c").claim()
    mq.queue("c").complete(job, 1)
    first = Pump(mq, ["c"]).start()
    eventually(
        lambda: mq.connection.client.get(mq.keys.outbox_lease("c")), 5, "the lease", every=0.01
    )
    first.stop()
    assert mq.connection.client.get(mq.keys.outbox_lease("c")) is None
    second = mq.add_flow("p", [Child(2, queue="c")])
    (job,) = mq.queue("c").claim()
    assert job.parent is not None and job.parent.id == second.parent_id
    mq.queue("c").complete(job, 1)
    assert Pump(mq, ["c"]).tick().delivered == 1  # no wait for a lapsed lease


def test_child_queues_names_the_direct_children_queues(mq: EchoMQ) -> None:
    """The read the Dagster integration's Pumps use to serve only a flow's queues."""
    ref = mq.add_flow(
        "cq-parent",
        [
            Child(1, queue="cq-b"),
            Child(2, queue="cq-a"),
            Child(3, queue="cq-b"),
            Child(4, children=[Child(5, queue="cq-deep")]),  # a sub-flow in the parent's queue
        ],
    )
    assert mq.child_queues(ref.queue, ref.parent_id) == ["cq-a", "cq-b", "cq-parent"]
    assert mq.child_queues(ref.queue, "JOB-no-such-flow") == []


def test_every_push_to_an_outbox_sets_the_pumps_wake_up_hint(backend: Backend, prefix: str) -> None:
    """complete, fail and recover (cross-queue children), deliver (a failed nested parent
    signalling upward) and replay_poison each set ``flow:outbox:wake`` with the signals they
    push (the idle Pump's BZPOPMIN pops it)."""
    from echomq_core.pump.drain import poison_replay

    mq = backend.client(prefix)
    parents, work, mid = backend.queues_on_distinct_nodes(3, "wk")
    raw = mq.connection.client

    def take(queue: str) -> bool:
        """The hint was set (and is taken away)."""
        return bool(raw.delete(mq.keys.outbox_wake(queue)))

    mq.add_flow(parents, [Child(i, queue=work) for i in range(3)], parent_id="JOB-w1")
    q = mq.queue(work, lease=0.2)
    done, dies, stalls = q.claim(3)
    assert not take(work)
    q.complete(done, 1)  # complete.lua
    assert take(work)
    assert q.fail(dies, "no", retry=False)  # fail.lua: buried, its signal pushed
    assert take(work)
    pump = Pump(mq, [work], max_stalls=0, maintain_every=0.0)
    # the lease expires; recover.lua buries
    buried = eventually(lambda: pump.tick().dead, 30, "the stalled job's burial", every=0.05)
    assert [job.id for job, _ in buried] == [stalls.id]
    assert take(work)
    # deliver.lua: the nested parent (in `mid`) of a child that died fails and signals upward
    mq.add_flow(
        parents, [Child("p2", queue=mid, children=[Child(0, queue=work)])], parent_id="JOB-w2"
    )
    (child,) = q.claim(1)
    assert q.fail(child, "dead", retry=False)
    take(mid)
    pump.tick()  # the same Pump: it holds the outbox's lease
    assert mq.snapshot(mid, "JOB-w2.0").parent_state == "failed"
    assert take(mid)
    # replay_poison.lua: a signal whose parent does not exist is poisoned, then replayed
    raw.rpush(mq.keys.outbox(work), b"c\nJOB-x.0\n" + parents.encode() + b"\nJOB-x\n1")
    pump.max_tries = 1

    def poisoned() -> bool:
        if raw.llen(mq.keys.poison(work)):
            return True
        pump.tick()
        return False

    eventually(poisoned, 30, "the poisoned signal", every=0.0)
    take(work)
    assert mq.perform(poison_replay(mq.keys, work, 10)) == 1
    assert take(work)
    mq.close()


def test_an_idle_pump_is_woken_by_a_signal_not_by_its_interval(
    backend: Backend, prefix: str
) -> None:
    """A Pump idles for its whole (here 60 s, jittered) interval unless a signal wakes it: the
    second flow's release within 20 s can only come from the wake-up hint. The first flow is
    delivered by the Pump's first tick (on a Cluster it makes the child queue's slot the one
    the Pump blocks on: its queues span slots)."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "wp")
    q = mq.queue(work)
    first = mq.add_flow(parents, [Child(i, queue=work) for i in range(5)])
    q.complete_many([(j, j.payload) for j in q.claim(5)])
    with Pump(mq, [parents, work], interval=60.0):
        eventually(
            lambda: mq.dependencies(parents, first.parent_id) == 0,
            20,
            "the first flow's release",
            every=0.01,
        )
        assert mq.dependencies(parents, first.parent_id) == 0
        time.sleep(0.3)  # the Pump is idle now, blocked on the hint
        second = mq.add_flow(parents, [Child(i, queue=work) for i in range(5)])
        q.complete_many([(j, j.payload) for j in q.claim(5)])
        eventually(
            lambda: mq.dependencies(parents, second.parent_id) == 0,
            20,
            "the second flow's release",
            every=0.01,
        )
        assert mq.dependencies(parents, second.parent_id) == 0
    mq.close()


@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 4097, 9000])
def test_the_fingerprint_is_the_digest_of_the_whole_list(n: int) -> None:
    """The fingerprint a parent keeps is the digest of its children's ``queue<TAB>id`` lines
    joined by newlines, whatever the pieces it is hashed in: a re-add by a client that hashed
    the whole text at once (or will) compares equal. Ids and queues with non-ASCII text."""
    import hashlib

    leaves = [
        plan._Node("wörk" if i % 3 else "w", f"p/run.{i}☃", b"", 1, None, "fp", ())
        for i in range(n)
    ]
    root = plan._Node("p", "p/run", b"", 1, None, "fp", tuple(leaves))
    text = "\n".join(f"{c.queue}\t{c.id}" for c in leaves)
    assert add.fingerprint(root) == hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
