"""The example in ``examples/dagster/``: real Dagster, a real server, real worker processes.

The example's workers run as users run them, with their own Pump (the default); that Dagster's
own Pumps deliver alone is tested with pump-less workers (``worker_proc.py``) in the other
files.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetKey, DagsterInstance, materialize
from dagster_support import (
    EXAMPLE_DIR,
    ROOT,
    client_url,
    evaluate_sensor,
    load_example,
    pump_threads,
)

from echomq_core import EchoMQ

N = 15  # numbers per queue: 2 * N children
DAGSTER = str(Path(sys.executable).with_name("dagster"))


def expected_summary(n: int) -> dict[str, Any]:
    return {
        "children": 2 * n,
        "totals": {
            "example-cubes": sum(i**3 for i in range(n)),
            "example-squares": sum(i * i for i in range(n)),
        },
        "counts": {"example-cubes": n, "example-squares": n},
    }


def start_example_workers(spawn: Callable[..., Any], url: str, prefix: str) -> None:
    spawn(str(EXAMPLE_DIR / "workers.py"), env={"ECHOMQ_URL": url, "ECHOMQ_PREFIX": prefix})


def test_example_materializes_in_process(
    backend: Any,
    prefix: str,
    spawn: Callable[..., Any],
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = client_url(backend)
    start_example_workers(spawn, url, prefix)
    example = load_example(monkeypatch, url, prefix, N)
    resources = example.defs.resources

    result = materialize(
        [example.measurements, example.summary], resources=resources, instance=instance
    )

    assert result.success
    assert result.output_for_node("summary") == expected_summary(N)
    flow = result.output_for_node("measurements")
    with EchoMQ(url, prefix=prefix) as mq:
        values = mq.children_values(flow.queue, flow.parent_id)
    # every child's result reached the downstream asset: ids f"{parent}.{index}", 2N of them
    assert set(values) == {f"{flow.parent_id}.{i}" for i in range(2 * N)}
    upstream = result.asset_materializations_for_node("measurements")[0].metadata
    assert upstream["N"].value == 2 * N
    assert upstream["echomq/parent_id"].value == flow.parent_id
    assert "processed" not in upstream  # counts are recorded when the flow settles, not here
    observed = result.asset_observations_for_node("summary")[0]
    assert observed.asset_key == AssetKey("measurements")
    counts = {k: observed.metadata[k].value for k in ("N", "processed", "ignored", "failed")}
    assert counts == {"N": 2 * N, "processed": 2 * N, "ignored": 0, "failed": 0}
    with EchoMQ(url, prefix=prefix) as mq:
        assert mq.snapshot(flow.queue, flow.parent_id).parent_state == "closed"
    assert pump_threads() == []

    # The example's sensor watches the flows of measurements. The one above was read (and
    # closed) by summary in the same run: it never requests a run, even on a first tick.
    sensor = example.defs.resolve_sensor_def("reports_released")
    sensor_resources = {"echomq": resources["echomq"]}  # its url is EnvVar("ECHOMQ_URL")

    def tick(cursor: str | None) -> Any:
        return evaluate_sensor(sensor, instance, cursor, sensor_resources)

    first = tick(None)
    assert not first.run_requests
    # A flow nobody read yet: one run, once.
    alone = materialize([example.measurements], resources=resources, instance=instance)
    unread = alone.output_for_node("measurements")
    cursor = first.cursor
    requested: list[str | None] = []
    deadline = time.monotonic() + 60
    while not requested:
        assert time.monotonic() < deadline, "the sensor never requested the unread flow"
        result = tick(cursor)
        cursor = result.cursor
        requested += [r.run_key for r in result.run_requests or []]
    assert requested == [unread.parent_id]
    assert not tick(cursor).run_requests


@pytest.mark.onlystandalone
def test_example_materializes_under_multiprocess_cli(
    backend: Any, prefix: str, spawn: Callable[..., Any], proc_env: dict[str, str], tmp_path: Path
) -> None:
    """``dagster asset materialize`` runs the Definitions' default (multiprocess) executor:
    upstream and downstream in separate step processes, each with its own Pump."""
    url = client_url(backend)
    start_example_workers(spawn, url, prefix)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {
        **proc_env,
        "ECHOMQ_URL": url,
        "ECHOMQ_PREFIX": prefix,
        "ECHOMQ_EXAMPLE_N": str(N),
        "DAGSTER_HOME": str(home),
    }

    def materialize_cli(*args: str) -> str:
        run = subprocess.run(
            [DAGSTER, "asset", "materialize", "-f", str(EXAMPLE_DIR / "definitions.py"), *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-4000:]
        assert "multiprocess executor" in run.stderr
        assert "RUN_SUCCESS" in run.stderr
        return run.stderr

    materialize_cli("--select", "measurements,summary")
    with open(home / "storage" / "summary", "rb") as fh:
        assert pickle.load(fh) == expected_summary(N)

    # A range of two daily partitions in one run (single-run backfill policy): one flow per
    # day, and the downstream gets each day's values.
    log = materialize_cli(
        "--select", "day_numbers,day_summary", "--partition-range", "2026-11-01...2026-11-02"
    )
    with EchoMQ(url, prefix=prefix) as mq:
        closed = mq.list_flows("example-reports", "closed")
    days = sorted(f.parent_id.rsplit(".", 1)[1] for f in closed if ".day_numbers." in f.parent_id)
    assert days == ["2026-11-01", "2026-11-02"]
    assert all(f.total == 2 * N for f in closed)
    for day in (1, 2):
        squares = sum((day + i) ** 2 for i in range(N))
        assert f"'example-squares': {squares}" in log


def test_example_passes_definitions_validate(proc_env: dict[str, str], tmp_path: Path) -> None:
    env = {**proc_env, "DAGSTER_HOME": str(tmp_path)}
    env.pop("ECHOMQ_URL", None)  # loading must not need a server
    run = subprocess.run(
        [DAGSTER, "definitions", "validate", "-f", str(EXAMPLE_DIR / "definitions.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "Validation successful" in run.stderr + run.stdout
    assert os.path.isdir(tmp_path)
