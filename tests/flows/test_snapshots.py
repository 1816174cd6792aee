"""``snapshots``: many flows' snapshots in one round trip, equal to one ``snapshot`` each (plain
and sharded queues, parents in several queues, flows that do not exist); sync and asyncio."""

from __future__ import annotations

import asyncio
from typing import Any

from echomq_core import AsyncEchoMQ, Child, EchoMQ, FlowRef, Worker

from ..conftest import Backend
from ..waiting import eventually


def flows_in_three_queues(mq: EchoMQ) -> list[FlowRef]:
    mq.set_shards("ss", 3)  # parents in a sharded queue land on all three shards
    refs = [
        mq.add_flow("ss", [Child(i, queue="sk") for i in range(n)], parent_id=f"JOB-af/s/{n}",
                    barrier=True)
        for n in range(1, 7)
    ]  # fmt: skip
    refs.append(mq.add_flow("sp", [Child(1, queue="sp")], parent_id="JOB-af/p/1", barrier=True))
    refs.append(FlowRef("sp", "JOB-af/p/none"))  # no such flow
    return refs


def test_snapshots_equal_one_snapshot_each_in_one_round_trip(
    backend: Backend, mq: EchoMQ
) -> None:
    refs = flows_in_three_queues(mq)
    worker = Worker(mq, {"sk": lambda job: job.payload, "sp": lambda job: job.payload})
    worker.start()
    try:  # some released, some not yet: a mix of states
        eventually(lambda: mq.snapshot("ss", "JOB-af/s/3").released, timeout=30)
    finally:
        worker.stop()
    each = [mq.snapshot(r.queue, r.parent_id) for r in refs]
    calls: list[Any] = []
    execute = mq.connection.execute

    def counted(steps: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(steps)
        return execute(steps, *args, **kwargs)

    mq.connection.execute = counted  # type: ignore[method-assign]
    try:
        together = mq.snapshots(refs)
    finally:
        mq.connection.execute = execute  # type: ignore[method-assign]
    assert together == each
    assert len(calls) == 1  # one pipelined step (split per node on a Cluster)
    assert {s.parent_state for s in together} >= {"released", None}
    assert mq.snapshots([]) == []


def test_async_snapshots(backend: Backend, mq: EchoMQ) -> None:
    refs = flows_in_three_queues(mq)
    each = [mq.snapshot(r.queue, r.parent_id) for r in refs]

    async def read() -> list[Any]:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=mq.keys.prefix)
        try:
            return await amq.snapshots(refs)
        finally:
            await amq.close()

    assert asyncio.run(read()) == each
