"""Declarative automation on a flow's release, under a real ``dagster dev`` (webserver, daemon,
code server) on ``automation_defs.py``, with an EchoMQ worker process and the daemon's own
sensors (the release sensor and the automation condition sensor, both running by default):

* the fan-out asset is materialized when its flow is added; while the children are held at a
  gate, the release sensor ticks and sees the flow waiting, the automation sensor ticks, and
  the downstream is *not* requested (an ``eager()`` downstream would be, and would block);
* once the gate opens and the flow is released, the release sensor reports the marker's
  materialization (the flow's queue, parent id and counts), and the automation sensor
  requests the downstream, which reads all N results (as a polars frame, built by the IO
  manager in the run's step process): one run, after the release;
* a second run of the fan-out (a new flow) is followed the same way: one more marker, one more
  downstream run.

Every process started here is in its own session, killed with its whole group at the end.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dagster_support import ROOT, WORKER_PROC, client_url
from deploy_support import GraphQL, dagster_home, entries, free_port, location_loaded, poll

DEFS = ROOT / "tests" / "dagster" / "automation_defs.py"
REPO = {"repositoryLocationName": "automation_defs.py", "repositoryName": "__repository__"}
BIN = Path(sys.executable).parent
N = 40
SUM = sum(i * i for i in range(N))

RUNS = """{ runsOrError { ... on Runs { results { runId status startTime
  assetSelection { path } } } } }"""
RUN = """query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"""
EVENTS = """query($path: [String!]!) { assetOrError(assetKey: {path: $path}) { ... on Asset {
  assetMaterializations(limit: 20) { runId timestamp
    metadataEntries { label ... on IntMetadataEntry { intValue } ... on TextMetadataEntry { text } }
  } } } }"""
TICKS = """query($sel: SensorSelector!) { sensorOrError(sensorSelector: $sel) { ... on Sensor {
  sensorState { ticks(limit: 50) { timestamp status skipReason } } } } }"""


@pytest.mark.slow
@pytest.mark.onlystandalone
def test_the_downstream_runs_on_the_release_not_on_the_add(
    backend: Any,
    prefix: str,
    proc_env: dict[str, str],
    group_spawn: Callable[..., subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    from automation_defs import CHILD

    url = client_url(backend)
    home = dagster_home(tmp_path)
    gate = tmp_path / "gate"
    env = {
        **proc_env,
        "ECHOMQ_AUTO_URL": url,
        "ECHOMQ_AUTO_PREFIX": prefix,
        "ECHOMQ_AUTO_GATE": str(gate),
        "ECHOMQ_SENSOR_INTERVAL": "5",
        "DAGSTER_HOME": str(home),
    }
    logs = [tmp_path / n for n in ("dagster.log", "worker.log")]
    port = free_port()
    group_spawn([sys.executable, str(WORKER_PROC), url, prefix, CHILD], env, logs[1])
    group_spawn([str(BIN / "dagster"), "dev", "-f", str(DEFS), "-p", str(port)], env, logs[0])
    gql = GraphQL(port)
    poll("the webserver and code location", lambda: location_loaded(gql), 180, logs)

    def runs(asset: str) -> list[dict[str, Any]]:
        found = gql(RUNS)["runsOrError"]["results"]
        return [r for r in found if [asset] in [a["path"] for a in r["assetSelection"] or []]]

    def materializations(asset: str) -> list[dict[str, Any]]:
        got = gql(EVENTS, path=[asset])["assetOrError"]
        return list(got.get("assetMaterializations") or [])

    def ticks(sensor: str, after: float) -> list[dict[str, Any]]:
        got = gql(TICKS, sel={**REPO, "sensorName": sensor})["sensorOrError"]
        return [t for t in got["sensorState"]["ticks"] if t["timestamp"] > after]

    def seconds(timestamp: str) -> float:  # an event's timestamp is in ms, a tick's in s
        return float(timestamp) / 1000 if float(timestamp) > 1e11 else float(timestamp)

    def status(run_id: str) -> str:
        found: str = gql(RUN, id=run_id)["runOrError"]["status"]
        return found

    def crawl() -> str:
        launched = gql(
            """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
              __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
            } }""",
            params={"selector": {**REPO, "jobName": "crawl_job"}},
        )["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id: str = launched["run"]["runId"]
        poll("the fan-out run to succeed", lambda: status(run_id) == "SUCCESS", 240, logs)
        return run_id

    # -- the flow added, its children held at the gate ----------------------------------
    first = crawl()
    added_at = seconds(max(m["timestamp"] for m in materializations("crawl")))
    # the gate of the negative: both sensors have evaluated (twice each) since the add, and
    # the release sensor saw the flow waiting
    poll(
        "the release sensor to see the flow waiting, twice",
        lambda: (
            sum("(1 waiting)" in (t["skipReason"] or "") for t in ticks("crawl_release", added_at))
            >= 2
        ),
        180,
        logs,
    )
    poll(
        "the automation sensor to evaluate twice since the add",
        lambda: len(ticks("echomq_automation", added_at)) >= 2,
        180,
        logs,
    )
    assert runs("crawl_summary") == []  # not requested on the add
    assert materializations("crawl_released") == []

    # -- released: the marker, then one downstream run reading all N -------------------
    gate.write_text("open")
    (marker,) = poll("the release marker", lambda: materializations("crawl_released"), 180, logs)
    meta = entries(marker)
    assert meta["echomq/queue"] == "auto-parent"
    assert meta["echomq/parent_id"] == f"JOB-dagster.{first}.crawl"
    assert (meta["echomq/total"], meta["echomq/processed"], meta["echomq/failed"]) == (N, N, 0)
    (summary,) = poll(
        "the downstream's materialization", lambda: materializations("crawl_summary"), 240, logs
    )
    assert entries(summary) == {"children": N, "sum": SUM}
    (summary_run,) = runs("crawl_summary")
    poll("the downstream run to end", lambda: status(summary_run["runId"]) == "SUCCESS", 120, logs)
    assert float(summary_run["startTime"]) * 1000 >= float(marker["timestamp"]) - 1000

    # -- a second fan-out run: one more marker, one more downstream run ----------------
    # Dagster 1.11 loses a release that shares an evaluation with the downstream's previous
    # materialization (test_dagster_automation.py; 1.13 orders them): the second flow is added
    # once the automation sensor has evaluated twice since that materialization
    summarized_at = seconds(summary["timestamp"])
    poll(
        "the automation sensor to evaluate twice after the first downstream run",
        lambda: len(ticks("echomq_automation", summarized_at)) >= 2,
        180,
        logs,
    )
    second = crawl()
    poll("the second marker", lambda: len(materializations("crawl_released")) == 2, 180, logs)
    poll(
        "the second downstream run",
        lambda: [
            m for m in materializations("crawl_summary") if m["runId"] != summary_run["runId"]
        ],
        240,
        logs,
    )
    latest = max(materializations("crawl_released"), key=lambda m: float(m["timestamp"]))
    assert entries(latest)["echomq/parent_id"] == f"JOB-dagster.{second}.crawl"
    # each release requested exactly one downstream run, after the automation sensor moved on
    done_at = max(float(m["timestamp"]) for m in materializations("crawl_summary")) / 1000
    poll(
        "the automation sensor to evaluate twice after the second downstream run",
        lambda: len(ticks("echomq_automation", done_at)) >= 2,
        180,
        logs,
    )
    assert len(runs("crawl_summary")) == 2
