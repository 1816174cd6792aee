"""Flows that grow (echomq_core.flows.spawning): a running child spawns siblings under its parent,
on standalone and on a real 3-master Cluster (parent and children on different nodes)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from echomq_core import (
    AsyncEchoMQ,
    AsyncWorker,
    Child,
    EchoMQ,
    FlowConflict,
    FlowRef,
    InvalidArgument,
    Job,
    Pump,
    Worker,
)
from echomq_core.flows import sharding, spawning

from ..conftest import Backend
from ..flowkit import invariant, keys_of, run_steps, work_off
from ..waiting import eventually


def claim_one(mq: EchoMQ, queue: str) -> Job:
    (job,) = mq.queue(queue).claim(1)
    job.spawner = spawning.SyncSpawner(mq)  # what a Worker sets before it calls the handler
    return job


def test_spawned_siblings_are_counted_before_the_spawner_settles(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "sp")
    ref = mq.add_flow(parents, [Child("seed", queue=work)], barrier=True, stream=True)
    seed = claim_one(mq, work)
    ids = seed.spawn([Child(i) for i in range(3)] + [Child("home", queue=parents)])
    assert ids == [f"{seed.id}.s{i}" for i in range(4)]
    assert seed.spawn([Child("late", max_attempts=1)]) == [f"{seed.id}.s4"]
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.total, snap.dependencies) == (6, 6)
    # the spawner settles first: the flow still waits for what it spawned
    assert mq.queue(work).complete_many([(seed, "seeded")]) == [True]
    pump = Pump(mq, [parents, work])
    try:
        eventually(lambda: pump.tick().delivered, 10, "the seed's delivery")
        snap = invariant(mq, parents, ref.parent_id)
        assert (snap.parent_state, snap.dependencies) == ("held", 5)
        work_off(mq, [parents, work], lambda job: job.payload, pump=pump)
    finally:
        pump.release_leases()
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.parent_state, snap.total, snap.processed) == ("released", 6, 6)
    values = mq.children_values(parents, ref.parent_id)
    spawned = dict(zip([*ids, f"{seed.id}.s4"], [0, 1, 2, "home", "late"], strict=True))
    assert values == {seed.id: "seeded", **spawned}
    streamed = dict(mq.iter_results(parents, ref.parent_id))
    assert streamed == values
    assert dict(mq.iter_children_values(parents, ref.parent_id)) == values
    with pytest.raises(InvalidArgument):  # positions: spawned ids have none
        mq.children_values_range(parents, ref.parent_id, 0, 6)
    # a retried add of the original flow still converges (N is what it added)
    again = mq.add_flow(parents, [Child("seed", queue=work)], parent_id=ref.parent_id,
                        barrier=True, stream=True)  # fmt: skip
    assert again.parent_id == ref.parent_id
    mq.close()


def test_a_rerun_spawns_the_same_children_once(backend: Backend, prefix: str) -> None:
    """A handler re-run (a lost lease) spawns the same ids: counted and landed once."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rr")
    ref = mq.add_flow(parents, [Child("seed", queue=work), Child("other", queue=work)])
    first = claim_one(mq, work)
    kids = [Child(i) for i in range(5)]
    first.spawn(kids[:3])
    rerun = Job(work, first.id, first.token, first.payload, 1, first.max_attempts, first.parent)
    rerun.spawner = spawning.SyncSpawner(mq)
    assert rerun.spawn(kids) == [f"{first.id}.s{i}" for i in range(5)]
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.total, snap.dependencies) == (7, 7)
    assert mq.queue(work).stats()["pending"] == 1 + 5
    mq.close()


