"""Results that scale, on request as values, matched to inputs; repair and replace on re-run.

Real Airflow (``dag.test()``), a real server, real worker processes.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from echomq_provider.errors import FlowNotReleased
from echomq_provider.flow_specs import parent_id_for
from echomq_provider.hooks.echomq import EchoMQHook
from echomq_provider.results import flow_frame, flow_results, flow_slices
from echomq_provider.sensors.echo_flow import EchoFlowSensor

from echomq_core import Child, EchoMQ, InvalidArgument, JobNotFound, ParentFailed, Pump

from .helpers import run_dag

pytestmark = pytest.mark.onlystandalone

KEYS = ["2026-01-01", "s3://bucket/a b.csv", "ümlaut~"]


def test_values_on_request_are_mapped_over(
    airflow_db: Path,
    echomq_conn: str,
    start_worker: Any,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    start_worker()
    with caplog.at_level(logging.INFO):
        run = run_dag(airflow_db, "echomq_values")
    states = {task_id: run.state_of(task_id) for task_id in run.tasks}
    assert states["wait"] == "success" and states["wait_keyed"] == "success"
    assert states["double"] == "success"
    # in spec order, so .expand() maps them one task per child, inputs matched by position
    assert run.xcom("wait") == [{"n": n, "value": n * n} for n in range(1, 6)]
    assert run.mapped_xcoms("double") == [2 * n * n for n in range(1, 6)]
    assert run.xcom("wait", "flow")["processed"] == 5  # the summary, beside the values
    assert run.xcom("wait_keyed") == {
        key: {"n": n, "value": n * n} for n, key in enumerate(KEYS, start=1)
    }
    # over the cap: a clear, typed error at the first poke, not a 5-value XCom
    assert states["wait_capped"] == "failed"
    logged = capfd.readouterr().out + caplog.text  # the task's exception, through structlog
    assert "TooManyValues: flow " in logged
    assert "has 5 children, over max_values=3" in logged


def test_too_many_values_fail_the_reader_and_leave_the_flow(
    airflow_db: Path,
    echomq_conn: str,
    standalone_server: Any,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A reader's misconfiguration never cancels the work: the sensor fails with
    TooManyValues and its flow goes on; where the count is known before the add (the waiting
    operator's plan) nothing is added."""
    with caplog.at_level(logging.INFO):
        run = run_dag(airflow_db, "echomq_too_many")
    assert {t: run.state_of(t) for t in run.tasks} == {
        "fan_out": "success",
        "wait_capped": "failed",
        "planned": "failed",
    }
    logged = capfd.readouterr().out + caplog.text
    parent = parent_id_for("echomq_too_many", run.run_id, "fan_out")
    assert f"TooManyValues: flow {parent} has 3 children, over max_values=2" in logged
    planned = parent_id_for("echomq_too_many", run.run_id, "planned")
    assert f"TooManyValues: flow {planned} has 3 children, over max_values=2" in logged
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        assert mq.snapshot("test.capped", planned).outcome == "missing"  # nothing added
        snap = mq.snapshot("test.capped", parent)
        assert (snap.parent_state, snap.dependencies) == ("held", 3)  # not cancelled
        work = mq.queue("test.capped")
        for job in work.claim(10):  # the work goes on ...
            work.complete(job, job.payload["n"] * 10)
        # ... and a reader that takes three values reads them
        sensor = EchoFlowSensor(
            task_id="fixed",
            parent_queue="test.capped",
            parent_id=parent,
            return_values=True,
            max_values=3,
        )
        poked = sensor.poke({"ti": _PushedXCom()})  # type: ignore[typeddict-item]
        sensor._close()
    assert poked.is_done and poked.xcom_value == [0, 10, 20]


def test_a_literal_plan_over_max_values_is_refused_when_parsed(airflow_db: Path) -> None:
    from echomq_provider.errors import TooManyValues
    from echomq_provider.operators.echo_flow import EchoFlowOperator

    args: dict[str, Any] = {"parent_queue": "q", "children": [1, 2, 3], "max_values": 2}
    with pytest.raises(TooManyValues, match="fan_out: the plan has 3 children, over max_values=2"):
        EchoFlowOperator(task_id="fan_out", wait_for_completion=True, return_values=True, **args)
    EchoFlowOperator(task_id="no_values", wait_for_completion=True, **args)  # the summary: fine
    EchoFlowOperator(task_id="no_wait", return_values=True, **args)  # returns the reference


