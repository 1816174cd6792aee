"""The workers registry (echomq_core.queues.registry) against real servers: a threaded and an
asyncio worker register at start with what they are, beat with what they hold, leave at once
on a clean stop; a real worker process killed with SIGKILL disappears within its lease (and
its registry member is trimmed by the reader); the dashboard's /workers page and the
collector's echomq_workers gauge."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from echomq_core import AsyncEchoMQ, AsyncWorker, EchoMQ, Job, Worker
from echomq_core.queues.registry import WorkerEntry, read_workers
from echomq_core.server import EmbeddedServer
from echomq_core.wire.calls import Call, Op

from ..conftest import Backend
from ..dashkit import Dashboard, env_for
from ..waiting import eventually

PROC = Path(__file__).parent.parent / "procs" / "worker_proc.py"


def live(mq: EchoMQ) -> dict[str, WorkerEntry]:
    return {w.id: w for w in mq.perform(read_workers(mq.keys))}


def test_a_worker_registers_beats_what_it_holds_and_leaves_at_stop(
    backend: Backend, mq: EchoMQ
) -> None:
    gate = threading.Event()

    def held(job: Job) -> int:
        gate.wait(30)
        return 1

    q = mq.queue("wr-a")
    q.add_bulk([1, 2])
    worker = Worker(mq, {"wr-a": held, "wr-b": held}, concurrency=3, lease=0.6).start()
    try:
        me = worker.presence.entry.id
        entry = eventually(lambda: live(mq).get(me), 10, "the worker's entry")
        assert entry.pid == os.getpid() and entry.kind == "thread"
        assert sorted(entry.queues) == ["wr-a", "wr-b"] and entry.concurrency == 3
        assert entry.started <= entry.beat
        # a later beat says what it holds now (two jobs held by the gate)
        eventually(lambda: (w := live(mq).get(me)) is not None and w.inflight == 2, 10)
        (ttl,) = mq.perform(_one("PTTL", mq.keys.worker(me)))
        assert 0 < int(ttl) <= 600  # three beats of lease / 3
    finally:
        gate.set()
        worker.stop()
    # at once, no expiry waited for: the hash and the registry member are gone
    assert me not in live(mq)
    assert mq.perform(_one("EXISTS", mq.keys.worker(me))) == [0]
    assert mq.perform(_one("ZSCORE", mq.keys.workers(), me)) == [None]


def test_an_async_worker_registers_and_leaves(backend: Backend, prefix: str) -> None:
    async def main() -> None:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)

        async def h(job: Job) -> int:
            return 1

        worker = AsyncWorker(amq, {"wr-async": h}, concurrency=5, lease=0.6)
        await worker.start()
        me = worker.presence.entry.id
        try:
            found = await _has(amq, me)  # written by start(), before it returned
            assert found is not None
            assert found.kind == "asyncio" and found.concurrency == 5
            assert found.queues == ["wr-async"]
        finally:
            await worker.stop()
        assert not await _has(amq, me)
        await amq.close()

    asyncio.run(main())


async def _has(amq: AsyncEchoMQ, worker_id: str) -> WorkerEntry | None:
    found = await amq.connection.perform(read_workers(amq.keys))
    return next((w for w in found if w.id == worker_id), None)


def test_a_killed_worker_process_disappears_within_its_lease(
    backend: Backend, mq: EchoMQ, prefix: str, proc_env: dict[str, str]
) -> None:
    args = [sys.executable, str(PROC), backend.url, "1" if backend.cluster else "0", prefix]
    proc = subprocess.Popen(
        [*args, "wr-kill", "0", "2"], env=proc_env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        entry = eventually(
            lambda: next((w for w in live(mq).values() if w.pid == proc.pid), None),
            10,
            "the process's entry",
        )
        assert entry.queues == ["wr-kill"] and entry.concurrency == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # the worker's lease is 5 s (worker_proc.py): its entry expires within it
        eventually(lambda: entry.id not in live(mq), 5 + 3, "the killed worker to disappear")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    # the reader trimmed the member whose hash expired
    assert mq.perform(_one("ZSCORE", mq.keys.workers(), entry.id)) == [None]


def _one(*args: object) -> Op[list[Any]]:
    return (yield [Call.cmd(*args)])  # type: ignore[no-any-return]


@pytest.mark.onlystandalone
def test_the_workers_page_lists_them(
    standalone_server: EmbeddedServer, prefix: str, proc_env: dict[str, str]
) -> None:
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    d = Dashboard(standalone_server.url, prefix, env_for(proc_env))
    try:
        assert 'id="no-workers"' in d.get("/workers").body
        worker = Worker(mq, {"wr-page": lambda job: 1}, concurrency=4).start()
        me = worker.presence.entry.id
        try:
            page = d.get("/workers").body
            assert f'data-worker="{me}"' in page and "wr-page" in page
            doc = json.loads(d.get("/api/workers").body)
            assert [w["id"] for w in doc["workers"]] == [me]
            assert doc["workers"][0]["concurrency"] == 4
        finally:
            worker.stop()
        assert json.loads(d.get("/api/workers").body) == {"workers": []}
    finally:
        d.stop()
        mq.close()