def test_spawn_refusals_write_nothing(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rf")
    mq.queue(work).add("plain")
    (plain,) = mq.queue(work).claim(1)
    plain.spawner = spawning.SyncSpawner(mq)
    with pytest.raises(InvalidArgument, match="not in a flow"):
        plain.spawn([Child(1)])
    ref = mq.add_flow(parents, [Child("seed", queue=work), Child("b", queue=work)])
    seed = claim_one(mq, work)
    with pytest.raises(InvalidArgument, match="spawn\\(\\) works inside a handler"):
        Job(work, seed.id, seed.token, None, 0, 1, seed.parent).spawn([Child(1)])
    with pytest.raises(InvalidArgument, match="an id of its own"):
        seed.spawn([Child(1, id="JOB-mine")])
    with pytest.raises(InvalidArgument, match="children"):
        seed.spawn([Child(1, children=[Child(2)])])
    with pytest.raises(InvalidArgument, match="an iterable of Child"):
        seed.spawn(Child(1))  # type: ignore[arg-type]
    before = keys_of(backend, prefix)
    # the bound: a flow of 2 may grow to 4, not 5
    nodes = spawning.plan_spawn(seed, [Child(i) for i in range(3)], dumps=mq.encode,
                                max_payload=mq.max_payload_bytes, start=0)  # fmt: skip
    with pytest.raises(InvalidArgument, match="bound is 4"):
        mq.perform(spawning.spawn(mq.keys, seed, nodes, bound=4))
    assert keys_of(backend, prefix) == before
    # a flow that no longer waits cannot grow
    mq.cancel_flow(parents, ref.parent_id, reason="stop")
    before = keys_of(backend, prefix)
    with pytest.raises(FlowConflict, match="cancelled: nothing spawned"):
        seed.spawn([Child(1)])
    assert keys_of(backend, prefix) == before
    assert seed.spawned == 0  # a refused spawn hands out no ids
    mq.close()


def test_cancel_and_the_cap_reach_spawned_children(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "cc")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(2)], max_running=2)
    seed = claim_one(mq, work)
    with pytest.raises(InvalidArgument, match="cannot run in"):
        seed.spawn([Child(1, queue=parents)])  # no share of the cap there
    seed.spawn([Child(i) for i in range(4)])
    cap = mq.flow_cap(parents, ref.parent_id)
    assert cap is not None and (cap.admitted, cap.waiting) == (2, 4), cap  # gated: they wait
    mq.cancel_flow(parents, ref.parent_id, reason="enough")
    assert mq.queue(work).claim(10) == []  # no unstarted child starts, spawned or not
    mq.close()


def test_workers_spawn_threaded_and_asyncio(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "wk")

    def handle(job: Job) -> Any:
        if job.payload == "root":
            job.spawn([Child(f"page-{i}") for i in range(3)])
        return job.payload

    async def ahandle(job: Job) -> Any:
        if job.payload == "root":
            await job.spawn([Child(f"page-{i}") for i in range(3)])
        return job.payload

    # the asyncio worker runs a sync handler in a thread: its spawn waits for the loop
    for kind, fn in (("threaded", handle), ("asyncio", ahandle), ("asyncio", handle)):
        ref = mq.add_flow(parents, [Child("root", queue=work), Child("x", queue=work)],
                          barrier=True)  # fmt: skip
        if kind == "threaded":
            worker = Worker(mq, {work: handle, parents: handle}, concurrency=2)
            t = threading.Thread(target=worker.run, kwargs={"install_signals": False})
            t.start()
            try:
                eventually(lambda r=ref: mq.snapshot(parents, r.parent_id).released, 30, kind)
            finally:
                worker.stop()
                t.join(30)
        else:

            async def run(ref: FlowRef = ref, fn: Any = fn) -> None:
                amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
                w = AsyncWorker(amq, {work: fn, parents: fn}, concurrency=2)
                await w.start()
                try:
                    deadline = time.monotonic() + 30
                    while not (await amq.snapshot(parents, ref.parent_id)).released:
                        assert time.monotonic() < deadline, "asyncio worker: no release"
                        await asyncio.sleep(0.02)  # a bounded poll of a real condition
                finally:
                    await w.stop()
                    await amq.close()

            asyncio.run(run())
        values = mq.children_values(parents, ref.parent_id)
        assert sorted(map(str, values.values())) == ["page-0", "page-1", "page-2", "root", "x"]
        invariant(mq, parents, ref.parent_id)
    mq.close()


