"""Children of a job's own (``job.spawn(children, own=True)``): a running child of a flow becomes
the parent of what it spawns, waits for them when its handler returns, and runs a second time
(``job.resumed``) to compute its result from their values - on standalone and on a real
3-master Cluster (the flow's root, the spawner and its children's queues on different nodes)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from echomq_core import (
    AsyncEchoMQ,
    AsyncWorker,
    Child,
    EchoMQ,
    InvalidArgument,
    Job,
    LeaseLost,
    Pump,
    Worker,
)
from echomq_core.flows import spawning

from ..conftest import Backend
from ..flowkit import cmd, keys_of, work_off
from ..waiting import eventually

AGES = ("completed_age", "dead_age", "failed_age", "closed_age", "unclosed_age", "cancelled_age")


def crawl(job: Job) -> Any:
    """A directory walk: a directory lists its entries as children of its own, then sums them."""
    if isinstance(job.payload, int):
        return job.payload  # a file: its size
    if job.resumed:
        values = job.children_values()
        return {"dir": job.payload, "size": sum(v["size"] if isinstance(v, dict) else v
                                                 for v in values.values())}  # fmt: skip
    entries = [Child(100), Child(20), Child(3)]
    if job.payload == "root":
        entries.append(Child("sub"))
    job.spawn(entries, own=True)
    return "ignored: the first run's value is not recorded"


def run_worker(mq: EchoMQ, handlers: dict[str, Any], until: Any, what: str) -> Worker:
    worker = Worker(mq, handlers, concurrency=4)
    pump = Pump(mq, list(handlers))
    worker.start()
    pump.start()
    try:
        eventually(until, 60, what)
    finally:
        worker.stop()
        pump.stop()
    return worker


def test_a_child_waits_for_its_own_children_and_sums_them(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work, files = backend.queues_on_distinct_nodes(3, "ow")
    ref = mq.add_flow(parents, [Child("root", queue=work), Child(7, queue=files)], barrier=True)
    root_id = ref.children[0][1]

    def sizes(job: Job) -> Any:
        return crawl(job)

    run_worker(mq, {work: sizes, files: sizes},
               lambda: mq.snapshot(parents, ref.parent_id).released, "the release")  # fmt: skip
    values = mq.children_values(parents, ref.parent_id)
    assert values[root_id] == {"dir": "root", "size": 123 + 123}
    own = mq.children_values(work, root_id)
    sub = f"{root_id}.k3"
    assert set(own) == {f"{root_id}.k{i}" for i in range(4)}
    assert own[sub] == {"dir": "sub", "size": 123}
    assert mq.children_values(work, sub) == {f"{sub}.k{i}": v for i, v in enumerate((100, 20, 3))}
    node = mq.snapshot(work, root_id)
    assert (node.total, node.processed, node.dependencies) == (4, 4, 0), node
    snap = mq.snapshot(parents, ref.parent_id)
    assert (snap.total, snap.processed, snap.dependencies) == (2, 2, 0), snap
    # the whole tree expires as a unit once the flow is closed: nothing is left behind
    mq.close_flow(parents, ref.parent_id)
    for queue in (parents, work, files):
        mq.set_retention(queue, **{age: 0 for age in AGES})
    pump = Pump(mq, [parents, work, files], maintain_every=0)

    def rows() -> list[str]:
        return [k for k in keys_of(backend, prefix) if ":job:" in k]

    try:
        eventually(lambda: pump.tick() and not rows(), 30, rows, every=0.1)
    finally:
        pump.release_leases()
    mq.close()


def test_children_that_settle_while_it_runs_release_it_at_its_return(
    backend: Backend, prefix: str
) -> None:
    """The counter reaches 0 while the spawner still runs: nothing is released then (it has not
    returned); its return releases it at once, and its second run reads every value."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "ot")
    ref = mq.add_flow(parents, [Child("seed", queue=work)], barrier=True)
    (seed,) = mq.queue(work).claim(1)
    seed.spawner = spawning.SyncSpawner(mq)
    ids = seed.spawn([Child(i, queue=parents) for i in range(3)], own=True)
    assert ids == [f"{seed.id}.k{i}" for i in range(3)]
    work_off(mq, [parents], lambda job: job.payload * 10)  # its children, cross-queue: the Pump
    node = mq.snapshot(work, seed.id)
    assert (node.dependencies, node.processed) == (0, 3), node
    assert mq.queue(work).stats()["pending"] == 0  # not released while it runs
    assert mq.queue(work).complete_many([(seed, "first")]) == [True]
    (again,) = mq.queue(work).claim(1)
    assert (again.id, again.resumed, again.attempts) == (seed.id, True, 0)  # attempts anew
    again.spawner = spawning.SyncSpawner(mq)
    assert again.children_values() == {i: v for i, v in zip(ids, (0, 10, 20), strict=True)}
    with pytest.raises(InvalidArgument, match="first run"):
        again.spawn([Child(1)], own=True)
    assert mq.queue(work).complete_many([(again, 30)]) == [True]
    work_off(mq, [parents, work])
    assert mq.children_values(parents, ref.parent_id) == {seed.id: 30}
    mq.close()


