"""Sharded queues keep their logical name where users meet them: ``job.queue`` in handlers and
hooks is the logical queue (``job.shard`` the physical one, where the job is settled), and a
Pump given the logical name serves every shard."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from echomq_core import AsyncEchoMQ, AsyncWorker, Child, EchoMQ, Job, Pump, Worker
from echomq_core.queues import reads

from ..conftest import Backend
from ..waiting import eventually, eventually_async


class Recorder:
    """Lifecycle hooks that note what they were told (the Worker's and the Pump's hooks=)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.completed: list[tuple[str, str]] = []
        self.released: list[tuple[str, str]] = []

    def job_completed(self, *, job: Job, result: bytes) -> None:
        with self.lock:
            self.completed.append((job.queue, job.shard))

    def flow_released(self, *, queue: str, parent_id: str) -> None:
        with self.lock:
            self.released.append((queue, parent_id))


def test_handlers_and_hooks_see_the_logical_name(mq: EchoMQ) -> None:
    """A root in a sharded queue with its children spread over the shards: every handler call
    and hook shows ``both``, never a shard's name; ``job.shard`` tells the shards apart, and
    the release is told under the logical name (it may come from a worker's settle or from
    its Pump's delivery; both are covered by the one hook)."""
    names = mq.set_shards("both", 3)
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def handle(job: Job) -> Any:
        with lock:
            seen.append((job.queue, job.shard))
        # the logical name is what the flow reads take
        return mq.dependencies(job.queue, job.id) if job.id == "JOB-af/d/t/r1" else 1

    hooks = Recorder()
    mq.add_flow("both", [Child(i) for i in range(60)], parent_id="JOB-af/d/t/r1")
    worker = Worker(mq, {"both": handle}, concurrency=4, hooks=hooks)
    worker.start()
    try:
        eventually(lambda: len(seen) == 61, timeout=60, what=lambda: len(seen))
        eventually(lambda: len(hooks.completed) == 61, timeout=30)
    finally:
        worker.stop()
    assert {q for q, _ in seen} == {"both"}
    assert {s for _, s in seen} == set(names)
    assert {q for q, _ in hooks.completed} == {"both"}
    assert {s for _, s in hooks.completed} == set(names)
    assert hooks.released == [("both", "JOB-af/d/t/r1")]
    assert mq.get_job("both", "JOB-af/d/t/r1").state == "completed"


def test_a_plain_claim_shows_the_logical_name(mq: EchoMQ) -> None:
    names = mq.set_shards("manual-n", 3)
    queue = mq.queue("manual-n")
    queue.add_bulk(list(range(30)))
    shards: set[str] = set()
    for _ in range(6):
        jobs = queue.claim(10)
        assert {j.queue for j in jobs} <= {"manual-n"}
        shards |= {j.shard for j in jobs}
        assert queue.complete_many([(j, j.payload) for j in jobs]) == [True] * len(jobs)
    assert shards == set(names)
    assert queue.stats()["completed"] == 30


def test_an_unsharded_job_is_its_own_shard(mq: EchoMQ) -> None:
    queue = mq.queue("plain-n")
    queue.add("x")
    (job,) = queue.claim()
    assert job.queue == job.shard == "plain-n"


def test_the_async_worker_shows_the_logical_name(backend: Backend, mq: EchoMQ) -> None:
    names = mq.set_shards("aq-n", 3)
    mq.queue("aq-n").add_bulk(list(range(60)))
    seen: list[tuple[str, str]] = []

    async def handle(job: Job) -> Any:
        seen.append((job.queue, job.shard))
        return job.payload

    async def main() -> None:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=mq.keys.prefix)
        worker = AsyncWorker(amq, {"aq-n": handle}, concurrency=4)
        try:
            await worker.start()
            await eventually_async(lambda: len(seen) >= 60, timeout=30)
        finally:
            await worker.stop()
            await amq.close()

    asyncio.run(main())
    assert {q for q, _ in seen} == {"aq-n"}
    assert {s for _, s in seen} == set(names)


def test_a_pump_given_the_logical_name_drains_every_shard(mq: EchoMQ) -> None:
    """The children ran under a worker without a Pump, so their signals wait in the three
    shards' outboxes; ``Pump(mq, ["pk-n"])`` (the logical name only) delivers them all."""
    names = mq.set_shards("pk-n", 3)
    ref = mq.add_flow("pp-n", [Child(i, queue="pk-n") for i in range(30)], barrier=True)
    worker = Worker(mq, {"pk-n": lambda job: job.payload}, pump=False)
    worker.start()
    try:
        eventually(lambda: mq.queue("pk-n").stats()["completed"] == 30, timeout=30)
    finally:
        worker.stop()
    assert all(mq.perform(reads.stats(mq.keys, n))["outbox"] for n in names)
    hooks = Recorder()
    pump = Pump(mq, ["pk-n"], hooks=hooks)
    for _ in range(20):  # a tick drains a page of each outbox it serves; 30 signals need one
        pump.tick()
        if mq.snapshot(ref.queue, ref.parent_id).parent_state == "released":
            break
    assert mq.snapshot(ref.queue, ref.parent_id).parent_state == "released"
    assert [mq.perform(reads.stats(mq.keys, n))["outbox"] for n in names] == [0, 0, 0]
    assert hooks.released == [("pp-n", ref.parent_id)]
