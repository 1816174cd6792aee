"""Release watchers (:mod:`echomq_core.flows.release_watch`): each released barrier flow of a queue
taken once, in release order, by whichever reader of a watcher polls first; on standalone and
on the Cluster (parents and children on different nodes)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from echomq_core import AsyncEchoMQ, Child, EchoMQ, InvalidArgument

from ..conftest import Backend
from ..flowkit import work_off


def released_flows(mq: EchoMQ, parents: str, work: str, n: int, tag: str) -> list[str]:
    """``n`` barrier flows of two children each, released in the order added."""
    ids = []
    for i in range(n):
        ref = mq.add_flow(
            parents,
            [Child({"i": i}, queue=work), Child({"i": -i}, queue=work)],
            parent_id=f"JOB-af/{tag}/fan_out/{i:04d}",
            barrier=True,
        )
        work_off(mq, [parents, work])
        ids.append(ref.parent_id)
    return ids


def test_a_watcher_takes_each_released_flow_once_in_release_order(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rw")
    before = released_flows(mq, parents, work, 2, "before")
    cursor, taken = mq.take_released(parents, "to-dwh")
    assert taken == []  # a new watcher starts now: what was released before is not its
    ids = released_flows(mq, parents, work, 5, "after")
    held = mq.add_flow(parents, [Child(1, queue=work)], barrier=True)  # never announced
    cursor, first = mq.take_released(parents, "to-dwh", cursor, limit=3)
    cursor, rest = mq.take_released(parents, "to-dwh", cursor, limit=3)
    assert [r.parent_id for r in first + rest] == ids
    assert {(r.queue, r.total, r.ignored) for r in first + rest} == {(parents, 2, 0)}
    assert mq.take_released(parents, "to-dwh", cursor) == (cursor, [])
    # a reader that lost its cursor (a restarted triggerer) reads the stored one
    assert mq.take_released(parents, "to-dwh") == (cursor, [])
    # another watcher of the same queue has its own cursor
    _, others = mq.take_released(parents, "audit")
    assert others == []
    assert held.parent_id not in {r.parent_id for r in first + rest} and before
    mq.close()


def test_flows_released_while_no_reader_ran_are_taken_by_the_next_poll(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rd")
    mq.take_released(parents, "late")  # the watcher exists; then nobody polls for a while
    ids = released_flows(mq, parents, work, 4, "down")
    other = backend.client(prefix)  # a new process: no cursor in hand
    _, taken = other.take_released(parents, "late", close=True)
    assert [r.parent_id for r in taken] == ids
    assert {mq.snapshot(parents, pid).parent_state for pid in ids} == {"closed"}
    mq.close()
    other.close()


def test_two_readers_of_one_watcher_never_take_the_same_flow(backend: Backend, prefix: str) -> None:
    """Two threads poll one watcher as fast as they can while flows are released: every flow
    is taken exactly once between them (the cursor moves by compare and set)."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rt")
    mq.take_released(parents, "shared")
    taken: dict[str, list[str]] = {"a": [], "b": []}
    stop = threading.Event()

    def reader(name: str) -> None:
        client = backend.client(prefix)
        cursor = None
        while not stop.is_set():
            cursor, got = client.take_released(parents, "shared", cursor, limit=2)
            taken[name] += [r.parent_id for r in got]
        cursor, got = client.take_released(parents, "shared", cursor, limit=1000)
        taken[name] += [r.parent_id for r in got]
        client.close()

    threads = [threading.Thread(target=reader, args=(n,)) for n in taken]
    for t in threads:
        t.start()
    try:
        ids = released_flows(mq, parents, work, 30, "race")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    everything = taken["a"] + taken["b"]
    assert sorted(everything) == sorted(ids), (len(everything), len(set(everything)))
    mq.close()


def test_flows_released_in_the_same_millisecond_are_all_taken(
    backend: Backend, prefix: str
) -> None:
    """Ties on the release time: ordered by id, none skipped across pages."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rs")
    mq.take_released(parents, "ties")
    refs = [
        mq.add_flow(parents, [Child(i, queue=work)], parent_id=f"JOB-tie-{i:03d}", barrier=True)
        for i in range(150)
    ]
    work_off(mq, [parents, work])  # many release within one millisecond
    cursor, seen = None, []
    for _ in range(10):
        cursor, got = mq.take_released(parents, "ties", cursor, limit=7)
        seen += [r.parent_id for r in got]
        if not got:
            break
    else:
        while got:
            cursor, got = mq.take_released(parents, "ties", cursor, limit=100)
            seen += [r.parent_id for r in got]
    assert sorted(seen) == sorted(r.parent_id for r in refs) and len(seen) == len(set(seen))
    mq.close()


def test_the_async_client_takes_as_the_sync_one(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "ra")

    async def take(cursor: str | None) -> tuple[str, list[str]]:
        client = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        try:
            cursor, got = await client.take_released(parents, "async", cursor)
            return cursor, [r.parent_id for r in got]
        finally:
            await client.close()

    cursor, _ = asyncio.run(take(None))
    ids = released_flows(mq, parents, work, 3, "async")
    assert asyncio.run(take(cursor))[1] == ids
    mq.close()


@pytest.mark.parametrize("name", ["", "a b", "x{y}", "q:z", "x" * 129, 7])
def test_a_bad_watcher_name_is_refused(mq: EchoMQ, name: object) -> None:
    with pytest.raises(InvalidArgument, match="watcher name"):
        mq.take_released("q", name)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="limit"):
        mq.take_released("q", "ok", limit=0)
