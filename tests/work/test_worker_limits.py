"""Handlers that misbehave (issue 12, items 4 and 5): one that raises KeyboardInterrupt,
SystemExit or GeneratorExit costs an attempt, never a runner; one that hangs is abandoned at
its time limit (queue, job or flow child), its attempt failed with TimeoutError, its slot freed,
and what it returns later is refused by its token. In-process on both backends, and as a real
``echomq worker --timeout`` process stopped by SIGINT and SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from echomq_core import Backoff, Child, EchoMQ, Job, JobSpec, ParentFailed, Pump, Worker
from echomq_core.server import EmbeddedServer

from ..conftest import Backend
from ..waiting import eventually

CLI = [sys.executable, "-m", "echomq_core.cli"]


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_a_handler_raising_a_base_exception_fails_the_attempt_and_the_runner_lives(
    mq: EchoMQ, kind: type[BaseException]
) -> None:
    q = mq.queue("bx", max_attempts=2)
    bad = q.add_bulk([JobSpec("bad", id=f"JOB-bad{i}") for i in range(2)])
    good = q.add_bulk(list(range(50)))
    seen: list[str] = []

    def handle(job: Job) -> Any:
        seen.append(job.id)
        if job.payload == "bad":
            raise kind("from the handler")
        return job.payload

    worker = Worker(
        mq, {"bx": handle}, concurrency=1, queue_options={"backoff": Backoff(10, 10)}
    ).start()
    try:
        eventually(lambda: q.stats()["completed"] == 50 and q.stats()["dead"] == 2, what="all jobs")
    finally:
        worker.stop()
    assert all(t.is_alive() is False for t in worker._runners)  # stopped, not crashed early
    for job_id in bad:
        info = q.get_job(job_id)
        assert (info.state, info.attempts) == ("dead", 2), info
        assert info.error == f"{kind.__name__}: from the handler"
    assert all(q.get_job(i).state == "completed" for i in good)
    assert seen.count("JOB-bad0") == 2  # each attempt ran once
    assert q.stats()["active"] == 0


def test_a_hung_handler_is_abandoned_at_the_queue_timeout_and_its_late_result_is_refused(
    mq: EchoMQ,
) -> None:
    q = mq.queue("hang")
    hang = threading.Event()
    release = threading.Event()
    q.add("hang", job_id="JOB-hang", max_attempts=2)
    q.add_bulk(list(range(20)))
    calls: list[str] = []

    def handle(job: Job) -> Any:
        calls.append(job.id)
        if job.payload == "hang":
            hang.set()
            release.wait(60)
            return "too late"
        return job.payload

    worker = Worker(
        mq,
        {"hang": handle},
        concurrency=1,
        lease=3.0,
        timeout=0.5,
        queue_options={"backoff": Backoff(50, 50)},
    ).start()
    try:
        # one runner: the 20 others can only complete if the hung call's slot was freed
        eventually(lambda: q.stats()["completed"] == 20, what="the other jobs")
        eventually(lambda: q.get_job("JOB-hang").state == "dead", what="the second timeout")
        info = q.get_job("JOB-hang")
        assert info.attempts == 2
        assert info.error == "TimeoutError: the handler ran longer than 0.5s"
        assert calls.count("JOB-hang") == 2
        assert worker.abandoned == 2
        assert q.stats()["active"] == 0  # the lease was not extended past the limit
        release.set()  # the abandoned calls return "too late": refused by their tokens
        eventually(
            lambda: sum(1 for t in threading.enumerate() if "runner" in t.name) == 1,
            what="the abandoned threads to end",
        )
        time.sleep(0.2)
        info = q.get_job("JOB-hang")
        assert (info.state, info.result) == ("dead", None)
        assert worker.completed == 20
    finally:
        release.set()
        worker.stop()


def test_job_and_flow_child_timeouts_win_over_the_queue(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "to")
    release = threading.Event()

    def handle(job: Job) -> Any:
        if job.payload == "slow":
            release.wait(30)
        return job.payload

    q = mq.queue(work)
    q.add("slow", job_id="JOB-own-limit", timeout=0.3, max_attempts=1)
    q.add("slow", job_id="JOB-no-limit", max_attempts=1)  # the queue's 20 s applies
    ref = mq.add_flow(
        parents,
        [
            Child("slow", queue=work, timeout=0.3, max_attempts=1),
            Child("fast", queue=work),
            Child(
                "slow", queue=work, timeout=0.3, max_attempts=1, ignore_dependency_on_failure=True
            ),
        ],
        parent_id="JOB-flow",
    )
    assert q.get_job("JOB-flow.0").state == "pending"
    worker = Worker(mq, {work: handle}, concurrency=2, timeout=20.0).start()
    pump = Pump(mq, [parents, work]).start()
    try:
        with pytest.raises(ParentFailed, match="TimeoutError"):
            mq.wait(parents, ref.parent_id, timeout=30)
        eventually(lambda: q.get_job("JOB-own-limit").state == "dead", what="the own limit")
        assert "TimeoutError" in (q.get_job("JOB-own-limit").error or "")
        assert "TimeoutError" in mq.failed_children(parents, "JOB-flow")["JOB-flow.0"]
        assert q.get_job("JOB-no-limit").state == "active"  # 20 s: still running, leased
    finally:
        release.set()
        worker.stop()
        pump.stop()
    assert q.get_job("JOB-no-limit").state == "completed"
    mq.close()


APP = """
import os, time

