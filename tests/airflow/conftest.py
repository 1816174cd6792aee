"""Fixtures for the Airflow provider tests: real Airflow, real server, real worker processes.

Airflow reads its configuration when first imported, so this module points it at a private
``AIRFLOW_HOME`` (a temp dir with a sqlite metadata DB and a DAGs folder) *before* anything
imports ``airflow``; the whole directory goes away at exit. ``airflow db migrate`` runs once
per session (a few seconds on sqlite).

Without Airflow installed (the default dev venv) the directory is skipped at collection.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
EXAMPLES = ROOT / "examples" / "airflow"
PACKAGED_EXAMPLES = ROOT / "airflow_provider" / "echomq_provider" / "example_dags"

if importlib.util.find_spec("airflow") is None:
    collect_ignore_glob = ["test_*.py"]
elif "ECHOMQ_TEST_AIRFLOW_HOME" in os.environ:  # imported twice: keep the first home
    AIRFLOW_HOME = Path(os.environ["ECHOMQ_TEST_AIRFLOW_HOME"])
else:
    AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="echomq-airflow-"))
    atexit.register(shutil.rmtree, AIRFLOW_HOME, True)
    os.environ.update(
        {
            "ECHOMQ_TEST_AIRFLOW_HOME": str(AIRFLOW_HOME),
            "AIRFLOW_HOME": str(AIRFLOW_HOME),
            "AIRFLOW__CORE__DAGS_FOLDER": str(AIRFLOW_HOME / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME}/airflow.db",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(AIRFLOW_HOME / "logs"),
            "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        }
    )
    os.environ.pop("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", None)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated metadata DB and a DAGs folder holding the example and the test DAGs."""
    dags = AIRFLOW_HOME / "dags"
    dags.mkdir(exist_ok=True)
    for source in [*PACKAGED_EXAMPLES.glob("echomq_*.py"), *(HERE / "dags").glob("*.py")]:
        shutil.copy(source, dags / source.name)
    from .helpers import airflow_cli

    result = airflow_cli("db", "migrate")
    assert result.returncode == 0, result.stderr[-3000:]
    return dags


@pytest.fixture
def echomq_conn(standalone_server: object, prefix: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``echomq_default`` pointing at the session's server with this test's key prefix."""
    url = urlsplit(standalone_server.url)  # type: ignore[attr-defined]
    uri = f"echomq://{url.hostname}:{url.port}/0?prefix={prefix}"
    monkeypatch.setenv("AIRFLOW_CONN_ECHOMQ_DEFAULT", uri)
    return uri


@pytest.fixture
def record_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the test DAGs' callbacks write what they saw (JSON lines)."""
    path = tmp_path / "record.jsonl"
    monkeypatch.setenv("ECHOMQ_TEST_RECORD", str(path))
    return path


@pytest.fixture
def start_worker(
    standalone_server: object, prefix: str, proc_env: dict[str, str]
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start real EchoMQ worker processes (Worker + Pump, the example's handlers); every one
    started is stopped (SIGTERM, drained) at teardown. ``job_delay``: seconds per job;
    ``gate``: a file every job waits for (see ``worker_proc``)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(job_delay: float = 0.0, gate: Path | None = None) -> subprocess.Popen[bytes]:
        env = dict(
            proc_env,
            ECHOMQ_URL=standalone_server.url,  # type: ignore[attr-defined]
            ECHOMQ_PREFIX=prefix,
            ECHOMQ_TEST_JOB_DELAY=str(job_delay),
        )
        if gate is not None:
            env["ECHOMQ_TEST_GATE"] = str(gate)
        proc = subprocess.Popen([sys.executable, str(HERE / "worker_proc.py")], env=env)
        procs.append(proc)
        time.sleep(0.3)
        assert proc.poll() is None, "worker process exited at start"
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            stop_process(proc)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM (the worker drains), then SIGKILL if it overstays."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
