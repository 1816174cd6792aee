"""A spawner that dies between counting its children and landing them, and whose re-run spawns
fewer (a handler that does not spawn the same children every time): the ids the earlier run
counted and never landed are settled as never landed once the re-run is recorded, so the flow
is released instead of held for ever; a zombie run that lands one of them later runs it for
nothing and counts nothing. Siblings and children of a job's own; standalone and a 3-master
Cluster (the counting node and the children on different nodes)."""

from __future__ import annotations

from typing import Any

import pytest

from echomq_core import Child, EchoMQ, FlowConflict, FlowRef, Job, LeaseLost, Pump, Worker
from echomq_core.flows import spawning
from echomq_core.wire.calls import Call

from ..conftest import Backend
from ..flowkit import cmd, invariant, run_steps, work_off
from ..waiting import eventually


def count_only(mq: EchoMQ, job: Job, n: int, own: bool) -> None:
    """The first run counts ``n`` children and dies before any of them lands."""
    job.spawner = spawning.SyncSpawner(mq)
    nodes = spawning.plan_spawn(job, [Child(f"first-{i}") for i in range(n)], dumps=mq.encode,
                                max_payload=mq.max_payload_bytes, start=0, own=own)  # fmt: skip
    mq.shards(job.queue)  # the shard count, cached: the op's first step is the count
    run_steps(mq, spawning.spawn(mq.keys, job, nodes, shard_cache=mq.shard_cache, own=own), 1)


def lose_lease(mq: EchoMQ, queue: str, job_id: str) -> None:
    """The lease runs out: the Pump's recover gives the job back (a stall counted)."""
    cmd(mq, "ZADD", mq.keys.active(queue), "XX", 0, job_id)
    pump = Pump(mq, [queue], maintain_every=0)
    try:
        eventually(lambda: pump.tick() and mq.queue(queue).stats()["pending"] == 1, 10, "recover")
    finally:
        pump.release_leases()


def died_after_counting(
    backend: Backend, mq: EchoMQ, stem: str, n: int, own: bool
) -> tuple[str, str, FlowRef, Job]:
    """A flow of one seed child in another queue whose first run counted ``n`` children and
    died before any landed, its lease then lost: (parent queue, child queue, flow, first
    run)."""
    parents, work = backend.queues_on_distinct_nodes(2, stem)
    ref = mq.add_flow(parents, [Child("seed", queue=work)], barrier=True)
    (first,) = mq.queue(work).claim(1)
    count_only(mq, first, n, own)
    lose_lease(mq, work, first.id)
    return parents, work, ref, first


def serve(mq: EchoMQ, queue: str, handler: Any, until: Any) -> None:
    worker = Worker(mq, {queue: handler}, concurrency=2).start()
    try:
        eventually(until, 60, "the release")
    finally:
        worker.stop()


@pytest.mark.parametrize("own", [False, True], ids=["siblings", "own"])
def test_a_rerun_that_spawns_fewer_settles_the_rest_as_never_landed(
    backend: Backend, prefix: str, own: bool
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rc")
    ref = mq.add_flow(parents, [Child("seed", queue=work)], barrier=True)
    (first,) = mq.queue(work).claim(1)
    count_only(mq, first, 5, own)
    node_queue, node_id = (work, first.id) if own else (parents, ref.parent_id)
    assert mq.snapshot(node_queue, node_id).dependencies == (5 if own else 6)
    lose_lease(mq, work, first.id)

    def handle(job: Job) -> Any:
        if job.payload != "seed":
            return job.payload
        if job.resumed:
            return sorted(job.children_values().values())
        assert job.stalls == 1  # the re-run: the page changed, two children now
        job.spawn([Child("again-0"), Child("again-1")], own=own)
        return "seeded"

    serve(mq, work, handle, lambda: mq.snapshot(parents, ref.parent_id).released)
    snap = invariant(mq, node_queue, node_id)
    never = {f"{first.id}.{'k' if own else 's'}{i}" for i in range(2, 5)}
    assert (snap.total, snap.ignored, snap.dependencies) == (5 if own else 6, 3, 0), snap
    ignored = mq.ignored_failures(node_queue, node_id)
    assert set(ignored) == never
    assert all(reason.startswith("never landed: an earlier run of") for reason in ignored.values())
    values = mq.children_values(parents, ref.parent_id)
    assert values == {first.id: ["again-0", "again-1"] if own else "seeded", **(
        {} if own else {f"{first.id}.s0": "again-0", f"{first.id}.s1": "again-1"})}  # fmt: skip
    # the first run was a zombie: it wakes up and lands what it counted - they run for nothing
    # and count nothing (their ids were settled as never landed)
    nodes = spawning.plan_spawn(first, [Child(f"first-{i}") for i in range(5)], dumps=mq.encode,
                                max_payload=mq.max_payload_bytes, start=0, own=own)  # fmt: skip
    if own:  # its lease is long gone: an own spawn is refused outright
        with pytest.raises(LeaseLost, match="no longer holds its lease"):
            mq.perform(spawning.spawn(mq.keys, first, nodes, own=True))
    else:  # a sibling spawn into a released flow is refused too
        with pytest.raises(FlowConflict, match="nothing spawned"):
            mq.perform(spawning.spawn(mq.keys, first, nodes))
    # ... and a landing cut off before the refusal (its count came before the release): the
    # rows land, they run, and their reports change nothing
    base = mq.keys.job_prefix(work)
    up = first.id if own else ref.parent_id
    up_queue = "" if own else parents
    argv: list[Any] = ["1", up, up_queue, "fp", 1, "", 0, "", "", "", ""]
    for i in range(2, 5):
        argv += [f"{first.id}.{'k' if own else 's'}{i}", mq.encode(f"zombie-{i}")]
    rows = (base + argv[11 + 2 * j] for j in range(3))
    keys = [*mq.keys.queue_keys(work), *rows, mq.keys.fair(work)]
    mq.connection.execute([Call.lua("land", keys, argv)])
    assert mq.queue(work).stats()["pending"] == 3
    work_off(mq, [parents, work])
    after = invariant(mq, node_queue, node_id)
    assert (after.total, after.processed, after.ignored, after.dependencies) == (
        snap.total, snap.processed, 3, 0)  # fmt: skip
    assert mq.children_values(parents, ref.parent_id) == values
    mq.close()


def test_a_rerun_that_spawns_as_many_settles_nothing_as_never_landed(
    backend: Backend, prefix: str
) -> None:
    """The usual re-run (the same children): nothing is settled as never landed."""
    mq = backend.client(prefix)
    parents, work, ref, _ = died_after_counting(backend, mq, "rs", 3, False)

    def handle(job: Job) -> Any:
        if job.payload == "seed":
            job.spawn([Child(f"first-{i}") for i in range(3)])
        return job.payload

    serve(mq, work, handle, lambda: mq.snapshot(parents, ref.parent_id).released)
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.total, snap.processed, snap.ignored) == (4, 4, 0), snap
    mq.close()


