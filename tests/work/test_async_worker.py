"""The asyncio worker (issue 19): the threaded worker's guarantees with tasks for threads -
outcomes, concurrency from ``await``, heartbeats, time limits, hooks, dropped children of a
cancelled flow - on standalone and Cluster, and a real ``echomq worker --async`` process
stopped by SIGTERM mid-batch. No timed assertions: waits are bounded, never measured."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from echomq_core import (
    AsyncEchoMQ,
    AsyncWorker,
    Backoff,
    Child,
    EchoMQ,
    Job,
    JobSpec,
    Pump,
    Unrecoverable,
)
from echomq_core.work.async_worker import is_async

from ..conftest import Backend
from ..waiting import eventually, eventually_async, past_first_lease

CLI = [sys.executable, "-m", "echomq_core.cli"]


def _aclient(backend: Backend, prefix: str) -> AsyncEchoMQ:
    return AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)


def _run(
    backend: Backend,
    prefix: str,
    handlers: dict[str, Any],
    body: Callable[[AsyncWorker], Awaitable[None]],
    **settings: Any,
) -> AsyncWorker:
    """Start an AsyncWorker on a fresh asyncio client, run ``body``, stop the worker."""

    async def main() -> AsyncWorker:
        amq = _aclient(backend, prefix)
        worker = AsyncWorker(amq, handlers, **settings)
        await worker.start()
        try:
            await body(worker)
        finally:
            await worker.stop()
            await amq.close()
        return worker

    return asyncio.run(main())


def test_handler_kinds_are_told_apart() -> None:
    async def coro(job: Job) -> None: ...

    class Callable_:
        async def __call__(self, job: Job) -> None: ...

    assert is_async(coro) and is_async(Callable_())
    assert not is_async(lambda job: None)


def test_async_and_sync_handlers_run_and_fail_cleanly(
    mq: EchoMQ, backend: Backend, prefix: str
) -> None:
    q = mq.queue("aw", max_attempts=1)
    s = mq.queue("aw-sync", max_attempts=1)
    ok = q.add_bulk(range(300))
    boom = q.add({"boom": True})
    bury = q.add({"bury": True})
    unserialisable = q.add({"object": True})
    sync_ok = s.add_bulk(range(50))
    threads: set[str] = set()

    async def handle(job: Job) -> object:
        await asyncio.sleep(0)
        payload = job.payload
        if isinstance(payload, dict):
            if "boom" in payload:
                raise ValueError("kaboom")
            if "bury" in payload:
                raise Unrecoverable("no point retrying")
            return object()
        return payload + 1

    def handle_sync(job: Job) -> int:
        threads.add(threading.current_thread().name)
        return int(job.payload) * 3

    async def body(worker: AsyncWorker) -> None:
        await eventually_async(
            lambda: (
                q.stats()["completed"] + q.stats()["dead"] == 303 and s.stats()["completed"] == 50
            ),
            what="every job",
        )

    _run(backend, prefix, {"aw": handle, "aw-sync": handle_sync}, body, concurrency=4)
    assert q.get_job(ok[10]).result == 11
    assert q.get_job(boom).error == "ValueError: kaboom"
    assert q.get_job(bury).state == "dead"
    assert "cannot be stored" in (q.get_job(unserialisable).error or "")
    assert s.get_job(sync_ok[7]).result == 21
    assert threads and all(name.startswith("echomq-sync") for name in threads)
    assert q.stats()["active"] == 0 and s.stats()["active"] == 0


def test_a_queue_whose_claims_fail_starves_no_other(
    mq: EchoMQ, backend: Backend, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """As the threaded worker's test: every claim from ``broken`` fails and is logged, the
    other queue is served."""
    caplog.set_level("WARNING", logger="echomq_core.work.worker")
    raw = mq.connection.client
    raw.set(mq.keys.pending("broken"), "not a sorted set")
    good = mq.queue("good")
    good.add_bulk(range(300))

    async def handle(job: Job) -> int:
        return int(job.payload) * 2

    async def body(worker: AsyncWorker) -> None:
        await eventually_async(lambda: good.stats()["completed"] == 300, what="every job")

    try:
        _run(backend, prefix, {"broken": handle, "good": handle}, body, concurrency=4)
    finally:
        raw.delete(mq.keys.pending("broken"))
    assert "claim from 'broken' failed" in caplog.text
    assert good.stats()["active"] == 0


def test_async_handlers_run_concurrently_on_one_loop(
    mq: EchoMQ, backend: Backend, prefix: str
) -> None:
    """20 handlers that each wait until all 20 are inside: they can only finish if the worker
    runs them at once (one loop, no threads)."""
    q = mq.queue("aw-conc")
    q.add_bulk(range(20))
    inside: list[int] = []
    all_in = asyncio.Event()
    loops: set[int] = set()

    async def handle(job: Job) -> int:
        loops.add(id(asyncio.get_running_loop()))
        inside.append(job.payload)
        if len(inside) == 20:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 30)
        return int(job.payload)

    async def body(worker: AsyncWorker) -> None:
        await eventually_async(lambda: q.stats()["completed"] == 20, what="20 completions")

    worker = _run(backend, prefix, {"aw-conc": handle}, body, concurrency=20)
    assert sorted(inside) == list(range(20))
    assert len(loops) == 1
    assert worker.completed == 20


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_a_base_exception_fails_the_attempt_and_the_worker_lives(
    mq: EchoMQ, backend: Backend, prefix: str, kind: type[BaseException]
) -> None:
    q = mq.queue("aw-bx", max_attempts=2)
    bad = q.add_bulk([JobSpec("bad", id=f"JOB-bad{i}") for i in range(2)])
    good = q.add_bulk(list(range(30)))

    async def handle(job: Job) -> Any:
        if job.payload == "bad":
            raise kind("from the handler")
        return job.payload

    async def body(worker: AsyncWorker) -> None:
        await eventually_async(
            lambda: q.stats()["completed"] == 30 and q.stats()["dead"] == 2, what="all jobs"
        )

    _run(
        backend,
        prefix,
        {"aw-bx": handle},
        body,
        concurrency=2,
        queue_options={"backoff": Backoff(10, 10)},
    )
    for job_id in bad:
        info = q.get_job(job_id)
        assert (info.state, info.attempts) == ("dead", 2), info
        assert info.error == f"{kind.__name__}: from the handler"
    assert all(q.get_job(i).state == "completed" for i in good)


def test_long_async_jobs_are_heartbeated(mq: EchoMQ, backend: Backend, prefix: str) -> None:
    q = mq.queue("aw-slow")
    job_id = q.add("x")
    started, gate = asyncio.Event(), asyncio.Event()
    active, r, lease = mq.keys.active("aw-slow"), mq.connection.client, 3.0

    async def handle(job: Job) -> str:
        started.set()
        await asyncio.wait_for(gate.wait(), 60)  # held until heartbeats carried it on
        return "done"

    async def body(worker: AsyncWorker) -> None:
        await asyncio.wait_for(started.wait(), 30)
        first = {job_id: float(r.zscore(active, job_id))}
        pump = Pump(mq, ["aw-slow"], maintain_every=0)
        deadline = time.monotonic() + 60
        while not past_first_lease(r, active, first, lease * 1000):
            assert time.monotonic() < deadline, "no heartbeat past the claim's lease in 60 s"
            await asyncio.to_thread(pump.tick)  # would recover the job if its lease lapsed
            await asyncio.sleep(0.1)
        gate.set()
        await eventually_async(
            lambda: q.get_job(job_id).state == "completed", what="the completion"
        )

    _run(backend, prefix, {"aw-slow": handle}, body, lease=lease)
    assert q.get_job(job_id).stalls == 0


def test_time_limits_cancel_async_handlers_and_abandon_sync_ones(
    mq: EchoMQ, backend: Backend, prefix: str
) -> None:
    q = mq.queue("aw-hang")
    s = mq.queue("aw-hang-sync")
    q.add("hang", job_id="JOB-hang", max_attempts=2)
    q.add_bulk(list(range(10)))
    s.add("hang", job_id="JOB-hang-sync", max_attempts=1)
    s.add_bulk(list(range(10)))
    release = threading.Event()
    cancelled: list[str] = []

    async def handle(job: Job) -> Any:
        if job.payload == "hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append(job.id)
                raise
        return job.payload

    def handle_sync(job: Job) -> Any:
        if job.payload == "hang":
            release.wait(60)
            return "too late"
        return job.payload

    async def body(worker: AsyncWorker) -> None:
        # one task: the others can only complete if the hung calls' slots were freed
        await eventually_async(
            lambda: q.stats()["completed"] == 10 and s.stats()["completed"] == 10,
            what="the other jobs",
        )
        await eventually_async(
            lambda: (
                q.get_job("JOB-hang").state == "dead" and s.get_job("JOB-hang-sync").state == "dead"
            ),
            what="the timeouts",
        )
        release.set()  # the abandoned sync call returns "too late": never recorded
        await asyncio.sleep(0.3)

    try:
        worker = _run(
            backend,
            prefix,
            {"aw-hang": handle, "aw-hang-sync": handle_sync},
            body,
            concurrency=1,
            lease=3.0,
            timeout=0.5,
            queue_options={"backoff": Backoff(50, 50)},
        )
    finally:
        release.set()
    info = q.get_job("JOB-hang")
    assert (info.state, info.attempts) == ("dead", 2)
    assert info.error == "TimeoutError: the handler ran longer than 0.5s"
    assert cancelled == ["JOB-hang", "JOB-hang"]  # cancelled, not left running
    sync = s.get_job("JOB-hang-sync")
    assert (sync.state, sync.result) == ("dead", None)
    assert worker.abandoned == 3
    assert worker.completed == 20
    assert q.stats()["active"] == 0 and s.stats()["active"] == 0


class _Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def job_completed(self, job: Job, result: bytes) -> None:
        self.seen.append(("completed", job.id))

    def job_dead(self, job: Job, error: str) -> None:
        self.seen.append(("dead", job.id))

    def flow_released(self, queue: str, parent_id: str) -> None:
        self.seen.append(("released", parent_id))

    def flow_failed(self, queue: str, parent_id: str) -> None:
        self.seen.append(("failed", parent_id))


def test_hooks_fire_as_in_the_threaded_worker(mq: EchoMQ, backend: Backend, prefix: str) -> None:
    hooks = _Recorder()
    ref = mq.add_flow("aw-hooks", [Child(i) for i in range(5)])
    dead = mq.queue("aw-hooks").add("boom", max_attempts=1)

    async def handle(job: Job) -> Any:
        if job.payload == "boom":
            raise RuntimeError("boom")
        return job.payload

    async def body(worker: AsyncWorker) -> None:
        await eventually_async(
            lambda: ("released", ref.parent_id) in hooks.seen, what="the release"
        )
        await eventually_async(lambda: ("dead", dead) in hooks.seen, what="the dead job")

    _run(backend, prefix, {"aw-hooks": handle}, body, hooks=hooks)
    assert sum(1 for kind, _ in hooks.seen if kind == "completed") >= 5


def test_claimed_children_of_a_cancelled_flow_are_dropped(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "acd")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(40)])
    started: list[tuple[float, int]] = []
    gate = asyncio.Event()

    async def handle(job: Job) -> Any:
        started.append((time.monotonic(), job.payload))
        if len(started) >= 6:
            gate.set()
        await asyncio.sleep(0.1)
        return job.payload

    returned: list[float] = []

    async def body(worker: AsyncWorker) -> None:
        await asyncio.wait_for(gate.wait(), 30)
        await asyncio.to_thread(mq.cancel_flow, parents, ref.parent_id)
        returned.append(time.monotonic())
        await asyncio.sleep(1.5)

    # fast_job=10 s: every job counts as fast, so claims grow (1, 2, 4, 8...) and wait
    worker = _run(backend, prefix, {work: handle}, body, fast_job=10.0, max_batch=16)
    late = [p for t, p in started if t > returned[0]]
    assert len(late) <= 3, (late, worker.dropped)  # at most 0.25 s of 0.1 s jobs
    assert worker.dropped > 0, "claimed, unstarted children were dropped"
    assert mq.queue(work).stats()["active"] == 0
    assert len(started) < 40
    mq.close()


APP = """
import asyncio
import pathlib

