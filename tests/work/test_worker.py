"""The worker, in-process and as a real process stopped with SIGTERM mid-batch."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from echomq_core import EchoMQ, Job, Unrecoverable, Worker
from echomq_core.queues.hints import hint_groups

from ..conftest import Backend
from ..waiting import eventually, past_first_lease

#: The lease of the heartbeat tests: heartbeats every lease / 3 leave a late heartbeat thread
#: two thirds of it (2 s) on a loaded machine before a job would expire.
LEASE = 3.0

PROC = str(Path(__file__).parent.parent / "procs" / "worker_proc.py")


def test_worker_runs_handlers_and_fails_cleanly(mq: EchoMQ) -> None:
    q = mq.queue("work", max_attempts=1)
    ok = q.add_bulk(range(300))
    boom = q.add({"boom": True})
    bury = q.add({"bury": True})
    unserialisable = q.add({"object": True})

    def handle(job: Job) -> object:
        payload = job.payload
        if isinstance(payload, dict):
            if "boom" in payload:
                raise ValueError("kaboom")
            if "bury" in payload:
                raise Unrecoverable("no point retrying")
            return object()
        return payload + 1

    worker = Worker(mq, {"work": handle}, concurrency=2).start()
    try:
        eventually(lambda: q.stats()["completed"] + q.stats()["dead"] == 303, 20)
    finally:
        worker.stop()
    assert q.get_job(ok[10]).result == 11
    assert q.get_job(boom).error == "ValueError: kaboom"
    assert q.get_job(bury).state == "dead"
    assert "cannot be stored" in (q.get_job(unserialisable).error or "")
    assert q.stats()["active"] == 0


def test_a_queue_whose_claims_fail_starves_no_other(
    mq: EchoMQ, caplog: pytest.LogCaptureFixture
) -> None:
    """Every claim from ``broken`` fails (its pending set is a string: the script raises);
    the failure is logged and the worker's other queue is served batch after batch."""
    caplog.set_level("WARNING", logger="echomq_core.work.worker")
    raw = mq.connection.client
    raw.set(mq.keys.pending("broken"), "not a sorted set")
    good = mq.queue("good")
    good.add_bulk(range(300))
    handlers = {"broken": lambda job: None, "good": lambda job: job.payload * 2}
    worker = Worker(mq, handlers, concurrency=4).start()
    try:
        eventually(lambda: good.stats()["completed"] == 300, 30)
    finally:
        worker.stop()
        raw.delete(mq.keys.pending("broken"))
    assert "claim from 'broken' failed" in caplog.text
    assert good.stats()["active"] == 0


def test_worker_heartbeats_long_jobs(mq: EchoMQ) -> None:
    q = mq.queue("slow")
    job_id = q.add("x")
    started, gate = threading.Event(), threading.Event()

    def handle(job: Job) -> str:
        started.set()
        assert gate.wait(60)  # held until heartbeats carried it past its first lease
        return "done"

    active, r = mq.keys.active("slow"), mq.connection.client
    worker = Worker(mq, {"slow": handle}, lease=LEASE).start()
    try:
        assert started.wait(30)
        first = {job_id: float(r.zscore(active, job_id))}
        from echomq_core import Pump

        pump = Pump(mq, ["slow"], maintain_every=0)

        def extended() -> bool:
            pump.tick()  # would recover the job if its lease lapsed
            return past_first_lease(r, active, first, LEASE * 1000)

        eventually(extended, 60, "a heartbeat past the claim's lease", every=0.1)
        gate.set()
        eventually(lambda: q.get_job(job_id).state == "completed", 20)
    finally:
        gate.set()
        worker.stop()
    assert q.get_job(job_id).stalls == 0


