"""The worker, in-process and as a real process stopped with SIGTERM mid-batch."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from echomq_core import EchoMQ, Job, Unrecoverable, Worker

from .conftest import Backend

PROC = str(Path(__file__).parent / "procs" / "worker_proc.py")


def _wait(predicate, timeout: float = 20.0, every: float = 0.02) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(every)


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
        _wait(lambda: q.stats()["completed"] + q.stats()["dead"] == 303)
    finally:
        worker.stop()
    assert q.get_job(ok[10]).result == 11
    assert q.get_job(boom).error == "ValueError: kaboom"
    assert q.get_job(bury).state == "dead"
    assert "cannot be stored" in (q.get_job(unserialisable).error or "")
    assert q.stats()["active"] == 0


def test_worker_heartbeats_long_jobs(mq: EchoMQ) -> None:
    q = mq.queue("slow")
    job_id = q.add("x")
    started = threading.Event()

    def handle(job: Job) -> str:
        started.set()
        time.sleep(0.8)  # four lease lengths: only heartbeats keep it leased
        return "done"

    worker = Worker(mq, {"slow": handle}, lease=0.2).start()
    try:
        started.wait(5)
        from echomq_core import Pump

        pump = Pump(mq, ["slow"], maintain_every=0)
        for _ in range(8):
            pump.tick()  # would recover the job if its lease lapsed
            time.sleep(0.1)
        _wait(lambda: q.get_job(job_id).state == "completed")
    finally:
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
        _wait(lambda: q.stats()["completed"] >= 20)
        _wait(lambda: q.stats()["active"] > 0, every=0.001)  # mid-batch: jobs are leased now
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