async def handle(job):
    pathlib.Path("started").touch()
    await asyncio.sleep(0.02)
    return job.payload * 2

HANDLERS = {"aw-term": handle}
"""


@pytest.mark.parametrize("concurrency", [1, 8])
def test_sigterm_mid_batch_loses_nothing(
    backend: Backend, prefix: str, proc_env: dict[str, str], tmp_path: Path, concurrency: int
) -> None:
    """A real ``echomq worker --async`` process: SIGTERM while jobs are leased; it exits 0,
    leaves nothing leased, every job completed or claimable again with no attempt counted."""
    (tmp_path / "aw_app.py").write_text(textwrap.dedent(APP))
    mq = backend.client(prefix)
    q = mq.queue("aw-term")
    ids = q.add_bulk(range(400))
    url = (
        backend.url if not backend.cluster else backend.url.replace("redis://", "redis+cluster://")
    )
    env = {k: v for k, v in proc_env.items() if k not in ("ECHOMQ_URL", "ECHOMQ_PREFIX")}
    proc = subprocess.Popen(
        [
            *CLI,
            "worker",
            "aw-term",
            "--async",
            "--app",
            "aw_app:HANDLERS",
            "--concurrency",
            str(concurrency),
            "--url",
            url,
            "--prefix",
            prefix,
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def going() -> bool:
            if q.stats()["completed"] >= 20 and q.stats()["active"] > 0:
                return True
            assert proc.poll() is None, proc.communicate()
            return False

        eventually(going, 30, "the worker to get going", every=0.001)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "(asyncio)" in err and "stopped" in err
    stats = q.stats()
    assert stats["active"] == 0, "a graceful stop leaves nothing leased"
    assert stats["completed"] + stats["pending"] == 400, stats
    assert stats["completed"] < 400, "the stop interrupted the run"
    rest = q.claim(400)
    assert all(j.attempts == 0 for j in rest)
    assert len(rest) == stats["pending"]
    q.complete_many([(j, j.payload * 2) for j in rest])
    assert all(q.get_job(i).result == n * 2 for n, i in enumerate(ids))
    mq.close()


def test_stop_from_another_task_while_run_waits(mq: EchoMQ, backend: Backend, prefix: str) -> None:
    """run() in one task, stop() from another: one shutdown (the second call waits for it),
    the running job finishes, the unstarted ones go back untouched."""
    q = mq.queue("aw-stop")
    q.add_bulk(range(50))
    gate = asyncio.Event()

    async def handle(job: Job) -> int:
        gate.set()
        await asyncio.sleep(0.05)
        return int(job.payload)

    async def main() -> AsyncWorker:
        amq = _aclient(backend, prefix)
        worker = AsyncWorker(amq, {"aw-stop": handle}, concurrency=2)
        running = asyncio.create_task(worker.run(install_signals=False))
        await asyncio.wait_for(gate.wait(), 30)
        await asyncio.gather(worker.stop(), worker.stop())
        await asyncio.wait_for(running, 30)
        await amq.close()
        return worker

    worker = asyncio.run(main())
    stats = q.stats()
    assert stats["active"] == 0
    assert stats["completed"] == worker.completed > 0
    assert stats["completed"] + stats["pending"] == 50
    assert all(j.attempts == 0 for j in q.claim(50))
