"""What Dagster's run machinery does to flows: a re-execution (a new run id, the root run in
the ``dagster/root_run_id`` tag) repairs the flow its failed fan-out step added; a range
step's refused output cancels what the step added; each partition's materialization and
observation names its own flow and belongs to its run. Jobs of ``run_jobs.py`` run through
``execute_job``, the range job in real step processes; real server and workers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    ReexecutionOptions,
    execute_job,
    reconstructable,
)
from dagster_echomq.handles import read_handle
from dagster_support import client_url, run_the_failure_sensor

from echomq_core import EchoMQ
from echomq_core.seeing.urls import flow_page

RANGE = {
    "dagster/asset_partition_range_start": "2026-11-01",
    "dagster/asset_partition_range_end": "2026-11-02",
}


@pytest.fixture
def job_env(
    backend: Any, prefix: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> dict[str, Path]:
    """The jobs' settings (read again in every step process), and the marker and record files."""
    paths = {"marker": tmp_path / "fixed", "record": tmp_path / "ran.txt"}
    monkeypatch.setenv("ECHOMQ_RUNS_URL", client_url(backend))
    monkeypatch.setenv("ECHOMQ_RUNS_PREFIX", prefix)
    monkeypatch.setenv("ECHOMQ_RUNS_MARKER", str(paths["marker"]))
    monkeypatch.setenv("ECHOMQ_RUNS_RECORD", str(paths["record"]))
    return paths


@pytest.mark.onlystandalone
def test_reexecuting_a_run_whose_fan_out_failed_repairs_its_flow(
    backend: Any,
    prefix: str,
    workers: Callable[..., Any],
    instance: DagsterInstance,
    job_env: dict[str, Path],
) -> None:
    """The fan-out step adds its flow and fails before storing it; the cancel sensor cancels
    it (two children done, two never started). Re-executing the run from failure re-runs the
    step under a new run id: it re-adds the same flow (keyed on the root run), which repairs
    it - the cancelled children run, the completed ones do not run again."""
    from run_jobs import DONE, LATER, PARENT, fan_job

    url = client_url(backend)
    workers(url, prefix, DONE)
    first = execute_job(reconstructable(fan_job), instance, raise_on_error=False)
    assert not first.success
    (failure,) = [e for e in first.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    assert failure.step_key == "fan"
    with EchoMQ(url, prefix=prefix) as mq:
        (added,) = mq.list_flows(PARENT)
        assert first.run_id in added.parent_id
        assert mq.snapshot(PARENT, added.parent_id).processed == 2  # the step waited for them
        run_the_failure_sensor(first, instance, url, prefix)
        assert mq.snapshot(PARENT, added.parent_id).outcome == "cancelled"

        job_env["marker"].touch()  # what made the step fail is fixed
        workers(url, prefix, LATER)
        options = ReexecutionOptions.from_failure(first.run_id, instance)
        again = execute_job(reconstructable(fan_job), instance, reexecution_options=options)
        assert again.success
        rerun = instance.get_run_by_id(again.run_id)
        # execute_job records the root run in the run's field; a launch through the webserver
        # or the daemon also in the dagster/root_run_id tag (test_dagster_deployment.py)
        assert rerun is not None and rerun.root_run_id == first.run_id
        assert again.run_id != first.run_id
        (summed,) = again.asset_materializations_for_node("fan_sum")
        assert summed.metadata["sum"].value == sum(i * i for i in range(4))
        assert [f.parent_id for f in mq.list_flows(PARENT)] == [added.parent_id]  # no new flow
        snap = mq.snapshot(PARENT, added.parent_id)
        assert (snap.parent_state, snap.repairs, snap.processed) == ("closed", 1, 4)
    ran = Counter(job_env["record"].read_text().split("\n")[:-1])
    assert ran == Counter({f"{DONE} 0": 1, f"{DONE} 1": 1, f"{LATER} 2": 1, f"{LATER} 3": 1})


@pytest.mark.onlystandalone
def test_a_range_output_under_the_wrong_partitions_cancels_what_its_step_added(
    backend: Any,
    prefix: str,
    instance: DagsterInstance,
    job_env: dict[str, Path],
) -> None:
    """The step adds a flow per partition, then returns them under the wrong partitions: the
    output is refused (InvalidInput, naming the partitions), no handle is written, and both
    flows - one of them not even in the output - are cancelled: no child of them starts."""
    from run_jobs import DONE, MODE_TAG, PARENT, day_job

    wrong = {**RANGE, MODE_TAG: "wrong"}
    result = execute_job(reconstructable(day_job), instance, tags=wrong, raise_on_error=False)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    assert failure.step_key == "day_fan"
    error = failure.step_failure_data.error
    assert error.cause.cls_name == "InvalidInput"
    assert "['2026-10-31', '2026-11-01'], but this step covers" in error.cause.message
    assert "the 2 flow(s) this step added were cancelled" in error.cause.message
    url = client_url(backend)
    with EchoMQ(url, prefix=prefix) as mq:
        flows = mq.list_flows(PARENT)
        assert len(flows) == 2
        for flow in flows:
            snap = mq.snapshot(PARENT, flow.parent_id)
            assert snap.outcome == "cancelled"
            assert (
                snap.error == f"dagster run {result.run_id}: the output of step day_fan was refused"
            )
        assert mq.queue(DONE).stats()["pending"] == 0  # nothing of them will run
        assert read_handle(mq, ["day_fan", "2026-11-01"]) is None


@pytest.mark.onlystandalone
def test_each_partition_of_a_range_names_its_own_flow_and_observations_belong_to_the_run(
    backend: Any,
    prefix: str,
    workers: Callable[..., Any],
    instance: DagsterInstance,
    job_env: dict[str, Path],
) -> None:
    """A range of two partitions in one run: each partition's materialization records its
    flow's N, queue, parent id and dashboard page, and the downstream's observation of each
    partition is an event of that run and step (the UI shows it with the run)."""
    from run_jobs import DASHBOARD, DAYS, DONE, PARENT, children_of, day_job

    url = client_url(backend)
    workers(url, prefix, DONE)
    result = execute_job(reconstructable(day_job), instance, tags=RANGE)
    assert result.success
    run_id = result.run_id
    # (the instance is the session's: other tests' runs materialize day_fan too)
    records = instance.fetch_materializations(AssetKey("day_fan"), limit=50).records
    materialized = [r for r in records if r.run_id == run_id]
    assert sorted(r.partition_key for r in materialized) == DAYS
    for record in materialized:
        day, event = record.partition_key, record.asset_materialization
        assert event is not None and day is not None
        meta = {k: v.value for k, v in event.metadata.items()}
        assert meta["N"] == children_of(day)  # that partition's flow, not the range's total
        assert meta["echomq/queue"] == PARENT
        assert meta["echomq/parent_id"].endswith(f".day_fan.{day}")
        assert meta["flow_page"] == flow_page(DASHBOARD, PARENT, meta["echomq/parent_id"])
    records = instance.fetch_observations(AssetKey("day_fan"), limit=50).records
    observed = [r for r in records if r.run_id == run_id]  # on today's code: none (runless)
    assert sorted(r.partition_key for r in observed) == DAYS
    for record in observed:
        assert record.event_log_entry.step_key == "day_collect"
        assert record.asset_observation is not None
        assert record.asset_observation.metadata["processed"].value == children_of(
            str(record.partition_key)
        )
    with EchoMQ(url, prefix=prefix) as mq:
        assert {mq.snapshot(PARENT, f.parent_id).parent_state for f in mq.list_flows(PARENT)} == {
            "closed"
        }