def test_a_cancel_between_counting_and_landing_still_stops_the_spawned(
    backend: Backend, prefix: str
) -> None:
    """The cancel's walk runs after the count but before the rows exist: the spawn's own read
    of the state after landing cancels what it landed."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "cl")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(2)])
    seed = claim_one(mq, work)
    nodes = spawning.plan_spawn(seed, [Child(i) for i in range(3)], dumps=mq.encode,
                                max_payload=mq.max_payload_bytes, start=0)  # fmt: skip
    mq.shards(work)  # the shard count, cached: the op's first step is the count
    op = spawning.spawn(mq.keys, seed, nodes, shard_cache=mq.shard_cache)
    land = op.send(mq.connection.execute(next(op)))  # counted; the land step is next
    mq.cancel_flow(parents, ref.parent_id, reason="mid-spawn")
    step = op.send(mq.connection.execute(land))  # landed: claimable for a moment
    step = op.send(mq.connection.execute(step))  # the state read: cancelled
    with pytest.raises(StopIteration):
        op.send(mq.connection.execute(step))
    assert mq.queue(work).claim(10) == []  # neither the original nor the spawned start
    assert mq.get_job(work, nodes[0].id).state == "cancelled"
    mq.close()


def test_repair_reaches_a_spawned_child(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rp")
    ref = mq.add_flow(parents, [Child("seed", queue=work)], barrier=True)
    seed = claim_one(mq, work)
    (doomed,) = seed.spawn([Child("doomed", max_attempts=1)])
    assert mq.queue(work).complete_many([(seed, "ok")]) == [True]
    work_off(mq, [parents, work], die=lambda job: job.id == doomed)
    snap = mq.snapshot(parents, ref.parent_id)
    assert snap.parent_state == "failed" and doomed in mq.failed_children(parents, ref.parent_id)
    mq.retry_flow(parents, ref.parent_id)
    work_off(mq, [parents, work])
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.parent_state, snap.processed) == ("released", 2)
    assert mq.children_values(parents, ref.parent_id)[doomed] == {"id": doomed, "payload": "doomed"}
    mq.close()


@pytest.mark.parametrize(
    ("min_success", "allowed"),
    [(2, 5), (0.5, 3)],  # 2 of 7 must succeed; ceil(0.5 x 7) = 4 of 7: the grown total's
    ids=["count", "fraction"],
)
def test_spawned_children_keep_their_policy_and_the_threshold_follows_the_growth(
    backend: Backend, prefix: str, min_success: Any, allowed: int
) -> None:
    """N = 2 grown to 7 by 5 spawned children (one of them ignore-on-failure): the threshold
    applies to the 7 - a count as given, a fraction of the grown total - so the allowance
    grows with the flow; `allowed` deaths of fail-parent children are tolerated, one more
    fails the flow; the ignored one counts against nothing."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "th")
    outcome = {}
    names = ["ignored", "a", "b", "c", "d"]
    for extra in (0, 1):
        pid = f"JOB-af/grow/th/{extra}"
        kids = [Child("seed", queue=work), Child("b", queue=work)]
        ref = mq.add_flow(parents, kids, parent_id=pid, min_success=min_success, barrier=True)
        seed = claim_one(mq, work)
        ids = seed.spawn([
            Child(names[0], max_attempts=1, ignore_dependency_on_failure=True),
            *(Child(n, max_attempts=1) for n in names[1:]),
        ])  # fmt: skip
        assert mq.snapshot(parents, ref.parent_id).allowed == allowed
        # a retried add of the flow as added converges though its allowance moved; another
        # threshold is refused
        again = mq.add_flow(parents, kids, parent_id=pid, min_success=min_success, barrier=True)
        assert again.parent_id == pid
        with pytest.raises(FlowConflict):
            other = 1 if min_success == 2 else 2  # another allowance at the N added
            mq.add_flow(parents, kids, parent_id=pid, min_success=other, barrier=True)
        fail_parent = [*ids[1:], f"{ref.parent_id}.1"]  # the 4 spawned and the added "b"
        deaths = allowed + extra
        if deaths > len(fail_parent):  # every other one dies too: the spawner itself
            assert mq.queue(work).fail(seed, "died after spawning", retry=False)
        else:
            assert mq.queue(work).complete_many([(seed, "ok")]) == [True]
        dies = {ids[0], *fail_parent[:deaths]}
        work_off(mq, [parents, work], die=lambda job, dies=dies: job.id in dies)
        snap = mq.snapshot(parents, ref.parent_id)
        outcome[extra] = (snap.parent_state, snap.ignored, snap.failed)
        assert ids[0] in mq.ignored_failures(parents, ref.parent_id)
    assert outcome == {0: ("released", 1, allowed), 1: ("failed", 1, allowed + 1)}
    mq.close()


