"""Under a real ``dagster dev`` (webserver, daemon, code server) on ``check_defs.py``, with an
EchoMQ worker and a long-lived ``echomq pump`` as processes, driven through GraphQL as the UI
is: a run of the fan-out asset's job runs its ``echomq_flow_check``, whose evaluation - failed
with severity WARN, one of four children ignored, that child named in its metadata - is what
the UI's check page shows; the reader downstream still runs (the check is not blocking).

Every process started here is in its own session, killed with its whole group at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dagster_support import ROOT, WORKER_PROC, client_url
from deploy_support import GraphQL, dagster_home, free_port, location_loaded, poll

DEFS = ROOT / "tests" / "dagster" / "check_defs.py"
REPO = {"repositoryLocationName": "check_defs.py", "repositoryName": "__repository__"}
BIN = Path(sys.executable).parent

CHECKS = """query($path: [String!]!) {
  assetCheckExecutions(assetKey: {path: $path}, checkName: "echomq_children", limit: 5) {
    runId status
    evaluation {
      success severity description
      metadataEntries {
        label
        ... on IntMetadataEntry { intValue }
        ... on FloatMetadataEntry { floatValue }
        ... on JsonMetadataEntry { jsonString }
        ... on TextMetadataEntry { text }
      }
    }
  }
}"""


@pytest.mark.slow
@pytest.mark.onlystandalone
def test_dagster_dev_runs_the_flow_check_with_the_asset(
    backend: Any,
    prefix: str,
    proc_env: dict[str, str],
    group_spawn: Callable[..., subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    from check_defs import CHILD

    url = client_url(backend)
    home = dagster_home(tmp_path)
    port = free_port()
    env = {**proc_env, "ECHOMQ_CK_URL": url, "ECHOMQ_CK_PREFIX": prefix, "DAGSTER_HOME": str(home)}
    logs = [tmp_path / n for n in ("dagster.log", "worker.log", "pump.log")]
    group_spawn([sys.executable, str(WORKER_PROC), url, prefix, CHILD], env, logs[1])
    group_spawn([str(BIN / "echomq"), "pump", "--url", url, "--prefix", prefix], env, logs[2])
    group_spawn([str(BIN / "dagster"), "dev", "-f", str(DEFS), "-p", str(port)], env, logs[0])
    gql = GraphQL(port)
    poll("the webserver and code location", lambda: location_loaded(gql), 180, logs)

    launched = gql(
        """mutation($params: ExecutionParams!) {
          launchRun(executionParams: $params) {
            __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
          }
        }""",
        params={"selector": {**REPO, "jobName": "ckd_job"}},
    )["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]

    def finished() -> str | None:
        run = gql(
            "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }", id=run_id
        )["runOrError"]
        return run["status"] if run["status"] in ("SUCCESS", "FAILURE", "CANCELED") else None

    assert poll("the run to end", finished, 180, logs) == "SUCCESS"
    executions = gql(CHECKS, path=["ckd_fan"])["assetCheckExecutions"]
    (execution,) = [e for e in executions if e["runId"] == run_id]
    evaluation = execution["evaluation"]
    assert execution["status"] == "FAILED"
    assert (evaluation["success"], evaluation["severity"]) == (False, "WARN")
    meta: dict[str, Any] = {}
    for entry in evaluation["metadataEntries"]:
        values = [v for k, v in entry.items() if k != "label"]
        meta[entry["label"]] = values[0] if values else None
    assert (meta["N"], meta["ignored"], meta["failed"], meta["bad_share"]) == (4, 1, 0, 0.25)
    ignored = json.loads(meta["ignored_children"])
    assert [k.rsplit(".", 1)[1] for k in ignored] == ["3"]
    assert "1 of 4 children failed or were ignored" in evaluation["description"]
