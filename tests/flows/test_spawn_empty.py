"""A spawn of nothing is a no-op (issue 48, item 6): a crawl that finds a page without links, a
walk that finds an empty directory. ``job.spawn([])`` writes nothing and returns ``[]``; the
child completes as if it had not called; with ``own=True`` it completes as a plain job with its
handler's value. And a spawn takes any iterable of ``Child`` (item 7): a generator. Threaded and
asyncio workers, standalone and Cluster."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from echomq_core import AsyncEchoMQ, AsyncWorker, Child, EchoMQ, Job, Pump, Worker

from ..conftest import Backend
from ..flowkit import invariant, keys_of
from ..waiting import eventually, eventually_async
from .test_spawn import claim_one

#: page -> the links found on it; "empty" has none
LINKS: dict[str, list[str]] = {"home": ["a", "empty"], "a": ["b"], "b": [], "empty": []}


def crawl(job: Job) -> Any:
    """A page spawns a sibling per link (a generator of them): none on a page without links."""
    links = LINKS[job.payload]
    job.spawn(Child(link) for link in links)
    return f"{job.payload}:{len(links)}"


def walk(job: Job) -> Any:
    """A directory spawns its entries as children of its own and sums them when resumed; an
    empty directory spawns none and completes at once with its size, 0."""
    if isinstance(job.payload, int):
        return job.payload
    if job.resumed:
        return sum(job.children_values().values())
    entries = [] if job.payload == "empty-dir" else [Child(5), Child(7)]
    job.spawn(entries, own=True)
    return 0  # the value of a directory with no entries


async def acrawl(job: Job) -> Any:
    links = LINKS[job.payload]
    ids = await job.spawn(Child(link) for link in links)
    assert len(ids) == len(links)
    return f"{job.payload}:{len(links)}"


async def awalk(job: Job) -> Any:
    if isinstance(job.payload, int):
        return job.payload
    if job.resumed:
        return sum((await job.children_values()).values())
    entries = [] if job.payload == "empty-dir" else [Child(5), Child(7)]
    await job.spawn(entries, own=True)
    return 0


def _flows(mq: EchoMQ, parents: str, work: str) -> tuple[str, str]:
    crawl_ref = mq.add_flow(parents, [Child("home", queue=work)], barrier=True)
    walk_ref = mq.add_flow(
        parents, [Child("empty-dir", queue=work), Child("full-dir", queue=work)], barrier=True
    )
    return crawl_ref.parent_id, walk_ref.parent_id


def _check(mq: EchoMQ, parents: str, work: str, crawled: str, walked: str) -> None:
    pages = mq.children_values(parents, crawled)
    assert sorted(pages.values()) == ["a:1", "b:0", "empty:0", "home:2"]
    snap = mq.snapshot(parents, crawled)
    assert (snap.total, snap.processed, snap.dependencies, snap.failed) == (4, 4, 0, 0)
    dirs = mq.children_values(parents, walked)
    assert sorted(dirs.values()) == [0, 12]  # the empty one: its handler's value, as a plain job
    empty_id = next(i for i, v in dirs.items() if v == 0)
    assert mq.snapshot(work, empty_id).total == 0  # it never became a parent
    snap = mq.snapshot(parents, walked)
    assert (snap.total, snap.processed, snap.dependencies, snap.failed) == (2, 2, 0, 0)
    invariant(mq, parents, crawled)
    invariant(mq, parents, walked)


def test_a_spawn_of_nothing_writes_nothing_and_returns_no_ids(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "se")
    mq.add_flow(parents, [Child("seed", queue=work)])
    seed = claim_one(mq, work)
    before = keys_of(backend, prefix)
    assert seed.spawn([]) == []
    assert seed.spawn(iter(())) == []
    assert seed.spawn([], own=True) == []
    assert (seed.spawned, seed.adopted) == (0, 0)
    assert keys_of(backend, prefix) == before
    mq.close()


def test_threaded_worker_a_crawl_and_a_walk_that_find_nothing(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "st")
    crawled, walked = _flows(mq, parents, work)

    def handle(job: Job) -> Any:
        return walk(job) if job.payload in ("empty-dir", "full-dir") or isinstance(
            job.payload, int
        ) else crawl(job)

    worker = Worker(mq, {work: handle}, concurrency=2)
    pump = Pump(mq, [parents, work])
    t = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    t.start()
    pump.start()
    try:
        eventually(
            lambda: mq.snapshot(parents, crawled).released
            and mq.snapshot(parents, walked).released,
            60,
            "both flows released",
        )
    finally:
        worker.stop()
        pump.stop()
        t.join(30)
    _check(mq, parents, work, crawled, walked)
    mq.close()


def test_asyncio_worker_a_crawl_and_a_walk_that_find_nothing(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "sa")
    crawled, walked = _flows(mq, parents, work)

    async def handle(job: Job) -> Any:
        if job.payload in ("empty-dir", "full-dir") or isinstance(job.payload, int):
            return await awalk(job)
        return await acrawl(job)

    async def run() -> None:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        w = AsyncWorker(amq, {work: handle}, concurrency=2)
        pump = Pump(mq, [parents, work])
        pump.start()
        await w.start()
        try:

            await eventually_async(
                lambda: mq.snapshot(parents, crawled).released
                and mq.snapshot(parents, walked).released,
                60,
                "both flows released",
            )
        finally:
            await w.stop()
            pump.stop()
            await amq.close()

    asyncio.run(run())
    _check(mq, parents, work, crawled, walked)
    mq.close()
