"""A ``FlowFollow`` input under a real ``dagster dev`` (webserver, daemon, code server) on
``stream_job.py``, launched through GraphQL as the UI does, with an EchoMQ worker process (no
Pump: the input's pass runs one): each step runs in a process of its own (the default
executor), the fan-out step ends once the flow is added, and the follower's step - started
after it - has its first value before the last child, gated on that value, completes.

Every process started here is in its own session, killed with its whole group at the end.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dagster_support import ROOT, WORKER_PROC, client_url
from deploy_support import GraphQL, dagster_home, free_port, location_loaded, poll

from echomq_core import EchoMQ

DEFS = ROOT / "tests" / "dagster" / "stream_job.py"
REPO = {"repositoryLocationName": "stream_job.py", "repositoryName": "__repository__"}
BIN = Path(sys.executable).parent


@pytest.mark.slow
@pytest.mark.onlystandalone
def test_a_followed_input_streams_under_dagster_dev(
    backend: Any,
    prefix: str,
    proc_env: dict[str, str],
    group_spawn: Callable[..., Any],
    tmp_path: Path,
) -> None:
    from stream_job import CHILD, PARENT, N

    url = client_url(backend)
    port = free_port()
    env = {
        **proc_env,
        "ECHOMQ_SJOB_URL": url,
        "ECHOMQ_SJOB_PREFIX": prefix,
        "ECHOMQ_SJOB_DIR": str(tmp_path),
        "DAGSTER_HOME": str(dagster_home(tmp_path)),
    }
    logs = [tmp_path / n for n in ("dagster.log", "worker.log")]
    group_spawn([str(BIN / "dagster"), "dev", "-f", str(DEFS), "-p", str(port)], env, logs[0])
    group_spawn([sys.executable, str(WORKER_PROC), url, prefix, CHILD], env, logs[1])
    gql = GraphQL(port)
    poll("the webserver and code location", lambda: location_loaded(gql), 180, logs)
    launched = gql(
        """mutation($params: ExecutionParams!) {
          launchRun(executionParams: $params) {
            __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
          }
        }""",
        params={"selector": {**REPO, "jobName": "stream_job"}},
    )["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]
    query = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"

    def finished() -> str | None:
        status: str = gql(query, id=run_id)["runOrError"]["status"]
        return status if status in ("SUCCESS", "FAILURE", "CANCELED") else None

    assert poll("the run to finish", finished, 300, logs) == "SUCCESS"
    records = [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]
    with EchoMQ(url, prefix=prefix) as mq:
        (flow,) = mq.list_flows(PARENT)
        ids = [f"{flow.parent_id}.{i}" for i in range(N)]
        assert sorted(r["child"] for r in records) == ids and records[-1]["child"] == ids[-1]
        last = mq.get_job(CHILD, ids[-1]).finished_ms or 0
        assert int(records[0]["at"] * 1000) <= last  # the first value came first (whole ms)
        assert mq.snapshot(PARENT, flow.parent_id).parent_state == "closed"