def handle(job):
    if job.payload == "interrupt":
        raise KeyboardInterrupt("a handler's own KeyboardInterrupt")
    if job.payload == "exit":
        raise SystemExit(3)
    if job.payload == "hang":
        open("hang.started", "w").close()
        time.sleep(3600)
    if job.payload == "slow":
        open("slow.started", "w").close()
        time.sleep(1.0)
    return job.payload

HANDLERS = {"lim": handle}
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_worker_process_with_timeout_survives_its_handlers_and_stops_gracefully(
    proc_env: dict[str, str],
    standalone_server: EmbeddedServer,
    prefix: str,
    tmp_path: Path,
    sig: signal.Signals,
) -> None:
    (tmp_path / "lim_app.py").write_text(textwrap.dedent(APP))
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    q = mq.queue("lim")
    ids = {p: q.add(p, max_attempts=1) for p in ("interrupt", "exit", "hang")}
    plain = q.add_bulk(list(range(10)))
    env = {k: v for k, v in proc_env.items() if k not in ("ECHOMQ_URL", "ECHOMQ_PREFIX")}
    worker = subprocess.Popen(
        [
            *CLI,
            "worker",
            "lim",
            "--app",
            "lim_app:HANDLERS",
            "--timeout",
            "1",
            "--url",
            standalone_server.url,
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
        eventually(
            lambda: q.stats()["dead"] == 3 and q.stats()["completed"] == 10,
            what="three dead, ten completed",
        )
        slow = q.add("slow")
        eventually(lambda: (tmp_path / "slow.started").exists(), what="the slow handler")
        worker.send_signal(sig)  # mid-job: graceful, the slow job finishes
        _, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    # a drain after Ctrl-C exits 130 (interrupted, as the help says), after SIGTERM 0
    assert worker.returncode == (130 if sig == signal.SIGINT else 0), err
    assert q.get_job(ids["interrupt"]).error == (
        "KeyboardInterrupt: a handler's own KeyboardInterrupt"
    )
    assert q.get_job(ids["exit"]).error == "SystemExit: 3"
    assert q.get_job(ids["hang"]).error == "TimeoutError: the handler ran longer than 1s"
    assert all(q.get_job(i).state == "completed" for i in plain)
    assert q.get_job(slow).state == "completed"
    assert q.stats()["active"] == 0
    mq.close()
