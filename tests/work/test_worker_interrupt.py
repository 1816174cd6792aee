"""Ctrl-C on ``echomq worker`` (threaded and ``--async``), as Celery does it: the first says
what the drain waits for (the jobs in flight, the ``--grace`` bound); the second stops at once
with the jobs in flight given back - their leases released, so another worker claims them at
once - and exit status 130 (issue 48, item 8)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from echomq_core import EchoMQ
from echomq_core.server import EmbeddedServer

from ..waiting import eventually
from .test_startup import _read_until

CLI = [sys.executable, "-m", "echomq_core.cli"]
#: A handler that holds its job until a file the test never writes appears: the jobs stay in
#: flight for as long as the test needs (its gate: each handler's ``started-ID`` file).
APP = """
import os, time

def hold(job):
    open(f"started-{job.id}", "w").close()  # the test's gate: this handler runs
    while not os.path.exists("release"):
        time.sleep(0.05)
    return job.payload

HANDLERS = {"ci-hold": hold}
"""


@pytest.mark.parametrize("mode", [[], ["--async"]], ids=["threads", "asyncio"])
def test_second_ctrl_c_gives_running_jobs_back_and_exits_130(
    standalone_server: EmbeddedServer, proc_env: dict[str, str], tmp_path: Path, mode: list[str]
) -> None:
    (tmp_path / "ci_app.py").write_text(textwrap.dedent(APP))
    prefix = f"ci{time.monotonic_ns()}"
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    q = mq.queue("ci-hold")
    ids = q.add_bulk(["a", "b"])
    proc = subprocess.Popen(
        [*CLI, "worker", "--app", "ci_app:HANDLERS", "--no-pump", "--concurrency", "2",
         "--grace", "30", *mode, "--url", standalone_server.url, "--prefix", prefix],
        env=proc_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # the gate: both handlers run
        eventually(lambda: all((tmp_path / f"started-{i}").exists() for i in ids), 60)
        proc.send_signal(signal.SIGINT)
        said = "".join(_read_until(proc, "in flight", 30))
        assert "30s" in said and all(i in said for i in ids), said
        assert proc.poll() is None  # draining: the handlers still hold their jobs
        began = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 130
        took = time.monotonic() - began
        assert took < 10, took  # not the 30 s grace
        # given back: another worker claims both at once, no lease expiry waited for
        claimed = q.claim(10)
        assert sorted(job.id for job in claimed) == sorted(ids)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        mq.close()


def test_sigterm_drain_exits_0(
    standalone_server: EmbeddedServer, proc_env: dict[str, str], tmp_path: Path
) -> None:
    """SIGTERM (Kubernetes) drains and exits 0; the help and docs say 130 only for Ctrl-C."""
    (tmp_path / "ci_app.py").write_text(textwrap.dedent(APP))
    prefix = f"ci{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [*CLI, "worker", "--app", "ci_app:HANDLERS", "--no-pump",
         "--url", standalone_server.url, "--prefix", prefix],
        env=proc_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    try:
        # the gate: its registry entry is written after its signal handlers are installed
        eventually(lambda: mq.connection.client.zcard(mq.keys.workers()) == 1, 60)
        proc.send_signal(signal.SIGTERM)
        said = "".join(_read_until(proc, "SIGTERM", 30))
        assert "no job in flight" in said, said
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        mq.close()


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_pump_exit_status_after_a_signal(
    standalone_server: EmbeddedServer, proc_env: dict[str, str], sig: int, status: int
) -> None:
    """``echomq pump``: 130 after Ctrl-C, 0 after SIGTERM (today 0 for both)."""
    proc = subprocess.Popen(
        [*CLI, "pump", "ci-hold", "--url", standalone_server.url, "--prefix", "ci-pump"],
        env=proc_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _read_until(proc, "pump: queues", 60)  # said once its signal handlers are installed
        proc.send_signal(sig)
        assert proc.wait(30) == status
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
