"""``echomq worker`` and ``echomq pump`` started before their server answers: they wait for it
(``--wait-for-server``), logging each try, instead of exiting."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from echomq_core import Child, ConnectionLost, EchoMQ, Worker
from echomq_core.server import EmbeddedServer

from ..waiting import eventually

CLI = [sys.executable, "-m", "echomq_core.cli"]
APP = """
def double(job):
    return job.payload * 2

HANDLERS = {"st-kids": double}
"""


def _read_until(proc: subprocess.Popen[str], needle: str, timeout: float = 60.0) -> list[str]:
    """The stderr lines of ``proc`` up to the first that holds ``needle`` (the gate)."""
    assert proc.stderr is not None
    stderr = proc.stderr
    seen: list[str] = []

    def told() -> str:
        return f"{needle!r} to be logged; stderr so far:\n{''.join(seen)}"

    def logged() -> bool:
        line = stderr.readline()
        if not line:
            if proc.poll() is not None:
                raise AssertionError(f"the process exited before {told()}")
            return False
        seen.append(line)
        return needle in line

    eventually(logged, timeout, told, every=0.0)
    return seen


def test_worker_and_pump_wait_for_a_server_that_starts_late(
    proc_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "st_app.py").write_text(textwrap.dedent(APP))
    server = EmbeddedServer()  # its port picked, nothing listening there yet
    url = f"redis://127.0.0.1:{server.port}/0"
    conn = ["--url", url, "--prefix", "st", "--connect-timeout", "0.5"]
    procs = [
        subprocess.Popen(
            [*CLI, *args, *conn, "--wait-for-server", "120"],
            env=proc_env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in (["worker", "--app", "st_app:HANDLERS", "--no-pump"], ["pump"])
    ]
    try:
        for proc in procs:  # each has tried and is waiting: the precondition, logged
            (line,) = [
                ln for ln in _read_until(proc, "does not answer") if "does not answer" in ln
            ]
            assert "try 1" in line and "--wait-for-server" in line
            assert proc.poll() is None
        server.start()
        for proc in procs:
            _read_until(proc, "the server answers")
        mq = EchoMQ(server.url, prefix="st")
        ref = mq.add_flow("st-parents", [Child(i, queue="st-kids") for i in range(20)],
                          barrier=True)
        snap = mq.wait(ref.queue, ref.parent_id, timeout=60)  # worker ran them, pump delivered
        assert snap.processed == 20
        assert sorted(mq.children_values(ref.queue, ref.parent_id).values()) == [
            2 * i for i in range(20)
        ]
        mq.close()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        server.stop()


@pytest.mark.parametrize("command", ["worker", "pump"])
def test_wait_for_server_zero_fails_at_once(
    proc_env: dict[str, str], tmp_path: Path, command: str
) -> None:
    (tmp_path / "st_app.py").write_text(textwrap.dedent(APP))
    port = EmbeddedServer().port  # nothing listens there
    extra = ["--app", "st_app:HANDLERS"] if command == "worker" else []
    started = time.monotonic()
    done = subprocess.run(
        [*CLI, command, *extra, "--url", f"redis://127.0.0.1:{port}/0", "--connect-timeout",
         "0.5", "--wait-for-server", "0"],
        env=proc_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "does not answer" not in done.stderr  # no retry was made
    assert time.monotonic() - started < 30


def test_in_process_worker_gives_up_after_wait_for_server() -> None:
    """``Worker(..., wait_for_server=S)`` on a server that never answers raises ConnectionLost
    after about S seconds, saying it gave up and the bound (0 would raise at once)."""
    port = EmbeddedServer().port  # nothing listens there
    mq = EchoMQ(f"redis://127.0.0.1:{port}/0", prefix="st", socket_connect_timeout=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(ConnectionLost, match=r"gave up after \d+ tries .*the bound is 1.5s"):
            Worker(mq, {"st-kids": lambda job: None}, wait_for_server=1.5)
    finally:
        mq.close()
    assert 1.5 <= time.monotonic() - started < 15
