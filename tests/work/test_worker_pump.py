"""Workers do the Pump's work for the queues they serve: a flow settles with workers alone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from echomq_core import (
    AsyncEchoMQ,
    AsyncWorker,
    Child,
    EchoMQ,
    FlowTimeout,
    Job,
    LeaseLost,
    Pump,
    Worker,
)
from echomq_core.control.options import PumpOptions

from ..conftest import Backend
from ..waiting import eventually

#: A worker's Pump that recovers leases every 50 ms (the default: once a second).
FAST = PumpOptions(interval=0.05, maintain_every=0.05)


def test_the_readme_program_settles_with_workers_alone(backend: Backend, prefix: str) -> None:
    """The "Using it" flow (docs/concepts/using-it.md): children in two queues on other slots
    than the parent, one ignored failure, a sub-flow; no Pump anywhere. The parent runs once,
    on its values."""
    mq = backend.client(prefix)
    reports, extract, transform = backend.queues_on_distinct_nodes(3, "rd")
    ran: list[Any] = []

    def handle(job: Job) -> Any:
        if job.id == ref.parent_id:
            ran.append(mq.children_values(job.queue, job.id))
            return len(ran[-1])
        if job.payload == {"part": 2}:
            raise RuntimeError("part 2 is allowed to fail")
        return {"rows": [job.payload]}

    ref = mq.add_flow(
        reports,
        [
            Child({"part": 1}, queue=extract),
            Child({"part": 2}, queue=extract, ignore_dependency_on_failure=True),
            Child(
                {"part": 3}, queue=transform, children=[Child(i, queue=extract) for i in range(10)]
            ),
        ],
        payload={"report": "daily"},
        max_attempts=1,
    )
    worker = Worker(mq, {extract: handle, transform: handle, reports: handle}, concurrency=4)
    worker.start()
    try:
        eventually(
            lambda: mq.get_job(reports, ref.parent_id).state == "completed", what="parent ran"
        )
    finally:
        worker.stop()
    assert len(ran) == 1 and set(ran[0]) == {f"{ref.parent_id}.0", f"{ref.parent_id}.2"}
    assert mq.ignored_failures(reports, ref.parent_id) == {
        f"{ref.parent_id}.1": "RuntimeError: part 2 is allowed to fail"
    }
    for q in (reports, extract, transform):
        assert mq.queue(q).stats()["outbox"] == 0
    mq.close()


def test_many_workers_share_the_outboxes_without_a_pump(backend: Backend, prefix: str) -> None:
    """Three workers on the child queue take turns on its outbox lease; every signal is
    delivered exactly once and the barrier flow is released."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "mw")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(3000)], barrier=True)
    workers = [
        Worker(mq, {work: lambda job: job.payload * 2}, concurrency=2).start() for _ in range(3)
    ]
    try:
        snap = mq.wait(ref.queue, ref.parent_id, timeout=60)
    finally:
        for w in workers:
            w.stop()
    assert (snap.parent_state, snap.processed, snap.dependencies) == ("released", 3000, 0)
    values = mq.children_values(ref.queue, ref.parent_id)
    assert sorted(values.values()) == [2 * i for i in range(3000)]
    assert mq.queue(work).stats()["outbox"] == 0
    mq.close()


def test_a_worker_recovers_expired_leases_of_its_queues(mq: EchoMQ) -> None:
    """A job whose holder died (its lease expired) runs again on a worker, with no Pump."""
    q = mq.queue("wp-stall", lease=0.2)
    job_id = q.add("x")
    (lost,) = q.claim()  # claimed by a "dead" process that never reports
    worker = Worker(mq, {"wp-stall": lambda job: "done"}, pump=FAST).start()
    try:
        eventually(lambda: q.get_job(job_id).state == "completed", what="the job re-ran")
    finally:
        worker.stop()
    info = q.get_job(job_id)
    assert (info.result, info.stalls) == ("done", 1)
    with pytest.raises(LeaseLost):  # the stale holder's late report changes nothing
        q.complete(lost, "late")
    assert q.get_job(job_id).result == "done"