def test_a_rerun_spawns_the_same_own_children_once(backend: Backend, prefix: str) -> None:
    """A first run that raises after spawning is retried: the retry spawns the same ids,
    counted once, and waits for them as the first would have."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "or")
    ref = mq.add_flow(parents, [Child("seed", queue=work, max_attempts=3)], barrier=True)
    runs: list[int] = []

    def handle(job: Job) -> Any:
        if job.payload != "seed":
            return job.payload
        if job.resumed:
            return sorted(job.children_values().values())
        runs.append(job.attempts)
        job.spawn([Child(i) for i in range(5)], own=True)
        if len(runs) == 1:
            raise RuntimeError("lost the connection after spawning")
        return None

    run_worker(mq, {work: handle}, lambda: mq.snapshot(parents, ref.parent_id).released,
               "the release")  # fmt: skip
    assert len(runs) == 2
    seed_id = ref.children[0][1]
    node = mq.snapshot(work, seed_id)
    assert (node.total, node.processed) == (5, 5), node
    assert mq.children_values(parents, ref.parent_id) == {seed_id: [0, 1, 2, 3, 4]}
    mq.close()


@pytest.mark.parametrize("ignore", [False, True])
def test_a_dead_own_child_fails_the_spawner_by_its_policy_and_a_repair_reaches_it(
    backend: Backend, prefix: str, ignore: bool
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "od")
    ref = mq.add_flow(parents, [Child("seed", queue=work, ignore_dependency_on_failure=ignore),
                                Child("other", queue=work)], barrier=True)  # fmt: skip
    seed_id, other_id = (i for _, i in ref.children)
    broken = threading.Event()
    broken.set()

    def handle(job: Job) -> Any:
        if job.payload == "seed":
            if job.resumed:
                return sorted(job.children_values().values())
            job.spawn([Child("ok"), Child("bad", max_attempts=1)], own=True)
        elif job.payload == "bad" and broken.is_set():
            raise ValueError("no such page")
        return job.payload

    if ignore:
        until = lambda: mq.snapshot(parents, ref.parent_id).released  # noqa: E731
    else:
        until = lambda: mq.snapshot(parents, ref.parent_id).parent_state == "failed"  # noqa: E731
    run_worker(mq, {work: handle}, until, "the flow's end")
    node = mq.snapshot(work, seed_id)
    assert node.parent_state == "failed", node
    assert "no such page" in (mq.get_job(work, seed_id).error or "")
    if ignore:
        assert seed_id in mq.ignored_failures(parents, ref.parent_id)
        assert mq.children_values(parents, ref.parent_id) == {other_id: "other"}
        mq.close()
        return
    assert seed_id in mq.failed_children(parents, ref.parent_id)
    # the page is back: a repair re-runs the dead child, and the seed runs as their parent
    broken.clear()
    mq.retry_flow(parents, ref.parent_id)
    run_worker(mq, {work: handle}, lambda: mq.snapshot(parents, ref.parent_id).released,
               "the repaired flow's release")  # fmt: skip
    values = mq.children_values(parents, ref.parent_id)
    assert values == {seed_id: ["bad", "ok"], other_id: "other"}
    mq.close()


def test_own_spawn_refusals_write_nothing(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "of")
    mq.queue(work).add("plain")
    (plain,) = mq.queue(work).claim(1)
    plain.spawner = spawning.SyncSpawner(mq)
    with pytest.raises(InvalidArgument, match="not in a flow: it has no parent to spawn children"):
        plain.spawn([Child(1)], own=True)
    mq.add_flow(parents, [Child("seed", queue=work)])
    (seed,) = [j for j in mq.queue(work).claim(5) if j.payload == "seed"]
    seed.spawner = spawning.SyncSpawner(mq)
    before = keys_of(backend, prefix)
    # the lease is gone (it expired and the job went back): nothing spawned, the row untouched
    cmd(mq, "HSET", mq.keys.leases(work), seed.id, "someone-else")
    with pytest.raises(LeaseLost, match="no longer holds its lease"):
        seed.spawn([Child(1)], own=True)
    after = keys_of(backend, prefix)
    assert {k: v for k, v in after.items() if "leases" not in k} == {
        k: v for k, v in before.items() if "leases" not in k
    }
    assert seed.adopted == 0
    mq.close()


def test_cancel_reaches_the_children_of_a_waiting_spawner(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work, other = backend.queues_on_distinct_nodes(3, "oc")
    ref = mq.add_flow(parents, [Child("seed", queue=work)], barrier=True)
    seed_id = ref.children[0][1]

    def handle(job: Job) -> Any:
        job.spawn([Child(i, queue=other) for i in range(4)], own=True)

    # no worker serves `other`: its first run returned, it waits for them as their parent
    worker = Worker(mq, {work: handle}).start()
    try:
        eventually(lambda: mq.snapshot(work, seed_id).parent_state == "held", 30, "the hold")
    finally:
        worker.stop()
    assert mq.queue(work).stats()["active"] == 0
    assert mq.queue(other).stats()["pending"] == 4
    mq.cancel_flow(parents, ref.parent_id, reason="enough")
    assert mq.queue(other).claim(10) == []  # its own children were cancelled too
    assert mq.snapshot(work, seed_id).parent_state == "cancelled"
    mq.close()


def test_cancel_reaches_the_children_of_a_spawner_that_died(backend: Backend, prefix: str) -> None:
    """A spawner whose run died after spawning (its last attempt) leaves its own children to
    run on; a cancel of the flow still reaches them through it (cancel.lua leaves the dead
    node as it is, the walk goes below it)."""
    mq = backend.client(prefix)
    parents, work, other = backend.queues_on_distinct_nodes(3, "od")
    ref = mq.add_flow(parents, [Child("seed", queue=work, max_attempts=1)], barrier=True)
    seed_id = ref.children[0][1]

    def handle(job: Job) -> Any:
        job.spawn([Child(i, queue=other) for i in range(4)], own=True)
        raise RuntimeError("the spawner fails after spawning")

    worker = Worker(mq, {work: handle}).start()  # no worker serves `other`
    try:
        eventually(lambda: mq.queue(work).stats()["dead"] == 1, 30, "the spawner's death")
    finally:
        worker.stop()
    assert mq.queue(other).stats()["pending"] == 4
    result = mq.cancel_flow(parents, ref.parent_id, reason="enough")
    assert result.children == 4, result
    assert mq.queue(other).claim(10) == []  # its own children were cancelled
    assert mq.snapshot(work, seed_id).parent_state == "dead"  # the death stays recorded
    mq.close()


def test_asyncio_workers_spawn_own_children(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "oa")
    ref = mq.add_flow(parents, [Child("root", queue=work)], barrier=True)

    async def handle(job: Job) -> Any:
        if isinstance(job.payload, int):
            return job.payload
        if job.resumed:
            values = await job.children_values()
            return sum(values.values())
        await job.spawn([Child(i) for i in range(1, 11)], own=True)
        return None

    async def main() -> None:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        worker = AsyncWorker(amq, {work: handle}, concurrency=4)
        await worker.start()
        try:
            for _ in range(3000):  # a bounded poll of a real condition (60 s)
                if (await amq.snapshot(parents, ref.parent_id)).released:
                    break
                await asyncio.sleep(0.02)
        finally:
            await worker.stop()
            await amq.close()

    asyncio.run(main())
    assert mq.children_values(parents, ref.parent_id) == {ref.children[0][1]: 55}
    mq.close()
