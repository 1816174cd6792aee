"""Helpers shared by the Dagster tests (kept out of conftest.py so tests can import them)."""

from __future__ import annotations

import importlib.util
import threading
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = ROOT / "examples" / "dagster"
WORKER_PROC = Path(__file__).with_name("worker_proc.py")


def client_url(backend: Any) -> str:
    """The backend's URL with the Cluster marker, so every process (workers, CLI) agrees."""
    url: str = backend.url
    if backend.cluster:
        return url.replace("redis://", "redis+cluster://", 1)
    return url


def pump_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("dagster-pump-")]


def load_example(monkeypatch: pytest.MonkeyPatch, url: str, prefix: str, n: int) -> ModuleType:
    """Import ``examples/dagster/definitions.py`` afresh with this test's server and prefix."""
    monkeypatch.setenv("ECHOMQ_URL", url)
    monkeypatch.setenv("ECHOMQ_PREFIX", prefix)
    monkeypatch.setenv("ECHOMQ_EXAMPLE_N", str(n))
    name = f"echomq_dagster_example_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, EXAMPLE_DIR / "definitions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def evaluate_sensor(
    sensor: Any, instance: Any, cursor: str | None, resources: Any, definitions: Any = None
) -> Any:
    """One evaluation of ``sensor`` as the daemon runs it: resources set up (EnvVar values
    resolved) and torn down around it. ``definitions`` (needed for partitioned run requests):
    the Definitions the sensor belongs to."""
    from dagster import build_sensor_context

    with build_sensor_context(
        instance=instance, cursor=cursor, resources=resources, definitions=definitions
    ) as context:
        return sensor.evaluate_tick(context)


def run_the_failure_sensor(result: Any, instance: Any, url: str, prefix: str) -> None:
    """Evaluate echomq_cancel_sensors' run failure sensor on the failed run ``result``."""
    from dagster import DagsterEventType, DagsterRunStatus, build_run_status_sensor_context
    from dagster_echomq import EchoMQResource, echomq_cancel_sensors

    failed_sensor, terminated_sensor = echomq_cancel_sensors()
    assert terminated_sensor.name == "echomq_cancel_terminated"
    run = instance.get_run_by_id(result.run_id)
    assert run is not None and run.status == DagsterRunStatus.FAILURE
    (event,) = [e for e in result.all_events if e.event_type == DagsterEventType.RUN_FAILURE]
    with build_run_status_sensor_context(
        sensor_name=failed_sensor.name,
        dagster_event=event,
        dagster_instance=instance,
        dagster_run=run,
        resources={"echomq": EchoMQResource(url=url, prefix=prefix)},
    ) as context:
        failed_sensor(context.for_run_failure())