def test_pump_false_leaves_the_outbox_to_a_pump(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "np")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(50)], barrier=True)
    worker = Worker(mq, {work: lambda job: job.payload}, pump=False).start()
    try:
        eventually(lambda: mq.queue(work).stats()["completed"] == 50, what="children done")
    finally:
        worker.stop()
    assert mq.queue(work).stats()["outbox"] == 50
    assert mq.dependencies(parents, ref.parent_id) == 50
    assert Pump(mq, [work]).tick().delivered == 50
    assert mq.snapshot(parents, ref.parent_id).parent_state == "released"
    mq.close()


def test_async_worker_settles_a_cross_queue_flow_alone(backend: Backend, prefix: str) -> None:
    async def scenario() -> Any:
        sync = backend.client(prefix)
        client = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        parents, work = backend.queues_on_distinct_nodes(2, "aw")
        try:
            ref = sync.add_flow(parents, [Child(i, queue=work) for i in range(500)], barrier=True)

            async def handle(job: Job) -> int:
                return int(job.payload) + 1

            worker = AsyncWorker(client, {work: handle}, concurrency=8)
            task = asyncio.create_task(worker.run(install_signals=False))
            try:
                snap = await client.wait(ref.queue, ref.parent_id, timeout=60)
            finally:
                await worker.stop()
                await task
            leases = [sync.connection.client.get(sync.keys.outbox_lease(work))]
            return snap, sync.queue(work).stats()["outbox"], leases
        finally:
            await client.close()
            sync.close()

    snap, outbox, leases = asyncio.run(scenario())
    assert (snap.parent_state, snap.processed) == ("released", 500)
    assert outbox == 0
    assert leases == [None]  # given up when the worker stopped


def test_a_drainer_that_is_not_the_holder_hands_the_hint_on(backend: Backend, prefix: str) -> None:
    """Pump B, finding A's lease on an outbox, stops waiting on that outbox's hint; when it
    had popped the hint just before, it sets it again once, for A."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "hh")
    mq.add_flow(parents, [Child(i, queue=work) for i in range(4)], barrier=True)
    q = mq.queue(work)
    hint = mq.keys.outbox_wake(work)
    a, b = Pump(mq, [work], pump_id="pump-a"), Pump(mq, [work], pump_id="pump-b")
    jobs = q.claim(4)
    q.complete_many([(j, 1) for j in jobs[:2]])
    assert a.tick().delivered == 2  # A holds the lease now
    raw = mq.connection.client
    raw.delete(hint)
    q.complete_many([(j, 1) for j in jobs[2:]])  # two more signals, the hint set
    assert raw.zcard(hint) == 1
    raw.delete(hint)  # as if B had popped it
    b._woken = True  # B's last wait ended on that hint
    assert b.tick().delivered == 0
    assert raw.zcard(hint) == 1  # set again for the holder
    assert b._hint_keys() == []  # B waits on no outbox that A holds
    raw.delete(hint)
    assert b.tick().delivered == 0
    assert raw.zcard(hint) == 0  # once per popped hint, not at every tick
    assert a.tick().delivered == 2
    mq.close()


def test_a_wait_that_times_out_says_what_holds_the_flow(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "to")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(6)], barrier=True)
    with pytest.raises(FlowTimeout, match=rf"{work!r} has 6 pending job\(s\) and none running"):
        mq.wait(ref.queue, ref.parent_id, timeout=0.05)
    q = mq.queue(work)
    q.complete_many([(j, 1) for j in q.claim(4)])  # as a worker run without its Pump
    with pytest.raises(FlowTimeout) as caught:
        mq.wait(ref.queue, ref.parent_id, timeout=0.05)
    assert f"the outbox of {work!r} holds 4 signal(s) and nothing drains it" in str(caught.value)
    assert f"{work!r} has 2 pending job(s) and none running" in str(caught.value)
    mq.close()
