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
