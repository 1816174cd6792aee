"""Under a real ``dagster dev`` (webserver, daemon, code server) on ``run_jobs.py``, with EchoMQ
workers and a long-lived ``echomq pump`` as processes, driven through GraphQL as the UI is:

* a run whose fan-out step fails after adding its flow fails, the daemon's cancel sensor
  cancels the flow, and re-executing the run from failure (a new run id, the root run in the
  ``dagster/root_run_id`` tag) repairs that same flow: completed children do not run again;
  the observation of the flow belongs to the re-executed run;
* a backfill of a range whose step returns its flows under the wrong partitions fails, and
  the step's own refusal cancels both flows; a correct backfill of the range records each
  partition's own N, queue, parent id and flow page, and its observations carry the run id;
* a sensor watching two fixed flows added outside Dagster launches one run for the barrier
  flow and none, on any tick, for the one added without ``barrier=True``;
* a fan-out over an empty plan (``EchoMQResource.fan_out``, ``output_required=False``), in
  step processes of the multiprocess executor: the run succeeds, no flow is added, the
  fan-out asset is not materialized and the asset reading it is skipped;
* the same with ``on_empty="empty"``: the fan-out asset is materialized with N = 0, its reader
  runs on ``{}``; re-executed (a new run id, the root run in ``dagster/root_run_id``), the
  plan keeps the root run's parent id and still adds no flow.

Every process started here is in its own session, killed with its whole group at the end.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dagster_support import ROOT, WORKER_PROC, client_url
from deploy_support import GraphQL, dagster_home, entries, free_port, location_loaded, poll

from echomq_core import Child, EchoMQ
from echomq_core.seeing.urls import flow_page

DEFS = ROOT / "tests" / "dagster" / "run_jobs.py"
REPO = {"repositoryLocationName": "run_jobs.py", "repositoryName": "__repository__"}
BIN = Path(sys.executable).parent

RUN = """query($id: ID!) {
  runOrError(runId: $id) { ... on Run { status tags { key value } stepStats { stepKey status } } }
}"""
LAUNCHED = """__typename
  ... on LaunchRunSuccess { run { runId } }
  ... on PythonError { message }
  ... on InvalidSubsetError { message }
  ... on RunConfigValidationInvalid { errors { message } }"""
EVENTS = """runId stepKey partition
  metadataEntries {
    label
    ... on IntMetadataEntry { intValue }
    ... on TextMetadataEntry { text }
    ... on UrlMetadataEntry { url }
  }"""
ASSET_EVENTS = (
    "query($path: [String!]!) { assetOrError(assetKey: {path: $path}) { ... on Asset { "
    f"assetMaterializations(limit: 20) {{ {EVENTS} }} "
    f"assetObservations(limit: 20) {{ {EVENTS} }} "
    "} } }"
)


@pytest.mark.slow
@pytest.mark.onlystandalone
def test_dagster_dev_reexecution_range_refusal_and_a_fixed_flow_sensor(
    backend: Any,
    prefix: str,
    proc_env: dict[str, str],
    group_spawn: Callable[..., subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    from run_jobs import (
        DASHBOARD,
        DAYS,
        DONE,
        EXTERNAL,
        LATER,
        MODE_TAG,
        PARENT,
        PLAN_TAG,
        children_of,
    )

    url = client_url(backend)
    home = dagster_home(tmp_path)
    marker, record = tmp_path / "fixed", tmp_path / "ran.txt"
    port = free_port()
    env = {
        **proc_env,
        "ECHOMQ_RUNS_URL": url,
        "ECHOMQ_RUNS_PREFIX": prefix,
        "ECHOMQ_RUNS_MARKER": str(marker),
        "ECHOMQ_RUNS_RECORD": str(record),
        "ECHOMQ_SENSOR_INTERVAL": "5",
        "DAGSTER_HOME": str(home),
    }
    logs = [tmp_path / n for n in ("dagster.log", "done.log", "later.log", "pump.log")]
    group_spawn([sys.executable, str(WORKER_PROC), url, prefix, DONE], env, logs[1])
    group_spawn([str(BIN / "echomq"), "pump", "--url", url, "--prefix", prefix], env, logs[3])
    group_spawn([str(BIN / "dagster"), "dev", "-f", str(DEFS), "-p", str(port)], env, logs[0])
    gql = GraphQL(port)
    poll("the webserver and code location", lambda: location_loaded(gql), 180, logs)
    mq = EchoMQ(url, prefix=prefix)
    try:
        # -- the sensor on fixed flows: started first, it ticks while the rest runs ---------
        barrier, worker_run = EXTERNAL
        mq.add_flow(
            PARENT, [Child({"n": 5}, queue=DONE)], parent_id=barrier.parent_id, barrier=True
        )
        mq.add_flow(PARENT, [Child({"n": 6}, queue=DONE)], parent_id=worker_run.parent_id)
        sensor = {**REPO, "sensorName": "external_released"}
        started = gql(
            """mutation($sel: SensorSelector!) {
              startSensor(sensorSelector: $sel) { __typename ... on PythonError { message } }
            }""",
            sel=sensor,
        )["startSensor"]
        assert started["__typename"] == "Sensor", started

        status = functools.partial(run_status, gql)

        # -- a fan-out over an empty plan: nothing added, the reader skipped ---------------
        launched = gql(
            f"""mutation($params: ExecutionParams!) {{
              launchRun(executionParams: $params) {{ {LAUNCHED} }}
            }}""",
            params={
                "selector": {**REPO, "jobName": "plan_job"},
                "executionMetadata": {"tags": [{"key": PLAN_TAG, "value": "0"}]},
            },
        )["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        empty = launched["run"]["runId"]
        poll("the empty plan's run to succeed", lambda: status(empty) == "SUCCESS", 240, logs)
        steps = {s["stepKey"]: s["status"] for s in gql(RUN, id=empty)["runOrError"]["stepStats"]}
        assert steps == {"plan_fan": "SUCCESS", "plan_sum": "SKIPPED"}
        planned = gql(ASSET_EVENTS, path=["plan_fan"])["assetOrError"]  # or: not found
        assert planned.get("assetMaterializations", []) == []
        assert [f for f in mq.list_flows(PARENT) if ".plan_fan" in f.parent_id] == []

        # -- an empty plan whose reader asked for an empty result, then re-executed --------
        def empty_plan_run(field: str, argument: str, params: dict[str, Any]) -> str:
            kind = argument[0].upper() + argument[1:]
            launched = gql(
                f"""mutation($params: {kind}!) {{
                  {field}({argument}: $params) {{ {LAUNCHED} }}
                }}""",
                params=params,
            )[field]
            assert launched["__typename"] == "LaunchRunSuccess", launched
            run_id: str = launched["run"]["runId"]
            poll("the empty plan's run to succeed", lambda: status(run_id) == "SUCCESS", 240, logs)
            stats = gql(RUN, id=run_id)["runOrError"]["stepStats"]
            assert {s["stepKey"]: s["status"] for s in stats} == {
                "plan_empty": "SUCCESS",
                "plan_empty_sum": "SUCCESS",
            }
            return run_id

        first_empty = empty_plan_run(
            "launchRun", "executionParams", {"selector": {**REPO, "jobName": "plan_empty_job"}}
        )
        again_empty = empty_plan_run(
            "launchRunReexecution",
            "reexecutionParams",
            {"parentRunId": first_empty, "strategy": "ALL_STEPS"},
        )
        tags = {t["key"]: t["value"] for t in gql(RUN, id=again_empty)["runOrError"]["tags"]}
        assert tags["dagster/root_run_id"] == first_empty != again_empty
        for run_id in (first_empty, again_empty):
            (made,) = [
                entries(e)
                for e in gql(ASSET_EVENTS, path=["plan_empty"])["assetOrError"][
                    "assetMaterializations"
                ]
                if e["runId"] == run_id
            ]
            assert made == {
                "echomq/empty_plan": PARENT,
                "echomq/empty_parent_id": f"JOB-dagster.{first_empty}.plan_empty",
                "N": 0,
            }
            (read,) = [
                entries(e)
                for e in gql(ASSET_EVENTS, path=["plan_empty_sum"])["assetOrError"][
                    "assetMaterializations"
                ]
                if e["runId"] == run_id
            ]
            assert read == {"sum": 0, "read": 0}
        assert [f for f in mq.list_flows(PARENT) if ".plan_empty" in f.parent_id] == []

        # -- a fan-out step that fails after adding its flow, then re-executed -------------
        later = [sys.executable, str(WORKER_PROC), url, prefix, LATER]
        reexecuted_from_failure(
            gql, mq, logs, marker, record, lambda: group_spawn(later, env, logs[2])
        )

        # -- backfills of a range (one run each: single-run backfill policy) ---------------
        def backfill(tags: list[dict[str, str]]) -> str:
            result = gql(
                """mutation($params: LaunchBackfillParams!) {
                  launchPartitionBackfill(backfillParams: $params) {
                    __typename ... on LaunchBackfillSuccess { backfillId }
                    ... on PythonError { message }
                  }
                }""",
                params={
                    "partitionNames": DAYS,
                    "assetSelection": [{"path": ["day_fan"]}, {"path": ["day_collect"]}],
                    "tags": tags,
                },
            )["launchPartitionBackfill"]
            assert result["__typename"] == "LaunchBackfillSuccess", result
            backfill_id: str = result["backfillId"]
            return backfill_id

        def backfill_run(backfill_id: str, wanted: str) -> str | None:
            data = gql(
                """query($key: String!, $value: String!) {
                  runsOrError(filter: {tags: [{key: $key, value: $value}]}) {
                    ... on Runs { results { runId status } }
                  }
                }""",
                key="dagster/backfill",
                value=backfill_id,
            )
            runs = data["runsOrError"]["results"]
            done = [r["runId"] for r in runs if r["status"] == wanted]
            return done[0] if done else None

        wrong = backfill([{"key": MODE_TAG, "value": "wrong"}])
        wrong_run = poll(
            "the wrong backfill's run to fail", lambda: backfill_run(wrong, "FAILURE"), 300, logs
        )
        refused = [f for f in mq.list_flows(PARENT) if ".day_fan." in f.parent_id]
        assert len(refused) == 2
        for summary in refused:  # cancelled by the step's refusal (not later, by the sensor)
            snap = mq.snapshot(PARENT, summary.parent_id)
            assert (snap.outcome, snap.error) == (
                "cancelled",
                f"dagster run {wrong_run}: the output of step day_fan was refused",
            )

        right = backfill([])
        right_run = poll(
            "the backfill's run to succeed", lambda: backfill_run(right, "SUCCESS"), 300, logs
        )
        day_events = gql(ASSET_EVENTS, path=["day_fan"])["assetOrError"]
        mine = [e for e in day_events["assetMaterializations"] if e["runId"] == right_run]
        assert sorted(e["partition"] for e in mine) == DAYS
        for event in mine:
            meta = entries(event)
            day = event["partition"]
            assert meta["N"] == children_of(day)
            assert meta["echomq/queue"] == PARENT
            assert meta["echomq/parent_id"].endswith(f".day_fan.{day}")
            assert meta["flow_page"] == flow_page(DASHBOARD, PARENT, meta["echomq/parent_id"])
        observed = [e for e in day_events["assetObservations"] if e["runId"] == right_run]
        assert sorted((e["partition"], e["stepKey"]) for e in observed) == [
            (day, "day_collect") for day in DAYS
        ]

        # -- the sensor: one run, for the barrier flow, on every tick since ---------------
        def external_runs() -> list[dict[str, Any]]:
            data = gql(
                """query($key: String!, $value: String!) {
                  runsOrError(filter: {tags: [{key: $key, value: $value}]}) {
                    ... on Runs { results { runId status tags { key value } } }
                  }
                }""",
                key="echomq/queue",
                value=PARENT,
            )
            runs: list[dict[str, Any]] = data["runsOrError"]["results"]
            return runs

        poll(
            "the barrier flow's run to succeed",
            lambda: [r for r in external_runs() if r["status"] == "SUCCESS"],
            240,
            logs,
        )

        def ticks() -> int:
            data = gql(
                """query($sel: SensorSelector!) {
                  sensorOrError(sensorSelector: $sel) {
                    ... on Sensor { sensorState { ticks(limit: 50) { id } } }
                  }
                }""",
                sel=sensor,
            )
            return len(data["sensorOrError"]["sensorState"]["ticks"])

        seen = ticks()
        poll("two more sensor ticks", lambda: ticks() >= seen + 2, 120, logs)
        requested = [
            next(t["value"] for t in r["tags"] if t["key"] == "echomq/parent_id")
            for r in external_runs()
        ]
        assert requested == [barrier.parent_id]  # never the worker-run flow
        assert mq.snapshot(PARENT, barrier.parent_id).parent_state == "closed"
    finally:
        mq.close()


def run_status(gql: GraphQL, run_id: str) -> str:
    found: str = gql(RUN, id=run_id)["runOrError"]["status"]
    return found


def reexecuted_from_failure(
    gql: GraphQL,
    mq: EchoMQ,
    logs: list[Path],
    marker: Path,
    record: Path,
    start_later_worker: Callable[[], Any],
) -> None:
    """``fan_job``'s step fails after adding its flow (no ``marker``); the daemon's cancel
    sensor cancels the flow; with the marker made and a worker for the later children
    started, re-executing the run from failure (a new run id, the root run in its tag)
    repairs that same flow: the completed children do not run again (``record``)."""
    from run_jobs import DONE, LATER, PARENT

    status = functools.partial(run_status, gql)

    launched = gql(
        f"""mutation($params: ExecutionParams!) {{
          launchRun(executionParams: $params) {{ {LAUNCHED} }}
        }}""",
        params={"selector": {**REPO, "jobName": "fan_job"}},
    )["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    first = launched["run"]["runId"]
    poll("the fan-out run to fail", lambda: status(first) == "FAILURE", 240, logs)
    (flow,) = [f for f in mq.list_flows(PARENT) if f.parent_id.endswith(".fan")]
    assert first in flow.parent_id
    poll(
        "the cancel sensor to cancel the failed run's flow",
        lambda: mq.snapshot(PARENT, flow.parent_id).outcome == "cancelled",
        120,
        logs,
    )
    assert mq.snapshot(PARENT, flow.parent_id).processed == 2  # kept through the repair

    marker.touch()
    start_later_worker()
    again = gql(
        f"""mutation($params: ReexecutionParams!) {{
          launchRunReexecution(reexecutionParams: $params) {{ {LAUNCHED} }}
        }}""",
        params={"parentRunId": first, "strategy": "FROM_FAILURE"},
    )["launchRunReexecution"]
    assert again["__typename"] == "LaunchRunSuccess", again
    rerun = again["run"]["runId"]
    poll("the re-executed run to succeed", lambda: status(rerun) == "SUCCESS", 240, logs)
    tags = {t["key"]: t["value"] for t in gql(RUN, id=rerun)["runOrError"]["tags"]}
    assert tags["dagster/root_run_id"] == first != rerun
    assert [f.parent_id for f in mq.list_flows(PARENT) if ".fan" in f.parent_id] == [
        flow.parent_id
    ]  # the same flow, no second one
    snap = mq.snapshot(PARENT, flow.parent_id)
    assert (snap.parent_state, snap.repairs, snap.processed) == ("closed", 1, 4)
    ran = Counter(record.read_text().split("\n")[:-1])
    assert ran == Counter({f"{DONE} 0": 1, f"{DONE} 1": 1, f"{LATER} 2": 1, f"{LATER} 3": 1})
    fan_events = gql(ASSET_EVENTS, path=["fan"])["assetOrError"]
    assert [(o["runId"], o["stepKey"]) for o in fan_events["assetObservations"]] == [
        (rerun, "fan_sum")
    ]
