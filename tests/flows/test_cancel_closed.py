"""``cancel_flow`` on a closed flow is refused with ``FlowConflict`` (sync and async), as
``docs/concepts/using-it.md`` says, and nothing of the flow changes: it stays closed, its
values readable, in the ``closed`` index (issue 48, item 12)."""

from __future__ import annotations

import asyncio

import pytest

from echomq_core import AsyncEchoMQ, Child, FlowConflict

from ..conftest import Backend
from .test_flow_lifecycle import work_off


def test_a_closed_flow_is_refused_by_cancel_and_left_closed(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "cc")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(3)], barrier=True)
    work_off(mq, [parents, work], lambda job: job.payload * 2)
    assert mq.wait(parents, ref.parent_id, timeout=5).released
    assert mq.close_flow(parents, ref.parent_id) == "closed"
    with pytest.raises(FlowConflict, match="closed flow cannot be cancelled"):
        mq.cancel_flow(parents, ref.parent_id, reason="too late")

    async def cancel_async() -> None:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        try:
            await amq.cancel_flow(parents, ref.parent_id, reason="too late")
        finally:
            await amq.close()

    with pytest.raises(FlowConflict, match="closed flow cannot be cancelled"):
        asyncio.run(cancel_async())
    snap = mq.snapshot(parents, ref.parent_id)
    assert (snap.parent_state, snap.error) == ("closed", None)
    assert sorted(mq.children_values(parents, ref.parent_id).values()) == [0, 2, 4]
    assert [f.state for f in mq.list_flows(parents)] == ["closed"]
    # a flow not closed yet is still cancelled as before
    held = mq.add_flow(parents, [Child(1, queue=work)], barrier=True)
    assert mq.cancel_flow(parents, held.parent_id, reason="stop").state == "cancelled"
    mq.close()


def test_a_replace_over_a_closed_flow_still_replaces_it(backend: Backend, prefix: str) -> None:
    """A replace cancels whatever the id holds before it resets the root: a closed flow is
    replaced by the new one (the refusal is cancel_flow's, not the replace's) - the Airflow
    provider's re-run of a task whose plan changed takes this path."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "cr")
    ref = mq.add_flow(
        parents, [Child(i, queue=work) for i in range(3)], parent_id="JOB-af/d/t/r/1", barrier=True
    )
    work_off(mq, [parents, work], lambda job: job.payload * 2)
    assert mq.wait(parents, ref.parent_id, timeout=5).released
    assert mq.close_flow(parents, ref.parent_id) == "closed"
    again = mq.add_flow(
        parents, [Child(10 + i, queue=work) for i in range(2)], parent_id=ref.parent_id,
        barrier=True, replace=True,
    )
    assert again.parent_id == ref.parent_id
    work_off(mq, [parents, work], lambda job: job.payload * 2)
    assert mq.wait(parents, ref.parent_id, timeout=5).released
    assert sorted(mq.children_values(parents, ref.parent_id).values()) == [20, 22]
    mq.close()