@pytest.mark.parametrize("concurrency", [1, 4])
def test_sigterm_mid_batch_loses_nothing(
    backend: Backend, prefix: str, proc_env: dict[str, str], concurrency: int
) -> None:
    mq = backend.client(prefix)
    q = mq.queue("work")
    ids = q.add_bulk(range(400))
    proc = subprocess.Popen(
        [
            sys.executable,
            PROC,
            backend.url,
            "1" if backend.cluster else "0",
            prefix,
            "work",
            "10",
            str(concurrency),
        ],
        env=proc_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        eventually(lambda: q.stats()["completed"] >= 20, 20)
        # mid-batch: jobs are leased now
        eventually(lambda: q.stats()["active"] > 0, 20, "a leased job", every=0.001)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopped" in out
    stats = q.stats()
    assert stats["active"] == 0, "a graceful stop leaves nothing leased"
    assert stats["completed"] + stats["pending"] == 400, stats
    assert stats["completed"] < 400, "the stop interrupted the run"
    # every job is either completed or claimable again, none counted an attempt
    rest = q.claim(400)
    assert all(j.attempts == 0 for j in rest)
    assert len(rest) == stats["pending"]
    q.complete_many([(j, j.payload * 2) for j in rest])
    results = {i: q.get_job(i).result for i in ids}
    assert all(results[i] == n * 2 for n, i in enumerate(ids))
    mq.close()


# -- waking idle workers ----------------------------------------------------------------------
# Every worker below polls every 30 s at best: a job that starts within seconds was started by
# the wake-up hint, not by a poll.

SLOW_POLL = {"poll": 30.0, "max_poll": 30.0}


def _idle(worker: Worker) -> Worker:
    worker.start()
    time.sleep(0.3)  # its first claim found nothing: every runner now waits on the hint
    return worker


def test_idle_worker_starts_new_jobs_at_once(mq: EchoMQ, caplog: pytest.LogCaptureFixture) -> None:
    q = mq.queue("wake")
    caplog.set_level("WARNING", logger="echomq_core.work.worker")
    worker = _idle(Worker(mq, {"wake": lambda job: job.payload + 1}, **SLOW_POLL))
    try:
        time.sleep(6)  # longer than redis-py's 5 s socket timeout: the wait is sliced
        assert "waiting for work failed" not in caplog.text
        for round_ in range(3):  # woken, idle again, woken again
            job_id = q.add(round_)
            eventually(lambda j=job_id: q.get_job(j).state == "completed", timeout=10)
            time.sleep(0.2)
    finally:
        worker.stop()


def test_wake_up_is_passed_on_to_other_idle_runners(mq: EchoMQ) -> None:
    q = mq.queue("wake-many")
    seen: set[str] = set()

    def handle(job: Job) -> None:
        seen.add(threading.current_thread().name)
        time.sleep(0.02)

    worker = _idle(Worker(mq, {"wake-many": handle}, concurrency=3, **SLOW_POLL))
    try:
        q.add_bulk(range(60))
        eventually(lambda: q.stats()["completed"] == 60, timeout=10)
    finally:
        worker.stop()
    assert len(seen) >= 2, f"only {seen} ran jobs: the wake-up was not passed on"


def test_flow_children_and_released_parents_wake_their_workers(mq: EchoMQ) -> None:
    from echomq_core import Child, Pump

    ran: list[str] = []
    children = _idle(Worker(mq, {"wk-c": lambda job: job.payload}, **SLOW_POLL))
    parents = _idle(Worker(mq, {"wk-p": lambda job: ran.append(job.id)}, **SLOW_POLL))
    pump = Pump(mq, ["wk-c", "wk-p"]).start()
    try:
        # same-queue: the completion script releases the parent into its own (idle) queue
        same = mq.add_flow("wk-p", [Child(i) for i in range(20)])
        # cross-queue: landed children wake the child worker; the Pump's delivery wakes the
        # parent's worker
        cross = mq.add_flow("wk-p", [Child(i, queue="wk-c") for i in range(20)])
        eventually(lambda: {same.parent_id, cross.parent_id} <= set(ran), timeout=10)
    finally:
        pump.stop()
        children.stop()
        parents.stop()


def test_promoted_and_given_back_jobs_wake_workers(mq: EchoMQ) -> None:
    from echomq_core import Pump

    q = mq.queue("wk-later")
    held_id = q.add("held")
    (held,) = q.claim(1)  # leased by this client, not by the worker
    worker = _idle(Worker(mq, {"wk-later": lambda job: "ok"}, **SLOW_POLL))
    pump = Pump(mq, ["wk-later"]).start()
    try:
        later = q.add("x", delay=0.3)  # due while the worker waits: the Pump's promotion wakes it
        eventually(lambda: q.get_job(later).state == "completed", timeout=10)
        time.sleep(0.2)
        assert q.release([held]) == [True]  # a job given back wakes the idle worker
        eventually(lambda: q.get_job(held_id).state == "completed", timeout=10)
    finally:
        pump.stop()
        worker.stop()


def test_worker_blocks_on_every_slot(mq: EchoMQ, backend: Backend) -> None:
    one = Worker(mq, {"solo": lambda job: None})
    assert list(one.handlers) == ["solo"]
    many = Worker(mq, {"q-one": lambda job: None, "q-two": lambda job: None})
    assert list(many.handlers) == ["q-one", "q-two"]
    groups = hint_groups([mq.keys.wake(q) for q in many.handlers], backend.cluster)
    # two hash tags, two slots on a Cluster: one BZPOPMIN each (a waiter thread per slot)
    assert len(groups) == (2 if backend.name == "cluster" else 1)


def test_stopping_an_idle_worker_ends_its_blocked_runners_quietly(
    mq: EchoMQ, backend: Backend, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="echomq_core.work.worker")
    worker = _idle(Worker(mq, {"wk-stop": lambda job: None}, concurrency=3, **SLOW_POLL))
    started = time.monotonic()
    worker.stop(wait=False)
    for thread in worker._runners:
        thread.join(10)  # blocked in slices of BLOCK_SLICE: a stop is seen within one
    assert not any(t.is_alive() for t in worker._runners)
    assert time.monotonic() - started < 10
    # a CLI command closes its client right after the stop: runners still blocked (another
    # worker's, here with nothing to wake them) end quietly, with no warning
    client = backend.client(prefix)
    other = _idle(Worker(client, {"wk-stop-2": lambda job: None}, **SLOW_POLL))
    other._stop.set()
    client.close()
    for thread in other._runners:
        thread.join(10)
    assert not any(t.is_alive() for t in other._runners)
    assert "waiting for work failed" not in caplog.text
    # the rest of both workers (helpers, heartbeat, Pump) ends too: nothing outlives the test
    other.stop(wait=False)
    for w in (worker, other):
        assert w.pump is not None and not w.pump.running


def test_the_threaded_worker_awaits_what_a_handler_returns(mq: EchoMQ) -> None:
    """A coroutine (an ``async def`` handler) or any other awaitable a handler returns is
    awaited on the runner's own event loop; plain results (None, numbers, text, containers)
    are recorded as they are, without that check's cost."""
    import asyncio

    class Later:
        def __await__(self) -> Any:
            yield from asyncio.sleep(0).__await__()
            return "awaited"

    async def coro(job: Job) -> int:
        await asyncio.sleep(0)
        return int(job.payload) * 3

    q, r = mq.queue("aw-coro"), mq.queue("aw-plain")
    coro_ids = q.add_bulk(range(5))
    payloads: list[object] = [None, 7, 1.5, "t", [1], {"k": 2}, "later"]
    plain_ids = r.add_bulk(payloads)

    def plain(job: Job) -> object:
        return Later() if job.payload == "later" else job.payload

    worker = Worker(mq, {"aw-coro": coro, "aw-plain": plain}, concurrency=2).start()
    try:
        eventually(
            lambda: q.stats()["completed"] == 5 and r.stats()["completed"] == len(payloads), 30
        )
    finally:
        worker.stop()
    assert [q.get_job(i).result for i in coro_ids] == [0, 3, 6, 9, 12]
    expected = [None, 7, 1.5, "t", [1], {"k": 2}, "awaited"]
    assert [r.get_job(i).result for i in plain_ids] == expected


def test_fast_job_zero_claims_for_free_runners_only(mq: EchoMQ) -> None:
    """``fast_job=0`` (every handler counts as slow: claims only for free runners) works from
    the first claim, before any handler has been timed - the claim size is not divided by a
    handler time of zero."""
    q = mq.queue("fj0")
    ids = q.add_bulk(range(20))
    worker = Worker(mq, {"fj0": lambda job: job.payload}, concurrency=2, fast_job=0.0).start()
    try:
        eventually(lambda: q.stats()["completed"] == 20, 30, lambda: q.stats())
    finally:
        worker.stop()
    assert [q.get_job(i).result for i in ids] == list(range(20))
