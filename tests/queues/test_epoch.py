"""``note_epoch``: an orchestrator's attempt counter on a flow's root row (the Airflow provider
records the DAG run's clear number there; a late failure callback of an older attempt leaves a
flow with a newer epoch): it only goes up, 0 reads it, a missing flow is None and gets no key,
it goes with the flow; plain and sharded parent queues, sync and asyncio."""

from __future__ import annotations

import asyncio

import pytest

from echomq_core import AsyncEchoMQ, Child, EchoMQ, InvalidArgument

from ..conftest import Backend
from ..flowkit import cmd


@pytest.mark.parametrize("shards", [1, 3])
def test_the_epoch_only_goes_up_and_goes_with_the_flow(
    backend: Backend, mq: EchoMQ, shards: int
) -> None:
    if shards > 1:
        mq.set_shards("ep", shards)
    parent = "JOB-af/dag/fan_out/9f2c"  # a provider-derived id: it holds '/'
    mq.add_flow("ep", [Child(i, queue="ep.kids") for i in range(3)], parent_id=parent,
                barrier=True)  # fmt: skip
    assert mq.note_epoch("ep", parent) == 0  # none recorded: 0 reads
    assert mq.note_epoch("ep", parent, 2) == 2
    assert mq.note_epoch("ep", parent, 1) == 2  # an older attempt's late write: no lower
    assert mq.note_epoch("ep", parent, 0) == 2
    assert mq.note_epoch("ep", parent, 3) == 3
    # the flow is untouched otherwise: still held, its children claimable
    assert mq.snapshot("ep", parent).parent_state == "held"
    # no flow: None, and nothing written for it
    assert mq.note_epoch("ep", "JOB-af/dag/fan_out/none", 5) is None
    assert mq.note_epoch("ep", "JOB-af/dag/fan_out/none") is None
    home = mq.home("ep", "JOB-af/dag/fan_out/none")
    assert cmd(mq, "EXISTS", mq.keys.job(home, "JOB-af/dag/fan_out/none")) == 0
    # the field is on the row: what expires the flow deletes it
    row = mq.keys.job(mq.home("ep", parent), parent)
    assert cmd(mq, "HGET", row, "epoch") == b"3"


def test_bad_epochs_are_refused_before_anything_is_written(mq: EchoMQ) -> None:
    mq.add_flow("ep", [Child(1, queue="ep")], parent_id="JOB-ep-1", barrier=True)
    for bad in (-1, 1.5, "2", True, 2**53 + 1):
        with pytest.raises(InvalidArgument, match="epoch"):
            mq.note_epoch("ep", "JOB-ep-1", bad)  # type: ignore[arg-type]
    assert mq.note_epoch("ep", "JOB-ep-1") == 0


def test_async_note_epoch(backend: Backend, mq: EchoMQ) -> None:
    mq.add_flow("ep", [Child(1, queue="ep")], parent_id="JOB-ep-a", barrier=True)

    async def run() -> list[int | None]:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=mq.keys.prefix)
        try:
            return [
                await amq.note_epoch("ep", "JOB-ep-a", 4),
                await amq.note_epoch("ep", "JOB-ep-a", 1),
                await amq.note_epoch("ep", "JOB-ep-none", 1),
            ]
        finally:
            await amq.close()

    assert asyncio.run(run()) == [4, 4, None]
    assert mq.note_epoch("ep", "JOB-ep-a") == 4