@pytest.mark.parametrize("own", [False, True], ids=["siblings", "own"])
def test_complete_many_settles_what_an_earlier_run_counted_and_never_landed(
    backend: Backend, prefix: str, own: bool
) -> None:
    """Outside a Worker (a job claimed and completed by hand) the re-run's completion settles
    the rest as never landed too, in the same call (``Settlement.voided``)."""
    mq = backend.client(prefix)
    parents, work, ref, first = died_after_counting(backend, mq, "rm", 4, own)
    (again,) = mq.queue(work).claim(1)
    assert (again.id, again.stalls) == (first.id, 1)
    again.spawner = spawning.SyncSpawner(mq)
    again.spawn([Child("again-0")], own=own)
    settled = mq.queue(work).settle_completed(mq.queue(work).encode_results([(again, "seeded")]))
    assert (settled.statuses, settled.voided) == ([1], 3)
    node_queue, node_id = (work, first.id) if own else (parents, ref.parent_id)
    snap = invariant(mq, node_queue, node_id)
    # again-0 still to run (and, in the root's count, the seed's report: no Pump ran yet)
    assert (snap.ignored, snap.dependencies) == (3, 1 if own else 2), snap
    assert set(mq.ignored_failures(node_queue, node_id)) == {
        f"{first.id}.{'k' if own else 's'}{i}" for i in range(1, 4)
    }
    work_off(mq, [parents, work])
    assert mq.snapshot(parents, ref.parent_id).released
    mq.close()


class Released:
    """Hooks that note the flows released (any thread)."""

    def __init__(self) -> None:
        self.released: list[tuple[str, str]] = []

    def flow_released(self, *, queue: str, parent_id: str) -> None:
        self.released.append((queue, parent_id))


def test_a_release_by_the_never_landed_fires_the_flow_released_hook(
    backend: Backend, prefix: str
) -> None:
    """The seed shares its root's queue, so its completion leaves the root waiting only for
    what its first run counted: the settling of those releases the root, and the Worker fires
    ``flow_released`` for it as for a release by a child's report."""
    mq = backend.client(prefix)
    (parents,) = backend.queues_on_distinct_nodes(1, "rh")
    ref = mq.add_flow(parents, [Child("seed")], barrier=True)
    (first,) = mq.queue(parents).claim(1)
    count_only(mq, first, 3, False)
    lose_lease(mq, parents, first.id)
    hooks = Released()
    worker = Worker(mq, {parents: lambda job: "seeded"}, hooks=hooks).start()  # spawns nothing
    try:
        eventually(lambda: (parents, ref.parent_id) in hooks.released, 30, "the hook")
    finally:
        worker.stop()
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.released, snap.processed, snap.ignored) == (True, 1, 3), snap
    assert hooks.released == [(parents, ref.parent_id)]
    mq.close()