def test_a_spawn_cut_after_its_count_is_completed_by_the_rerun(
    backend: Backend, prefix: str
) -> None:
    """The worker dies after the parent counted the children, before they landed: the flow
    waits for them (never released early), and the re-run lands them, counting nothing twice."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "cut")
    ref = mq.add_flow(parents, [Child("seed", queue=work)], barrier=True)
    seed = claim_one(mq, work)
    kids = [Child(i) for i in range(4)]
    nodes = spawning.plan_spawn(seed, kids, dumps=mq.encode, max_payload=mq.max_payload_bytes,
                                start=0)  # fmt: skip
    mq.shards(work)  # the shard count, cached: the op's first step is the count
    run_steps(mq, spawning.spawn(mq.keys, seed, nodes, shard_cache=mq.shard_cache), 1)
    assert mq.snapshot(parents, ref.parent_id).dependencies == 5
    assert mq.queue(work).stats()["pending"] == 0  # nothing landed
    rerun = Job(work, seed.id, seed.token, seed.payload, 1, seed.max_attempts, seed.parent)
    rerun.spawner = spawning.SyncSpawner(mq)
    rerun.spawn(kids)
    assert mq.queue(work).complete_many([(seed, "ok")]) == [True]
    work_off(mq, [parents, work])
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.parent_state, snap.total, snap.processed) == ("released", 5, 5)
    mq.close()


@pytest.mark.parametrize("barrier", [True, False])
def test_a_released_or_failed_flow_does_not_grow(
    backend: Backend, prefix: str, barrier: bool
) -> None:
    """A stale run of a child (its flow released, or failed, since) spawns nothing."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rl")
    done = mq.add_flow(parents, [Child("seed", queue=work)], barrier=barrier)
    failing = mq.add_flow(parents, [Child("seed", queue=work), Child("x", queue=work,
                                                                      max_attempts=1)])  # fmt: skip
    seeds = {j.parent.id: j for j in mq.queue(work).claim(2)}  # type: ignore[union-attr]
    stale = {pid: Job(work, j.id, j.token, j.payload, 0, 1, j.parent) for pid, j in seeds.items()}
    for job in stale.values():
        job.spawner = spawning.SyncSpawner(mq)
    assert mq.queue(work).complete_many([(seeds[done.parent_id], "ok")]) == [True]
    work_off(mq, [work], die=lambda job: job.payload == "x")
    pump = Pump(mq, [parents, work])
    try:

        def settled() -> bool:
            pump.tick()
            return bool(mq.snapshot(parents, done.parent_id).released) and (
                mq.snapshot(parents, failing.parent_id).parent_state == "failed"
            )

        eventually(settled, 10, "the release and the failure")
    finally:
        pump.release_leases()
    before = keys_of(backend, prefix)
    with pytest.raises(FlowConflict, match=r"released: nothing spawned|released \(its parent"):
        stale[done.parent_id].spawn([Child(1)])
    with pytest.raises(FlowConflict, match="failed: nothing spawned"):
        stale[failing.parent_id].spawn([Child(1)])
    assert keys_of(backend, prefix) == before
    mq.close()


def test_spawned_children_of_a_sharded_queue_go_to_their_shards(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, wide = backend.queues_on_distinct_nodes(2, "sh")
    shards = mq.set_shards(wide, 3)
    ref = mq.add_flow(parents, [Child("seed", queue=parents)], barrier=True)
    seed = claim_one(mq, parents)
    ids = seed.spawn([Child(i, queue=wide) for i in range(30)])
    rows = {i: mq.get_job(sharding.shard_of(shards, i), i).state for i in ids}
    assert set(rows.values()) == {"pending"}, rows
    assert all(mq.queue(s).stats()["pending"] > 0 for s in shards)  # spread over the shards
    assert mq.queue(parents).complete_many([(seed, "ok")]) == [True]
    work_off(mq, [parents, *shards])
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.parent_state, snap.processed) == ("released", 31)
    mq.close()
