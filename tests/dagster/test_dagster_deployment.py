"""A real deployment: ``dagster dev`` (webserver + daemon + code server) on the example's
Definitions, EchoMQ workers and a long-lived ``echomq pump`` as processes, driven through the
GraphQL API as a user's UI would be.

* ``imports_released`` (a sensor watching every flow of ``example-imports``) launches exactly
  one run per flow added outside Dagster, and none more on later ticks; each run reads its
  flow (an ``AssetSpec`` naming only the queue; the run's tags name the flow) and closes it.
* A run terminated while it waits for its flow (children in a queue no worker serves) ends
  CANCELED, and its flow is cancelled, naming the run.
* A backfill of two daily partitions of ``day_numbers`` -> ``day_summary`` (single-run backfill
  policy) completes, one flow per partition, each read and closed.

The resource's URL is ``EnvVar("ECHOMQ_URL")``: the code server, the sensor and the runs all
resolve it from their environment. Every process started here is in its own session and is
killed with its whole group at the end, also when the test fails.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dagster_support import EXAMPLE_DIR, client_url
from deploy_support import GraphQL, dagster_home, free_port, location_loaded, logs_mention, poll

from echomq_core import Child, EchoMQ

IMPORTS, SQUARES, CUBES, REPORTS = (
    "example-imports",
    "example-squares",
    "example-cubes",
    "example-reports",
)
LOCATION, REPOSITORY = "definitions.py", "__repository__"
DAYS = ["2026-11-01", "2026-11-02"]
BIN = Path(sys.executable).parent


SENSOR = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}

RUNS = """query($key: String!, $value: String!) {
  runsOrError(filter: {tags: [{key: $key, value: $value}]}) {
    ... on Runs { results { runId status tags { key value } } }
  }
}"""

TICKS = """query($sel: SensorSelector!) {
  sensorOrError(sensorSelector: $sel) {
    ... on Sensor { sensorState { status ticks(limit: 50) { id status } } }
  }
}"""


@pytest.mark.slow
@pytest.mark.onlystandalone
def test_dagster_dev_sensor_and_partitioned_backfill(
    backend: Any,
    prefix: str,
    proc_env: dict[str, str],
    group_spawn: Callable[..., subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    url = client_url(backend)
    home = dagster_home(tmp_path)
    port = free_port()
    env = {
        **proc_env,
        "ECHOMQ_URL": url,
        "ECHOMQ_PREFIX": prefix,
        "ECHOMQ_EXAMPLE_N": "5",
        "ECHOMQ_SENSOR_INTERVAL": "5",
        "DAGSTER_HOME": str(home),
    }
    logs = [tmp_path / "dagster.log", tmp_path / "workers.log", tmp_path / "pump.log"]
    group_spawn([sys.executable, str(EXAMPLE_DIR / "workers.py")], env, logs[1])
    group_spawn([str(BIN / "echomq"), "pump", "--url", url, "--prefix", prefix], env, logs[2])
    group_spawn(
        [str(BIN / "dagster"), "dev", "-f", str(EXAMPLE_DIR / "definitions.py"), "-p", str(port)],
        env,
        logs[0],
    )
    gql = GraphQL(port)
    poll("the webserver and code location", lambda: location_loaded(gql), 180, logs)

    mq = EchoMQ(url, prefix=prefix)
    try:
        sensor_and_terminate(gql, mq, logs)
        backfill(gql, mq, logs, DAYS)
    finally:
        mq.close()


def sensor_and_terminate(gql: GraphQL, mq: EchoMQ, logs: list[Path]) -> None:
    """The sensor launches exactly one run per external flow; a run terminated while it waits
    ends CANCELED and cancels its flow."""
    flows = [
        mq.add_flow(
            IMPORTS,
            [Child({"n": i}, queue=q) for q in (SQUARES, CUBES) for i in range(4)],
            parent_id=f"JOB-import-{k}",
            barrier=True,
        )
        for k in range(2)
    ]
    sensor = {**SENSOR, "sensorName": "imports_released"}
    started = gql(
        """mutation($sel: SensorSelector!) {
          startSensor(sensorSelector: $sel) {
            __typename ... on Sensor { sensorState { status } }
            ... on PythonError { message }
          }
        }""",
        sel=sensor,
    )["startSensor"]
    assert started["__typename"] == "Sensor", started

    def import_runs() -> list[dict[str, Any]]:
        data = gql(RUNS, key="echomq/queue", value=IMPORTS)
        runs: list[dict[str, Any]] = data["runsOrError"]["results"]
        return runs

    def both_succeeded() -> list[dict[str, Any]] | None:
        runs = import_runs()
        failed = [r for r in runs if r["status"] == "FAILURE"]
        assert not failed, failed
        done = [r for r in runs if r["status"] == "SUCCESS"]
        return runs if len(done) >= 2 else None

    poll("a successful run per external flow", both_succeeded, 240, logs)

    # A flow whose children nobody runs, and a run of import_job for it (tagged as the
    # sensor tags its runs): the run waits; terminating it cancels the flow.
    stuck = mq.add_flow(
        IMPORTS,
        [Child({"n": 1}, queue="example-nobody")],
        parent_id="JOB-import-stuck",
        barrier=True,
    )
    launched_run = gql(
        """mutation($params: ExecutionParams!) {
          launchRun(executionParams: $params) {
            __typename ... on LaunchRunSuccess { run { runId } }
            ... on PythonError { message }
          }
        }""",
        params={
            "selector": {**SENSOR, "jobName": "import_job"},
            "executionMetadata": {
                "tags": [
                    {"key": "echomq/queue", "value": IMPORTS},
                    {"key": "echomq/parent_id", "value": stuck.parent_id},
                ]
            },
        },
    )["launchRun"]
    assert launched_run["__typename"] == "LaunchRunSuccess", launched_run

    def stuck_run() -> str | None:
        for run in import_runs():
            tags = {t["key"]: t["value"] for t in run["tags"]}
            if tags["echomq/parent_id"] == stuck.parent_id and run["status"] == "STARTED":
                run_id: str = run["runId"]
                return run_id
        return None

    run_id = poll("the run of the stuck flow to start", stuck_run, 240, logs)
    poll(
        "the run to wait for its flow",
        lambda: (
            mq.child_queues(stuck.queue, stuck.parent_id)
            and logs_mention(gql, run_id, "EchoMQ flow")
        ),
        120,
        logs,
    )
    terminated = gql(
        """mutation($id: String!) {
          terminateRun(runId: $id) { __typename ... on PythonError { message } }
        }""",
        id=run_id,
    )["terminateRun"]
    assert terminated["__typename"] == "TerminateRunSuccess", terminated

    def canceled() -> bool:
        runs = [r for r in import_runs() if r["runId"] == run_id]
        return runs[0]["status"] == "CANCELED"

    poll("the terminated run to end CANCELED", canceled, 120, logs)
    snap = poll(
        "the flow of the terminated run to be cancelled",
        lambda: (s := mq.snapshot(stuck.queue, stuck.parent_id)).outcome == "cancelled" and s,
        60,
        logs,
    )
    assert "terminated" in snap.error and run_id in snap.error

    def ticks() -> list[dict[str, Any]]:
        state = gql(TICKS, sel=sensor)["sensorOrError"]["sensorState"]
        found: list[dict[str, Any]] = state["ticks"]
        return found

    seen = len(ticks())
    poll("two more sensor ticks", lambda: len(ticks()) >= seen + 2, 120, logs)
    runs = import_runs()
    by_flow = sorted(
        next(t["value"] for t in r["tags"] if t["key"] == "echomq/parent_id") for r in runs
    )
    # one run per external flow (the sensor launched two; the stuck one was launched here)
    assert by_flow == sorted([*(f.parent_id for f in flows), stuck.parent_id])
    for flow in flows:
        assert mq.snapshot(flow.queue, flow.parent_id).parent_state == "closed"


def backfill(
    gql: GraphQL,
    mq: EchoMQ,
    logs: list[Path],
    days: list[str],
    during: Callable[[str], None] | None = None,
) -> None:
    """A backfill of ``days`` (one run: single-run backfill policy) completes, one flow per
    day, each read and closed; ``during(backfill id)`` runs once it is launched."""
    launched = gql(
        """mutation($params: LaunchBackfillParams!) {
          launchPartitionBackfill(backfillParams: $params) {
            __typename ... on LaunchBackfillSuccess { backfillId }
            ... on PythonError { message }
          }
        }""",
        params={
            "partitionNames": days,
            "assetSelection": [{"path": ["day_numbers"]}, {"path": ["day_summary"]}],
        },
    )["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    if during is not None:
        during(launched["backfillId"])

    def backfill_done() -> str | None:
        data = gql(
            """query($id: String!) {
              partitionBackfillOrError(backfillId: $id) {
                ... on PartitionBackfill { status }
              }
            }""",
            id=launched["backfillId"],
        )
        status: str = data["partitionBackfillOrError"]["status"]
        assert status not in ("FAILED", "COMPLETED_FAILED", "CANCELED"), status
        return status if status in ("COMPLETED", "COMPLETED_SUCCESS") else None

    poll("the backfill", backfill_done, 300, logs)
    day_flows = [f for f in mq.list_flows(REPORTS, "closed") if ".day_numbers." in f.parent_id]
    # one flow per day, none added twice (a second run would add its own, run-scoped ids)
    assert sorted(f.parent_id.rsplit(".", 1)[1] for f in day_flows) == days
    assert {f.total for f in day_flows} == {10}
    assert mq.list_flows(REPORTS, "held") == []