class _PushedXCom:
    """A task instance stand-in for a direct poke with ``return_values``: the summary it pushes
    beside the values is kept."""

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def test_summary_xcom_stays_small_and_results_read_in_pages(
    airflow_db: Path, echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    """The default sensor output is the same few hundred bytes at 3 and at 20,000 children;
    ``flow_results`` reads all of them in pages, matched to their index."""
    sizes = {}
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        for n in (3, 20_000):
            ref = mq.add_flow("sum", [Child(i) for i in range(n)], barrier=True)
            work = mq.queue("sum")  # same queue: settled without a Pump
            while jobs := work.claim(1000):
                for job in jobs:
                    work.complete(job, {"square": job.payload * job.payload})
            sensor = EchoFlowSensor(
                task_id=f"wait_{n}", parent_queue="sum", parent_id=ref.parent_id
            )
            poked = sensor.poke({"ti": _NoXCom()})  # type: ignore[typeddict-item]
            sensor._close()
            assert poked.is_done
            summary = poked.xcom_value
            sizes[n] = len(json.dumps(summary))
            assert (summary["state"], summary["total"], summary["processed"]) == ("closed", n, n)
            assert "children_values" not in summary
            if n == 20_000:
                seen = Counter()
                total = 0
                for index, value in flow_results(summary, page=500):
                    seen[index] += 1
                    total += value["square"]
                    assert value["square"] == index * index  # matched by index
                assert len(seen) == n and set(seen.values()) == {1}
                assert total == sum(i * i for i in range(n))
    assert sizes[20_000] - sizes[3] < 40  # only the digits of the counts differ
    assert sizes[20_000] < 600


def test_flow_results_reads_20000_values_in_a_few_round_trips(
    echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    """Counted by the server (INFO commandstats): 20,000 results in 4 HSCAN pages, each value
    matched to its spec's index."""
    import redis

    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        ref = mq.add_flow("few", [Child(i) for i in range(20_000)], barrier=True)
        work = mq.queue("few")  # same queue: settled without a Pump
        while jobs := work.claim(1000):
            work.complete_many([(job, job.payload * 2) for job in jobs])
    raw = redis.Redis.from_url(standalone_server.url)

    def hscans() -> int:
        return int(raw.info("commandstats").get("cmdstat_hscan", {}).get("calls", 0))

    before = hscans()
    values = dict(flow_results(ref.to_dict()))
    assert values == {i: 2 * i for i in range(20_000)}
    assert hscans() - before <= 5
    raw.close()


class _NoXCom:
    """A task instance stand-in for a direct poke: the default mode pushes no XCom."""

    def xcom_push(self, **_: Any) -> None:
        raise AssertionError("the default mode must not push XCom")


def test_iter_results_refuses_what_is_not_readable(
    echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    hook = EchoMQHook()
    mq = hook.get_conn()
    held = mq.add_flow("rd", [Child(1, queue="rd.work")], barrier=True)
    with pytest.raises(FlowNotReleased, match="1 of 1 children outstanding"):
        list(hook.iter_results(held.to_dict()))
    failing = mq.add_flow("rd", [Child(1, queue="rd.work2")], barrier=True)
    work = mq.queue("rd.work2")
    [job] = work.claim(1)
    work.fail(job, "boom", retry=False)
    with Pump(mq, queues=["rd.work2"]), pytest.raises(ParentFailed):  # carried across queues
        mq.wait(failing.queue, failing.parent_id, timeout=30)
    with pytest.raises(ParentFailed, match="boom"):
        list(hook.iter_results(failing.to_dict()))
    with pytest.raises(JobNotFound, match="no flow 'JOB-nothing' in queue 'rd': never added"):
        list(hook.iter_results({"queue": "rd", "parent_id": "JOB-nothing"}))
    hook.close()


def test_rerun_repairs_a_failed_flow_and_replaces_a_changed_plan(
    airflow_db: Path,
    echomq_conn: str,
    start_worker: Any,
    standalone_server: Any,
    prefix: str,
    tmp_path: Path,
    proc_env: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    runs = tmp_path / "runs.jsonl"
    proc_env.update(ECHOMQ_TEST_RUNS=str(runs), ECHOMQ_TEST_MARKERS=str(tmp_path))
    start_worker()
    parent = f"JOB-replan-{prefix}"
    conf = {"n": 3, "parent": parent, "fail_once": "second"}
    first = run_dag(airflow_db, "echomq_replan", conf=conf)
    assert (first.state_of("fan_out"), first.state_of("wait")) == ("success", "failed")
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        assert mq.snapshot("example.reports", parent).parent_state == "cancelled"
        # the same plan again (as a clear of fan_out would): repaired, only the dead child runs
        with caplog.at_level(logging.INFO):
            second = run_dag(airflow_db, "echomq_replan", conf=conf)
        assert second.state == "success"
        assert second.xcom("collect") == {"0": 1, "1": 4, "2": 9}
        ran = Counter(json.loads(line)["id"] for line in runs.read_text().splitlines())
        assert [ran[f"{parent}.{i}"] for i in range(3)] == [1, 2, 1]
        assert "repaired (repair 1): 1 children re-run" in capfd.readouterr().out + caplog.text
        # another plan under the same id: replaced (a new generation of child ids)
        third = run_dag(airflow_db, "echomq_replan", conf={**conf, "n": 4, "fail_once": ""})
        assert third.state == "success"
        assert third.xcom("collect") == {"0": 1, "1": 4, "2": 9, "3": 16}
        snap = mq.snapshot("example.reports", parent)
        assert (snap.total, snap.processed, snap.parent_state) == (4, 4, "closed")
        ran = Counter(json.loads(line)["id"] for line in runs.read_text().splitlines())
        assert [ran[f"{parent}.g1.{i}"] for i in range(4)] == [1, 1, 1, 1]


def test_timeouts_cancel_the_flow(
    airflow_db: Path, echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    run = run_dag(airflow_db, "echomq_timeouts")  # no worker: the flow never settles
    assert run.state_of("wait_poke") == "failed"
    parent = parent_id_for("echomq_timeouts", run.run_id, "fan_out")
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        snap = mq.snapshot("test.idle-reports", parent)
        job = mq.get_job("test.idle", f"{parent}.0")
        assert mq.queue("test.idle").claim(1) == []
    assert snap.parent_state == "cancelled" and "timed out" in (snap.error or "")
    assert job.state == "cancelled"


def test_a_soft_fail_sensor_cancels_its_flow_saying_it_timed_out(
    airflow_db: Path, echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    """soft_fail turns the timeout into a skip whose message says only 'soft_fail'; the
    cancel reason carries the timeout it came from."""
    run = run_dag(airflow_db, "echomq_timeouts_soft")
    assert run.state_of("wait_soft") == "skipped"
    parent = parent_id_for("echomq_timeouts_soft", run.run_id, "fan_out")
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        snap = mq.snapshot("test.idle-reports", parent)
    assert snap.parent_state == "cancelled"
    assert "soft_fail" in (snap.error or "") and "timed out" in (snap.error or ""), snap.error


def test_killed_sensor_cancels_its_flow(
    airflow_db: Path, echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    run = run_dag(airflow_db, "echomq_killed")
    assert (run.state_of("wait_cancelled"), run.state_of("wait_kept")) == ("failed", "failed")
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        cancelled = mq.snapshot(
            "test.idle-reports", parent_id_for("echomq_killed", run.run_id, "fan_out_cancelled")
        )
        kept = mq.snapshot(
            "test.idle-reports", parent_id_for("echomq_killed", run.run_id, "fan_out_kept")
        )
    assert cancelled.parent_state == "cancelled"
    assert "sensor wait_cancelled:" in (cancelled.error or "")
    assert kept.parent_state == "held"  # cancel_on_failure=False


def test_an_empty_plan_skips_the_fan_out_as_expand_does(
    airflow_db: Path, echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    """A flow needs a child: the operator given none adds nothing and skips, and the tasks
    waiting on it are skipped - the run ends as the same DAG with ``.expand()`` does."""
    native = run_dag(airflow_db, "native_empty")
    echo = run_dag(airflow_db, "echomq_empty")
    assert native.state_of("work") == "skipped" and native.state_of("total") == "skipped"
    assert [echo.state_of(t) for t in ("fan_out", "wait", "collect")] == ["skipped"] * 3
    assert echo.state == native.state == "success"
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        assert mq.queues() == []  # nothing written


def test_mapped_tasks_read_one_slice_each_of_the_flow(
    airflow_db: Path, echomq_conn: str, start_worker: Callable[..., Any]
) -> None:
    """2,000 children, four mapped readers of 500 positions: the sum is whole and what XCom
    holds is the slices, a few hundred bytes, never a value."""
    start_worker()
    run = run_dag(airflow_db, "echomq_slices")
    assert run.state == "success", {k: str(t.state) for k, t in run.tasks.items()}
    assert run.xcom("total") == sum(n * n for n in range(1, 2_001))
    parts = run.xcom("slices")
    assert [(p["start"], p["stop"]) for p in parts] == [
        (0, 500),
        (500, 1000),
        (1000, 1500),
        (1500, 2000),
    ]
    assert len(json.dumps(parts)) < 600
    # the same flow as frames: whole (polars, pages of 700) and one slice per mapped task
    assert run.xcom("frame_total") == {
        "rows": 2_000,
        "sum": sum(n * n for n in range(1, 2_001)),
        "columns": ["child", "n", "value"],
        "positions": True,
    }
    assert run.mapped_xcoms("slice_frame") == [[500, s, s + 499] for s in range(0, 2000, 500)]


def test_slices_of_a_flow_with_ids_of_its_own_are_refused(
    echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        ref = mq.add_flow("sl", [Child(1, id="JOB-own-1"), Child(2)], barrier=True)
    with pytest.raises(InvalidArgument, match="ids of their own"):
        flow_slices({"queue": "sl", "parent_id": ref.parent_id})


def test_a_frame_of_an_unknown_kind_is_refused_before_anything_is_read(echomq_conn: str) -> None:
    # the flow does not exist: the refusal comes from the kind, before any read
    with pytest.raises(InvalidArgument, match="frame kind must be one of"):
        flow_frame({"queue": "nowhere", "parent_id": "JOB-af/d/t/0"}, kind="excel")
