"""Batch handlers (issue 31 item 4): ``Worker(..., batch=N)`` / ``batch={queue: N}`` and the
same on :class:`AsyncWorker` and ``echomq worker --batch``. A handler gets a list of up to N
jobs of one queue; per-job outcomes, retries, time limits, heartbeats, flows and hooks work per
job. On standalone and Cluster; preconditions that depend on timing are reached through gates
the test holds (``threading.Event``) or conditions it polls, never through sleeps."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from echomq_core import (
    AsyncEchoMQ,
    AsyncWorker,
    Backoff,
    Child,
    EchoMQ,
    InvalidArgument,
    Job,
    Unrecoverable,
    Worker,
)

from ..conftest import Backend
from ..waiting import eventually, eventually_async, past_first_lease

CLI = [sys.executable, "-m", "echomq_core.cli"]


class Recorder:
    """Hooks that note every event (any thread)."""

    def __init__(self) -> None:
        self.completed: list[str] = []
        self.dead: list[str] = []
        self.released: list[str] = []

    def job_completed(self, *, job: Job, result: bytes) -> None:
        self.completed.append(job.id)

    def job_dead(self, *, job: Job, error: str) -> None:
        self.dead.append(job.id)

    def flow_released(self, *, queue: str, parent_id: str) -> None:
        self.released.append(parent_id)


def _settled(mq: EchoMQ, queue: str, count: int) -> bool:
    stats = mq.queue(queue).stats()
    return bool(stats["completed"] + stats["dead"] == count)


def test_a_batch_handler_gets_lists_of_one_queue(mq: EchoMQ) -> None:
    """The old worker called a handler once per job (and refused ``batch=``): here one call
    takes several jobs of its queue, never more than the batch size, and a queue left at 1
    keeps one-job calls in the same worker."""
    ids = mq.queue("bq").add_bulk(range(64))
    single = mq.queue("one").add_bulk(range(5))
    calls: list[list[int]] = []
    singles: list[Any] = []

    def batch(jobs: list[Job]) -> list[int]:
        assert isinstance(jobs, list) and {j.queue for j in jobs} == {"bq"}
        calls.append([j.payload for j in jobs])
        return [j.payload * 10 for j in jobs]

    def one(job: Job) -> int:
        singles.append(job)
        return int(job.payload) + 1

    worker = Worker(mq, {"bq": batch, "one": one}, batch={"bq": 16}, concurrency=2).start()
    try:
        eventually(lambda: _settled(mq, "bq", 64) and _settled(mq, "one", 5), 30)
    finally:
        worker.stop()
    assert worker.batches == {"bq": 16}
    assert sorted(p for call in calls for p in call) == list(range(64))
    assert max(len(c) for c in calls) > 1 and all(len(c) <= 16 for c in calls)
    assert len(calls) < 64
    assert [mq.queue("bq").get_job(i).result for i in ids[:3]] == [0, 10, 20]
    assert all(isinstance(j, Job) for j in singles) and len(singles) == 5
    assert mq.queue("one").get_job(single[4]).result == 5


def test_per_job_exceptions_and_a_raise(mq: EchoMQ) -> None:
    """An exception instance in the list fails only its job (Unrecoverable buries it, an
    unstorable result fails that job only); a raise fails every job of the call."""
    q = mq.queue("bx", max_attempts=1)
    q.add_bulk(range(40))
    boom = q.add("boom")
    calls: list[list[Any]] = []

    def batch(jobs: list[Job]) -> list[Any]:
        calls.append([j.id for j in jobs])
        if any(j.payload == "boom" for j in jobs):
            raise RuntimeError("the whole call")
        out: list[Any] = []
        for j in jobs:
            if j.payload == 1:
                out.append(Unrecoverable("bury one"))
            elif j.payload == 2:
                out.append(object())  # cannot be serialised
            elif j.payload % 3 == 0:
                out.append(ValueError(f"bad {j.payload}"))
            else:
                out.append(j.payload)
        return out

    hooks = Recorder()
    worker = Worker(mq, {"bx": batch}, batch=8, hooks=hooks).start()
    try:
        eventually(lambda: _settled(mq, "bx", 41), 30)
    finally:
        worker.stop()
    boom_call = next(c for c in calls if boom in c)
    for job_id in boom_call:
        row = q.get_job(job_id)
        assert (row.state, row.error) == ("dead", "RuntimeError: the whole call")
    rest = {q.get_job(i).payload: q.get_job(i) for c in calls if c is not boom_call for i in c}
    assert rest[1].error == "Unrecoverable: bury one"
    assert "cannot be stored" in (rest[2].error or "")
    assert rest[9].error == "ValueError: bad 9" and rest[9].state == "dead"
    assert "ValueError: bad 9" in (rest[9].traceback or "")
    assert (rest[4].state, rest[4].result) == ("completed", 4)
    assert len(hooks.completed) + len(hooks.dead) == 41


def test_wrong_count_or_not_a_list_fails_each_job_of_the_call(mq: EchoMQ) -> None:
    short, odd = mq.queue("bshort", max_attempts=1), mq.queue("bodd", max_attempts=1)
    short_ids, odd_ids = short.add_bulk(range(10)), odd.add_bulk(range(6))

    def drops_one(jobs: list[Job]) -> list[int]:
        return [j.payload for j in jobs][:-1] if len(jobs) > 1 else []

    def a_dict(jobs: list[Job]) -> dict[str, int]:
        return {j.id: j.payload for j in jobs}

    worker = Worker(mq, {"bshort": drops_one, "bodd": a_dict}, batch=4).start()
    try:
        eventually(lambda: _settled(mq, "bshort", 10) and _settled(mq, "bodd", 6), 30)
    finally:
        worker.stop()
    for job_id in short_ids:
        row = short.get_job(job_id)
        assert row.state == "dead"
        assert row.error is not None and row.error.startswith("InvalidArgument: ")
        assert "results for" in row.error and "(expected" in row.error
    for job_id in odd_ids:
        error = odd.get_job(job_id).error or ""
        assert "returned a dict, not a list of" in error, error


@pytest.mark.parametrize("bad", [0, -1, "4", 2.0, True, 600, None])
def test_bad_batch_sizes_are_refused(mq: EchoMQ, bad: Any) -> None:
    with pytest.raises(InvalidArgument, match="batch"):
        Worker(mq, {"q": lambda jobs: jobs}, batch=bad)
    with pytest.raises(InvalidArgument, match="batch"):
        Worker(mq, {"q": lambda jobs: jobs}, batch={"q": bad})
    with pytest.raises(InvalidArgument, match="batch"):
        AsyncWorker(AsyncEchoMQ("redis://127.0.0.1:1"), {"q": lambda jobs: jobs}, batch=bad)


def test_a_batch_for_a_queue_without_a_handler_is_refused(mq: EchoMQ) -> None:
    with pytest.raises(InvalidArgument, match=r"'other'.*no handler"):
        Worker(mq, {"q": lambda jobs: jobs}, batch={"other": 4})
    with pytest.raises(InvalidArgument, match="exceeds max_batch"):
        Worker(mq, {"q": lambda jobs: jobs}, batch=64, max_batch=32)


def test_retries_per_job(mq: EchoMQ) -> None:
    q = mq.queue("bretry", max_attempts=3, backoff=Backoff(base_ms=1, cap_ms=5))
    ids = q.add_bulk(range(30))

    def batch(jobs: list[Job]) -> list[Any]:
        return [
            ValueError("odd, first try") if j.payload % 2 and j.attempts == 0 else j.payload
            for j in jobs
        ]

    worker = Worker(mq, {"bretry": batch}, batch=8).start()
    try:
        eventually(lambda: q.stats()["completed"] == 30, 30, lambda: q.stats())
    finally:
        worker.stop()
    rows = [q.get_job(i) for i in ids]
    assert [r.result for r in rows] == list(range(30))
    assert [r.attempts for r in rows] == [p % 2 for p in range(30)]  # failed attempts


def _fan_in(payload_sum: int, values: dict[str, Any]) -> int:
    return payload_sum + sum(int(v) for v in values.values())


def test_flows_settle_through_batches(mq: EchoMQ, backend: Backend) -> None:
    """Children run in batches settle their parents as one-job children do: cross-queue (the
    worker's Pump delivers) and same-queue (the parent itself runs in a batch)."""
    parents, kids = backend.queues_on_distinct_nodes(2, "bf")
    cross = mq.add_flow(parents, [Child(i, queue=kids) for i in range(40)], payload=0)
    same = mq.add_flow(kids, [Child(100 + i, queue=kids) for i in range(20)], payload=0)

    def batch(jobs: list[Job]) -> list[Any]:
        out = []
        for j in jobs:
            if j.id == same.parent_id:
                out.append(_fan_in(j.payload, mq.children_values(kids, j.id)))
            else:
                out.append(j.payload)
        return out

    def parent(job: Job) -> int:
        return _fan_in(job.payload, mq.children_values(parents, job.id))

    hooks = Recorder()
    worker = Worker(
        mq, {kids: batch, parents: parent}, batch={kids: 8}, concurrency=2, hooks=hooks
    ).start()
    try:
        eventually(
            lambda: mq.queue(parents).get_job(cross.parent_id).state == "completed"
            and mq.queue(kids).get_job(same.parent_id).state == "completed",
            30,
        )
    finally:
        worker.stop()
    assert mq.queue(parents).get_job(cross.parent_id).result == sum(range(40))
    assert mq.queue(kids).get_job(same.parent_id).result == sum(range(100, 120))
    assert len(mq.children_values(parents, cross.parent_id)) == 40
    assert sorted(hooks.released) == sorted([cross.parent_id, same.parent_id])
    assert len(hooks.completed) == 40 + 20 + 2


def test_a_time_limit_applies_per_call(mq: EchoMQ) -> None:
    q = mq.queue("btime", max_attempts=1)
    ids = q.add_bulk(range(4))
    gate, entered = threading.Event(), threading.Event()

    def batch(jobs: list[Job]) -> list[int]:
        entered.set()
        gate.wait(30)  # held until every job of the call has failed
        return [j.payload for j in jobs]

    worker = Worker(mq, {"btime": batch}, batch=4, timeout=0.2).start()
    try:
        assert entered.wait(30)
        eventually(lambda: q.stats()["dead"] == 4, 30, lambda: q.stats())
        gate.set()
    finally:
        gate.set()
        worker.stop()
    assert worker.abandoned == 1
    for job_id in ids:
        assert (q.get_job(job_id).error or "").startswith("TimeoutError")


def test_heartbeats_cover_every_job_of_a_running_batch(mq: EchoMQ) -> None:
    q = mq.queue("bbeat")
    ids = q.add_bulk(range(6))
    gate, entered = threading.Event(), threading.Event()

    def batch(jobs: list[Job]) -> list[int]:
        entered.set()
        gate.wait(60)
        return [j.payload for j in jobs]

    active, r = mq.keys.active("bbeat"), mq.connection.client
    worker = Worker(mq, {"bbeat": batch}, batch=6, lease=3.0).start()
    try:
        assert entered.wait(30)
        first = {i: float(r.zscore(active, i)) for i in ids}
        # held until every lease ends a whole lease after the claim's deadline: without the
        # heartbeat extending each job of the call, they would have expired
        eventually(lambda: past_first_lease(r, active, first, 3000), 60, "the heartbeats")
        gate.set()
        eventually(lambda: q.stats()["completed"] == 6, 30)
    finally:
        gate.set()
        worker.stop()
    assert all(q.get_job(i).stalls == 0 for i in ids)


def test_children_of_a_cancelled_flow_buffered_for_a_batch_are_dropped(
    mq: EchoMQ, backend: Backend
) -> None:
    parents, kids = backend.queues_on_distinct_nodes(2, "bc")
    ref = mq.add_flow(parents, [Child(i, queue=kids) for i in range(12)])
    gate, entered = threading.Event(), threading.Event()
    calls: list[int] = []

    def batch(jobs: list[Job]) -> list[int]:
        calls.append(len(jobs))
        entered.set()
        gate.wait(60)
        return [j.payload for j in jobs]

    worker = Worker(mq, {kids: batch}, batch=4, fast_job=10.0, pump=False)
    worker.recheck = 0.0  # check leases before every call: no wait for their age
    worker.start()
    try:
        assert entered.wait(30)
        eventually(lambda: len(worker._hand.buffer) == 8, 30, lambda: len(worker._hand.buffer))
        mq.cancel_flow(parents, ref.parent_id)
        gate.set()
        eventually(lambda: worker.dropped == 8, 30, lambda: worker.dropped)
    finally:
        gate.set()
        worker.stop()
    assert calls == [4]
    assert mq.queue(kids).stats()["active"] == 0


@pytest.mark.parametrize("wait", [True, False])
def test_a_stop_mid_batch_loses_nothing(mq: EchoMQ, wait: bool) -> None:
    """A graceful stop lets the running call finish (its jobs complete) and gives back the
    rest; a stop without waiting gives back the running call's jobs too (what the call
    returns later is refused)."""
    q = mq.queue("bstop")
    ids = q.add_bulk(range(20))
    gate, entered = threading.Event(), threading.Event()
    calls: list[list[str]] = []

    def batch(jobs: list[Job]) -> list[int]:
        calls.append([j.id for j in jobs])
        entered.set()
        gate.wait(60)
        return [j.payload for j in jobs]

    worker = Worker(mq, {"bstop": batch}, batch=8, pump=False).start()
    stopper = threading.Thread(target=worker.stop, kwargs={"wait": wait})
    try:
        assert entered.wait(30)
        stopper.start()
        eventually(worker._stop.is_set, 30)
        if not wait:
            stopper.join(30)  # the running call's jobs are given back before it returns
        gate.set()
        stopper.join(30)
    finally:
        gate.set()
    assert len(calls) == 1
    stats = q.stats()
    ran = len(calls[0])
    if wait:
        assert (stats["completed"], stats["pending"]) == (ran, 20 - ran)
    else:
        eventually(lambda: q.stats()["pending"] == 20, 30, lambda: q.stats())
        assert q.stats()["completed"] == 0
    assert q.stats()["active"] == 0
    assert all(q.get_job(i).attempts == 0 for i in ids)  # nothing counted as a failed attempt


# -- the asyncio worker -------------------------------------------------------------------


def _arun(backend: Backend, prefix: str, handlers: dict[str, Any], until: Any, **kw: Any) -> Any:
    async def main() -> AsyncWorker:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        worker = AsyncWorker(amq, handlers, **kw)
        await worker.start()
        try:
            await eventually_async(until, 30)
        finally:
            await worker.stop()
            await amq.close()
        return worker

    return asyncio.run(main())


def test_async_batch_handlers(mq: EchoMQ, backend: Backend, prefix: str) -> None:
    """Async handlers are awaited with a list, sync ones run in the pool with a list; per-job
    exceptions, a wrong count and a cross-queue flow as in the threaded worker."""
    parents, kids = backend.queues_on_distinct_nodes(2, "ab")
    ref = mq.add_flow(parents, [Child(i, queue=kids) for i in range(30)], payload=0)
    sync_q, short = mq.queue("async-sync", max_attempts=1), mq.queue("ashort", max_attempts=1)
    sync_ids, short_ids = sync_q.add_bulk(range(20)), short.add_bulk(range(5))
    sizes: list[int] = []

    async def kids_batch(jobs: list[Job]) -> list[Any]:
        sizes.append(len(jobs))
        await asyncio.sleep(0)
        return [j.payload for j in jobs]

    def sync_batch(jobs: list[Job]) -> list[Any]:
        return [ValueError("seven") if j.payload == 7 else -j.payload for j in jobs]

    async def short_batch(jobs: list[Job]) -> list[Any]:
        return []

    def parent(job: Job) -> int:
        return _fan_in(job.payload, mq.children_values(parents, job.id))

    def done() -> bool:
        return (
            mq.queue(parents).get_job(ref.parent_id).state == "completed"
            and _settled(mq, "async-sync", 20)
            and _settled(mq, "ashort", 5)
        )

    handlers = {kids: kids_batch, parents: parent, "async-sync": sync_batch, "ashort": short_batch}
    batch = {kids: 8, "async-sync": 8, "ashort": 8}
    worker = _arun(backend, prefix, handlers, done, batch=batch, concurrency=2)
    assert worker.batches == batch
    assert max(sizes) > 1 and all(s <= 8 for s in sizes)
    assert mq.queue(parents).get_job(ref.parent_id).result == sum(range(30))
    rows = {r.payload: r for r in (sync_q.get_job(i) for i in sync_ids)}
    assert rows[7].error == "ValueError: seven" and rows[3].result == -3
    for job_id in short_ids:
        assert "returned 0 results for" in (short.get_job(job_id).error or "")


def test_async_time_limit_cancels_the_call(mq: EchoMQ, backend: Backend, prefix: str) -> None:
    q = mq.queue("atime", max_attempts=1)
    ids = q.add_bulk(range(4))
    cancelled = []

    async def batch(jobs: list[Job]) -> list[int]:
        try:
            await asyncio.Event().wait()  # never set: only the time limit ends it
        except asyncio.CancelledError:
            cancelled.append(len(jobs))
            raise
        return []

    worker = _arun(
        backend, prefix, {"atime": batch}, lambda: q.stats()["dead"] == 4, batch=4, timeout=0.2
    )
    assert worker.abandoned == 1 and cancelled == [4]
    assert all((r.error or "").startswith("TimeoutError") for r in map(q.get_job, ids))


# -- the command line ---------------------------------------------------------------------

APP = """
import json, pathlib

def batch(jobs):
    with open("calls", "a") as f:
        f.write(json.dumps(len(jobs)) + "\\n")
    return [j.payload + 1 for j in jobs]

HANDLERS = {"cli-b": batch, "cli-one": lambda job: job.payload}
"""


def test_the_worker_command_takes_batch(
    mq: EchoMQ, backend: Backend, prefix: str, proc_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    mq.queue("cli-b").add_bulk(range(50))
    mq.queue("cli-one").add_bulk(range(3))
    url = backend.url.replace("redis://", "redis+cluster://") if backend.cluster else backend.url
    bad = subprocess.run(
        [*CLI, "worker", "--app", "app:HANDLERS", "--batch", "cli-b=0", "--url", url],
        cwd=tmp_path, env=proc_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "--batch" in bad.stderr
    proc = subprocess.Popen(
        [*CLI, "worker", "--app", "app:HANDLERS", "--batch", "cli-b=10", "--url", url,
         "--prefix", prefix],
        cwd=tmp_path, env=proc_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        eventually(lambda: _settled(mq, "cli-b", 50) and _settled(mq, "cli-one", 3), 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "batch cli-b=10" in out + err
    sizes = [int(line) for line in (tmp_path / "calls").read_text().split()]
    assert sum(sizes) == 50 and max(sizes) <= 10 and len(sizes) < 50


def test_a_sharded_queue_is_batched_per_shard(mq: EchoMQ) -> None:
    """``batch={logical queue: n}`` covers every shard; a call holds jobs of one shard."""
    mq.set_shards("bsh", 3)
    q = mq.queue("bsh")
    q.add_bulk(range(60))
    calls: list[set[str]] = []

    def batch(jobs: list[Job]) -> list[int]:
        calls.append({j.shard for j in jobs})
        assert {j.queue for j in jobs} == {"bsh"}
        return [j.payload for j in jobs]

    worker = Worker(mq, {"bsh": batch}, batch={"bsh": 8}).start()
    try:
        eventually(lambda: q.stats()["completed"] == 60, 30, lambda: q.stats())
    finally:
        worker.stop()
    assert set(worker.batches.values()) == {8} and len(worker.batches) == 3
    assert all(len(shards) == 1 for shards in calls) and len(calls) < 60


def test_async_stop_mid_batch_finishes_the_call_and_gives_back_the_rest(
    mq: EchoMQ, backend: Backend, prefix: str
) -> None:
    q = mq.queue("astop")
    q.add_bulk(range(20))
    calls: list[int] = []

    async def main() -> None:
        gate, entered = asyncio.Event(), asyncio.Event()

        async def batch(jobs: list[Job]) -> list[int]:
            calls.append(len(jobs))
            entered.set()
            await gate.wait()
            return [j.payload for j in jobs]

        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        worker = AsyncWorker(amq, {"astop": batch}, batch=8, pump=False)
        await worker.start()
        try:
            await asyncio.wait_for(entered.wait(), 30)
            stopping = asyncio.ensure_future(worker.stop())
            await eventually_async(worker._stop.is_set, 30)
            gate.set()
            await asyncio.wait_for(stopping, 60)
        finally:
            gate.set()
            await worker.stop()
            await amq.close()

    asyncio.run(main())
    assert calls == [8]
    stats = q.stats()
    assert (stats["completed"], stats["pending"], stats["active"]) == (8, 12, 0)


def test_the_batch_flag_takes_n_and_queue_n() -> None:
    from echomq_core.cli import build_parser
    from echomq_core.cli.common import UsageError

    args = build_parser().parse_args(["worker", "--app", "m:o", "--batch", "256", "--batch", "q=4"])
    assert args.batch_specs == [(None, 256), ("q", 4)]
    for bad in ("0", "q=x", "=4", "5001"):
        with pytest.raises(UsageError, match="--batch"):
            build_parser().parse_args(["worker", "--app", "m:o", "--batch", bad])
