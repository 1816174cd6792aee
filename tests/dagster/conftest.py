"""Fixtures for the Dagster integration tests: real Dagster, real servers, real workers.

Where Dagster is not installed (the project's main environment) this directory is not
collected; CI runs it from the environment that has ``dagster-echomq``. So nothing here
imports Dagster at module level.
"""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from dagster_support import ROOT, WORKER_PROC, pump_threads
from deploy_support import signal_group

if TYPE_CHECKING:
    from dagster import DagsterInstance

if importlib.util.find_spec("dagster") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def instance() -> Iterator[DagsterInstance]:
    """A persistent instance in a temporary directory (sqlite storage, local compute logs).

    One per session: creating one costs about 2 s, and runs never see each other's state
    (each test has its own key prefix, each run its own id)."""
    from dagster import instance_for_test

    with instance_for_test() as inst:
        yield inst


@pytest.fixture
def spawn(proc_env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start a real process; every one still running at teardown gets SIGTERM (then SIGKILL)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, *args], env={**proc_env, **(env or {})})
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
def workers(spawn: Callable[..., subprocess.Popen[bytes]]) -> Callable[..., object]:
    """``workers(url, prefix, "q1", "q2")``: a worker process (no Pump) serving those queues."""

    def start(url: str, prefix: str, *queues: str) -> subprocess.Popen[bytes]:
        return spawn(str(WORKER_PROC), url, prefix, ",".join(queues))

    return start


@pytest.fixture(autouse=True)
def no_pump_left_behind() -> Iterator[None]:
    """Every test ends with no resource Pump registered and no Pump thread alive."""
    from dagster_echomq.pumps import PumpShare

    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and pump_threads():
        time.sleep(0.05)
    assert PumpShare.live_pumps() == []
    assert pump_threads() == []


@pytest.fixture
def group_spawn(proc_env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start a process in a session of its own; at teardown its whole process group (dagster
    dev's webserver, daemon, code server and the runs they launch) gets SIGTERM, then
    SIGKILL if it lingers past 5 s: nothing is checked after the test, and with a 30 s grace
    every ``dagster dev`` test's teardown took the whole 30 s."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args,
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
        signal_group(proc, signal.SIGKILL)  # what is left of the group, leader or not
        proc.wait(10)
