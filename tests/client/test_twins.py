"""One client written once (issue 49, item 3): :class:`AsyncEchoMQ` has every public method of
:class:`EchoMQ`, with the same parameters and defaults, awaited (and :class:`AsyncQueue` every
one of :class:`Queue`); both drive the same operations (echomq_core/client/base.py). The twins
the asyncio client lacked before are run here against real servers, standalone and Cluster,
and read back what the other client wrote."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from echomq_core import (
    AsyncEchoMQ,
    AsyncQueue,
    Child,
    EchoMQ,
    InvalidArgument,
    InvalidQueueName,
    JobNotFound,
    Queue,
)

from ..conftest import Backend
from ..flowkit import work_off

PID = "JOB-twins/2026"

#: Methods that make a handle, not a round trip: plain in both classes.
HANDLES = {"queue"}


def _public(cls: type) -> dict[str, Any]:
    return {n: getattr(cls, n) for n in dir(cls) if not n.startswith("_")}


def test_the_clients_take_the_same_constructor_arguments() -> None:
    """Names, kinds and defaults (the connection's type differs: sync or asyncio)."""

    def shape(cls: type) -> list[tuple[str, Any, Any]]:
        params = inspect.signature(cls.__init__).parameters.values()  # type: ignore[misc]
        return [(p.name, p.kind, p.default) for p in params]

    assert shape(EchoMQ) == shape(AsyncEchoMQ)


@pytest.mark.parametrize(("sync_cls", "async_cls"), [(EchoMQ, AsyncEchoMQ), (Queue, AsyncQueue)])
def test_every_public_method_has_its_asyncio_twin_with_the_same_signature(
    sync_cls: type, async_cls: type
) -> None:
    sync, twins = _public(sync_cls), _public(async_cls)
    assert sorted(sync) == sorted(twins), set(sync) ^ set(twins)
    checked = 0
    for name, method in sync.items():
        twin = twins[name]
        if not callable(method):
            continue
        ours, theirs = inspect.signature(method), inspect.signature(twin)
        assert list(ours.parameters.values()) == list(theirs.parameters.values()), (
            f"{name}: {ours} != {theirs}"
        )
        assert not inspect.iscoroutinefunction(method), name
        if twin is method or name in HANDLES:  # shared by both (built once), or a handle
            assert not inspect.iscoroutinefunction(twin), name
        else:
            assert inspect.iscoroutinefunction(twin), f"{async_cls.__name__}.{name} is not async"
            checked += 1
    assert checked > (30 if sync_cls is EchoMQ else 10), checked
    if hasattr(sync_cls, "__enter__"):  # a context manager: the twin an async one
        assert inspect.iscoroutinefunction(async_cls.__aenter__)
        assert inspect.iscoroutinefunction(async_cls.__aexit__)


def _async(backend: Backend, prefix: str, body: Callable[[AsyncEchoMQ], Awaitable[Any]]) -> Any:
    """Run ``body`` on a fresh asyncio client of the same keyspace, closed after (``async
    with``: the twin of the sync client's ``with``)."""

    async def main() -> Any:
        async with AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix) as amq:
            return await body(amq)

    return asyncio.run(main())


def test_the_registry_twins(backend: Backend, prefix: str, mq: EchoMQ) -> None:
    mq.register_queue("alpha")

    async def body(amq: AsyncEchoMQ) -> list[str]:
        await amq.register_queue("beta")
        await amq.register_queue("beta")  # once per process: nothing more is sent
        with pytest.raises(InvalidQueueName):
            await amq.register_queue("no spaces")
        return await amq.queues()

    assert _async(backend, prefix, body) == ["alpha", "beta"] == mq.queues()


def test_the_retention_twins(backend: Backend, prefix: str, mq: EchoMQ) -> None:
    async def body(amq: AsyncEchoMQ) -> tuple[Any, Any]:
        before = await amq.retention("rq")
        await amq.set_retention("rq", completed_age=5, failed_count=7)
        with pytest.raises(InvalidArgument):
            await amq.set_retention("rq", completed_age=-1)
        return before, await amq.retention("rq")

    before, after = _async(backend, prefix, body)
    other = backend.client(prefix + "x")
    assert before == other.retention("rq")  # the defaults
    other.close()
    assert after == mq.retention("rq") and after != before
    assert (after["completed_age"], after["failed_count"]) == (5, 7)
    assert "rq" in mq.queues()  # registered with its settings, as the sync client does


def test_the_shard_twins(backend: Backend, prefix: str, mq: EchoMQ) -> None:
    async def body(amq: AsyncEchoMQ) -> tuple[tuple[str, ...], tuple[str, ...], str]:
        names = await amq.set_shards("sq", 3)
        ref = await amq.add_flow("sq", [Child({"n": 1}, queue="w")], parent_id=PID)
        return names, await amq.shards("sq"), await amq.home("sq", ref.parent_id)

    names, shards, home = _async(backend, prefix, body)
    assert len(names) == 3 and names[0] == "sq" and shards == names
    assert mq.shards("sq") == names and mq.home("sq", PID) == home
    assert mq.dependencies("sq", PID) == 1  # the sync client reads the flow where it went
    assert {"sq", "w"} <= set(mq.queues())  # the async add registered its child queue


def test_the_flow_read_twins(backend: Backend, prefix: str, mq: EchoMQ) -> None:
    parents, work = backend.queues_on_distinct_nodes(2, "tw")
    children = [Child({"n": i}, queue=work) for i in range(5)]
    ref = mq.add_flow(parents, children, parent_id=PID, barrier=True)
    work_off(mq, [parents, work], lambda job: job.payload["n"] * 10)
    mq.wait(parents, PID, timeout=30)

    async def body(amq: AsyncEchoMQ) -> dict[str, Any]:
        pages = await amq.iter_children_values(parents, PID, page=2)
        with pytest.raises(JobNotFound):  # at the call: the first page is read by it
            await amq.iter_children_values(parents, "JOB-none")
        with pytest.raises(JobNotFound):
            await amq.children_values_range(parents, "JOB-none", 0, 1)
        await amq.save_ref("nightly", ref)
        return {
            "child_queues": await amq.child_queues(parents, PID),
            "values": sorted([pair async for pair in pages]),
            "range": await amq.children_values_range(parents, PID, 1, 4),
            "ref": await amq.load_ref("nightly"),
            "none": await amq.load_ref("no-such-ref"),
        }

    got = _async(backend, prefix, body)
    assert got["child_queues"] == [work] == mq.child_queues(parents, PID)
    assert got["values"] == sorted(mq.iter_children_values(parents, PID))
    assert [v for _, v in got["values"]] == [0, 10, 20, 30, 40]
    sliced = mq.children_values_range(parents, PID, 1, 4)
    assert got["range"] == [(1, 10), (2, 20), (3, 30)] == sliced
    loaded = mq.load_ref("nightly")
    assert loaded is not None and got["ref"] == loaded
    assert (loaded.queue, loaded.parent_id) == (parents, PID)
    assert got["none"] is None
